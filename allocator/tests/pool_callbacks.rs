//! The pool under user callbacks that misbehave and inputs that used to break it: event sinks
//! that panic or call back into the pool, stream runtimes that fail, panic or call back, an
//! event that cannot be queried, reuse settings out of range, stale frees.

mod within;
use within::within;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};

use devarena::pool::{
    AllocRequest, FreeRequest, MAX_REUSE_BLOCKS, ManualStreams, PoolAction, PoolEvent, PoolSlice,
    StreamEvent, StreamId, StreamSync,
};
use devarena::{Error, Pool, PoolClient};

/// Captures `log` records so tests can read what the pool logged.
struct Capture;

static LOGS: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        LOGS.lock()
            .unwrap()
            .push((record.level(), format!("{}", record.args())));
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture;

fn capture_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        log::set_logger(&CAPTURE).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

/// Logged lines that contain `needle` (tests run in parallel: each uses its own pool name).
fn logs_containing(needle: &str) -> Vec<(log::Level, String)> {
    LOGS.lock()
        .unwrap()
        .iter()
        .filter(|(_, line)| line.contains(needle))
        .cloned()
        .collect()
}

#[test]
fn reuse_settings_out_of_range_are_errors_at_build() {
    for blocks in [usize::MAX, 1 << 40, MAX_REUSE_BLOCKS + 1] {
        let err = Pool::builder(1 << 20)
            .name("reuse-range")
            .reuse(blocks, usize::MAX)
            .build_host()
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert!(
            text.contains("reuse-range") && text.contains(&blocks.to_string()),
            "{text}"
        );
    }
    // The largest allowed ring and any byte limit build, and the pool serves and reuses.
    let pool = Pool::builder(1 << 20)
        .reuse(MAX_REUSE_BLOCKS, usize::MAX)
        .build_host()
        .unwrap();
    for _ in 0..3 {
        let a = pool.allocate(5000, 0).unwrap();
        pool.deallocate(a).unwrap();
    }
    let stats = pool.stats();
    assert_eq!((stats.live, stats.in_use, stats.reused), (0, 0, 2));
}

/// A sink that panics on every event.
fn panicking_sink(_: &PoolEvent<'_>) {
    panic!("sink failure");
}

#[test]
fn a_panicking_sink_loses_nothing_and_is_reported_once() {
    capture_logs();
    let pool = Pool::builder(1 << 20)
        .name("panicking-sink")
        .events(Arc::new(panicking_sink))
        .build_host()
        .unwrap();
    // Every call returns normally; the allocations are live and freed as usual.
    let a = pool.allocate(1000, 0).unwrap();
    let b = pool.allocate(2000, 0).unwrap();
    assert!(pool.allocate(2 << 20, 0).is_err());
    let stats = pool.stats();
    assert_eq!((stats.live, stats.allocations, stats.failures), (2, 2, 1));
    pool.deallocate(a).unwrap();
    pool.deallocate(b).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.live, stats.in_use, stats.frees), (0, 0, 2));
    // The whole region is still there to take.
    let all = pool.allocate(1 << 20, 0).unwrap();
    pool.deallocate(all).unwrap();
    let reports = logs_containing("pool `panicking-sink`: the event sink panicked");
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].0, log::Level::Error);
}

#[test]
fn a_sink_that_calls_back_into_the_pool_works() {
    // The sink allocates and frees a scratch block on every allocation of another size: the
    // pool must neither wait for ever nor lose an event.
    let pool_slot: Arc<OnceLock<PoolClient>> = Arc::new(OnceLock::new());
    let seen: Arc<Mutex<Vec<(PoolAction, usize)>>> = Arc::default();
    let sink = {
        // Weak: the pool holds its sink, so a strong reference to its client would make a
        // cycle that keeps the pool alive after the test (LeakSanitizer reports it).
        let pool_slot = Arc::downgrade(&pool_slot);
        let seen = seen.clone();
        move |e: &PoolEvent<'_>| {
            seen.lock().unwrap().push((e.action, e.size));
            if e.action == PoolAction::Allocate && e.size != 256 {
                let pool_slot = pool_slot.upgrade().expect("the test holds the slot");
                let client = pool_slot.get().expect("set before the first allocation");
                let scratch = client.allocate(256, 0).expect("the pool serves its sink");
                client.deallocate(scratch).expect("and frees for it");
            }
        }
    };
    let pool = Pool::builder(1 << 20)
        .events(Arc::new(sink))
        .build_host()
        .unwrap();
    pool_slot.set(pool.own_client().clone()).unwrap();
    let a = pool.allocate(1000, 0).unwrap();
    pool.deallocate(a).unwrap();
    let seen = seen.lock().unwrap().clone();
    // In the pool's order: the allocation, then the sink's own pair, then the free.
    assert_eq!(
        seen,
        [
            (PoolAction::Allocate, 1000),
            (PoolAction::Allocate, 256),
            (PoolAction::Free, 256),
            (PoolAction::Free, 1000),
        ]
    );
    let stats = pool.stats();
    assert_eq!((stats.live, stats.allocations, stats.frees), (0, 2, 2));
}

#[test]
fn events_from_many_threads_arrive_in_the_pools_order() {
    // Every address's events alternate allocate, free, allocate, ... in the log: a free is
    // never delivered before the allocation it frees, nor an allocation before the free of the
    // block it reuses.
    let log: Arc<Mutex<Vec<(PoolAction, u64)>>> = Arc::default();
    let sink = {
        let log = log.clone();
        move |e: &PoolEvent<'_>| log.lock().unwrap().push((e.action, e.addr))
    };
    let pool = Arc::new(
        Pool::builder(1 << 20)
            .events(Arc::new(sink))
            .build_host()
            .unwrap(),
    );
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                for i in 0..2000 {
                    let a = pool.allocate(256 * (1 + (i + t) % 4), 0).unwrap();
                    pool.deallocate(a).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 4 * 2000 * 2);
    let mut live = std::collections::HashMap::new();
    for &(action, addr) in log.iter() {
        let was_live = live
            .insert(addr, action == PoolAction::Allocate)
            .unwrap_or(false);
        match action {
            PoolAction::Allocate => assert!(!was_live, "{addr:#x} handed out twice"),
            PoolAction::Free => assert!(was_live, "{addr:#x} freed before it was allocated"),
            PoolAction::AllocateFailure => unreachable!(),
        }
    }
}

/// A stream runtime whose events complete, fail or panic as the test says, and which can be
/// made to panic or to call back into its pool.
#[derive(Debug, Default)]
struct Scripted {
    /// What the next queries of events answer: 0 not yet, 1 complete, 2 an error, 3 a panic.
    answer: AtomicUsize,
    panic_on_record: AtomicBool,
    call_back: AtomicBool,
    /// The pool's client for calls back into it; taken out when the test's [`Script`] drops,
    /// which ends the cycle pool → runtime → this → client → pool (else the pool outlives the
    /// test, and LeakSanitizer reports it).
    pool: Mutex<Option<PoolClient>>,
    /// What a call back into the pool got.
    call_back_result: Mutex<Option<Result<u64, Error>>>,
}

#[derive(Debug)]
struct ScriptedEvent(Arc<Scripted>);

impl StreamEvent for ScriptedEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        match self.0.answer.load(Ordering::SeqCst) {
            0 => Ok(false),
            1 => Ok(true),
            2 => Err(Error::InvalidArgument {
                what: "CUDA_ERROR_ILLEGAL_ADDRESS (scripted)".into(),
            }),
            _ => panic!("scripted panic in is_complete"),
        }
    }
}

#[derive(Debug)]
struct ScriptedStreams(Arc<Scripted>);

impl StreamSync for ScriptedStreams {
    fn record(&self, _stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        if self.0.panic_on_record.load(Ordering::SeqCst) {
            panic!("scripted panic in record");
        }
        if self.0.call_back.load(Ordering::SeqCst) {
            let client = self
                .0
                .pool
                .lock()
                .unwrap()
                .clone()
                .expect("set after build");
            *self.0.call_back_result.lock().unwrap() = Some(client.allocate(256, 0));
        }
        Ok(Box::new(ScriptedEvent(self.0.clone())))
    }

    fn order_after(&self, _waiter: StreamId, _producer: StreamId) -> Result<(), Error> {
        Ok(())
    }
}

const HOME: StreamId = StreamId(1);
const OTHER: StreamId = StreamId(2);

/// A test's hold on its [`Scripted`] runtime: dropped, it takes the pool's client back out.
struct Script(Arc<Scripted>);

impl std::ops::Deref for Script {
    type Target = Scripted;
    fn deref(&self) -> &Scripted {
        &self.0
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let client = self.0.pool.lock().unwrap_or_else(|e| e.into_inner()).take();
        // Dropped after the slot's lock: the pool's drop may call the runtime, which may lock it.
        drop(client);
    }
}

fn scripted_pool(name: &str, capacity: usize) -> (Pool, Script) {
    let script = Arc::new(Scripted::default());
    // The pool's own index alone, whose frees on another stream record events (with thread
    // heaps a thread's blocks of another stream are freed there without one).
    let pool = Pool::builder(capacity)
        .name(name)
        .reuse(0, 0)
        .thread_heaps(0)
        .streams(Arc::new(ScriptedStreams(script.clone())), HOME)
        .build_host()
        .unwrap();
    *script.pool.lock().unwrap() = Some(pool.own_client().clone());
    (pool, Script(script))
}

#[test]
fn an_event_that_cannot_be_queried_sets_aside_only_its_block() {
    capture_logs();
    let (pool, script) = scripted_pool("failing-event", 1 << 20);
    let a = pool.allocate_on(4096, 0, OTHER).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    assert_eq!(pool.stats().pending, 4096);
    // The driver fails the query: the block is set aside, the pool carries on.
    script.answer.store(2, Ordering::SeqCst);
    let b = pool.allocate(1000, 0).unwrap();
    assert_eq!(pool.reclaim().unwrap(), 0);
    let stats = pool.stats();
    assert_eq!((stats.pending, stats.quarantined, stats.live), (0, 4096, 1));
    assert_eq!(stats.free, (1 << 20) - 4096 - 1024);
    // Everything else is still served; only the set-aside block is missing.
    pool.deallocate(b).unwrap();
    let half = pool.allocate(1 << 19, 0).unwrap();
    assert!(half >= a + 4096);
    pool.deallocate(half).unwrap();
    assert_eq!(pool.stats().largest_free, (1 << 20) - 4096);
    assert!(pool.allocate(1 << 20, 0).is_err());
    let reports = logs_containing("pool `failing-event`: the event of a block of 4096 bytes");
    assert_eq!(reports.len(), 1, "{reports:?}");
}

#[test]
fn a_stream_runtime_that_panics_gives_errors_and_changes_nothing() {
    let (pool, script) = scripted_pool("panicking-streams", 1 << 20);
    let a = pool.allocate_on(4096, 0, OTHER).unwrap();
    script.panic_on_record.store(true, Ordering::SeqCst);
    let err = pool.deallocate_on(a, OTHER).unwrap_err();
    // The error carries the panic's message.
    assert!(
        err.to_string()
            .contains("panicked in `record`: scripted panic in record"),
        "{err}"
    );
    // The allocation is still live and the pool as it was.
    assert_eq!(pool.stats().live, 1);
    script.panic_on_record.store(false, Ordering::SeqCst);
    pool.deallocate_on(a, OTHER).unwrap();
    // A panicking query sets the block aside like a failing one.
    script.answer.store(3, Ordering::SeqCst);
    assert_eq!(pool.reclaim().unwrap(), 0);
    let stats = pool.stats();
    assert_eq!((stats.pending, stats.quarantined), (0, 4096));
    let b = pool.allocate(4096, 0).unwrap();
    pool.deallocate(b).unwrap();
}

#[test]
fn a_stream_runtime_that_calls_back_gets_an_error_instead_of_a_hang() {
    let (pool, script) = scripted_pool("reentrant-streams", 1 << 20);
    let a = pool.allocate_on(4096, 0, OTHER).unwrap();
    script.call_back.store(true, Ordering::SeqCst);
    // `record` runs under the pool's lock and calls `allocate`: that call fails at once.
    pool.deallocate_on(a, OTHER).unwrap();
    let inner = script.call_back_result.lock().unwrap().take().unwrap();
    let err = inner.unwrap_err();
    assert!(
        err.to_string()
            .contains("pool `reentrant-streams` was called from its own stream runtime"),
        "{err}"
    );
    script.call_back.store(false, Ordering::SeqCst);
    script.answer.store(1, Ordering::SeqCst);
    assert_eq!(pool.reclaim().unwrap(), 4096);
    let stats = pool.stats();
    assert_eq!((stats.live, stats.pending, stats.in_use), (0, 0, 0));
}

#[test]
fn a_free_that_names_the_wrong_size_frees_nothing() {
    let pool = Pool::builder(1 << 20).reuse(0, 0).build_host().unwrap();
    let client = pool.client("sized", usize::MAX);
    let a = client.allocate(1000, 0).unwrap();
    let err = client
        .deallocate_with(FreeRequest::new(a).size(999))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("names 999 bytes") && text.contains("asked for 1000 bytes"),
        "{text}"
    );
    assert_eq!(client.stats().live, 1);
    client
        .deallocate_with(FreeRequest::new(a).size(1000))
        .unwrap();
    // A stale free after the address was handed out again is caught by the size.
    let b = pool.allocate(5000, 0).unwrap();
    assert_eq!(a, b);
    assert!(
        pool.deallocate_with(FreeRequest::new(a).size(1000))
            .is_err()
    );
    assert_eq!(pool.stats().live, 1);
    pool.deallocate_with(FreeRequest::new(b).size(5000))
        .unwrap();
    assert_eq!(pool.stats().live, 0);
}

// ---------------------------------------------------------------------------------------------
// Callbacks that reach the pool by less direct ways: through a second pool's runtime, from an
// event's destructor, from a statistics call.

/// What a test hooks into a runtime call, run once.
type Hook = Mutex<Option<Box<dyn FnOnce() + Send>>>;

/// A stream runtime that, in `record`, runs what the test put in `on_record` (once).
#[derive(Default)]
struct Hooked {
    on_record: Hook,
    /// Run (once) in `validate`.
    on_validate: Hook,
    /// Events whose destructor runs what the test put here (once).
    on_event_drop: Arc<Hook>,
    complete: Arc<AtomicBool>,
}

impl std::fmt::Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooked")
    }
}

struct HookedEvent {
    on_drop: Arc<Hook>,
    complete: Arc<AtomicBool>,
}

impl std::fmt::Debug for HookedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookedEvent")
    }
}

impl StreamEvent for HookedEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        Ok(self.complete.load(Ordering::SeqCst))
    }
}

impl Drop for HookedEvent {
    fn drop(&mut self) {
        let hook = self.on_drop.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
    }
}

impl StreamSync for Hooked {
    fn record(&self, _stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        let hook = self.on_record.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        Ok(Box::new(HookedEvent {
            on_drop: self.on_event_drop.clone(),
            complete: self.complete.clone(),
        }))
    }

    fn order_after(&self, _waiter: StreamId, _producer: StreamId) -> Result<(), Error> {
        Ok(())
    }

    fn validate(&self, _stream: StreamId) -> Result<(), Error> {
        let hook = self.on_validate.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        Ok(())
    }
}

/// Completes the runtime's events and reclaims, from another thread within 20 s: the one
/// parked block of 4096 bytes comes back (its event dropped under the pool's lock).
fn reclaim_the_parked_block(pool: &Arc<Pool>, streams: &Hooked) {
    streams.complete.store(true, Ordering::SeqCst);
    let reclaimed = within(20, {
        let pool = pool.clone();
        move || pool.reclaim()
    });
    assert!(
        matches!(reclaimed, Some(Ok(4096))),
        "reclaim did not return: {reclaimed:?}"
    );
}

fn hooked_pool(name: &str) -> (Arc<Pool>, Arc<Hooked>) {
    let streams = Arc::new(Hooked::default());
    (Arc::new(pool_on(name, streams.clone())), streams)
}

/// A 1 MiB host pool on the runtime `streams`, without a reuse cache or thread heaps.
fn pool_on(name: &str, streams: Arc<dyn StreamSync>) -> Pool {
    Pool::builder(1 << 20)
        .name(name)
        .reuse(0, 0)
        .thread_heaps(0)
        .streams(streams, HOME)
        .build_host()
        .unwrap()
}

#[test]
fn a_call_back_through_a_second_pools_runtime_gets_an_error_instead_of_a_hang() {
    let (a, a_streams) = hooked_pool("nested-a");
    let (b, b_streams) = hooked_pool("nested-b");
    let inner: Arc<Mutex<Option<Result<u64, Error>>>> = Arc::default();
    // B's `record` calls A (which holds its lock further up this thread's stack).
    *b_streams.on_record.lock().unwrap() = Some(Box::new({
        let (a, inner) = (a.clone(), inner.clone());
        move || *inner.lock().unwrap() = Some(a.allocate(256, 0))
    }));
    // A's `record` frees a block of B on another stream, which records on B's runtime.
    let b_block = b.allocate(4096, 0).unwrap();
    *a_streams.on_record.lock().unwrap() = Some(Box::new({
        let b = b.clone();
        move || b.deallocate_on(b_block, OTHER).unwrap()
    }));
    let a_block = a.allocate(4096, 0).unwrap();
    let done = within(20, {
        let a = a.clone();
        move || a.deallocate_on(a_block, OTHER)
    });
    assert!(
        matches!(done, Some(Ok(()))),
        "the free on pool A did not return"
    );
    let inner = inner.lock().unwrap().take().expect("B's runtime called A");
    let err = inner.unwrap_err();
    assert!(
        err.to_string()
            .contains("pool `nested-a` was called from its own stream runtime"),
        "{err}"
    );
    assert_eq!((a.stats().pending, b.stats().pending), (4096, 4096));
}

#[test]
fn an_event_whose_drop_calls_the_pool_gets_an_error_instead_of_a_hang() {
    let (pool, streams) = hooked_pool("event-drop-reenters");
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    let inner: Arc<Mutex<Option<Result<u64, Error>>>> = Arc::default();
    *streams.on_event_drop.lock().unwrap() = Some(Box::new({
        let (pool, inner) = (pool.clone(), inner.clone());
        move || *inner.lock().unwrap() = Some(pool.allocate(256, 0))
    }));
    reclaim_the_parked_block(&pool, &streams);
    // The call from the destructor, made under the pool's lock, failed instead of waiting.
    let inner = inner.lock().unwrap().take();
    assert!(matches!(inner, Some(Err(_))), "{inner:?}");
}

#[test]
fn an_event_whose_drop_panics_does_not_panic_the_pool_call() {
    let (pool, streams) = hooked_pool("event-drop-panics");
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    *streams.on_event_drop.lock().unwrap() =
        Some(Box::new(|| panic!("scripted panic in an event's drop")));
    streams.complete.store(true, Ordering::SeqCst);
    let reclaimed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.reclaim()));
    assert!(
        matches!(reclaimed, Ok(Ok(4096))),
        "reclaim panicked or failed"
    );
    let stats = pool.stats();
    assert_eq!((stats.pending, stats.live, stats.in_use), (0, 0, 0));
}

/// A panic payload whose own `Drop` panics: user code may panic with any payload
/// (`std::panic::panic_any`).
struct Bomb(&'static AtomicUsize);

impl Drop for Bomb {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("a panic payload's drop panics");
    }
}

/// A sink, a stream runtime and an event's destructor that panic with a payload whose `Drop`
/// panics: each payload is dropped (its destructor runs) and that second panic stays inside
/// the pool's catch, as the first does: every pool call returns, and the pool carries on.
#[test]
fn panics_whose_payloads_panic_when_dropped_stay_inside_the_pool() {
    static SINK_BOMBS: AtomicUsize = AtomicUsize::new(0);
    static RUNTIME_BOMBS: AtomicUsize = AtomicUsize::new(0);
    static EVENT_BOMBS: AtomicUsize = AtomicUsize::new(0);
    capture_logs();
    let bombing_sink = |_: &PoolEvent<'_>| std::panic::panic_any(Bomb(&SINK_BOMBS));
    let pool = Pool::builder(1 << 20)
        .name("bomb-sink")
        .events(Arc::new(bombing_sink))
        .build_host()
        .unwrap();
    let a = pool.allocate(1000, 0).unwrap();
    pool.deallocate(a).unwrap();
    assert!(SINK_BOMBS.load(Ordering::SeqCst) >= 2);
    assert_eq!(pool.stats().allocations, 1);

    /// A runtime whose `record` panics with a bomb.
    #[derive(Debug)]
    struct BombingStreams;
    impl StreamSync for BombingStreams {
        fn record(&self, _stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
            std::panic::panic_any(Bomb(&RUNTIME_BOMBS))
        }
        fn order_after(&self, _waiter: StreamId, _producer: StreamId) -> Result<(), Error> {
            Ok(())
        }
    }
    let pool = Pool::builder(1 << 20)
        .name("bomb-runtime")
        .thread_heaps(0)
        .streams(Arc::new(BombingStreams), HOME)
        .build_host()
        .unwrap();
    let a = pool.allocate_on(4096, 0, OTHER).unwrap();
    let err = pool.deallocate_on(a, OTHER).unwrap_err();
    assert!(err.to_string().contains("panicked in `record`"), "{err}");
    assert_eq!(RUNTIME_BOMBS.load(Ordering::SeqCst), 1);
    // Nothing changed: the block is live, and freed on the home stream as usual.
    assert_eq!(pool.stats().live, 1);
    pool.deallocate(a).unwrap();
    assert_eq!(pool.stats().in_use, 0);

    let (pool, streams) = hooked_pool("bomb-event-drop");
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    *streams.on_event_drop.lock().unwrap() =
        Some(Box::new(|| std::panic::panic_any(Bomb(&EVENT_BOMBS))));
    streams.complete.store(true, Ordering::SeqCst);
    let reclaimed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.reclaim()));
    assert!(
        matches!(reclaimed, Ok(Ok(4096))),
        "reclaim panicked or failed"
    );
    assert_eq!(EVENT_BOMBS.load(Ordering::SeqCst), 1);
    let stats = pool.stats();
    assert_eq!((stats.pending, stats.live, stats.in_use), (0, 0, 0));
}

/// A payload whose `Drop` panics with a payload like itself, for ever: the pool drops a few
/// of the chain and forgets the rest, and its call returns. (A payload whose `Drop` panics
/// with a message, as `Bomb`'s does, has that message dropped too: Miri finds no leak.)
#[test]
fn a_chain_of_payloads_that_panic_when_dropped_ends() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    struct Chain;
    impl Drop for Chain {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
            std::panic::panic_any(Chain);
        }
    }
    capture_logs();
    let pool = Pool::builder(1 << 20)
        .name("chain-sink")
        .events(Arc::new(|_: &PoolEvent<'_>| std::panic::panic_any(Chain)))
        .build_host()
        .unwrap();
    let a = pool.allocate(1000, 0).unwrap();
    // One event, one caught panic: its payload and three more of the chain dropped, the
    // fifth forgotten.
    assert_eq!(DROPS.load(Ordering::SeqCst), 4);
    pool.deallocate(a).unwrap();
    assert_eq!(DROPS.load(Ordering::SeqCst), 8);
    assert_eq!(pool.stats().in_use, 0);
}

/// Statistics, reports and settings return plain values, so from inside a callback of their
/// own pool (where waiting for the lock would be for ever) they have no error to return: the
/// call unwinds out of the callback, and the pool call that ran it fails, naming what was
/// asked for. The pool loses nothing.
#[test]
fn a_runtime_that_asks_for_statistics_fails_its_pool_call_instead_of_hanging() {
    type Ask = fn(&Pool);
    let asks: [(&str, Ask); 4] = [
        ("statistics", |pool| {
            let _ = pool.stats();
        }),
        ("a leak report", |pool| {
            let _ = pool.leak_report();
        }),
        ("every client's statistics", |pool| {
            let _ = pool.client_stats();
        }),
        ("a new client", |pool| {
            let _ = pool.client("late", usize::MAX);
        }),
    ];
    for (what, ask) in asks {
        let (pool, streams) = hooked_pool("stats-from-runtime");
        let reached: Arc<AtomicBool> = Arc::default();
        *streams.on_record.lock().unwrap() = Some(Box::new({
            let (pool, reached) = (pool.clone(), reached.clone());
            move || {
                ask(&pool);
                reached.store(true, Ordering::SeqCst);
            }
        }));
        let a = pool.allocate(4096, 0).unwrap();
        let done = within(20, {
            let pool = pool.clone();
            move || pool.deallocate_on(a, OTHER)
        });
        let err = match done {
            Some(Err(err)) => err,
            other => panic!("asking for {what}: the free returned {other:?}"),
        };
        assert!(
            err.to_string().contains(&format!(
                "pool `stats-from-runtime` was asked for {what} from inside its own stream \
                 runtime's callback or virtual-memory backend"
            )),
            "{err}"
        );
        // The call did not return into the runtime, and the free changed nothing: the block
        // is still live, and freed normally afterwards.
        assert!(!reached.load(Ordering::SeqCst), "asking for {what}");
        let stats = pool.stats();
        assert_eq!((stats.live, stats.in_use, stats.pending), (1, 4096, 0));
        pool.deallocate(a).unwrap();
        assert_eq!(pool.stats().live, 0);
    }
}

/// An event's destructor has no pool call to fail: its call back for statistics is abandoned
/// and logged, and the call that dropped the event carries on.
#[test]
fn an_event_whose_drop_asks_for_statistics_is_logged_and_the_pool_carries_on() {
    capture_logs();
    let (pool, streams) = hooked_pool("event-drop-asks-stats");
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    *streams.on_event_drop.lock().unwrap() = Some(Box::new({
        let pool = pool.clone();
        move || {
            let _ = pool.stats();
        }
    }));
    reclaim_the_parked_block(&pool, &streams);
    let stats = pool.stats();
    assert_eq!((stats.pending, stats.live, stats.in_use), (0, 0, 0));
    let logged = logs_containing("pool `event-drop-asks-stats` was asked for statistics");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].0, log::Level::Warn);
}

/// Opening a graph reservation asks the runtime to validate the stream without the pool's lock:
/// a call back into the pool from there waits for the lock as any call does, and succeeds
/// whether or not another thread holds the lock at that moment.
#[test]
fn a_runtime_that_calls_the_pool_while_validating_a_graph_stream_is_served() {
    let (pool, streams) = hooked_pool("validate-calls-back");
    let served: Arc<Mutex<Vec<Result<(), Error>>>> = Arc::default();
    *streams.on_validate.lock().unwrap() = Some(Box::new({
        let (pool, served) = (pool.clone(), served.clone());
        move || {
            for _ in 0..2000 {
                let result = pool.allocate(256, 0).and_then(|a| pool.deallocate(a));
                served.lock().unwrap().push(result);
            }
        }
    }));
    // Another thread keeps the lock busy meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = std::thread::spawn({
        let (pool, stop) = (pool.clone(), stop.clone());
        move || {
            while !stop.load(Ordering::Relaxed) {
                let a = pool.allocate(512, 0).unwrap();
                pool.deallocate(a).unwrap();
            }
        }
    });
    let reservation = pool.graph_reservation(OTHER);
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    assert!(reservation.is_ok());
    let served = served.lock().unwrap();
    assert_eq!(served.len(), 2000);
    let failed: Vec<_> = served.iter().filter(|r| r.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} failed, first: {:?}",
        failed.len(),
        failed[0]
    );
    drop(reservation);
    assert_eq!(pool.stats().live, 0);
}

#[test]
fn a_slice_dropped_in_an_event_destructor_is_freed_by_the_next_call() {
    // A runtime's event that owns a pool slice (keeping a buffer alive until the event
    // completes) is dropped by the pool under its lock: the slice's free cannot be made there,
    // and its destructor has no one to give an error to. The free waits for the next call
    // that takes the lock, which makes it before anything else.
    let (pool, streams) = hooked_pool("slice-in-an-event");
    let slice = pool.alloc_slice::<u32>(1000).unwrap();
    let held = slice.addr();
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    let before = pool.stats();
    assert_eq!(before.live, 1);
    *streams.on_event_drop.lock().unwrap() = Some(Box::new(move || drop(slice)));
    reclaim_the_parked_block(&pool, &streams);
    // The statistics are the next call: the slice is freed, nothing leaks.
    let after = pool.stats();
    assert_eq!((after.live, after.in_use, after.requested), (0, 0, 0));
    assert_eq!(after.frees, before.frees + 1);
    assert_eq!(pool.leak_report().leaks.len(), 0);
    // Its memory is free again: the whole region in one request.
    let all = pool.allocate(1 << 20, 0).unwrap();
    assert!(all <= held);
    pool.deallocate(all).unwrap();
}

/// A [`hooked_pool`] with a slice of half its region, and a block of 4096 bytes freed on
/// `OTHER` whose event (not complete) drops the slice when it is dropped.
fn slice_in_a_parked_blocks_event(name: &str) -> (Arc<Pool>, Arc<Hooked>) {
    let (pool, streams) = hooked_pool(name);
    let slice = pool.alloc_slice::<u8>(512 << 10).unwrap();
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    *streams.on_event_drop.lock().unwrap() = Some(Box::new(move || drop(slice)));
    (pool, streams)
}

#[test]
fn a_slice_dropped_in_an_event_destructor_is_freed_before_an_allocation_needs_it() {
    // The same, with an allocation as the next call: it needs the whole region, which it
    // finds only once the deferred free is made.
    let (pool, streams) = slice_in_a_parked_blocks_event("slice-in-an-event-alloc");
    reclaim_the_parked_block(&pool, &streams);
    let all = pool.allocate(1 << 20, 0).unwrap();
    pool.deallocate(all).unwrap();
    assert_eq!(pool.stats().live, 0);
}

#[test]
fn a_slice_dropped_by_the_allocations_own_reclaim_is_freed_for_it() {
    // The event that owns the slice completes, but nothing reclaims it before the allocation
    // that needs the whole region: the allocation's own reclaim drops the event (and the
    // slice in it) under the lock, after the allocation looked for deferred frees. It must
    // still find the slice's memory free.
    let (pool, streams) = slice_in_a_parked_blocks_event("slice-in-an-event-own-reclaim");
    streams.complete.store(true, Ordering::SeqCst);
    let all = within(20, {
        let pool = pool.clone();
        move || pool.allocate(1 << 20, 0)
    });
    let all = all.expect("the allocation returned").unwrap();
    pool.deallocate(all).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.live, stats.in_use, stats.pending), (0, 0, 0));
}

/// [`ManualStreams`] (its events, waits and captures) with a hook run in `record` (once), and
/// one that the next event recorded runs in its destructor.
#[derive(Default)]
struct HookedManual {
    manual: ManualStreams,
    on_record: Hook,
    on_event_drop: Hook,
}

/// An event of [`HookedManual`]: `ManualStreams`' own, and what runs when it is dropped.
struct DropHooked {
    event: Box<dyn StreamEvent>,
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for DropHooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DropHooked")
    }
}

impl StreamEvent for DropHooked {
    fn is_complete(&self) -> Result<bool, Error> {
        self.event.is_complete()
    }
}

impl Drop for DropHooked {
    fn drop(&mut self) {
        if let Some(hook) = self.on_drop.take() {
            hook();
        }
    }
}

impl std::fmt::Debug for HookedManual {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookedManual")
    }
}

impl StreamSync for HookedManual {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        let hook = self.on_record.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        Ok(Box::new(DropHooked {
            event: self.manual.record(stream)?,
            on_drop: self.on_event_drop.lock().unwrap().take(),
        }))
    }
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.manual.order_after(waiter, producer)
    }
    fn is_capturing(&self, stream: StreamId) -> Result<bool, Error> {
        self.manual.is_capturing(stream)
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        self.manual.synchronize(stream)
    }
}

#[test]
fn a_deferred_free_on_the_home_stream_does_not_make_a_capturing_stream_wait() {
    // A slice on the home stream dropped in `record` (under the pool's lock) is freed by the
    // next call that allocates. When that call is an allocation for a capturing stream, the
    // host must have waited for the home stream past that free too: the capturing stream
    // cannot wait for the home stream (the capture would be invalidated).
    let (pool, streams) =
        slice_dropped_then_captured("deferred-before-capture", |streams, slice| {
            *streams.on_record.lock().unwrap() = Some(Box::new(move || drop(slice)));
        });
    // The slice was freed (before the capture's allocation), and the home stream waited for.
    let stats = pool.stats();
    assert_eq!((stats.live, stats.pending), (1, 4096));
    assert!(streams.manual.synchronized().contains(&HOME));
}

/// A pool on a [`HookedManual`] runtime with a 4096-byte slice that `hook` hands to the
/// runtime (to drop in `record` or in an event's destructor), a block freed on `OTHER` (its
/// event recorded), then (after `hook`'s runtime setup) an allocation for a stream that
/// captures: it succeeds, and the runtime refused no call.
fn slice_dropped_then_captured(
    name: &str,
    hook: impl FnOnce(&HookedManual, PoolSlice<u8>),
) -> (Pool, Arc<HookedManual>) {
    slice_dropped_then_captured_after(name, hook, |_| {})
}

fn slice_dropped_then_captured_after(
    name: &str,
    hook: impl FnOnce(&HookedManual, PoolSlice<u8>),
    before_capture: impl FnOnce(&HookedManual),
) -> (Pool, Arc<HookedManual>) {
    const CAPTURE: StreamId = StreamId(3);
    let streams = Arc::new(HookedManual::default());
    let pool = pool_on(name, streams.clone());
    hook(&streams, pool.alloc_slice::<u8>(4096).unwrap());
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    before_capture(&streams);
    streams.manual.begin_capture(CAPTURE);
    let b = pool.allocate_for_capture(AllocRequest::new(256, 0).on(CAPTURE));
    assert!(b.is_ok(), "{b:?}");
    assert_eq!(streams.manual.refused(), []);
    (pool, streams)
}

#[test]
fn a_slice_freed_by_a_capturing_allocations_own_reclaim_does_not_make_it_wait() {
    // The same, with the slice in an event that the capture's allocation reclaims itself.
    let (pool, streams) = slice_dropped_then_captured_after(
        "deferred-in-capture-reclaim",
        |streams, slice| {
            *streams.on_event_drop.lock().unwrap() = Some(Box::new(move || drop(slice)));
        },
        |streams| streams.manual.complete(OTHER),
    );
    let stats = pool.stats();
    assert_eq!((stats.live, stats.pending), (1, 0));
    assert!(streams.manual.synchronized().contains(&HOME));
}

#[test]
fn a_slice_of_a_thread_heap_dropped_in_an_event_destructor_is_freed_on_its_heap() {
    // The slice and the parked block are the main thread's heap's; another thread's reclaim
    // drops the event (and the slice in it) under the pool's lock. The free is deferred, then
    // made on the heap that owns the block, and nothing leaks.
    capture_logs();
    let streams = Arc::new(Hooked::default());
    let pool = Arc::new(
        Pool::builder(1 << 20)
            .name("heap-slice-in-an-event")
            .eager_thread_heaps(true)
            .streams(streams.clone(), HOME)
            .build_host()
            .unwrap(),
    );
    let slice = pool.alloc_slice::<u8>(256 << 10).unwrap();
    let a = pool.allocate(4096, 0).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    pool.deallocate_on(a, OTHER).unwrap();
    let frees = pool.stats().frees;
    *streams.on_event_drop.lock().unwrap() = Some(Box::new(move || drop(slice)));
    reclaim_the_parked_block(&pool, &streams);
    let deferred = logs_containing("pool `heap-slice-in-an-event`: the free of a slice");
    assert_eq!(deferred.len(), 1, "{deferred:?}");
    let stats = pool.stats();
    assert_eq!((stats.live, stats.in_use, stats.requested), (0, 0, 0));
    assert_eq!(stats.frees, frees + 1);
    assert!(pool.leak_report().leaks.is_empty());
    // The whole region in one request: every byte came back.
    let all = pool.allocate(1 << 20, 0).unwrap();
    pool.deallocate(all).unwrap();
}

// ---------------------------------------------------------------------------------------------
// User objects the pool drops, and frees whose event cannot be recorded.

/// A sink that holds a client of its pool and, when dropped, asks the pool for statistics (a
/// sink that prints a summary when it goes, say).
struct SummarySink(Arc<OnceLock<PoolClient>>);

impl devarena::pool::EventSink for SummarySink {
    fn event(&self, _: &PoolEvent<'_>) {}
}

impl Drop for SummarySink {
    fn drop(&mut self) {
        if let Some(client) = self.0.get() {
            let _ = client.pool_stats();
        }
    }
}

#[test]
fn replacing_a_sink_whose_destructor_calls_the_pool_does_not_hang() {
    let slot: Arc<OnceLock<PoolClient>> = Arc::default();
    let pool = Arc::new(
        Pool::builder(1 << 20)
            .name("sink-drop-calls-back")
            .events(Arc::new(SummarySink(slot.clone())))
            .build_host()
            .unwrap(),
    );
    slot.set(pool.own_client().clone()).unwrap();
    let a = pool.allocate(1000, 0).unwrap();
    pool.deallocate(a).unwrap();
    // The pool holds the only reference to the sink: replacing it drops it.
    let replaced = within(20, {
        let pool = pool.clone();
        move || pool.set_events(None)
    });
    assert!(replaced.is_some(), "set_events(None) did not return");
    assert_eq!(pool.stats().live, 0);
}

/// A pool on its own index with a slice of 4096 bytes for `OTHER`, its stream runtime failing
/// from then on (a driver error at every call).
fn slice_on_a_failing_runtime(name: &str) -> (Pool, Arc<ManualStreams>, PoolSlice<u8>) {
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(1 << 20)
        .name(name)
        .reuse(0, 0)
        .thread_heaps(0)
        .streams(streams.clone(), HOME)
        .build_host()
        .unwrap();
    let slice = pool.own_client().alloc_slice_on::<u8>(4096, OTHER).unwrap();
    streams.fail_with(Some(Error::Driver {
        call: "cuEventRecord",
        name: "CUDA_ERROR_LAUNCH_TIMEOUT".into(),
        text: "transient failure".into(),
        code: 702,
    }));
    (pool, streams, slice)
}

/// A slice on another stream is freed with an event recorded there. When the runtime cannot
/// record it (a driver error), the slice is gone and no one else may free its block (only the
/// slice frees an owned block): the block is parked behind the failure and set aside, counted,
/// not left live for good.
#[test]
fn a_slice_dropped_while_no_event_can_be_recorded_is_set_aside_and_counted() {
    let (pool, streams, slice) = slice_on_a_failing_runtime("slice-drop-record-fails");
    let addr = slice.addr();
    drop(slice); // the error logged, the block parked behind the failure
    assert_set_aside_once_the_runtime_works(&pool, &streams);
    // Nor can the caller free it by address: the block belongs to a slice that is gone.
    assert!(pool.deallocate_on(addr, OTHER).is_err());
}

/// The runtime works again and the pool reclaims: the slice's block of 4096 bytes is set
/// aside, neither live nor pending, and the rest of the pool serves on.
fn assert_set_aside_once_the_runtime_works(pool: &Pool, streams: &ManualStreams) {
    streams.fail_with(None);
    streams.complete_all();
    let _ = pool.reclaim();
    let stats = pool.stats();
    assert_eq!(
        (stats.live, stats.in_use, stats.pending, stats.quarantined),
        (0, 0, 0, 4096),
        "{stats:?}"
    );
    let rest = pool.allocate(512 << 10, 0).unwrap();
    pool.deallocate(rest).unwrap();
}

/// `PoolSlice::free` returns the error of a free whose event cannot be recorded, and the
/// block is set aside as for a dropped slice.
#[test]
fn a_slice_whose_free_cannot_record_an_event_returns_the_error_and_sets_the_block_aside() {
    let (pool, streams, slice) = slice_on_a_failing_runtime("slice-free-record-fails");
    // `free` reports the error, and takes the slice: nothing is left to free the block with.
    let error = slice.free().unwrap_err();
    assert!(matches!(error, Error::Driver { code: 702, .. }), "{error}");
    assert_eq!((pool.stats().live, pool.stats().pending), (0, 4096));
    assert_set_aside_once_the_runtime_works(&pool, &streams);
}

/// A runtime whose `is_per_thread` panics at build: the error should say so, not claim that
/// the home stream is CUDA's per-thread default stream.
#[derive(Debug)]
struct PanicsOnPerThread;

impl StreamSync for PanicsOnPerThread {
    fn record(&self, _stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        unreachable!()
    }
    fn order_after(&self, _waiter: StreamId, _producer: StreamId) -> Result<(), Error> {
        Ok(())
    }
    fn is_per_thread(&self, _stream: StreamId) -> bool {
        panic!("runtime not initialised");
    }
}

#[test]
fn a_runtime_that_panics_at_build_is_named_in_the_error() {
    let err = Pool::builder(1 << 20)
        .name("per-thread-panics")
        .streams(Arc::new(PanicsOnPerThread), HOME)
        .build_host()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("panicked") && err.contains("runtime not initialised"),
        "{err}"
    );
}

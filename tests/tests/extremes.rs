//! Every public entry point of the pool, the builder, the arenas and the host backend, called
//! with extreme values: 0, 1, `usize::MAX`, `isize::MAX`, numbers that are not powers of two,
//! huge alignments, huge stage counts. Each call must give `Ok` or one specific `Err` (never a
//! panic, a hang or an abort), and the pool must still serve afterwards.
//!
//! The last tests reproduce defects the pool had (an unvalidated reuse setting, a failed event
//! query that poisoned the pool, event sinks run inside the lock); they failed before the
//! fixes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use devarena::pool::{
    AllocRequest, BLOCK_GRANULE, MAX_POOL_CAPACITY, ManualStreams, PoolEvent, StreamEvent,
    StreamId, StreamSync, Tracking, guaranteed_fit, reserved_bytes,
};
use devarena::{
    Arena, Backend, DeviceLayout, DynArena, Error, HostBackend, LayoutBuilder, Pool, PoolClient,
};

const MIB: usize = 1 << 20;

fn is_invalid(result: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(result, Err(Error::InvalidArgument { .. }))
}

fn exhausted(result: &Result<u64, Error>, which: &str) -> bool {
    matches!(result, Err(Error::PoolExhausted { limit, .. }) if *limit == which)
}

/// The pool still hands out and takes back every byte: nothing live, the region whole.
fn still_serves(pool: &Pool) {
    let stats = pool.stats();
    assert_eq!(stats.live, 0, "{stats}");
    assert_eq!(stats.in_use, 0);
    assert_eq!(stats.largest_free, pool.capacity(), "{stats}");
    // One block of every 256 bytes (up to 64 of them), then all freed.
    let blocks = (pool.capacity() / 256).min(64);
    let addrs: Vec<u64> = (0..blocks)
        .map(|i| pool.allocate(i % 256 + 1, 256).expect("a small request"))
        .collect();
    for addr in addrs {
        pool.deallocate(addr).expect("a live allocation");
    }
    if reserved_bytes(pool.capacity()) == Some(pool.capacity()) {
        let whole = pool.allocate(pool.capacity(), 0).expect("the whole region");
        assert_eq!(whole, pool.base());
        pool.deallocate(whole).unwrap();
    }
}

#[test]
fn pool_sizes_and_builders_at_the_edges() {
    for capacity in [0, 1, 255] {
        let err = Pool::host(capacity).unwrap_err();
        assert!(
            err.to_string().contains("below the smallest block"),
            "{err}"
        );
    }
    // Overflowing capacities are refused with the numbers.
    for capacity in [usize::MAX, usize::MAX - 255, isize::MAX as usize] {
        let result = Pool::host(capacity);
        assert!(is_invalid(&result), "{capacity}: {result:?}");
    }
    // Past the most a pool indexes: refused before anything is reserved, with the numbers.
    for capacity in [1 << 46, MAX_POOL_CAPACITY + BLOCK_GRANULE] {
        match Pool::host(capacity) {
            Err(Error::InvalidArgument { what }) => assert!(
                what.contains(&capacity.to_string())
                    && what.contains(&MAX_POOL_CAPACITY.to_string()),
                "{what}"
            ),
            other => panic!("{capacity}: {other:?}"),
        }
    }
    // The most, likely more than this machine has: an error from the backend, or (with
    // overcommit) a pool.
    match Pool::host(MAX_POOL_CAPACITY + BLOCK_GRANULE - 1) {
        Err(Error::OutOfMemory { requested, .. }) => assert!(requested >= MAX_POOL_CAPACITY),
        Err(other) => panic!("{other:?}"),
        Ok(pool) => assert_eq!(pool.capacity(), MAX_POOL_CAPACITY),
    }
    // A capacity that is not a multiple of 256 rounds down.
    let pool = Pool::host(256 * 3 + 255).unwrap();
    assert_eq!(pool.capacity(), 768);
    still_serves(&pool);
    // The smallest pool, and reuse settings at their harmless edges.
    for (blocks, bytes) in [(0, 0), (0, usize::MAX), (1, usize::MAX), (1 << 16, 0)] {
        let pool = Pool::builder(256)
            .reuse(blocks, bytes)
            .name("")
            .build_host()
            .unwrap();
        still_serves(&pool);
        let a = pool.allocate(0, 0).unwrap();
        assert!(exhausted(&pool.allocate(0, 0), "capacity"));
        pool.deallocate(a).unwrap();
        still_serves(&pool);
    }
}

#[test]
fn pool_requests_at_the_edges() {
    let events = Arc::new(AtomicUsize::new(0));
    let counted = events.clone();
    let pool = Pool::builder(MIB)
        .tracking(Tracking::Tags)
        .events(Arc::new(move |_: &PoolEvent<'_>| {
            counted.fetch_add(1, Ordering::Relaxed);
        }))
        .build_host()
        .unwrap();
    let base = pool.base();
    // Sizes: 0 and 1 take one block; the rest cannot fit.
    let zero = pool.allocate(0, 0).unwrap();
    let one = pool.allocate(1, 1).unwrap();
    assert_ne!(zero, one);
    for size in [
        usize::MAX,
        usize::MAX - 255,
        isize::MAX as usize,
        1 << 40,
        MIB + 1,
    ] {
        assert!(exhausted(&pool.allocate(size, 0), "capacity"), "{size}");
    }
    // Alignments: powers of two up to 4096; everything else is refused, naming the number.
    for align in [1, 2, 256, 4096] {
        let a = pool.allocate(3, align).unwrap();
        assert_eq!(a % align.max(256) as u64, 0);
        pool.deallocate(a).unwrap();
    }
    for align in [3, 100, 4095, 4097, 8192, 1 << 30, 1 << 63, usize::MAX] {
        let err = pool.allocate(1, align).unwrap_err();
        assert!(
            err.to_string().contains(&align.to_string()),
            "{align}: {err}"
        );
        assert!(matches!(err, Error::InvalidArgument { .. }));
    }
    // Streams: any id is fine without a stream runtime.
    for stream in [StreamId(0), StreamId(u64::MAX)] {
        let a = pool.allocate_on(17, 0, stream).unwrap();
        pool.deallocate_on(a, StreamId(u64::MAX - 1)).unwrap();
    }
    // Tags of any length and content.
    let long = "x".repeat(1 << 20);
    for tag in ["", "\0,\n\u{feff}", long.as_str()] {
        let a = pool
            .allocate_with(AllocRequest::new(5, 0).tag(tag))
            .unwrap();
        let report = pool.leak_report();
        assert!(report.leaks.iter().any(|l| l.tag.as_deref() == Some(tag)));
        pool.deallocate(a).unwrap();
    }
    // Frees of addresses the pool never handed out.
    for addr in [
        0,
        1,
        u64::MAX,
        base + 1,
        base + 255,
        base + MIB as u64,
        zero + 1,
    ] {
        match pool.deallocate(addr) {
            Err(Error::UnknownAddress { addr: a, .. }) => assert_eq!(a, addr),
            other => panic!("{addr:#x}: {other:?}"),
        }
    }
    // Typed slices whose byte count overflows, and empty ones.
    assert!(is_invalid(&pool.alloc_slice::<u64>(usize::MAX)));
    assert!(is_invalid(&pool.alloc_slice::<u32>(usize::MAX / 2)));
    assert!(matches!(
        pool.alloc_slice::<u8>(usize::MAX),
        Err(Error::PoolExhausted { .. })
    ));
    let empty = pool.alloc_slice::<u128>(0).unwrap();
    assert_eq!(empty.as_slice().unwrap().len(), 0);
    drop(empty);
    // Clients: quota 0 serves nothing, quota usize::MAX is bounded by the capacity; names of
    // any length.
    let none = pool.client("", 0);
    assert!(exhausted(&none.allocate(0, 0), "quota"));
    let all = pool.client(&long, usize::MAX);
    assert!(exhausted(&all.allocate(usize::MAX, 0), "capacity"));
    let a = all.allocate(MIB / 2, 0).unwrap();
    assert!(is_invalid(&none.deallocate(a)), "another client's block");
    all.deallocate(a).unwrap();
    // Tracking switched to every mode and back.
    for tracking in [Tracking::Backtraces, Tracking::Off, Tracking::Tags] {
        pool.set_tracking(tracking);
        let a = pool.allocate(1, 0).unwrap();
        pool.deallocate(a).unwrap();
    }
    pool.deallocate(zero).unwrap();
    pool.deallocate(one).unwrap();
    assert!(pool.reclaim().is_ok());
    let stats = pool.stats();
    assert_eq!(
        events.load(Ordering::Relaxed) as u64,
        2 * stats.allocations - stats.live + stats.failures
    );
    still_serves(&pool);
    drop((none, all));
}

#[test]
fn stream_pools_at_the_edges() {
    let streams = Arc::new(ManualStreams::new());
    let home = StreamId(u64::MAX);
    // The pool's own index (a thread heap for `other` is below).
    let pool = Pool::builder(MIB)
        .thread_heaps(0)
        .streams(streams.clone(), home)
        .build_host()
        .unwrap();
    assert_eq!(pool.home_stream(), home);
    let other = StreamId(0);
    let a = pool.allocate_on(MIB, 0, other).unwrap();
    pool.deallocate_on(a, other).unwrap();
    assert!(
        exhausted(&pool.allocate(0, 0), "capacity"),
        "parked until its event"
    );
    assert_eq!(pool.reclaim(), Ok(0));
    streams.complete(other);
    assert_eq!(pool.reclaim(), Ok(MIB));
    // A stream runtime that fails: the calls that need it fail, nothing else changes.
    let c = pool.allocate(1, 0).unwrap();
    pool.deallocate(c).unwrap(); // a home-stream free: the next allocation for `other` waits
    streams.fail_with(Some(Error::NoDevice {
        reason: "test".into(),
    }));
    let b = pool.allocate(1, 0).unwrap();
    let before = pool.stats();
    assert!(matches!(
        pool.deallocate_on(b, other),
        Err(Error::NoDevice { .. })
    ));
    assert!(matches!(
        pool.allocate_on(1, 0, other),
        Err(Error::NoDevice { .. })
    ));
    let after = pool.stats();
    assert_eq!(
        (after.live, after.in_use, after.frees),
        (before.live, before.in_use, before.frees)
    );
    assert_eq!(after.failures, before.failures + 1);
    streams.fail_with(None);
    for addr in pool
        .leak_report()
        .leaks
        .iter()
        .map(|l| l.addr)
        .collect::<Vec<_>>()
    {
        pool.deallocate(addr).unwrap();
    }
    still_serves(&pool);

    // With thread heaps (the default), the stream ids at the edges get heaps of their own: the
    // heap for `other` (0) reuses its block there at once, and gives it back whole.
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(MIB)
        .streams(streams.clone(), home)
        .build_host()
        .unwrap();
    let a = pool.allocate_on(MIB / 2, 0, other).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    pool.deallocate_on(a, other).unwrap();
    assert_eq!(pool.allocate_on(MIB / 2, 0, other), Ok(a));
    pool.deallocate_on(a, other).unwrap();
    let h = pool.allocate_on(MIB / 4, 0, home).unwrap();
    assert_eq!(pool.thread_heaps(), 2, "and one for the home stream");
    pool.deallocate_on(h, home).unwrap();
    assert_eq!(streams.pending(other), 0);
    streams.complete_all();
    assert_eq!(pool.stats().live, 0);
    streams.complete_all();
    pool.reclaim().unwrap();
    let stats = pool.stats();
    assert_eq!((stats.pending, stats.largest_free), (0, MIB));
}

#[test]
fn pool_numbers_at_the_edges() {
    assert_eq!(reserved_bytes(0), Some(256));
    assert_eq!(reserved_bytes(1), Some(256));
    assert_eq!(reserved_bytes(usize::MAX), None);
    assert_eq!(reserved_bytes(usize::MAX - 255), None);
    assert!(reserved_bytes(isize::MAX as usize).is_none_or(|r| r > isize::MAX as usize));
    assert_eq!(guaranteed_fit(0, 0), Some(256));
    assert_eq!(guaranteed_fit(usize::MAX, 0), None);
    for align in [3, 8192, usize::MAX] {
        assert_eq!(guaranteed_fit(1, align), None, "{align}");
    }
    assert!(guaranteed_fit(isize::MAX as usize, 4096).is_none_or(|f| f > isize::MAX as usize));
}

#[test]
fn builder_and_dyn_arena_at_the_edges() {
    let plan_error = |b: LayoutBuilder| match b.build() {
        Err(Error::Plan { message, .. }) => message,
        other => panic!("expected a plan error, got {other:?}"),
    };
    // Sizes that overflow, and a zero-length buffer.
    let m = plan_error(LayoutBuilder::new("edges").array::<u8>("a", usize::MAX));
    assert!(m.contains("edges") && m.contains('a'), "{m}");
    plan_error(LayoutBuilder::new("edges").array::<u64>("a", usize::MAX / 8 + 1));
    plan_error(
        LayoutBuilder::new("edges")
            .array::<u8>("a", isize::MAX as usize)
            .array::<u8>("b", isize::MAX as usize),
    );
    plan_error(LayoutBuilder::new("edges").array::<u8>("a", 0));
    // Alignments: 0, not a power of two, above the largest (2^30), usize::MAX.
    for align in [0, 3, 1 << 31, 1 << 63, usize::MAX] {
        plan_error(LayoutBuilder::new("edges").align(align).array::<u8>("a", 1));
        plan_error(LayoutBuilder::new("edges").array_aligned::<u8>("a", 1, align));
    }
    // The largest alignment plans (the arena itself is not made: 1 GiB).
    let huge = LayoutBuilder::new("edges")
        .array_aligned::<u8>("a", 1, 1 << 30)
        .build()
        .unwrap();
    assert_eq!((huge.size(), huge.align()), (1 << 30, 1 << 30));
    // max_bytes 0: only an empty layout fits.
    plan_error(LayoutBuilder::new("edges").max_bytes(0).array::<u8>("a", 1));
    let empty = LayoutBuilder::new("edges").max_bytes(0).build().unwrap();
    assert_eq!(empty.size(), 0);
    let mut arena = DynArena::new(empty).unwrap();
    assert!(arena.view_mut::<u8>("a").is_err());
    // Live ranges outside the stages, reversed, and at usize::MAX.
    for (first, last) in [(0, 4), (3, 2), (usize::MAX, usize::MAX), (4, 4)] {
        plan_error(
            LayoutBuilder::new("edges")
                .stages(4)
                .array::<u8>("a", 1)
                .live(first, last),
        );
    }
    // Stages: the derive's limit, 4096, plans quickly.
    let many = LayoutBuilder::new("edges")
        .stages(4096)
        .array::<u32>("a", 1)
        .live(0, 0)
        .array::<u32>("b", 1)
        .live(4095, 4095)
        .build()
        .unwrap();
    assert_eq!(
        many.fields()[0].offset,
        many.fields()[1].offset,
        "never live together"
    );
    // A layout larger than this machine: an error from the backend (or, with overcommit, an
    // arena whose views are never touched).
    let big = LayoutBuilder::new("edges")
        .array::<u8>("a", 1 << 46)
        .build()
        .unwrap();
    match DynArena::new(big) {
        Err(Error::OutOfMemory { requested, .. }) => assert_eq!(requested, 1 << 46),
        Err(other) => panic!("{other:?}"),
        Ok(arena) => assert_eq!(arena.layout().size(), 1 << 46),
    }
    // Views by the wrong name or type.
    let layout = LayoutBuilder::new("edges")
        .array::<u8>("bytes", 3)
        .array_aligned::<u8>("odd", 5, 1)
        .build()
        .unwrap();
    let mut arena = DynArena::new(layout).unwrap();
    assert!(
        arena.view::<u32>("bytes").is_err(),
        "3 bytes are not whole u32s"
    );
    assert!(arena.view::<u8>("").is_err());
    assert!(arena.views_mut::<u8, 2>(["bytes", "bytes"]).is_err());
    let [a, b] = arena.views_mut::<u8, 2>(["bytes", "odd"]).unwrap();
    a.fill(1);
    b.fill(2);
    assert_eq!(arena.view::<u8>("bytes").unwrap(), [1, 1, 1]);
}

#[test]
fn arenas_and_the_host_backend_at_the_edges() {
    #[derive(DeviceLayout)]
    struct Empty {}
    #[derive(DeviceLayout)]
    struct TooBig {
        a: [u8; 1 << 46],
    }
    let mut empty = Arena::<Empty>::new().unwrap();
    let _ = empty.views_mut();
    empty.free().unwrap();
    match Arena::<TooBig>::new() {
        Err(Error::OutOfMemory { requested, .. }) => assert_eq!(requested, 1 << 46),
        Err(other) => panic!("{other:?}"),
        Ok(arena) => assert_eq!(arena.size(), 1 << 46),
    }
    let host = HostBackend::new();
    for (bytes, align) in [(1, 0), (1, 3), (usize::MAX, 1), (isize::MAX as usize, 2)] {
        assert!(
            is_invalid(&host.allocate(bytes, align)),
            "{bytes} at {align}"
        );
    }
    match host.allocate(1, 1 << 62) {
        Err(Error::OutOfMemory { .. }) | Err(Error::InvalidArgument { .. }) => {}
        other => panic!("{other:?}"),
    }
    let zero = host.allocate(0, 1 << 62).unwrap();
    assert_eq!(zero.addr % (1 << 62), 0);
    // SAFETY: the allocation came from this backend and is freed once.
    unsafe { host.deallocate(&zero) }.unwrap();
    let stats = host.stats();
    assert_eq!(stats.live_bytes, 0);
    assert_eq!(stats.allocations, stats.frees);
}

// --- defects that were inside the pool, fixed and kept as tests -----------------------------

/// `reuse(usize::MAX, ..)` overflows `next_power_of_two` when the pool is built (a panic in a
/// debug build; in a release build an empty ring after which every free panics). It must be
/// an `Err` naming the number, or a pool that serves.
#[test]
fn reuse_usize_max_blocks_is_an_error_or_serves() {
    let outcome =
        std::panic::catch_unwind(
            || match Pool::builder(MIB).reuse(usize::MAX, 0).build_host() {
                Err(Error::InvalidArgument { what }) => assert!(what.contains("reuse"), "{what}"),
                Err(other) => panic!("{other:?}"),
                Ok(pool) => still_serves(&pool),
            },
        );
    assert!(outcome.is_ok(), "reuse(usize::MAX, 0) panicked");
}

/// `reuse(1 << 40, ..)` sizes the reuse ring by the block count: an 8 TiB allocation that
/// aborts the process. Run alone.
#[test]
fn reuse_huge_block_count_is_an_error_or_serves() {
    match Pool::builder(MIB).reuse(1 << 40, 0).build_host() {
        Err(Error::InvalidArgument { .. }) => {}
        Err(other) => panic!("{other:?}"),
        Ok(pool) => still_serves(&pool),
    }
}

/// A stream runtime whose event queries fail.
#[derive(Debug, Default)]
struct FailingEvents;

#[derive(Debug)]
struct FailingEvent;

impl StreamEvent for FailingEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        Err(Error::NoDevice {
            reason: "event query failed".into(),
        })
    }
}

impl StreamSync for FailingEvents {
    fn record(&self, _stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        Ok(Box::new(FailingEvent))
    }

    fn order_after(&self, _waiter: StreamId, _producer: StreamId) -> Result<(), Error> {
        Ok(())
    }
}

/// One failing event query must set aside only its own block: the rest of the pool serves.
#[test]
fn a_failed_event_query_sets_aside_only_its_block() {
    let pool = Pool::builder(MIB)
        .streams(Arc::new(FailingEvents), StreamId(1))
        .build_host()
        .unwrap();
    let a = pool.allocate_on(256, 0, StreamId(2)).unwrap();
    pool.deallocate_on(a, StreamId(2)).unwrap();
    let b = pool.allocate(1000, 0);
    assert!(b.is_ok(), "{b:?}");
    assert!(pool.reclaim().is_ok() || pool.allocate(1000, 0).is_ok());
}

/// A sink that panics during an allocation: the allocation must not stay committed while the
/// caller never gets its address.
#[test]
fn a_panicking_sink_leaks_nothing() {
    let pool = Pool::builder(MIB)
        .events(Arc::new(|e: &PoolEvent<'_>| {
            if e.size == 12345 {
                panic!("sink failure");
            }
        }))
        .build_host()
        .unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.allocate(12345, 0)));
    match result {
        Ok(Ok(addr)) => pool.deallocate(addr).unwrap(),
        Ok(Err(e)) => panic!("{e}"),
        Err(_) => {}
    }
    assert_eq!(
        pool.stats().live,
        0,
        "the block of a call that panicked stays live"
    );
}

/// A sink that calls back into the pool: it must work or get an error, never hang.
#[test]
fn a_sink_that_calls_the_pool_does_not_hang() {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let slot: Arc<std::sync::OnceLock<PoolClient>> = Arc::default();
        // Weak: the pool holds its sink, so a strong reference to its client would make a
        // cycle that keeps the pool alive after the test (LeakSanitizer reports it).
        let inner = Arc::downgrade(&slot);
        let pool = Pool::builder(MIB)
            .events(Arc::new(move |e: &PoolEvent<'_>| {
                let slot = inner.upgrade();
                if let (Some(client), 777) = (slot.as_ref().and_then(|s| s.get()), e.size) {
                    let _ = client.pool_stats();
                }
            }))
            .build_host()
            .unwrap();
        let _ = slot.set(pool.own_client().clone());
        let a = pool.allocate(777, 0);
        let _ = done.send(a.is_ok());
    });
    let outcome = finished.recv_timeout(Duration::from_secs(10));
    assert!(outcome.is_ok(), "the allocation did not return within 10 s");
}

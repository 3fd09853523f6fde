//! A logger is user code too, and the pool logs while it holds its lock: an event destructor's
//! call back into the pool (while it still runs that destructor as a callback of its lock), a
//! growable region's mapping of chunks. A logger that calls the pool there must neither unwind
//! out of the pool call that logged nor wait for ever on the lock its own thread holds.
//! (A test binary of its own: `log`'s logger is set once per process.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use devarena::pool::{StreamEvent, StreamId, StreamSync};
use devarena::{Error, Pool};

/// The pool the logger asks for statistics, once set.
static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
/// Whether the logger was asked to log the destructor's call back.
static LOGGED: AtomicBool = AtomicBool::new(false);
/// The growable pool the logger calls when it maps chunks, once set.
static GROWABLE: OnceLock<Arc<Pool>> = OnceLock::new();
/// What the logger's calls on the growable pool got, one entry per record of a mapping.
static FROM_LOGGER: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct AsksThePool;

impl log::Log for AsksThePool {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        if format!("{}", record.args()).contains("pool `logger-panics-on-sink-report`")
            || format!("{}", record.args()).contains("logger-panics-on-leak-report")
        {
            panic!("logger failure");
        }
        if format!("{}", record.args()).starts_with("mapped ") {
            if let Some(pool) = GROWABLE.get() {
                // Logged under the pool's lock, which this thread holds.
                let allocated = pool.allocate(256, 0).map_err(|e| e.to_string());
                FROM_LOGGER
                    .lock()
                    .unwrap()
                    .push(format!("allocate: {allocated:?}"));
                let _ = pool.stats(); // unwinds: never returns here
                FROM_LOGGER.lock().unwrap().push("stats returned".into());
            }
        }
        if format!("{}", record.args()).contains("an event's destructor") {
            LOGGED.store(true, Ordering::SeqCst);
            if let Some(pool) = POOL.get() {
                let _ = pool.stats();
            }
        }
    }
    fn flush(&self) {}
}

static LOGGER: AsksThePool = AsksThePool;

/// A runtime whose events complete at once and whose destructors ask the pool for statistics.
#[derive(Debug)]
struct Streams;

#[derive(Debug)]
struct Event;

impl StreamEvent for Event {
    fn is_complete(&self) -> Result<bool, Error> {
        Ok(true)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(pool) = POOL.get() {
            let _ = pool.stats();
        }
    }
}

impl StreamSync for Streams {
    fn record(&self, _stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        Ok(Box::new(Event))
    }
    fn order_after(&self, _waiter: StreamId, _producer: StreamId) -> Result<(), Error> {
        Ok(())
    }
}

fn set_logger() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&LOGGER).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

#[test]
fn a_logger_that_asks_the_pool_for_statistics_does_not_unwind_out_of_the_pool_call() {
    set_logger();
    let pool = Pool::builder(1 << 20)
        .name("logger-asks-stats")
        .reuse(0, 0)
        .thread_heaps(0)
        .streams(Arc::new(Streams), StreamId(1))
        .build_host()
        .unwrap();
    let pool = POOL.get_or_init(|| Arc::new(pool));
    let a = pool.allocate(4096, 0).unwrap();
    // Parked with an event of the other stream, which `reclaim` finds complete and drops.
    pool.deallocate_on(a, StreamId(2)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn({
        let pool = pool.clone();
        move || {
            let reclaimed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.reclaim()));
            let _ = tx.send(reclaimed.map_err(|_| "reclaim unwound into its caller"));
        }
    });
    let reclaimed = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("reclaim returned");
    assert!(
        matches!(reclaimed, Ok(Ok(4096))),
        "reclaim: {:?}",
        reclaimed.map(|r| r.map_err(|e| e.to_string()))
    );
    assert!(LOGGED.load(Ordering::SeqCst), "the call back was logged");
    let stats = pool.stats();
    assert_eq!((stats.pending, stats.live, stats.in_use), (0, 0, 0));
    // The pool serves as before.
    let b = pool.allocate(1 << 20, 0).unwrap();
    pool.deallocate(b).unwrap();
}

/// A growable region logs each mapping of chunks while the pool's lock is held: a logger that
/// allocates there gets an error, one that asks for statistics is cut short (its record is
/// lost), and the allocation that mapped the chunks succeeds with the pool as it should be.
#[test]
fn a_logger_that_calls_the_pool_under_its_lock_neither_hangs_nor_breaks_it() {
    set_logger();
    let vm = Arc::new(devarena::backend::HostVirtualMemory::new(64 << 10).unwrap());
    let pool = Pool::builder(4 << 20)
        .name("logger-under-lock")
        .thread_heaps(0)
        .build_mapped(vm)
        .unwrap();
    let pool = GROWABLE.get_or_init(|| Arc::new(pool)).clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn({
        let pool = pool.clone();
        move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let a = pool.allocate(1 << 20, 0)?; // maps 16 chunks of 64 KiB
                let b = pool.allocate(1 << 20, 0)?;
                pool.deallocate(a)?;
                pool.deallocate(b)?;
                Ok::<_, Error>((a, b))
            }));
            let _ = tx.send(result.map_err(|_| "the pool call unwound into its caller"));
        }
    });
    let result = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the allocations returned");
    let (a, b) = result.unwrap().unwrap();
    assert_ne!(a, b);
    let seen = FROM_LOGGER.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the mappings were logged");
    for line in &seen {
        assert!(
            line.starts_with("allocate: Err(") && line.contains("logger-under-lock"),
            "{line}"
        );
    }
    let stats = pool.stats();
    assert_eq!((stats.live, stats.in_use), (0, 0));
    assert!(stats.mapped >= 2 << 20, "{stats:?}");
    // The pool serves as before.
    let c = pool.allocate(4 << 20, 0).unwrap();
    pool.deallocate(c).unwrap();
}

/// The pool logs the first panic of its sink, after its lock is released, while it delivers
/// events: a logger that panics there must not unwind out of the pool call (whose allocation
/// was made) nor stop the pool from delivering later events.
#[test]
fn a_logger_that_panics_on_the_sink_report_neither_unwinds_nor_stops_delivery() {
    set_logger();
    let events = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sink = {
        let events = events.clone();
        move |_: &devarena::pool::PoolEvent<'_>| {
            if events.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("sink failure");
            }
        }
    };
    let pool = Pool::builder(1 << 20)
        .name("logger-panics-on-sink-report")
        .thread_heaps(0)
        .log_leaks_on_drop(false)
        .events(Arc::new(sink))
        .build_host()
        .unwrap();
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.allocate(1000, 0)));
    let live = pool.stats().live;
    // Later events reach the sink.
    let before = events.load(Ordering::SeqCst);
    let b = pool.allocate(2000, 0).unwrap();
    pool.deallocate(b).unwrap();
    let delivered = events.load(Ordering::SeqCst) - before;
    drop(pool);
    assert_eq!(delivered, 2, "events after the panic were not delivered");
    assert!(
        matches!(first, Ok(Ok(_))),
        "the allocation unwound into its caller; its block stays live ({live} live)"
    );
}

/// A pool dropped with live allocations logs its leak report: a logger that panics there must
/// not unwind out of the drop (during an unwind, that aborts the process).
#[test]
fn a_logger_that_panics_on_the_leak_report_does_not_unwind_out_of_the_drop() {
    set_logger();
    let pool = Pool::builder(1 << 20)
        .name("logger-panics-on-leak-report")
        .thread_heaps(0)
        .build_host()
        .unwrap();
    let _leaked = pool.allocate(1000, 0).unwrap();
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(pool)));
    assert!(dropped.is_ok(), "dropping the pool unwound into its caller");
}

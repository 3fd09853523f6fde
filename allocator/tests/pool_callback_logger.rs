//! A logger is user code too: the pool logs an event destructor's call back into the pool
//! while it still runs that destructor as a callback of its lock. A logger that asks the pool
//! for statistics there must not unwind out of the pool call that dropped the event.
//! (A test binary of its own: `log`'s logger is set once per process.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use devarena::pool::{StreamEvent, StreamId, StreamSync};
use devarena::{Error, Pool};

/// The pool the logger asks for statistics, once set.
static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
/// Whether the logger was asked to log the destructor's call back.
static LOGGED: AtomicBool = AtomicBool::new(false);

struct AsksThePool;

impl log::Log for AsksThePool {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
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

#[test]
fn a_logger_that_asks_the_pool_for_statistics_does_not_unwind_out_of_the_pool_call() {
    log::set_logger(&LOGGER).expect("no other logger in this test binary");
    log::set_max_level(log::LevelFilter::Trace);
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

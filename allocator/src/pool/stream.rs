//! Stream ordering: when a freed block may be handed out again.
//!
//! A pool made with [`PoolBuilder::streams`](super::PoolBuilder::streams) has a *home stream*
//! and a [`StreamSync`] that records and queries events on streams:
//!
//! * A block freed **on the home stream** is reusable at once: work queued later on the home
//!   stream runs after the work that used it (stream order).
//! * A block freed **on another stream** is parked with an event recorded on that stream at
//!   the free; it goes back to the free lists once the event has completed. Parked blocks are
//!   retried lazily, at the start of every allocation on the pool's own index, on a thread
//!   heap's slow path (and by [`Pool::reclaim`](super::Pool::reclaim)).
//! * Where threads have heaps ([`PoolBuilder::thread_heaps`](super::PoolBuilder::thread_heaps)),
//!   a thread has one **for each stream** it allocates on, and each is to its stream what the
//!   pool's index is to the home stream: a block freed there on that stream is reusable at
//!   once on it, a free on any other stream parks the block. See the
//!   [pool's threads](super#threads) for how their blocks reach other streams.
//! * A block handed out **for another stream** may have been freed on the home stream with
//!   work still queued there; before the first such allocation after a home-stream free, the
//!   pool makes that stream wait for the home stream ([`StreamSync::order_after`], an event
//!   recorded on the home stream and waited on by the other stream). One wait covers every
//!   home-stream free before it, so a stream that allocates again with no home-stream free in
//!   between pays nothing.
//!
//! A pool without a [`StreamSync`] (every host pool by default) treats all streams as one: host
//! memory has no queued work, so every free is reusable at once.
//!
//! **Streams that capture a CUDA graph** take no event and no wait: the capture would record
//! them into the graph (an event recorded there cannot be queried afterwards) or refuse them and
//! invalidate itself. The CUDA runtime refuses to record on, wait on or synchronize a capturing
//! stream, with an error that names it, so an allocation or a free by address that would need
//! one fails and changes nothing (a slice's free, which cannot leave its block live, parks the
//! block behind the error: set aside, see
//! [`PoolStats::quarantined`](super::PoolStats::quarantined)). A stream served by a thread heap
//! ([`PoolBuilder::thread_heaps`](super::PoolBuilder::thread_heaps)) is like the home stream
//! here: its heap hands out and takes back its blocks without asking the runtime anything, so
//! plain allocations and frees on it succeed during a capture as on the home stream while the
//! heap has room (a new span needs the stream to wait for the home stream's frees, which the
//! capture refuses), and a block freed there by the captured code is reused by later work on
//! that stream while the graph may still replay it. Allocations for a capture go through a
//! [`GraphReservation`](super::GraphReservation) (or
//! [`Pool::allocate_for_capture`](super::Pool::allocate_for_capture)), which orders the
//! capturing stream without touching it: the host waits for the home stream's earlier frees
//! instead. See [`graph`](super::graph) for what holds for the blocks a graph uses.
//!
//! The CUDA backend implements [`StreamSync`] with `cuEventRecord` / `cuEventQuery` /
//! `cuStreamWaitEvent` (`pool::cuda::CudaStreams`); [`ManualStreams`] is a host stand-in whose events complete only when a
//! test says so.

use alloc::boxed::Box;
use alloc::format;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::Any;
use core::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::Error;
use crate::pool::engine::CalledBack;
use crate::pool::lock::{LockId, logged};

/// A stream, by its raw handle: a `CUstream` (`cudaStream_t`) as an integer, `0` for the legacy
/// default stream. The pool only compares stream ids and hands them to its [`StreamSync`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The legacy default stream (`0`): what plain [`Pool::allocate`](super::Pool::allocate)
    /// and [`Pool::deallocate`](super::Pool::deallocate) use on a pool without a home stream.
    pub const DEFAULT: StreamId = StreamId(0);

    /// The raw handle.
    pub fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamId({:#x})", self.0)
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// An event recorded on a stream: complete once every piece of work queued on the stream
/// before the record has finished. Dropping it releases it (`cuEventDestroy`, or back to an
/// event cache).
///
/// The pool may drop an event while it holds its lock (a reclaimed block's, a free that failed
/// after its event was recorded). It runs the destructor as it runs the runtime's methods: a
/// call back into the pool from it fails (see [`StreamSync`]) instead of waiting for the lock,
/// and a panic in it is caught; the event is gone either way.
pub trait StreamEvent: Send + fmt::Debug {
    /// Whether the event has completed (`cuEventQuery`: `CUDA_SUCCESS` → `true`,
    /// `CUDA_ERROR_NOT_READY` → `false`, anything else → `Err`). Must not block.
    fn is_complete(&self) -> Result<bool, Error>;
}

/// What the pool needs from a stream runtime: record an event, and order one stream after
/// another. Implemented by the CUDA backend; [`ManualStreams`] is a host stand-in for tests.
///
/// The pool calls these methods while it holds its lock, when its state is consistent, so they
/// should not block, and must not call back into the pool. From inside them, the pool's
/// allocations, frees and `reclaim` return an error, with one exception: a
/// [`PoolSlice`](super::PoolSlice) of the pool dropped there (an event that owns one, to keep
/// a buffer alive until it completes, say) is freed later, by the first call that needs the
/// memory or the counts: statistics, reports, settings, `reclaim`, `trim`, and every
/// allocation that a thread heap does not serve (before it looks for a block; a plain free
/// does not look). Its statistics, reports and settings,
/// which return plain values, do not return at all: they unwind out of the method (with
/// [`std::panic::resume_unwind`], so no panic hook runs), and the pool call that made the
/// method fails with an error naming what was asked for. A panic in them is caught and becomes
/// an error of the pool call that made it, with the panic's message (for
/// [`StreamEvent::is_complete`]: the block is set aside, see
/// [`PoolStats::quarantined`](super::PoolStats::quarantined)). Nothing of the pool's is lost
/// either way: the pool stays usable, its counts exact. All of this needs unwinding: built
/// with `panic = "abort"`, such a call back (or a panic in them) aborts the process, after the
/// panic hook has printed the call's message; and a frame that cannot unwind between the
/// method and the call back (an `extern "C"` function, a destructor already running during
/// a panic) aborts it as well.
pub trait StreamSync: Any + Send + Sync + fmt::Debug {
    /// Records an event on `stream` that completes when all work queued on it so far has
    /// finished (`cuEventRecord`).
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error>;

    /// Whether the runtime can serve `stream`: the pool asks before it hands out a block of its
    /// own index for a stream other than its home stream, before a graph reservation on such a
    /// stream, and when it makes a thread heap for such a stream (once: the heap's requests do not ask
    /// again), so that a stream the runtime cannot use fails at once and changes nothing.
    /// Every stream by default.
    fn validate(&self, stream: StreamId) -> Result<(), Error> {
        let _ = stream;
        Ok(())
    }

    /// Makes work queued on `waiter` from now on wait for all work queued on `producer` so far
    /// (`cuEventRecord` on `producer`, then `cuStreamWaitEvent` on `waiter`). Must not block
    /// the host.
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error>;

    /// Whether `stream` names a different stream on each thread that uses it (CUDA's
    /// per-thread default stream, `CU_STREAM_PER_THREAD`): the pool then keeps no thread heap
    /// for it (a heap reuses its blocks on its stream at once, which would be another thread's
    /// stream there) and takes no earlier wait of it as covering a later one. `false` by
    /// default.
    fn is_per_thread(&self, stream: StreamId) -> bool {
        let _ = stream;
        false
    }

    /// Whether `stream` is capturing a CUDA graph (`cuStreamIsCapturing`): work queued on it is
    /// recorded, not run, so the pool records no event on it and makes it wait for nothing.
    /// Also asked when a thread would get a heap for a stream other than the home stream: none
    /// while the stream captures, or while this returns an error. `false` by default (a runtime
    /// without graphs).
    fn is_capturing(&self, stream: StreamId) -> Result<bool, Error> {
        let _ = stream;
        Ok(false)
    }

    /// Blocks the calling thread until all work queued on `stream` so far has finished
    /// (the CUDA runtime: an event recorded on it and waited for). The pool calls it, without
    /// its lock held when it can, before it unmaps memory freed on its home stream
    /// (`Pool::trim`, `Pool::synchronize`). By default: an event recorded on `stream`, polled
    /// until it completes.
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        let event = self.record(stream)?;
        while !event.is_complete()? {
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// An event the pool holds (recorded by its runtime): its destructor, user code that the pool
/// may run while it holds its lock (a reclaimed block's event, a free that failed after its
/// event was recorded), runs as a callback of that lock, so that a call back into the pool
/// from it fails instead of waiting for ever, and a panic in it is caught there.
pub(super) struct HeldEvent {
    event: Option<Box<dyn StreamEvent>>,
    lock: LockId,
}

impl HeldEvent {
    pub(super) fn boxed(event: Box<dyn StreamEvent>, lock: LockId) -> Box<dyn StreamEvent> {
        Box::new(HeldEvent {
            event: Some(event),
            lock,
        })
    }
}

impl fmt::Debug for HeldEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.event {
            Some(event) => event.fmt(f),
            None => f.write_str("HeldEvent(dropped)"),
        }
    }
}

impl StreamEvent for HeldEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        // (Only `drop` takes the event out.)
        self.event
            .as_ref()
            .map_or(Ok(true), |event| event.is_complete())
    }
}

impl Drop for HeldEvent {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            // As for the runtime's methods (`Shared::stream_call`): a call back into the pool
            // from the destructor must not find this thread's heap either.
            super::thread_heap::forget_current();
            self.lock.callback(|| {
                // A panic in the runtime's destructor loses nothing of the pool's: the event is
                // gone either way. A call back into the pool that could only unwind (see
                // `Shared::lock_wait`) has no pool call to fail here: it is logged. The logger is
                // user code run inside this callback too: its own call back unwinds as well, and
                // is caught here, not in the pool call that dropped the event.
                let dropped = super::lock::caught(move || drop(event));
                if let Err(payload) = dropped {
                    if let Some(CalledBack(message)) = payload.payload().downcast_ref::<CalledBack>() {
                        logged(|| {
                            log::warn!(target: "devarena::pool", "an event's destructor: {message}");
                        });
                    }
                }
            });
        }
    }
}

/// An event that several parked blocks share: recorded on `stream` when a thread heap of that
/// stream gave its spans back, or, where the stream could not record one then (it was
/// capturing a graph), at the first look once it no longer captures. Recorded later, it
/// completes later: never before the work queued when the blocks were parked.
#[derive(Clone)]
pub(super) struct SharedEvent(Arc<Mutex<SharedEventState>>);

struct SharedEventState {
    streams: Arc<dyn StreamSync>,
    stream: StreamId,
    event: Option<Box<dyn StreamEvent>>,
    /// The pool's lock, under which the event recorded later drops ([`HeldEvent`]).
    lock: LockId,
    /// Records that failed in a row, with the stream not capturing when asked just before.
    failed_records: u8,
}

/// How many records of a [`SharedEvent`] in a row may fail before its error stands: a
/// capture that begins between the question and the record refuses one of them; three in a
/// row is a stream that cannot record.
const RECORD_TRIES: u8 = 3;

impl SharedEvent {
    pub(super) fn new(
        streams: Arc<dyn StreamSync>,
        stream: StreamId,
        event: Option<Box<dyn StreamEvent>>,
        lock: LockId,
    ) -> Self {
        SharedEvent(Arc::new(Mutex::new(SharedEventState {
            streams,
            stream,
            event,
            lock,
            failed_records: 0,
        })))
    }

    /// A free block a heap gave back, parked until this event completes: a heap of another
    /// stream's (`fenced` false), or a home-stream heap's during a wait for the home stream
    /// (see [`Parked::fenced`](super::engine::Parked)).
    pub(super) fn park(&self, block: u32, bytes: usize, fenced: bool) -> super::engine::Parked {
        super::engine::Parked {
            heap: None,
            block,
            bytes,
            event: Box::new(self.clone()),
            given_back: !fenced,
            fenced,
        }
    }
}

impl fmt::Debug for SharedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("SharedEvent")
            .field("stream", &state.stream)
            .field("event", &state.event)
            .finish()
    }
}

impl StreamEvent for SharedEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        // (A panic of the runtime below leaves the state as it was: the event is recorded
        // once, or not at all.)
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut *state;
        let event = match &mut state.event {
            Some(event) => event,
            None => {
                if state.streams.is_capturing(state.stream)? {
                    return Ok(false);
                }
                let event = match state.streams.record(state.stream) {
                    Ok(event) => event,
                    // Refused, perhaps for a capture begun since the question (the CUDA
                    // runtime asks again after its record, see `CudaStreams::record`), which
                    // may be over by now: not done, the next look records again. An error
                    // that stands (every try in a row failed) sets the blocks aside.
                    Err(error) => {
                        state.failed_records = state.failed_records.saturating_add(1);
                        if state.failed_records < RECORD_TRIES {
                            return Ok(false);
                        }
                        return Err(error);
                    }
                };
                state.event.insert(HeldEvent::boxed(event, state.lock))
            }
        };
        event.is_complete()
    }
}

/// A host stand-in for a stream runtime: events complete only when the test calls
/// [`complete`](Self::complete) (or the pool [synchronizes](StreamSync::synchronize) their
/// stream, which completes them: the host waited for the stream to drain); every
/// [`order_after`](StreamSync::order_after) and every synchronize is recorded.
///
/// A stream can be put in capture mode ([`begin_capture`](Self::begin_capture)): like the CUDA
/// runtime, it then refuses to record an event on that stream, to make it wait or to
/// synchronize it, and remembers each refused call ([`refused`](Self::refused)), so a test can
/// check that nothing was asked of a capturing stream.
///
/// ```
/// use std::sync::Arc;
/// use devarena::pool::{ManualStreams, Pool, StreamId};
///
/// let home = StreamId(1);
/// let other = StreamId(2);
/// let streams = Arc::new(ManualStreams::new());
/// let pool = Pool::builder(4096).streams(streams.clone(), home).build_host()?;
///
/// let a = pool.allocate(4096, 0)?;
/// pool.deallocate_on(a, other)?; // parked until the event on `other` completes
/// assert!(pool.allocate(4096, 0).is_err());
/// streams.complete(other);
/// assert_eq!(pool.allocate(4096, 0)?, a);
/// # Ok::<(), devarena::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct ManualStreams {
    inner: Mutex<ManualInner>,
}

#[derive(Debug, Default)]
struct ManualInner {
    events: Vec<(StreamId, Arc<AtomicBool>)>,
    waits: Vec<(StreamId, StreamId)>,
    synchronized: Vec<StreamId>,
    fail_with: Option<Error>,
    /// Shared with every event recorded: while set, their queries fail.
    queries_fail: Arc<AtomicBool>,
    capturing: Vec<StreamId>,
    refused: Vec<(&'static str, StreamId)>,
}

impl ManualInner {
    /// The error of a call the runtime does not make: a failure asked for by the test, or a
    /// stream in capture mode (remembered as refused).
    fn refuse(&mut self, call: &'static str, streams: &[StreamId]) -> Result<(), Error> {
        if let Some(error) = &self.fail_with {
            return Err(error.clone());
        }
        if let Some(&stream) = streams.iter().find(|s| self.capturing.contains(s)) {
            self.refused.push((call, stream));
            return Err(Error::invalid(format!(
                "{call}: stream {stream} is capturing a graph (ManualStreams)"
            )));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct ManualEvent {
    done: Arc<AtomicBool>,
    queries_fail: Arc<AtomicBool>,
}

impl StreamEvent for ManualEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        if self.queries_fail.load(Ordering::Acquire) {
            // As the driver reports an event whose query fails (here, on request).
            return Err(Error::Driver {
                call: "cuEventQuery",
                name: "CUDA_ERROR_INVALID_HANDLE".into(),
                text: "injected by ManualStreams::fail_queries".into(),
                code: 400,
            });
        }
        Ok(self.done.load(Ordering::Acquire))
    }
}

impl ManualStreams {
    /// No events yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ManualInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Completes every event recorded on `stream` so far.
    pub fn complete(&self, stream: StreamId) {
        let mut inner = self.lock();
        inner.events.retain(|(s, done)| {
            if *s == stream {
                done.store(true, Ordering::Release);
                false
            } else {
                true
            }
        });
    }

    /// Completes every event recorded so far, on every stream.
    pub fn complete_all(&self) {
        let mut inner = self.lock();
        for (_, done) in inner.events.drain(..) {
            done.store(true, Ordering::Release);
        }
    }

    /// Events recorded on `stream` that have not completed.
    pub fn pending(&self, stream: StreamId) -> usize {
        self.lock()
            .events
            .iter()
            .filter(|(s, _)| *s == stream)
            .count()
    }

    /// Every `(waiter, producer)` pair passed to [`order_after`](StreamSync::order_after), in
    /// order.
    pub fn waits(&self) -> Vec<(StreamId, StreamId)> {
        self.lock().waits.clone()
    }

    /// How many [`waits`](Self::waits) there have been: a mark for
    /// [`waits_since`](Self::waits_since).
    pub fn wait_count(&self) -> usize {
        self.lock().waits.len()
    }

    /// The [`waits`](Self::waits) made since `mark` (a [`wait_count`](Self::wait_count)), in
    /// order, without copying the earlier ones.
    pub fn waits_since(&self, mark: usize) -> Vec<(StreamId, StreamId)> {
        let inner = self.lock();
        inner.waits.get(mark..).unwrap_or_default().to_vec()
    }

    /// Every stream passed to [`synchronize`](StreamSync::synchronize), in order.
    pub fn synchronized(&self) -> Vec<StreamId> {
        self.lock().synchronized.clone()
    }

    /// Makes every later `record`, `order_after` and `synchronize` fail with `error` (until called with
    /// `None`): for testing that a failing stream runtime disturbs nothing.
    pub fn fail_with(&self, error: Option<Error>) {
        self.lock().fail_with = error;
    }

    /// Makes the query of every event this runtime recorded, before or after, fail (until
    /// called with `false`): for testing that a pool sets aside the blocks whose events cannot
    /// be queried ([`PoolStats::quarantined`](super::PoolStats::quarantined)) and carries on.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use devarena::pool::{ManualStreams, Pool, StreamId};
    ///
    /// let (home, other) = (StreamId(1), StreamId(2));
    /// let streams = Arc::new(ManualStreams::new());
    /// let pool = Pool::builder(8192).streams(streams.clone(), home).build_host()?;
    /// let a = pool.allocate(4096, 0)?;
    /// pool.deallocate_on(a, other)?; // parked until the event on `other` completes
    /// streams.fail_queries(true);
    /// // Nothing says `other` is done with the block: it is set aside for good.
    /// assert_eq!(pool.reclaim()?, 0);
    /// assert_eq!((pool.stats().quarantined, pool.stats().pending), (4096, 0));
    /// streams.fail_queries(false);
    /// streams.complete(other);
    /// assert_eq!(pool.reclaim()?, 0);
    /// // The rest of the pool serves on.
    /// assert!(pool.allocate(4096, 0).is_ok());
    /// assert!(pool.allocate(4096, 0).is_err());
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn fail_queries(&self, fail: bool) {
        self.lock().queries_fail.store(fail, Ordering::Release);
    }

    /// Puts `stream` in capture mode: from now on it reports
    /// [`is_capturing`](StreamSync::is_capturing), and an event on it, a wait by it or for it,
    /// or a synchronize of it is refused (and remembered) until
    /// [`end_capture`](Self::end_capture).
    pub fn begin_capture(&self, stream: StreamId) {
        let mut inner = self.lock();
        if !inner.capturing.contains(&stream) {
            inner.capturing.push(stream);
        }
    }

    /// Takes `stream` out of capture mode.
    pub fn end_capture(&self, stream: StreamId) {
        self.lock().capturing.retain(|&s| s != stream);
    }

    /// Every call refused because a stream it named was capturing, in order: the call
    /// (`"record"`, `"order_after"`, `"synchronize"`) and the capturing stream.
    pub fn refused(&self) -> Vec<(&'static str, StreamId)> {
        self.lock().refused.clone()
    }
}

impl StreamSync for ManualStreams {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        let mut inner = self.lock();
        inner.refuse("record", &[stream])?;
        let done = Arc::new(AtomicBool::new(false));
        inner.events.push((stream, done.clone()));
        Ok(Box::new(ManualEvent {
            done,
            queries_fail: inner.queries_fail.clone(),
        }))
    }

    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        let mut inner = self.lock();
        inner.refuse("order_after", &[waiter, producer])?;
        inner.waits.push((waiter, producer));
        Ok(())
    }

    fn is_capturing(&self, stream: StreamId) -> Result<bool, Error> {
        Ok(self.lock().capturing.contains(&stream))
    }

    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        self.lock().refuse("synchronize", &[stream])?;
        self.complete(stream);
        self.lock().synchronized.push(stream);
        Ok(())
    }
}

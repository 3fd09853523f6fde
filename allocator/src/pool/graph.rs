//! Pools in CUDA graphs: the blocks a graph uses keep their addresses, and their bytes, for the
//! graph's whole life.
//!
//! A graph captured once and replayed many times reads and writes the addresses its captured
//! work was given, on every replay, at whatever time the replay runs. A pool that hands out
//! temporaries during a capture must therefore treat them unlike ordinary frees: a block the
//! captured work freed (on the host, during the capture: the free of a temporary) is still
//! used by every replay. A [`GraphReservation`] is what the pool keeps for one graph, like
//! PyTorch's graph-private pools:
//!
//! * **Allocations for the graph** ([`GraphReservation::allocate`],
//!   [`GraphReservation::alloc_slice`]) are ordinary blocks of the pool, made for the graph's
//!   stream, and remembered as the graph's.
//! * **A block of the graph that is freed while the reservation lives is held, not freed**: it
//!   is neither handed out again nor merged with its neighbours, by this pool, to anyone —
//!   other threads, other streams, the graph's own later allocations — until the reservation is
//!   released. Its bytes count as [`pending`](super::PoolStats::pending).
//! * **Releasing the reservation** (dropping it, or [`GraphReservation::release`]; a
//!   `PoolGraph` releases its own after destroying its executable graph) records an event on
//!   the graph's stream: replays queued there before it complete first. Every held block is
//!   then parked until that event completes (and, for a block freed on a third stream, the
//!   event of its free too), and goes back to the free lists the next time the pool looks, as a
//!   block freed on another stream does ([`stream`](super::stream)). A block of the graph that
//!   is still live when the reservation is released keeps that event: its later free, on any
//!   stream, parks it until the graph's replays are done.
//!
//! **Stream order without touching the capturing stream.** A capturing stream cannot record an
//! event or wait for one (the capture would record it, or refuse it and invalidate itself), so
//! the pool does not order it after the home stream the way it orders other streams (see
//! [`stream`](super::stream)). Instead, before the first graph allocation after a free on the
//! home stream, the host waits for the home stream ([`StreamSync::synchronize`](super::StreamSync::synchronize)): every block
//! the home stream freed before that is idle, and no replay can overlap work queued there
//! before it. This wait happens during the capture, once per home-stream free, and never during
//! replays; it is made without the pool's lock (work queued on the home stream may call into
//! the pool), and frees on the home stream made meanwhile wait behind an event recorded there.
//! Where blocks freed on the home stream keep reaching the pool during three such waits (thread
//! heaps giving them back), the allocation fails with an error rather than wait with the lock
//! held. Allocations for a graph captured on the home stream itself need none of it.
//!
//! **Thread heaps stay off the graph's stream until its capture is over**: every thread's heap
//! for that stream (see [`PoolBuilder::thread_heaps`](super::PoolBuilder::thread_heaps)) gives
//! its spans back when the reservation opens, and none takes a span (nor is a new one made)
//! until the pool has seen the capture end: `Pool::capture` says so when it ends its capture;
//! otherwise the pool notes what the stream runtime says at the requests on the stream that
//! reach it (a graph allocation or a plain request while heaps are off): capturing, then no
//! longer capturing. Meanwhile the stream's plain requests on any thread take the pool's
//! index, which refuses a plain free on the stream while it captures (its event would be
//! captured) rather than hand the block out again at once. After the capture the stream's
//! heaps serve again while the graph lives. A reservation whose capture the pool never sees
//! (no request on its stream during it) keeps heaps off the stream until it is released. (A
//! second capture on one reservation is not watched for: a graph gets a reservation of its
//! own.) Reservations on the home stream leave its heaps as they are.
//!
//! **What stays the caller's.** The reservation keeps the blocks it allocated. Memory a graph
//! reaches that came from elsewhere (blocks allocated before the capture, arenas, cudarc
//! buffers) must outlive the graph and its replays as with any CUDA graph: nothing ties them
//! to it, which is why `Pool::capture` (with `cuda`) is `unsafe` and says what to keep.
//!
//! The driver calls the pool makes while a capture may be open (mapping memory for a growable
//! region, querying events recorded outside the capture, waiting for the home stream) run in
//! relaxed capture mode, which the driver allows during a capture on another stream or on
//! this thread; nothing is ever queued on the capturing stream.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use std::sync::Mutex;

use super::handles::PoolClient;
use super::lock::logged_unlocked;
use super::stream::{StreamEvent, StreamId};
use super::{AllocRequest, PoolSlice};
use crate::error::Error;
use crate::layout::Element;

/// What a pool keeps for one CUDA graph: the blocks allocated for it, held while the graph
/// lives even when they are freed, and given back once its replays are done. See the
/// [module docs](self).
///
/// Made by [`Pool::graph_reservation`](super::Pool::graph_reservation) (or
/// [`PoolClient::graph_reservation`], under that client's quota) for the stream the graph is
/// captured on and replays on. Dropping it releases it; [`release`](Self::release) does the
/// same and reports an error.
///
/// ```
/// use std::sync::Arc;
/// use devarena::pool::{ManualStreams, Pool, StreamId};
///
/// let (home, graph_stream) = (StreamId(1), StreamId(2));
/// let streams = Arc::new(ManualStreams::new());
/// let pool = Pool::builder(1 << 20).streams(streams.clone(), home).build_host()?;
///
/// let graph = pool.graph_reservation(graph_stream)?;
/// streams.begin_capture(graph_stream); // a capture on the graph's stream begins
/// let temp = graph.allocate(4096, 0)?; // a temporary of the captured work
/// pool.deallocate_on(temp, graph_stream)?; // freed by the capturing code: held, not reused
/// assert_eq!(pool.stats().pending, 4096);
/// assert_ne!(pool.allocate(4096, 0)?, temp); // never handed out while the graph lives
/// streams.end_capture(graph_stream);
/// assert!(streams.refused().is_empty()); // nothing was asked of the capturing stream
///
/// graph.release()?; // an event on the graph's stream: replays queued there finish first
/// streams.complete(graph_stream);
/// pool.reclaim()?;
/// assert_eq!(pool.stats().pending, 0); // the temporary is free again
/// # Ok::<(), devarena::Error>(())
/// ```
pub struct GraphReservation {
    client: PoolClient,
    key: u64,
    stream: StreamId,
    released: bool,
}

/// What a [`GraphReservation`] holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphStats {
    /// Allocations made for the graph so far.
    pub allocations: u64,
    /// Those still live.
    pub live: usize,
    /// Those freed and held for the graph (not reusable until it is released).
    pub held: usize,
    /// Bytes of the held blocks (each rounded up to its size class).
    pub held_bytes: usize,
}

impl GraphReservation {
    pub(super) fn open(client: PoolClient, stream: StreamId) -> Result<Self, Error> {
        let key = client.shared().open_graph(stream)?;
        Ok(GraphReservation {
            client,
            key,
            stream,
            released: false,
        })
    }

    /// The stream the graph is captured on and replays on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Allocates `size` bytes at `align` (0 = 256) for the graph, on its stream; returns the
    /// address. The block is the graph's: freeing it (with
    /// [`Pool::deallocate_on`](super::Pool::deallocate_on) and the like, preferably on the
    /// graph's stream) while the reservation lives holds it for the graph.
    ///
    /// No event is recorded on the graph's stream and it is made to wait for nothing, so this
    /// may be called while the stream captures. The calling thread may wait for the home
    /// stream first (see the [module docs](self)).
    pub fn allocate(&self, size: usize, align: usize) -> Result<u64, Error> {
        self.allocate_with(AllocRequest::new(size, align))
    }

    /// Allocates with every option ([`AllocRequest`]); its stream must be the graph's (or
    /// `None`, which means the graph's).
    pub fn allocate_with(&self, request: AllocRequest<'_>) -> Result<u64, Error> {
        let request = self.for_graph_stream(request)?;
        self.client
            .shared()
            .allocate_for_graph(self.client.id(), request, false, Some(self.key))
    }

    /// A typed slice of `len` elements for the graph, on its stream, freed (on its stream)
    /// when dropped — which holds the block for the graph while the reservation lives.
    pub fn alloc_slice<T: Element>(&self, len: usize) -> Result<PoolSlice<T>, Error> {
        PoolSlice::new_with(&self.client, len, Some(self.stream), |size, align| {
            let request = AllocRequest::new(size, align).on(self.stream);
            self.client
                .shared()
                .allocate_for_graph(self.client.id(), request, true, Some(self.key))
        })
    }

    /// What the reservation holds now.
    pub fn stats(&self) -> GraphStats {
        self.client.shared().graph_stats(self.key)
    }

    /// The client the reservation allocates as.
    pub fn client(&self) -> &PoolClient {
        &self.client
    }

    /// Releases the reservation now (see the [module docs](self)) and reports a failure;
    /// dropping it does the same and logs one.
    ///
    /// When no event can be recorded on the graph's stream (a driver error, or the stream is
    /// capturing again), the host waits for the stream instead, without the pool's lock (work
    /// queued there may call into the pool), and the graph's blocks are reused once that wait
    /// has returned; when it fails too, they are set aside for good
    /// ([`PoolStats::quarantined`](super::PoolStats::quarantined)) and the error comes back:
    /// nothing says the replays are done with them.
    pub fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.client.shared().release_graph(self.key)
    }

    /// The graph's capture has ended (`Pool::capture` says so): thread heaps may serve its
    /// stream again (see the [module docs](self)).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn capture_over(&self) {
        self.client.shared().graph_capture_over(self.key);
    }

    fn for_graph_stream<'a>(&self, request: AllocRequest<'a>) -> Result<AllocRequest<'a>, Error> {
        match request.stream {
            Some(stream) if stream != self.stream => Err(Error::invalid(format!(
                "pool `{}`: a graph reservation for stream {} cannot allocate for stream \
                 {stream}: a graph's blocks are made for the stream it is captured on",
                self.client.shared().name,
                self.stream
            ))),
            _ => Ok(request.on(self.stream)),
        }
    }
}

impl Drop for GraphReservation {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Err(error) = self.client.shared().release_graph(self.key) {
            logged_unlocked(|| {
                log::error!(
                    target: "devarena::pool",
                    "releasing a graph reservation on stream {}: {error}",
                    self.stream
                )
            });
        }
    }
}

impl fmt::Debug for GraphReservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphReservation")
            .field("pool", &self.client.shared().name)
            .field("stream", &self.stream)
            .field("stats", &self.stats())
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------
// The bookkeeping, behind the pool's lock.

/// A block freed while its graph lives: held until the graph is released.
pub(super) struct Held {
    pub(super) block: u32,
    pub(super) bytes: usize,
    /// The event of its free, when it was freed on a stream that is neither the home stream
    /// nor the graph's (whose work the release event does not cover).
    pub(super) event: Option<Box<dyn StreamEvent>>,
}

/// One graph's entry.
struct Entry {
    key: u64,
    stream: StreamId,
    /// Set once the reservation is released: the event later frees of its live blocks wait
    /// for.
    released: Option<GraphEvent>,
    held: Vec<Held>,
    held_bytes: usize,
    live: usize,
    allocations: u64,
    /// What the pool has seen of the graph's capture (see [`Graphs::heaps_barred`]).
    capture: Seen,
}

/// What the pool has seen of a reservation's capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Not begun, as far as the pool knows.
    NotYet,
    /// The stream was seen capturing.
    Capturing,
    /// The stream was seen no longer capturing after that, or the capture's owner said so.
    Over,
}

/// Who owns a live block of a graph, as the free path needs it.
pub(super) struct Owner {
    pub(super) key: u64,
    /// The graph's stream.
    pub(super) stream: StreamId,
    /// The release event, once the reservation is released.
    pub(super) released: Option<GraphEvent>,
}

/// The graphs of a pool (see the [module docs](self)).
#[derive(Default)]
pub(super) struct Graphs {
    next: u64,
    entries: Vec<Entry>,
    /// Every live block that belongs to a graph (released or not): address → key. Empty
    /// unless graphs are in use, which is what the free path's fast check looks at.
    owners: BTreeMap<u64, u64>,
    /// The home stream's free count (`home_epoch`) up to which the host has waited for the
    /// home stream on behalf of graph allocations.
    pub(super) drained: u64,
}

impl Graphs {
    /// Whether any live block belongs to a graph (the free path looks further only then).
    #[inline(always)]
    pub(super) fn owns_blocks(&self) -> bool {
        !self.owners.is_empty()
    }

    fn entry(&self, key: u64) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    fn entry_mut(&mut self, key: u64) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.key == key)
    }

    /// A new graph on `stream`; its key.
    pub(super) fn open(&mut self, stream: StreamId) -> u64 {
        self.next += 1;
        self.entries.push(Entry {
            key: self.next,
            stream,
            released: None,
            held: Vec::new(),
            held_bytes: 0,
            live: 0,
            allocations: 0,
            capture: Seen::NotYet,
        });
        self.next
    }

    /// Whether thread heaps stay off `stream`: a graph reservation on it is open whose capture
    /// the pool has not seen end. `capturing` (whether the stream captures now; `None`: the
    /// runtime cannot say) is asked only then, and what it says is noted: a reservation seen
    /// capturing, then seen not capturing, has its capture over. A stream seen capturing is
    /// taken as the capture of a reservation still waiting for its own only where one
    /// reservation on the stream waits (with several, each is marked by a graph allocation of
    /// its own during its capture, [`saw_capture`](Self::saw_capture)). An answer the runtime
    /// cannot give keeps the heaps off and notes nothing.
    pub(super) fn heaps_barred(
        &mut self,
        stream: StreamId,
        capturing: impl FnOnce() -> Option<bool>,
    ) -> bool {
        let waiting =
            |e: &Entry| e.stream == stream && e.released.is_none() && e.capture != Seen::Over;
        let count = self.entries.iter().filter(|e| waiting(e)).count();
        if count == 0 {
            return false;
        }
        let Some(now) = capturing() else {
            return true;
        };
        let mut barred = false;
        for entry in self.entries.iter_mut().filter(|e| waiting(e)) {
            entry.capture = match (entry.capture, now) {
                (Seen::NotYet, true) if count == 1 => Seen::Capturing,
                (Seen::Capturing, false) => Seen::Over,
                (seen, _) => seen,
            };
            barred |= entry.capture != Seen::Over;
        }
        barred
    }

    /// The graph `key` allocated while its stream captured: its capture has begun.
    pub(super) fn saw_capture(&mut self, key: u64) {
        if let Some(entry) = self.entry_mut(key) {
            if entry.capture == Seen::NotYet {
                entry.capture = Seen::Capturing;
            }
        }
    }

    /// The capture of graph `key` has ended (its owner, `Pool::capture`, says so).
    pub(super) fn capture_over(&mut self, key: u64) {
        if let Some(entry) = self.entry_mut(key) {
            entry.capture = Seen::Over;
        }
    }

    /// Whether the graph exists and is not released.
    pub(super) fn is_open(&self, key: u64) -> bool {
        self.entry(key).is_some_and(|e| e.released.is_none())
    }

    /// Records a new live block of an open graph.
    pub(super) fn adopt(&mut self, key: u64, addr: u64) {
        if let Some(entry) = self.entry_mut(key) {
            entry.live += 1;
            entry.allocations += 1;
            self.owners.insert(addr, key);
        }
    }

    /// The graph a live block belongs to, if any.
    pub(super) fn owner(&self, addr: u64) -> Option<Owner> {
        let key = *self.owners.get(&addr)?;
        let entry = self.entry(key)?;
        Some(Owner {
            key,
            stream: entry.stream,
            released: entry.released.clone(),
        })
    }

    /// The live block at `addr` was freed: it is no longer the graph's live block; the entry of
    /// a released graph goes with its last block.
    pub(super) fn forget(&mut self, addr: u64) {
        let Some(key) = self.owners.remove(&addr) else {
            return;
        };
        if let Some(at) = self.entries.iter().position(|e| e.key == key) {
            let entry = &mut self.entries[at];
            entry.live -= 1;
            if entry.released.is_some() && entry.live == 0 {
                self.entries.swap_remove(at);
            }
        }
    }

    /// Holds a freed block for its open graph.
    pub(super) fn hold(&mut self, key: u64, held: Held) {
        if let Some(entry) = self.entry_mut(key) {
            entry.held_bytes += held.bytes;
            entry.held.push(held);
        }
    }

    /// The graph's stream and whether it has anything to release.
    pub(super) fn describe(&self, key: u64) -> Option<(StreamId, bool)> {
        let entry = self.entry(key)?;
        Some((entry.stream, entry.live > 0 || !entry.held.is_empty()))
    }

    /// Releases a graph: its held blocks come back to the caller (to be parked or freed), its
    /// live blocks keep `event` for their frees; the entry goes once it has no live block.
    pub(super) fn release(&mut self, key: u64, event: GraphEvent) -> Vec<Held> {
        let Some(at) = self.entries.iter().position(|e| e.key == key) else {
            return Vec::new();
        };
        let entry = &mut self.entries[at];
        let held = core::mem::take(&mut entry.held);
        entry.held_bytes = 0;
        if entry.live == 0 {
            self.entries.swap_remove(at);
        } else {
            entry.released = Some(event);
        }
        held
    }

    pub(super) fn stats(&self, key: u64) -> GraphStats {
        self.entry(key)
            .map_or_else(GraphStats::default, |e| GraphStats {
                allocations: e.allocations,
                live: e.live,
                held: e.held.len(),
                held_bytes: e.held_bytes,
            })
    }
}

// ---------------------------------------------------------------------------------------------
// Events.

/// The event a released graph's blocks wait for, shared by all of them: complete once the
/// event recorded on the graph's stream at the release has completed (once the host's wait
/// for the stream has returned where no event could be recorded; at once for a pool without a
/// stream runtime); an error for good when neither could be done.
#[derive(Clone)]
pub(super) struct GraphEvent(Arc<Mutex<GraphEventState>>);

enum GraphEventState {
    Waiting(Box<dyn StreamEvent>),
    Complete,
    Failed(Error),
}

impl GraphEvent {
    pub(super) fn after(event: Box<dyn StreamEvent>) -> Self {
        GraphEvent(Arc::new(Mutex::new(GraphEventState::Waiting(event))))
    }

    pub(super) fn complete() -> Self {
        GraphEvent(Arc::new(Mutex::new(GraphEventState::Complete)))
    }

    /// Neither an event nor the host's wait worked: the graph's blocks can never be released.
    pub(super) fn fail(&self, error: Error) {
        *self.lock() = GraphEventState::Failed(error);
    }

    /// Whether the blocks can never be released (neither an event nor a wait worked).
    pub(super) fn has_failed(&self) -> bool {
        matches!(*self.lock(), GraphEventState::Failed(_))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GraphEventState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The event a block of this graph parks with: this one and, for a block freed on a third
    /// stream, the event of its free.
    pub(super) fn with(self, own: Option<Box<dyn StreamEvent>>) -> Box<dyn StreamEvent> {
        Box::new(ParkedGraphBlock { graph: self, own })
    }
}

impl StreamEvent for GraphEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        let mut state = self.lock();
        let complete = match &*state {
            GraphEventState::Complete => return Ok(true),
            GraphEventState::Failed(error) => return Err(error.clone()),
            GraphEventState::Waiting(event) => event.is_complete()?,
        };
        if complete {
            // The stream's event goes back now (a CUDA event is destroyed), not with the last
            // block.
            *state = GraphEventState::Complete;
        }
        Ok(complete)
    }
}

impl fmt::Debug for GraphEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.lock() {
            GraphEventState::Waiting(event) => f.debug_tuple("GraphEvent").field(event).finish(),
            GraphEventState::Complete => f.write_str("GraphEvent(complete)"),
            GraphEventState::Failed(error) => write!(f, "GraphEvent(failed: {error})"),
        }
    }
}

/// A block of a released graph, parked: complete once the graph's release event and the
/// event of its own free (if any) are.
#[derive(Debug)]
struct ParkedGraphBlock {
    graph: GraphEvent,
    own: Option<Box<dyn StreamEvent>>,
}

impl StreamEvent for ParkedGraphBlock {
    fn is_complete(&self) -> Result<bool, Error> {
        if !self.graph.is_complete()? {
            return Ok(false);
        }
        match &self.own {
            Some(event) => event.is_complete(),
            None => Ok(true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Flag(Arc<core::sync::atomic::AtomicBool>);

    impl StreamEvent for Flag {
        fn is_complete(&self) -> Result<bool, Error> {
            Ok(self.0.load(core::sync::atomic::Ordering::Acquire))
        }
    }

    fn flag() -> (Arc<core::sync::atomic::AtomicBool>, Box<dyn StreamEvent>) {
        let done = Arc::new(core::sync::atomic::AtomicBool::new(false));
        (done.clone(), Box::new(Flag(done)))
    }

    #[test]
    fn a_parked_graph_block_waits_for_both_events() {
        let (graph_done, graph) = flag();
        let (own_done, own) = flag();
        let shared = GraphEvent::after(graph);
        let parked = shared.clone().with(Some(own));
        let plain = shared.clone().with(None);
        assert!(!parked.is_complete().unwrap() && !plain.is_complete().unwrap());
        own_done.store(true, core::sync::atomic::Ordering::Release);
        assert!(
            !parked.is_complete().unwrap(),
            "the graph's replays still run"
        );
        graph_done.store(true, core::sync::atomic::Ordering::Release);
        assert!(parked.is_complete().unwrap() && plain.is_complete().unwrap());
        assert!(
            format!("{shared:?}").contains("complete"),
            "the inner event went"
        );
    }

    #[test]
    fn a_failed_release_stays_failed() {
        let failed = GraphEvent::complete();
        assert!(!failed.has_failed());
        failed.fail(Error::invalid("no event"));
        assert!(failed.has_failed());
        let parked = failed.with(None);
        assert!(parked.is_complete().is_err());
        assert!(parked.is_complete().is_err());
    }

    #[test]
    fn the_book_holds_forgets_and_releases() {
        let mut graphs = Graphs::default();
        assert!(!graphs.owns_blocks());
        let a = graphs.open(StreamId(7));
        let b = graphs.open(StreamId(8));
        assert_ne!(a, b);
        graphs.adopt(a, 0x1000);
        graphs.adopt(a, 0x2000);
        graphs.adopt(b, 0x3000);
        assert!(graphs.owns_blocks());
        let owner = graphs.owner(0x2000).unwrap();
        assert_eq!((owner.key, owner.stream), (a, StreamId(7)));
        assert!(owner.released.is_none());
        assert!(graphs.owner(0x4000).is_none());

        graphs.forget(0x2000);
        graphs.hold(
            a,
            Held {
                block: 3,
                bytes: 512,
                event: None,
            },
        );
        assert_eq!(
            graphs.stats(a),
            GraphStats {
                allocations: 2,
                live: 1,
                held: 1,
                held_bytes: 512
            }
        );
        let held = graphs.release(a, GraphEvent::complete());
        assert_eq!(held.len(), 1);
        assert!(!graphs.is_open(a), "released");
        assert!(
            graphs.owner(0x1000).unwrap().released.is_some(),
            "its live block keeps the release event"
        );
        graphs.forget(0x1000);
        assert_eq!(graphs.stats(a), GraphStats::default(), "the entry went");
        assert!(graphs.describe(a).is_none());
        assert_eq!(graphs.describe(b), Some((StreamId(8), true)));
        let held = graphs.release(b, GraphEvent::complete());
        assert!(held.is_empty());
        graphs.forget(0x3000);
        assert!(!graphs.owns_blocks());
        assert!(graphs.entries.is_empty());
    }
}

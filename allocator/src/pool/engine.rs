//! The engine: everything behind the pool's lock, and the allocation and free paths.

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::format;
use alloc::string::String;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use std::backtrace::Backtrace;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

use super::addr_map::AddrMap;
use super::counters::{Counters, Spare};
use super::events::{self, EventSink, PoolAction, Record};
use super::graph::Graphs;
use super::lock::{Lock, LockGuard, Reentrant, caught, logged, logged_unlocked, panic_message};
use super::region::{Region, RegionOwner};
use super::stats::{ClientStats, Leak, LeakReport, PoolStats, Tracking};
use super::stream::{HeldEvent, StreamEvent, StreamId, StreamSync};
use super::thread_heap::{self, HeapEntry, SpanDirectory, ThreadHeap};
use super::tlsf::{self, Tlsf};
use super::vmm::{ChunkMap, Mapping};
use super::{BLOCK_GRANULE, DEFAULT_REUSE_BLOCKS};
use crate::backend::MemoryKind;
use crate::error::Error;

// The engine's rooms: the allocation path, the free path, trimming a growable region, and
// graph reservations. The state, the lock, events and statistics live here.
mod allocate;
mod free;
mod graph;
mod trim;

/// How often [`Shared::trim_to`] waits for the home stream outside the lock before it waits
/// under it (each retry means a free on the home stream came in during the wait).
const TRIM_TRIES: usize = 3;

/// What tracking keeps for one allocation.
pub(super) struct LiveInfo {
    tag: Option<String>,
    at: Instant,
    backtrace: Option<Backtrace>,
}

/// One live allocation, kept at its block's index. Plain data (no drop glue), so that writing
/// it on allocation and reading it on free are a few moves; what tracking records lives in
/// [`State::info`], touched only for an allocation made with tracking on.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Live {
    pub(super) size: usize,
    pub(super) serial: u64,
    pub(super) stream: StreamId,
    pub(super) client: u32,
    /// The alignment in effect (at most [`MAX_POOL_ALIGN`](crate::pool::MAX_POOL_ALIGN)).
    pub(super) align: u16,
    /// Owned by a [`PoolSlice`](crate::pool::PoolSlice): only the slice frees it.
    pub(super) owned: bool,
    /// Its block's entry of [`State::info`] holds what tracking recorded.
    pub(super) tracked: bool,
}

/// A block waiting for an event: freed on a stream other than the one its index serves (the
/// home stream for the pool's index, a thread heap's own stream), or a free block a thread
/// heap of another stream gave back.
pub(super) struct Parked {
    /// The thread heap whose block it is; `None`: the pool's own index.
    pub(super) heap: Option<Arc<ThreadHeap>>,
    pub(super) block: u32,
    pub(super) bytes: usize,
    pub(super) event: Box<dyn StreamEvent>,
    /// A free block a thread heap of the queue's stream gave back (not a block freed on a
    /// stream other than its own): a refusal may make the home stream wait for that stream
    /// and take it (see [`Shared::order_given_back`]).
    pub(super) given_back: bool,
    /// A block freed on the home stream while a wait for it ran outside the lock (see
    /// [`State::home_fences`]), or given back then by a home-stream thread heap: a request
    /// that would fail without it may take it back at once ([`Shared::take_fenced`]).
    pub(super) fenced: bool,
}

/// One client: a name, a quota, its counters.
#[derive(Clone)]
pub(super) struct ClientState {
    pub(super) name: Arc<str>,
    pub(super) quota: usize,
    pub(super) counts: Counters,
    /// Headroom below the client's peak leased to no heap in particular (with exact peaks;
    /// counted in `counts.leased`): what its heaps take and give back without the lock.
    pub(super) spare: Arc<Spare>,
    /// How many thread heaps are listed as holding leases of this client.
    pub(super) heaps: usize,
}

impl ClientState {
    pub(super) fn new(name: &str, quota: usize) -> Self {
        ClientState {
            name: Arc::from(name),
            quota,
            counts: Counters::default(),
            spare: Arc::default(),
            heaps: 0,
        }
    }

    /// Whether `reserved` more bytes stay within the quota.
    #[inline(always)]
    fn allows(&self, reserved: usize) -> bool {
        self.counts.allows(reserved, self.quota)
    }

    pub(super) fn stats(&self) -> ClientStats {
        let c = &self.counts;
        ClientStats {
            name: String::from(&*self.name),
            quota: self.quota,
            in_use: c.in_use,
            requested: c.requested,
            peak: c.peak,
            allocations: c.allocations,
            frees: c.frees,
            failures: c.failures,
            live: c.live(),
        }
    }
}

/// Everything behind the pool's lock.
pub(super) struct State {
    /// The pool's index: every block, a thread heap's span being one used block here.
    pub(super) tlsf: Tlsf,
    /// Address of every live allocation in the pool's index → its block.
    pub(super) live: AddrMap,
    /// What is known about the live allocation in each block (indexed like the TLSF blocks;
    /// entries of free blocks are stale).
    pub(super) meta: Vec<Live>,
    /// What tracking recorded, by block, for the live allocations whose `tracked` is set
    /// (`None` everywhere else; empty while tracking has never been on).
    info: Vec<Option<Box<LiveInfo>>>,
    pub(super) clients: Vec<ClientState>,
    /// The pool's own bytes (`in_use`, `peak`, `leased`): every client's together. Its other
    /// counts stay 0: the pool's are its clients' added up (see [`Counters::on_alloc_bytes`]).
    pub(super) counts: Counters,
    /// Parked blocks, one FIFO per stream (events on one stream complete in order).
    pub(super) parked: Vec<(StreamId, VecDeque<Parked>)>,
    pub(super) pending: usize,
    /// Bytes of parked blocks whose events could not be queried: never handed out again.
    quarantined: usize,
    /// Bumped by every free on the home stream with a stream runtime present, and every time
    /// free blocks of thread heaps reach the pool's index without an event of their own
    /// (given back as they are, or once the home stream waits for their stream): blocks that
    /// another stream may use only after waiting for the home stream.
    pub(super) home_epoch: u64,
    /// How many waits for the home stream run now outside the lock (a trim's, a graph's
    /// allocation's: see [`Shared::wait_for_home_fenced`]): while any does, a free on the home
    /// stream parks its block behind an event recorded there instead of returning it to the
    /// free lists, and so do the free blocks a home-stream thread heap gives back, so that the
    /// free blocks the waiting side uses afterwards are those its wait covered.
    pub(super) home_fences: u32,
    /// For each other stream: the `home_epoch` at its last wait on the home stream.
    waited: Vec<(StreamId, u64)>,
    pub(super) sink: Option<Arc<dyn EventSink>>,
    /// Events recorded and not yet delivered, in the order the pool did things.
    outbox: VecDeque<Record>,
    /// Which chunks of the region are backed by memory (all of a classic region).
    pub(super) mapping: Mapping,
    /// The thread heaps (see [`thread_heap`]).
    pub(super) heaps: Vec<HeapEntry>,
    /// Every span of a thread heap, by address: its size and heap.
    pub(super) spans: BTreeMap<u64, (u64, Arc<ThreadHeap>)>,
    /// The serial number of the next allocation here (thread heaps take batches of them).
    pub(super) next_serial: u64,
    /// Blocks that heaps given back had taken whole from their caches.
    pub(super) reused: u64,
    /// Home-stream heaps stepped aside near the capacity (see
    /// [`HeapBar`](super::thread_heap::HeapBar)).
    pub(super) heap_bar: super::thread_heap::HeapBar,
    /// Graph reservations: the blocks graphs own and hold (`pool/graph.rs`).
    graphs: Graphs,
}

impl State {
    /// Whether thread heaps stay off `stream` for a graph reservation's capture (see
    /// [`Graphs::heaps_barred`](super::graph::Graphs::heaps_barred)).
    pub(super) fn heaps_barred_on(
        &mut self,
        stream: StreamId,
        capturing: impl FnOnce() -> Option<bool>,
    ) -> bool {
        self.graphs.heaps_barred(stream, capturing)
    }

    /// Notes that `stream` is ordered after the home stream's frees up to `epoch` (a later
    /// note never moves it back).
    pub(super) fn note_waited(&mut self, stream: StreamId, epoch: u64) {
        match self.waited.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, last)) => *last = (*last).max(epoch),
            None => self.waited.push((stream, epoch)),
        }
    }

    /// Takes `addr` (block `block`) out of the live map, and what tracking recorded for it
    /// if it was `tracked`: the common start of every free that goes through the lock.
    fn forget_live(&mut self, addr: u64, block: u32, tracked: bool) -> Option<Box<LiveInfo>> {
        let removed = self.live.remove(addr);
        debug_assert_eq!(removed, Some(block));
        if tracked {
            self.info[block as usize].take()
        } else {
            None
        }
    }
}

/// Bits of [`Shared::flags`]: the tracking mode (two bits), then the rest.
const TRACKING: u8 = 0b11;
/// An event sink is on.
pub(super) const SINK: u8 = 1 << 2;
/// Blocks are parked.
pub(super) const PARKED: u8 = 1 << 3;
/// Some thread has a heap.
pub(super) const HEAPS: u8 = 1 << 4;
/// Every thread gets a heap at its first allocation.
pub(super) const EAGER: u8 = 1 << 5;
/// Frees of pool slices dropped inside one of the pool's own callbacks wait to be made (see
/// [`Shared::defer_free`]).
pub(super) const DEFERRED: u8 = 1 << 6;
/// A thread is taking the locks of every heap (or of several) under the pool's lock: a heap's
/// own paths that find this under their heap's lock let go of it and go to the pool's lock,
/// where they wait, instead of taking the heap's lock again and again while that thread waits
/// for it (with eight threads busy on their heaps, statistics took 150 to 500 µs to get every
/// lock). A hint for speed only: every path is correct with it set or not.
pub(super) const PAUSE: u8 = 1 << 7;
/// What sends an allocation on a thread heap down the general path: tracking, a sink. (Parked
/// blocks do not: they come back when a path takes the pool's lock. On the pool's own index
/// every allocation takes the general path while blocks are parked, and takes them back.)
pub(super) const HEAP_SLOW: u8 = TRACKING | SINK;

/// Without exact peaks, a lease takes at least `1 / LEASE_CHUNKS` of the capacity beyond its
/// need (see `Shared::lease_keep`).
const LEASE_CHUNKS: usize = 256;

/// Numbers the pools, for the thread-local list of thread heaps.
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// What never changes after creation, beside the lock.
pub(super) struct Shared {
    pub(super) state: Lock<State>,
    /// Names this pool among all pools of the process (never reused).
    pub(super) id: u64,
    /// This pool, weakly: what a thread's list of heaps holds.
    pub(super) this: Weak<Shared>,
    pub(super) name: String,
    pub(super) capacity: usize,
    /// The largest request the capacity holds ([`tlsf::largest_request`]): a thread heap's
    /// fast path compares the request's size with it, then rounds without overflow checks.
    pub(super) max_request: u64,
    pub(super) base: u64,
    pub(super) memory: MemoryKind,
    pub(super) backend: &'static str,
    /// The tracking mode and the conditions that send requests down the general path, read
    /// without the lock ([`SINK`], [`PARKED`], [`HEAPS`]).
    pub(super) flags: AtomicU8,
    pub(super) streams: Option<Arc<dyn StreamSync>>,
    pub(super) home: StreamId,
    log_leaks_on_drop: bool,
    /// The most free bytes the thread heaps keep, all together (0: no thread heaps).
    pub(super) heap_bytes: usize,
    /// Each heap's share of `heap_bytes`: the heaps share it evenly.
    pub(super) heap_bound: AtomicUsize,
    /// A thread heap's reuse cache: blocks, and the most bytes (besides half its bound).
    pub(super) heap_cache: (usize, u64),
    /// Whether `peak` stays exact with thread heaps (see `PoolBuilder::exact_peaks`).
    pub(super) exact_peaks: bool,
    /// With exact peaks: headroom below the pool's peak leased to no heap in particular
    /// (counted in the state's `counts.leased`), which heaps take and give back without the
    /// lock (see [`thread_heap`]).
    pub(super) spare: Spare,
    /// Where the heaps' spans lie, for frees from other threads (see `thread_heap::remote`).
    pub(super) span_dir: SpanDirectory,
    /// Without exact peaks: the headroom a lease takes beyond what it needs, and keeps.
    pub(super) lease_chunk: usize,
    /// A thread is handing the outbox to the sinks (see [`deliver`](Shared::deliver)).
    delivering: AtomicBool,
    /// Frees that could not be made where they were asked for (see
    /// [`defer_free`](Shared::defer_free)): client, address, stream.
    deferred: std::sync::Mutex<Vec<(u32, u64, StreamId)>>,
    /// A sink has panicked (reported once).
    sink_panicked: AtomicBool,
    /// Whether memory is mapped on demand (and can be trimmed).
    pub(super) growable: bool,
    /// Which chunks are mapped, read by thread heaps without the lock (see [`super::vmm`]).
    pub(super) chunks: ChunkMap,
    // Dropped last: the region outlives every other field (a growable region's reservation
    // lives in the state's mapping, dropped with the state).
    _region: Option<Box<dyn RegionOwner>>,
}

/// The settings a pool is made with, beside its region (see [`PoolBuilder`](super::PoolBuilder)).
pub(super) struct Settings {
    pub(super) name: String,
    pub(super) tracking: Tracking,
    pub(super) sink: Option<Arc<dyn EventSink>>,
    pub(super) streams: Option<Arc<dyn StreamSync>>,
    pub(super) home: StreamId,
    pub(super) log_leaks_on_drop: bool,
    pub(super) reuse_blocks: usize,
    pub(super) reuse_bytes: usize,
    pub(super) release_threshold: usize,
    pub(super) heap_bytes: usize,
    pub(super) eager_heaps: bool,
    pub(super) exact_peaks: bool,
}

/// A block the TLSF index handed out for a request: its index, address and size.
struct Taken {
    block: u32,
    addr: u64,
    reserved: usize,
}

/// Why [`Shared::allocate_admitted`] did not allocate.
enum Refusal {
    Quota,
    Capacity,
    Error(Error),
}

/// What a statistics, report or settings call unwinds with when made from inside one of its
/// pool's own callbacks (see [`Shared::lock_wait`]): the message of the error that the pool
/// call running the callback returns.
pub(super) struct CalledBack(pub(super) String);

/// The parts of a request that an event and an error report.
#[derive(Clone, Copy)]
pub(super) struct Ask {
    pub(super) client: u32,
    pub(super) size: usize,
    pub(super) align: usize,
    pub(super) stream: StreamId,
}

impl Shared {
    /// A pool over `region`, with one client: the pool's own, named after it, without quota.
    pub(super) fn new(settings: Settings, region: Region, this: Weak<Shared>) -> Self {
        let Region {
            base,
            capacity,
            memory,
            backend,
            owner,
            mut mapping,
        } = region;
        let growable = mapping.is_growable();
        let chunks = mapping.chunk_map();
        mapping.release_threshold = settings.release_threshold;
        let state = State {
            tlsf: Tlsf::new(
                base,
                capacity as u64,
                settings.reuse_blocks,
                settings.reuse_bytes as u64,
            ),
            live: AddrMap::with_capacity(64),
            meta: Vec::with_capacity(128),
            info: Vec::new(),
            clients: alloc::vec![ClientState::new(&settings.name, usize::MAX)],
            counts: Counters::default(),
            parked: Vec::new(),
            pending: 0,
            quarantined: 0,
            home_epoch: 0,
            home_fences: 0,
            waited: Vec::new(),
            outbox: VecDeque::new(),
            mapping,
            graphs: Graphs::default(),
            heaps: Vec::new(),
            spans: BTreeMap::new(),
            next_serial: 1,
            reused: 0,
            heap_bar: Default::default(),
            sink: settings.sink,
        };
        let heap_bytes = settings.heap_bytes;
        let flags = settings.tracking as u8
            | if state.sink.is_some() { SINK } else { 0 }
            | if settings.eager_heaps && heap_bytes > 0 {
                EAGER
            } else {
                0
            };
        let heap_cache = match settings.reuse_blocks {
            0 => (0, 0),
            blocks => (
                blocks.min(DEFAULT_REUSE_BLOCKS),
                settings.reuse_bytes as u64,
            ),
        };
        Shared {
            state: Lock::new(state),
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            this,
            name: settings.name,
            capacity,
            max_request: tlsf::largest_request(capacity as u64),
            base,
            memory,
            backend,
            flags: AtomicU8::new(flags),
            streams: settings.streams,
            home: settings.home,
            log_leaks_on_drop: settings.log_leaks_on_drop,
            heap_bytes,
            heap_bound: AtomicUsize::new(heap_bytes),
            heap_cache,
            exact_peaks: settings.exact_peaks,
            spare: Spare::default(),
            span_dir: SpanDirectory::default(),
            lease_chunk: (capacity / LEASE_CHUNKS).max(BLOCK_GRANULE),
            delivering: AtomicBool::new(false),
            deferred: std::sync::Mutex::new(Vec::new()),
            sink_panicked: AtomicBool::new(false),
            growable,
            chunks,
            _region: owner,
        }
    }

    /// Adds a client; returns its id.
    pub(super) fn add_client(&self, name: &str, quota: usize) -> u32 {
        let mut state = self.lock_wait("a new client");
        state.clients.push(ClientState::new(name, quota));
        (state.clients.len() - 1) as u32
    }

    /// A client's name.
    pub(super) fn client_name(&self, client: u32) -> String {
        String::from(&*self.lock_wait("a client's name").clients[client as usize].name)
    }

    /// A client's counters.
    pub(super) fn client_stats(&self, client: u32) -> ClientStats {
        let mut state = self.lock_wait("a client's statistics");
        self.with_heaps(&mut state, |state, heaps| {
            self.client_totals(state, heaps, client as usize)
        })
    }

    /// Every client's counters, the pool's own client first.
    pub(super) fn all_client_stats(&self) -> Vec<ClientStats> {
        let mut state = self.lock_wait("every client's statistics");
        self.with_heaps(&mut state, |state, heaps| {
            (0..state.clients.len())
                .map(|c| self.client_totals(state, heaps, c))
                .collect()
        })
    }

    /// Client `c`'s counters, its thread heaps' shares added (every heap locked).
    fn client_totals(
        &self,
        state: &State,
        heaps: &[thread_heap::Locked<'_>],
        c: usize,
    ) -> ClientStats {
        let mut stats = ClientState {
            counts: Self::client_counts(state, heaps, c),
            ..state.clients[c].clone()
        }
        .stats();
        // Without exact peaks a peak counts the headroom heaps' leases hold, which sets no
        // memory aside: with it the count can pass the capacity. Never reported above it.
        stats.peak = stats.peak.min(self.capacity);
        stats
    }

    /// Client `c`'s counts, its thread heaps' shares added and their unused leases not
    /// counted (every heap locked).
    fn client_counts(state: &State, heaps: &[thread_heap::Locked<'_>], c: usize) -> Counters {
        let mut counts = state.clients[c].counts;
        counts.in_use -= counts.leased;
        for h in heaps {
            if let Some(share) = h.state.clients.get(c) {
                counts.in_use += share.lease.used;
                counts.requested += share.requested;
                // A heap's allocation freed in the pool's index (given back in between) counts
                // there as a free: only the sums are exact.
                counts.allocations += share.allocations;
                counts.frees += share.frees;
            }
        }
        counts
    }

    /// How many threads have a heap on this pool.
    pub(super) fn thread_heaps(&self) -> usize {
        self.lock_wait("its number of thread heaps").heaps.len()
    }

    /// Replaces the event sink.
    pub(super) fn set_sink(&self, sink: Option<Arc<dyn EventSink>>) {
        let mut state = self.lock_wait("a new event sink");
        if sink.is_some() {
            self.flags.fetch_or(SINK, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!SINK, Ordering::Relaxed);
        }
        let replaced = core::mem::replace(&mut state.sink, sink);
        // A thread heap checks for a sink under its lock: a call that did not see the sink
        // finishes before this returns, and every later one sees it.
        for entry in &state.heaps {
            drop(entry.heap.state.lock_wait());
        }
        // The sink replaced is dropped with the lock released: its destructor is user code,
        // which may call the pool (a sink that reports a summary when it goes, say).
        drop(state);
        drop(replaced);
    }

    /// Changes what is recorded for new allocations.
    pub(super) fn set_tracking(&self, tracking: Tracking) {
        let _ = self
            .flags
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |flags| {
                Some(flags & !TRACKING | tracking as u8)
            });
    }

    /// Returns parked blocks whose events completed; the bytes reclaimed.
    pub(super) fn reclaim(&self) -> Result<usize, Error> {
        let mut state = self.lock()?;
        self.make_deferred_frees(&mut state);
        Ok(self.reclaim_parked(&mut state))
    }

    /// Takes the lock for an allocation, a free or a reclaim: an error instead of waiting for
    /// ever when the calling thread is inside one of this pool's stream-runtime callbacks.
    #[inline(always)]
    pub(super) fn lock(&self) -> Result<LockGuard<'_, State>, Error> {
        match self.state.lock() {
            Ok(guard) => Ok(guard),
            Err(Reentrant) => Err(self.reentrant()),
        }
    }

    /// Frees the block of a [`PoolSlice`](crate::pool::PoolSlice) of `client` at `addr`, on
    /// `stream`, later: the slice was dropped inside one of this pool's own callbacks (a
    /// stream event's destructor that owned it, say), where the pool is locked further up the
    /// stack and the free could only fail, and a destructor has no one to return the error
    /// to. The free is made by the next call that needs it, before it does anything else:
    /// statistics, reports and settings, `reclaim`, `trim`, and every allocation that a
    /// thread heap does not serve (the pool's own index sends every allocation down its
    /// general path meanwhile). A plain free does not look: it would cost every free a load
    /// and a branch.
    pub(super) fn defer_free(&self, client: u32, addr: u64, stream: StreamId) {
        self.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((client, addr, stream));
        // Every allocation on the pool's own index then takes the general path, which makes it.
        self.flags.fetch_or(DEFERRED, Ordering::Relaxed);
        logged(|| {
            log::debug!(
                target: "devarena::pool",
                "pool `{}`: the free of a slice at {addr:#x} dropped in a callback of the pool \
                 waits for the next call that needs it",
                self.name
            )
        });
    }

    /// Makes the frees [`defer_free`](Self::defer_free) set aside, with the lock held.
    #[inline(always)]
    pub(super) fn make_deferred_frees(&self, state: &mut State) {
        if self.flags.load(Ordering::Relaxed) & DEFERRED != 0 {
            self.make_deferred_frees_now(state);
        }
    }

    #[cold]
    #[inline(never)]
    fn make_deferred_frees_now(&self, state: &mut State) {
        // Cleared before the list is taken: a free deferred meanwhile sets it again.
        self.flags.fetch_and(!DEFERRED, Ordering::Relaxed);
        let frees = core::mem::take(&mut *self.deferred.lock().unwrap_or_else(|e| e.into_inner()));
        for (client, addr, stream) in frees {
            // (A callback these frees run may defer more: the next call makes those.)
            if let Err(error) =
                self.deallocate_general(state, Some(client), addr, None, stream, true)
            {
                logged(|| {
                    log::error!(
                        target: "devarena::pool",
                        "pool `{}`: a deferred free of a slice at {addr:#x}: {error}",
                        self.name
                    )
                });
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn reentrant(&self) -> Error {
        Error::invalid(format!(
            "pool `{}` was called from its own stream runtime's callback or virtual-memory \
             backend, which run while the pool is locked (a `StreamSync` or `VirtualMemory` \
             must not call back into its pool)",
            self.name
        ))
    }

    /// Takes the lock for everything else (statistics, reports, settings: `what`, as the
    /// error names it), waiting for it. These calls return plain values, so they have no error
    /// to return when made from inside one of this pool's own callbacks (where waiting would
    /// be for ever): there they unwind with a [`CalledBack`] payload, which every place that
    /// runs such a callback catches ([`runtime_call`](Self::runtime_call), a [`HeldEvent`]'s
    /// destructor) and turns into the error of the pool call that ran the callback.
    pub(super) fn lock_wait(&self, what: &str) -> LockGuard<'_, State> {
        match self.state.lock() {
            Ok(mut guard) => {
                self.make_deferred_frees(&mut guard);
                guard
            }
            Err(Reentrant) => self.called_back(what),
        }
    }

    #[cold]
    #[inline(never)]
    fn called_back(&self, what: &str) -> ! {
        let message = format!(
            "pool `{}` was asked for {what} from inside its own stream runtime's callback or \
             virtual-memory backend, which run while the pool is locked (a `StreamSync`, \
             `StreamEvent` or `VirtualMemory` must not call back into its pool); that call \
             was abandoned",
            self.name
        );
        // With `panic = "abort"` nothing can be caught and `resume_unwind` would abort without
        // a word: `panic!` lets the hook say why first.
        #[cfg(panic = "abort")]
        panic!("{message}");
        // `resume_unwind`, not `panic!`: no panic hook runs (nothing panicked; the callback
        // made a call it must not make, and its pool call reports that).
        #[cfg(not(panic = "abort"))]
        std::panic::resume_unwind(Box::new(CalledBack(message)))
    }

    /// Runs a stream-runtime callback under the lock: a panic becomes an error, and a call back
    /// into the pool fails instead of waiting for ever. The state is consistent whenever a
    /// callback runs.
    pub(super) fn stream_call<R>(
        &self,
        what: &str,
        f: impl FnOnce() -> Result<R, Error>,
    ) -> Result<R, Error> {
        // A call back into the pool from the callback must not find this thread's heap either.
        thread_heap::forget_current();
        self.state.callback(|| self.runtime_call(what, f))
    }

    /// Runs a stream-runtime callback, a panic becoming an error. Called as it is, without the
    /// lock, a call back into the pool from the callback takes the lock as any call does;
    /// under the lock, [`stream_call`](Self::stream_call) runs it.
    pub(super) fn runtime_call<R>(
        &self,
        what: &str,
        f: impl FnOnce() -> Result<R, Error>,
    ) -> Result<R, Error> {
        caught(f).unwrap_or_else(|payload| Err(self.callback_unwound(what, payload.payload())))
    }

    /// The error of a stream-runtime callback that unwound: the call back into the pool that
    /// it must not make ([`CalledBack`]), or its own panic, with the panic's message.
    #[cold]
    #[inline(never)]
    fn callback_unwound(&self, what: &str, payload: &(dyn core::any::Any + Send)) -> Error {
        if let Some(CalledBack(message)) = payload.downcast_ref::<CalledBack>() {
            return Error::invalid(message.clone());
        }
        Error::invalid(match panic_message(payload) {
            Some(message) => format!(
                "pool `{}`: the stream runtime panicked in `{what}`: {message}",
                self.name
            ),
            None => format!(
                "pool `{}`: the stream runtime panicked in `{what}`",
                self.name
            ),
        })
    }

    /// Whether `stream` captures a graph, as the stream runtime says under the lock (`None`:
    /// it cannot say, an error or a panic; no runtime: no).
    pub(super) fn capturing(&self, stream: StreamId) -> Option<bool> {
        match &self.streams {
            Some(streams) => self
                .stream_call("is_capturing", || streams.is_capturing(stream))
                .ok(),
            None => Some(false),
        }
    }

    /// Whether `stream`, another stream than the home stream, names a different stream on
    /// each thread (CUDA's per-thread default stream), as the stream runtime says (asked
    /// without the lock; a panic is an error).
    pub(super) fn per_thread_stream(&self, stream: StreamId) -> Result<bool, Error> {
        match &self.streams {
            Some(streams) if stream != self.home => {
                self.runtime_call("is_per_thread", || Ok(streams.is_per_thread(stream)))
            }
            _ => Ok(false),
        }
    }

    /// Records an event on `stream` (a runtime callback, see [`stream_call`](Self::stream_call)),
    /// kept as a [`HeldEvent`]: its destructor runs as a callback of the pool's lock.
    pub(super) fn record_event(
        &self,
        streams: &dyn StreamSync,
        stream: StreamId,
    ) -> Result<Box<dyn StreamEvent>, Error> {
        let event = self.stream_call("record", || streams.record(stream))?;
        Ok(HeldEvent::boxed(event, self.state.id()))
    }

    pub(super) fn tracking(&self) -> Tracking {
        match self.flags.load(Ordering::Relaxed) & TRACKING {
            0 => Tracking::Off,
            1 => Tracking::Tags,
            _ => Tracking::Backtraces,
        }
    }

    /// Counts a free of `reserved` bytes (the pool's and the owner's counters) and records
    /// its event for the sink, if one is on: the end every free under the lock shares.
    #[inline(always)]
    fn count_free(
        &self,
        state: &mut State,
        live: &Live,
        addr: u64,
        reserved: usize,
        stream: StreamId,
        tag: Option<&str>,
    ) {
        state.counts.on_free_bytes(reserved);
        state.clients[live.client as usize]
            .counts
            .on_free(reserved, live.size);
        self.emit_free(state, live, addr, reserved, stream, tag);
    }

    /// Records the event of a free of `reserved` bytes for the sink, if one is on.
    #[inline(always)]
    pub(super) fn emit_free(
        &self,
        state: &mut State,
        live: &Live,
        addr: u64,
        reserved: usize,
        stream: StreamId,
        tag: Option<&str>,
    ) {
        if state.sink.is_some() {
            let ask = Ask {
                client: live.client,
                size: live.size,
                align: live.align as usize,
                stream,
            };
            self.emit(state, PoolAction::Free, &ask, addr, reserved, tag, None);
        }
    }

    /// Records an event for the sink, to be delivered once the lock is released.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn emit(
        &self,
        state: &mut State,
        action: PoolAction,
        ask: &Ask,
        addr: u64,
        reserved: usize,
        tag: Option<&str>,
        error: Option<&Error>,
    ) {
        if let Some(sink) = &state.sink {
            let record = Record {
                sink: sink.clone(),
                action,
                addr,
                size: ask.size,
                reserved,
                align: ask.align,
                client: state.clients[ask.client as usize].name.clone(),
                tag: tag.map(String::from),
                stream: ask.stream,
                time: SystemTime::now(),
                thread: events::thread_number(),
                error: error.cloned(),
            };
            state.outbox.push_back(record);
        }
    }

    /// Hands recorded events to their sinks, in order, outside the lock. One thread delivers
    /// at a time; a thread that finds another delivering leaves its events to it. After it
    /// stops delivering, a thread looks once more, so that an event recorded while it was
    /// finishing is not left behind.
    #[cold]
    #[inline(never)]
    fn deliver(&self) {
        /// Ends this thread's turn at delivering, however it ends.
        struct Turn<'a>(&'a AtomicBool);
        impl Drop for Turn<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        loop {
            if self
                .delivering
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                return;
            }
            let turn = Turn(&self.delivering);
            loop {
                // Taken one at a time, so that a sink that calls the pool finds it unlocked.
                // (Where the lock cannot be waited for, inside a callback that may run under
                // it, the events left wait for the next call that delivers.)
                let Ok(mut state) = self.state.lock() else {
                    return;
                };
                let Some(record) = state.outbox.pop_front() else {
                    break;
                };
                drop(state);
                if !record.deliver(&self.name) && !self.sink_panicked.swap(true, Ordering::Relaxed)
                {
                    logged_unlocked(|| {
                        log::error!(
                            target: "devarena::pool",
                            "pool `{}`: the event sink panicked on a `{}` event at {:#x}; the \
                             pool carries on, and drops each event whose sink panics (reported \
                             once)",
                            self.name,
                            record.action,
                            record.addr
                        )
                    });
                }
            }
            drop(turn);
            match self.state.lock() {
                Ok(state) if !state.outbox.is_empty() => {}
                _ => return,
            }
        }
    }

    pub(super) fn stats(&self) -> PoolStats {
        let mut state = self.lock_wait("statistics");
        let mapping = state.mapping.stats();
        // Every heap locked and left as it is: its counts are added, and the blocks no
        // allocation uses, the pool's and the heaps', are described as they would be with
        // every heap's spans given back and every reuse cache merged (touching ones are one
        // block), without giving anything back: a thread that reads the statistics while
        // others allocate does not take their heaps and caches away. Under the locks, only
        // the counts and a copy of those blocks; they are sorted and merged after. Without
        // heaps, the pool's index describes itself without a copy (its cached blocks and
        // their runs only).
        let (stats, free) = self.with_heaps(&mut state, |state, heaps| {
            let mut clients = Counters::default();
            for c in 0..state.clients.len() {
                let totals = Self::client_counts(state, heaps, c);
                clients.requested += totals.requested;
                clients.allocations += totals.allocations;
                clients.frees += totals.frees;
                clients.failures += totals.failures;
            }
            let mut in_use = state.counts.in_use - state.counts.leased;
            let mut live = state.live.len();
            let mut reused = state.tlsf.reused() + state.reused;
            // `Ok`: described; `Err`: the copy to describe once the locks are released.
            let mut free = if heaps.is_empty() {
                let (bytes, largest, blocks) = state.tlsf.merged_unused();
                Ok(FreeBlocks {
                    bytes,
                    largest,
                    blocks,
                })
            } else {
                Err(state.tlsf.unused_ranges().collect::<Vec<_>>())
            };
            for h in heaps.iter() {
                let hs = &*h.state;
                in_use += hs.lease.used;
                live += hs.live.len();
                reused += hs.tlsf.reused();
                // A heap of another stream too: what it holds free serves a request on the
                // home stream that needs it, after the home stream waits for the heap's
                // stream (see `give_back_mode`), a wait the pool makes, not the caller.
                if let Err(unused) = &mut free {
                    unused.extend(hs.tlsf.unused_ranges());
                }
            }
            let stats = PoolStats {
                capacity: self.capacity,
                in_use,
                requested: clients.requested,
                // (As for a client's, see `client_totals`.)
                peak: state.counts.peak.min(self.capacity),
                allocations: clients.allocations,
                frees: clients.frees,
                failures: clients.failures,
                live: live as u64,
                // (Set below, from `free`.)
                free: 0,
                pending: state.pending,
                quarantined: state.quarantined,
                largest_free: 0,
                free_blocks: 0,
                mapped: mapping.mapped,
                peak_mapped: mapping.peak_mapped,
                chunk: mapping.chunk,
                maps: mapping.maps,
                unmaps: mapping.unmaps,
                reused,
            };
            (stats, free)
        });
        drop(state);
        let free = free.unwrap_or_else(|mut unused| FreeBlocks::merged(&mut unused));
        PoolStats {
            free: free.bytes as usize,
            largest_free: free.largest as usize,
            free_blocks: free.blocks,
            ..stats
        }
    }

    pub(super) fn leak_report(&self) -> LeakReport {
        let mut state = self.lock_wait("a leak report");
        let mut leaks = self.with_heaps(&mut state, |state, heaps| {
            let mut leaks = Self::leaks(state);
            for h in heaps.iter() {
                let h = &*h.state;
                leaks.extend(h.live.iter().map(|(addr, block)| {
                    let live = &h.meta[block as usize];
                    Leak {
                        addr,
                        size: live.size,
                        reserved: h.tlsf.block_size(block) as usize,
                        client: String::from(&*state.clients[live.client as usize].name),
                        serial: live.serial,
                        stream: live.stream,
                        tag: None,
                        age: None,
                        backtrace: None,
                    }
                }));
            }
            leaks
        });
        leaks.sort_by_key(|l| l.addr);
        LeakReport {
            pool: self.name.clone(),
            capacity: self.capacity,
            leaks,
        }
    }

    /// The live allocations of the pool's own index.
    fn leaks(state: &State) -> Vec<Leak> {
        let now = Instant::now();
        let info = |block: u32| -> Option<&LiveInfo> {
            state.meta[block as usize]
                .tracked
                .then(|| state.info[block as usize].as_deref())?
        };
        let leaks: Vec<Leak> = state
            .live
            .iter()
            .map(|(addr, block)| (addr, block, &state.meta[block as usize]))
            .map(|(addr, block, live)| Leak {
                addr,
                size: live.size,
                reserved: state.tlsf.block_size(block) as usize,
                client: String::from(&*state.clients[live.client as usize].name),
                serial: live.serial,
                stream: live.stream,
                tag: info(block).and_then(|i| i.tag.clone()),
                age: info(block).map(|i| now.duration_since(i.at)),
                backtrace: info(block)
                    .and_then(|i| i.backtrace.as_ref())
                    .map(|b| format!("{b}")),
            })
            .collect();
        leaks
    }
}

/// Makes room for `meta[slot]` (the TLSF index made a new block).
#[cold]
#[inline(never)]
pub(super) fn grow_meta(meta: &mut Vec<Live>, slot: usize) {
    meta.resize(slot + 1, Live::default());
}

/// [`grow_meta`], and `meta[slot]`.
#[cold]
#[inline(never)]
pub(super) fn grown_meta(meta: &mut Vec<Live>, slot: usize) -> &mut Live {
    grow_meta(meta, slot);
    &mut meta[slot]
}

/// Keeps what tracking recorded for the allocation in block `slot`.
#[cold]
#[inline(never)]
fn store_info(info: &mut Vec<Option<Box<LiveInfo>>>, slot: usize, recorded: Box<LiveInfo>) {
    if info.len() <= slot {
        info.resize_with(slot + 1, || None);
    }
    info[slot] = Some(recorded);
}

impl Drop for Shared {
    fn drop(&mut self) {
        if !self.lock_wait("its recorded events").outbox.is_empty() {
            self.deliver();
        }
        self.wait_for_streams_in_use();
        if self.log_leaks_on_drop {
            let report = self.leak_report();
            if !report.is_empty() {
                logged_unlocked(|| log::warn!(target: "devarena::pool", "{report}"));
            }
        }
        self.drop_heaps();
    }
}

impl Shared {
    /// At the drop of a pool of memory a device reaches (device, managed, pinned): waits for
    /// every stream whose queued work may still use the pool's blocks: the home stream,
    /// streams that blocks are parked behind (freed there, given back by a heap of it, held
    /// by a graph released there), and the streams of thread heaps, whose frees take no event.
    /// The region then goes back to the driver. (The region's own teardown waits too, for the
    /// home stream of its backend or the whole device of its virtual memory; the wait here,
    /// through the stream runtime, holds also where the runtime and the region were built on
    /// different contexts.) (Host memory: nothing queued on a stream reaches it.)
    ///
    /// A stream that names another stream on each thread (the per-thread default stream) is
    /// not synchronized (that would wait for this thread's): the events its blocks are parked
    /// behind, recorded on the freeing threads' streams, are waited for instead. A stream that
    /// captures a graph is not touched (waiting for it would end the capture); a wait that
    /// fails, or is not made for that reason, is logged, and the region goes back all the same.
    fn wait_for_streams_in_use(&self) {
        let Some(streams) = &self.streams else {
            return;
        };
        if self.memory == MemoryKind::Host {
            return;
        }
        let mut waiting: Vec<StreamId> = {
            let state = self.lock_wait("the streams that use it");
            state
                .parked
                .iter()
                .filter(|(_, queue)| !queue.is_empty())
                .map(|(stream, _)| *stream)
                .chain(state.heaps.iter().map(|entry| entry.heap.stream))
                .chain([self.home])
                .collect()
        };
        waiting.sort_unstable();
        waiting.dedup();
        let mut per_thread = Vec::new();
        for stream in waiting {
            if self.per_thread_stream(stream).unwrap_or(false) {
                per_thread.push(stream);
                continue;
            }
            let capturing = self
                .runtime_call("is_capturing", || streams.is_capturing(stream))
                .unwrap_or(true);
            let waited = match capturing {
                true => Err(Error::invalid(format!(
                    "stream {stream} captures a graph (or cannot say)"
                ))),
                false => self.runtime_call("synchronize", || streams.synchronize(stream)),
            };
            if let Err(error) = waited {
                self.unwaited(stream, &error);
            }
        }
        if !per_thread.is_empty() {
            self.wait_for_parked_events(&per_thread);
        }
    }

    /// Waits until no block is parked behind an event on one of `streams` (each completed, or
    /// set aside where its query fails), polling.
    fn wait_for_parked_events(&self, streams: &[StreamId]) {
        let mut pause = core::time::Duration::from_micros(50);
        loop {
            let left = {
                let mut state = self.lock_wait("its parked blocks");
                self.reclaim_parked(&mut state);
                state
                    .parked
                    .iter()
                    .any(|(stream, queue)| streams.contains(stream) && !queue.is_empty())
            };
            if !left {
                return;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(core::time::Duration::from_millis(10));
        }
    }

    #[cold]
    fn unwaited(&self, stream: StreamId, error: &Error) {
        logged_unlocked(|| {
            log::error!(
                target: "devarena::pool",
                "pool `{}`: not waiting for stream {stream} before its region goes back \
                 ({error}); work queued there may still use blocks freed on it",
                self.name
            )
        });
    }
}

/// The blocks no allocation uses, as one description: touching ones count as one block.
struct FreeBlocks {
    bytes: u64,
    largest: u64,
    blocks: usize,
}

impl FreeBlocks {
    /// Describes `ranges`, `(address, bytes)` that do not overlap, in any order (sorts them).
    fn merged(ranges: &mut [(u64, u64)]) -> FreeBlocks {
        ranges.sort_unstable_by_key(|&(addr, _)| addr);
        let mut free = FreeBlocks {
            bytes: 0,
            largest: 0,
            blocks: 0,
        };
        let mut run: Option<(u64, u64)> = None;
        for &(addr, size) in ranges.iter() {
            free.bytes += size;
            run = match run {
                Some((start, end)) if end == addr => Some((start, addr + size)),
                _ => {
                    free.blocks += 1;
                    Some((addr, addr + size))
                }
            };
            if let Some((start, end)) = run {
                free.largest = free.largest.max(end - start);
            }
        }
        free
    }
}

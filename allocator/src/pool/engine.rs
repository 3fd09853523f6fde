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
use super::lock::{Lock, LockGuard, Reentrant};
use super::region::{Region, RegionOwner};
use super::stats::{ClientStats, Leak, LeakReport, PoolStats, Tracking};
use super::stream::{StreamEvent, StreamId, StreamSync};
use super::thread_heap::{self, HeapEntry, ThreadHeap};
use super::tlsf::Tlsf;
use super::vmm::{ChunkMap, Mapping};
use super::{
    AllocRequest, BLOCK_GRANULE, DEFAULT_POOL_ALIGN, DEFAULT_REUSE_BLOCKS, FreeRequest,
    MAX_POOL_ALIGN, effective_align, reserved_bytes,
};
use crate::backend::MemoryKind;
use crate::error::Error;

// Graph reservations: the engine's side lives in `engine/graph.rs`.
mod graph;

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
    /// The alignment in effect (at most [`MAX_POOL_ALIGN`]).
    pub(super) align: u16,
    /// Owned by a [`PoolSlice`]: only the slice frees it.
    pub(super) owned: bool,
    /// Its block's entry of [`State::info`] holds what tracking recorded.
    pub(super) tracked: bool,
}

/// A block freed on a stream other than the home stream, waiting for its event.
pub(super) struct Parked {
    /// The thread heap whose block it is; `None`: the pool's own index.
    pub(super) heap: Option<Arc<ThreadHeap>>,
    pub(super) block: u32,
    pub(super) bytes: usize,
    pub(super) event: Box<dyn StreamEvent>,
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
    pending: usize,
    /// Bytes of parked blocks whose events could not be queried: never handed out again.
    quarantined: usize,
    /// Bumped by every free on the home stream with a stream runtime present (and every time
    /// blocks freed on a thread heap reach the pool's index).
    pub(super) home_epoch: u64,
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
    /// Graph reservations: the blocks graphs own and hold (`pool/graph.rs`).
    graphs: Graphs,
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
/// What sends every allocation down the general path: tracking, a sink, parked blocks.
pub(super) const SLOW: u8 = TRACKING | SINK | PARKED;

/// Without exact peaks, a lease takes `1 / LEASE_CHUNKS` of the capacity beyond its need.
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
    /// Without exact peaks: the headroom a lease takes beyond what it needs, and keeps.
    pub(super) lease_chunk: usize,
    /// A thread is handing the outbox to the sinks (see [`deliver`](Shared::deliver)).
    delivering: AtomicBool,
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
            waited: Vec::new(),
            outbox: VecDeque::new(),
            mapping,
            graphs: Graphs::default(),
            heaps: Vec::new(),
            spans: BTreeMap::new(),
            next_serial: 1,
            reused: 0,
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
            lease_chunk: (capacity / LEASE_CHUNKS).max(BLOCK_GRANULE),
            delivering: AtomicBool::new(false),
            sink_panicked: AtomicBool::new(false),
            growable,
            chunks,
            _region: owner,
        }
    }

    /// Adds a client; returns its id.
    pub(super) fn add_client(&self, name: &str, quota: usize) -> u32 {
        let mut state = self.lock_wait();
        state.clients.push(ClientState::new(name, quota));
        (state.clients.len() - 1) as u32
    }

    /// A client's name.
    pub(super) fn client_name(&self, client: u32) -> String {
        String::from(&*self.lock_wait().clients[client as usize].name)
    }

    /// A client's counters.
    pub(super) fn client_stats(&self, client: u32) -> ClientStats {
        let mut state = self.lock_wait();
        self.with_heaps(&mut state, |state, heaps| {
            Self::client_totals(state, heaps, client as usize)
        })
    }

    /// Every client's counters, the pool's own client first.
    pub(super) fn all_client_stats(&self) -> Vec<ClientStats> {
        let mut state = self.lock_wait();
        self.with_heaps(&mut state, |state, heaps| {
            (0..state.clients.len())
                .map(|c| Self::client_totals(state, heaps, c))
                .collect()
        })
    }

    /// Client `c`'s counters, its thread heaps' shares added (every heap locked).
    fn client_totals(state: &State, heaps: &[thread_heap::Locked<'_>], c: usize) -> ClientStats {
        let client = &state.clients[c];
        let mut counts = client.counts;
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
        ClientState {
            counts,
            ..client.clone()
        }
        .stats()
    }

    /// How many threads have a heap on this pool.
    pub(super) fn thread_heaps(&self) -> usize {
        self.lock_wait().heaps.len()
    }

    /// Replaces the event sink.
    pub(super) fn set_sink(&self, sink: Option<Arc<dyn EventSink>>) {
        let mut state = self.lock_wait();
        if sink.is_some() {
            self.flags.fetch_or(SINK, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!SINK, Ordering::Relaxed);
        }
        state.sink = sink;
        // A thread heap checks for a sink under its lock: a call that did not see the sink
        // finishes before this returns, and every later one sees it.
        for entry in &state.heaps {
            drop(entry.heap.state.lock_wait());
        }
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
        Ok(self.reclaim_parked(&mut *self.lock()?))
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

    #[cold]
    #[inline(never)]
    fn reentrant(&self) -> Error {
        Error::invalid(format!(
            "pool `{}` was called from its own stream runtime's callback, which runs while \
             the pool is locked (a `StreamSync` must not call back into its pool)",
            self.name
        ))
    }

    /// Takes the lock for everything else (statistics, reports, settings). These wait: they
    /// must not be called from the pool's stream-runtime callbacks (see [`StreamSync`]).
    pub(super) fn lock_wait(&self) -> LockGuard<'_, State> {
        loop {
            if let Ok(guard) = self.state.lock() {
                return guard;
            }
            std::thread::yield_now();
        }
    }

    /// Runs a stream-runtime callback under the lock: a panic becomes an error, and a call back
    /// into the pool fails instead of waiting for ever. The state is consistent whenever a
    /// callback runs.
    fn stream_call<R>(&self, what: &str, f: impl FnOnce() -> Result<R, Error>) -> Result<R, Error> {
        // A call back into the pool from the callback must not find this thread's heap either.
        thread_heap::forget_current();
        self.state.callback(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
                Err(Error::invalid(format!(
                    "pool `{}`: the stream runtime panicked in `{what}`",
                    self.name
                )))
            })
        })
    }

    pub(super) fn tracking(&self) -> Tracking {
        match self.flags.load(Ordering::Relaxed) & TRACKING {
            0 => Tracking::Off,
            1 => Tracking::Tags,
            _ => Tracking::Backtraces,
        }
    }

    // Inlined into each public entry point: the call and its argument passing cost about 20
    // instructions of the fast path.
    #[inline(always)]
    pub(super) fn allocate(
        &self,
        client: u32,
        req: AllocRequest<'_>,
        owned: bool,
    ) -> Result<u64, Error> {
        // What the fast path needs that the lock does not protect: tracking off, a valid
        // alignment, the home stream (or no stream runtime). Where the caller passes no stream
        // (`allocate`), the compiler knows the last one.
        let home = match req.stream {
            None => true,
            Some(stream) => self.streams.is_none() || stream == self.home,
        };
        let align = effective_align(req.align);
        let flags = self.flags.load(Ordering::Relaxed);
        // Nothing on: the pool's own index, as a pool that never had thread heaps does it.
        if let (0, Some(align), true) = (flags, align, home) {
            return self.allocate_on_pool(client, req, align, owned);
        }
        if let (0, Some(align), true) = (flags & SLOW, align, home) {
            let stream = req.stream.unwrap_or(self.home);
            return self.allocate_on_heap(client, req.size, align, stream, owned);
        }
        let req = AllocRequest { ..req };
        self.allocate_other(client, &req, owned)
    }

    /// The fast path where thread heaps are on: the calling thread's heap, if it has one (or
    /// gets one, with [`EAGER`]); else the pool's own index.
    #[inline(never)]
    fn allocate_on_heap(
        &self,
        client: u32,
        size: usize,
        align: usize,
        stream: StreamId,
        owned: bool,
    ) -> Result<u64, Error> {
        let ask = Ask {
            client,
            size,
            align,
            stream,
        };
        match self.on_thread_heap(|heap| self.heap_allocate_fast(heap, &ask, owned)) {
            Some(Some(addr)) => return Ok(addr),
            Some(None) => return self.heap_allocate_slow(&ask, owned),
            None => {}
        }
        let req = AllocRequest::new(size, align).on(stream);
        if self.flags.load(Ordering::Relaxed) & EAGER != 0 {
            return self.allocate_contended(&req, &ask, owned);
        }
        self.allocate_on_pool(client, req, align, owned)
    }

    /// The fast path on the pool's own index (`align` valid, tracking off, the home stream).
    #[inline(always)]
    fn allocate_on_pool(
        &self,
        client: u32,
        req: AllocRequest<'_>,
        align: usize,
        owned: bool,
    ) -> Result<u64, Error> {
        let stream = req.stream.unwrap_or(self.home);
        let Some(mut state) = self.state.try_guard() else {
            let req = AllocRequest { ..req };
            let ask = Ask {
                client,
                size: req.size,
                align,
                stream,
            };
            return self.allocate_contended(&req, &ask, owned);
        };
        let ask = Ask {
            client,
            size: req.size,
            align,
            stream,
        };
        if let Some(addr) = self.allocate_fast(&mut state, &ask, owned) {
            return Ok(addr);
        }
        // Copies made where they are needed: a reference to `req` itself would have the
        // compiler store it on the stack on every call.
        let req = AllocRequest { ..req };
        let result = self.allocate_general(&mut state, client, &req, stream, owned, None);
        self.unlock_and_deliver(state, result)
    }

    /// The fast path's allocation when another thread holds the pool's lock: the calling
    /// thread gets a heap of its own (see [`thread_heap`]) unless they are off.
    #[cold]
    #[inline(never)]
    fn allocate_contended(
        &self,
        req: &AllocRequest<'_>,
        ask: &Ask,
        owned: bool,
    ) -> Result<u64, Error> {
        let mut state = self.lock()?;
        if self.heap_bytes > 0 {
            if let Some(heap) = self.new_thread_heap(&mut state) {
                let result = self.heap_allocate_locked(&mut state, &heap, ask, owned);
                return self.unlock_and_deliver(state, result);
            }
        }
        if let Some(addr) = self.allocate_fast(&mut state, ask, owned) {
            return Ok(addr);
        }
        let result = self.allocate_general(&mut state, ask.client, req, ask.stream, owned, None);
        self.unlock_and_deliver(state, result)
    }

    /// An allocation the fast path never takes: tracking on, a bad alignment, another stream.
    #[inline(never)]
    fn allocate_other(
        &self,
        client: u32,
        req: &AllocRequest<'_>,
        owned: bool,
    ) -> Result<u64, Error> {
        let stream = req.stream.unwrap_or(self.home);
        let info = match self.flags.load(Ordering::Relaxed) & TRACKING {
            0 => None,
            _ => Some(self.record_info(req.tag)),
        };
        let mut state = self.lock()?;
        let result = self.allocate_general(&mut state, client, req, stream, owned, info);
        self.unlock_and_deliver(state, result)
    }

    /// Releases the lock, then delivers the events the call recorded (if any).
    #[inline(always)]
    pub(super) fn unlock_and_deliver<R>(&self, state: LockGuard<'_, State>, result: R) -> R {
        let recorded = !state.outbox.is_empty();
        drop(state);
        if recorded {
            self.deliver();
        }
        result
    }

    /// The common case: a valid alignment, tracking off, the home stream (or no stream
    /// runtime) (all three checked by the caller), nothing parked, within capacity and quota,
    /// and a free block found. It changes nothing until it has a block; `None` sends the
    /// request down [`allocate_general`](Self::allocate_general), which decides the same way
    /// and reports why a request fails.
    #[inline(always)]
    fn allocate_fast(&self, state: &mut State, ask: &Ask, owned: bool) -> Option<u64> {
        // Under the lock the flags are exact for a sink, parked blocks and thread heaps: all
        // three are set and cleared under it.
        let flags = self.flags.load(Ordering::Relaxed);
        let reserved = reserved_bytes(ask.size).filter(|&r| r <= self.capacity)?;
        let client = &state.clients[ask.client as usize];
        if !client.allows(reserved) {
            return None;
        }
        // With leases out, the general path takes their unused part back before it counts a
        // new peak.
        if flags & (SINK | PARKED | HEAPS) != 0
            && (flags & (SINK | PARKED) != 0
                || self.exact_peaks
                    && !(client.counts.admits(reserved) && state.counts.admits(reserved)))
        {
            return None;
        }
        let (block, addr) = state.tlsf.allocate(reserved as u64, ask.align as u64)?;
        // Memory behind the block: mapped already (all of a classic region, which needs no
        // look), or the general path maps it.
        if self.growable && !self.chunks.covers(addr, reserved as u64) {
            state.tlsf.free(block);
            return None;
        }
        let taken = Taken {
            block,
            addr,
            reserved,
        };
        // No sink: the flags, exact under the lock, said so.
        self.commit_allocation(state, ask, owned, None, taken, false);
        Some(addr)
    }

    /// Every allocation the fast path does not take: tracking on, a bad alignment, parked
    /// blocks, another stream, and every failure.
    #[inline(never)]
    pub(super) fn allocate_general(
        &self,
        state: &mut State,
        client: u32,
        req: &AllocRequest<'_>,
        stream: StreamId,
        owned: bool,
        info: Option<Box<LiveInfo>>,
    ) -> Result<u64, Error> {
        let align = effective_align(req.align);
        let ask = Ask {
            client,
            size: req.size,
            align: align.unwrap_or(req.align),
            stream,
        };
        let result = match align {
            Some(align) => self.try_allocate(state, &ask, align, owned, info),
            None => Err(self.unsupported_align(state, &ask)),
        };
        result.map_err(|error| self.allocation_failed(state, &ask, req.tag, error))
    }

    /// What tracking records for a new allocation (outside the lock: a backtrace is slow).
    #[cold]
    #[inline(never)]
    fn record_info(&self, tag: Option<&str>) -> Box<LiveInfo> {
        Box::new(LiveInfo {
            tag: tag.map(String::from),
            at: Instant::now(),
            backtrace: (self.tracking() == Tracking::Backtraces).then(Backtrace::force_capture),
        })
    }

    #[cold]
    #[inline(never)]
    fn unsupported_align(&self, state: &State, ask: &Ask) -> Error {
        Error::invalid(format!(
            "pool `{}`, client `{}`: alignment {} is not supported (a power of two up to \
             {MAX_POOL_ALIGN}, or 0 for {DEFAULT_POOL_ALIGN})",
            self.name, state.clients[ask.client as usize].name, ask.align
        ))
    }

    /// Counts and reports a failed allocation; returns its error.
    #[cold]
    #[inline(never)]
    pub(super) fn allocation_failed(
        &self,
        state: &mut State,
        ask: &Ask,
        tag: Option<&str>,
        error: Error,
    ) -> Error {
        state.clients[ask.client as usize].counts.on_failure();
        self.emit(
            state,
            PoolAction::AllocateFailure,
            ask,
            0,
            0,
            tag,
            Some(&error),
        );
        error
    }

    /// The allocation itself, at a valid alignment (`align`, at least 256).
    #[inline(always)]
    fn try_allocate(
        &self,
        state: &mut State,
        ask: &Ask,
        align: usize,
        owned: bool,
        info: Option<Box<LiveInfo>>,
    ) -> Result<u64, Error> {
        if !state.parked.is_empty() {
            self.reclaim_parked(state);
        }
        let reserved = match reserved_bytes(ask.size) {
            Some(r) if r <= self.capacity => r,
            _ => return Err(self.exhausted(state, ask, "capacity")),
        };
        let mut info = info;
        // Thread heaps give their spans back once before a request fails for capacity.
        let mut given_back = state.heaps.is_empty();
        loop {
            if self.exact_peaks && !state.heaps.is_empty() {
                // Headroom that waits for heaps serves the pool's own index too.
                self.draw_spare(state, ask.client, reserved);
            }
            let client = &state.clients[ask.client as usize];
            let exact = client.allows(reserved)
                && (!self.exact_peaks
                    || client.counts.admits(reserved) && state.counts.admits(reserved));
            let result = if exact || state.heaps.is_empty() {
                self.allocate_admitted(state, ask, align, reserved, owned, &mut info)
            } else {
                // The heaps' unused leases would count as in use: they are taken back first,
                // and the heaps stay locked until the allocation is counted, so that the
                // quota check and the peak are exact.
                self.with_heaps(state, |state, heaps| {
                    self.revoke(state, heaps, ask.client);
                    self.allocate_admitted(state, ask, align, reserved, owned, &mut info)
                })
            };
            match result {
                Ok(addr) => return Ok(addr),
                Err(Refusal::Capacity) if !given_back => {
                    self.dissolve_all(state);
                    given_back = true;
                }
                Err(Refusal::Capacity) => return Err(self.exhausted(state, ask, "capacity")),
                Err(Refusal::Quota) => return Err(self.exhausted(state, ask, "quota")),
                Err(Refusal::Error(error)) => return Err(error),
            }
        }
    }

    /// [`try_allocate`](Self::try_allocate) once the leases are settled: the quota, the
    /// streams, a block from the pool's index.
    #[inline(always)]
    fn allocate_admitted(
        &self,
        state: &mut State,
        ask: &Ask,
        align: usize,
        reserved: usize,
        owned: bool,
        info: &mut Option<Box<LiveInfo>>,
    ) -> Result<u64, Refusal> {
        if !state.clients[ask.client as usize].allows(reserved) {
            return Err(Refusal::Quota);
        }
        if let Some(streams) = &self.streams {
            if ask.stream != self.home {
                self.stream_call("validate", || streams.validate(ask.stream))
                    .map_err(Refusal::Error)?;
                self.order_after_home(state, &**streams, ask.stream, self.home)
                    .map_err(Refusal::Error)?;
            }
        }
        let mut taken = state.tlsf.allocate(reserved as u64, align as u64);
        if taken.is_none() && state.tlsf.cached().1 > 0 {
            // Merge what waits in the reuse cache and look again: a request fails only when
            // it fails with every free byte merged.
            state.tlsf.flush();
            taken = state.tlsf.allocate(reserved as u64, align as u64);
        }
        let Some((block, addr)) = taken else {
            return Err(Refusal::Capacity);
        };
        // Memory behind the block: map what is missing; when that fails, the block goes back
        // and the pool is as it was.
        let (block, addr) = if state.mapping.covers(addr, reserved as u64) {
            (block, addr)
        } else {
            self.map_block(state, block, addr, reserved, align)
                .map_err(Refusal::Error)?
        };
        let taken = Taken {
            block,
            addr,
            reserved,
        };
        let log = state.sink.is_some();
        self.commit_allocation(state, ask, owned, info.take(), taken, log);
        Ok(addr)
    }

    /// Maps the memory behind a block whose chunks are not all mapped (a growable region
    /// grows). When that fails (the device is out of memory), the block goes back to the free
    /// lists; if freed blocks wait in the reuse cache (all of them mapped), they are merged and
    /// the request looks once more, where it may find mapped memory. When that fails too, the
    /// pool is as it was (but for the merged cache) and the error (`OutOfMemory` with the
    /// driver's error name, when the device is out of memory) fails the request.
    ///
    /// The cache is not merged before the pool grows: merging it resets what it learned, and
    /// on the pool benchmark's workload that cut its hits from 93% to 28% and doubled the time
    /// of a pair, for a quarter of the memory mapped (see `BENCHMARKS.md`). A growable region so
    /// maps the addresses a classic region of the same workload would touch, no more.
    #[cold]
    #[inline(never)]
    fn map_block(
        &self,
        state: &mut State,
        block: u32,
        addr: u64,
        reserved: usize,
        align: usize,
    ) -> Result<(u32, u64), Error> {
        let Err(error) = state.mapping.ensure(addr, reserved as u64) else {
            return Ok((block, addr));
        };
        state.tlsf.free(block);
        if state.tlsf.cached().1 == 0 {
            return Err(error);
        }
        state.tlsf.flush();
        let Some((block, addr)) = state.tlsf.allocate(reserved as u64, align as u64) else {
            return Err(error);
        };
        if !state.mapping.covers(addr, reserved as u64) {
            if let Err(error) = state.mapping.ensure(addr, reserved as u64) {
                state.tlsf.free(block);
                return Err(error);
            }
        }
        Ok((block, addr))
    }

    /// Records a block taken for `ask`: the address map, the block's [`Live`], what tracking
    /// recorded, the counters, the event log.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn commit_allocation(
        &self,
        state: &mut State,
        ask: &Ask,
        owned: bool,
        info: Option<Box<LiveInfo>>,
        taken: Taken,
        log: bool,
    ) {
        let Taken {
            block,
            addr,
            reserved,
        } = taken;
        state.counts.on_alloc_bytes(reserved);
        state.clients[ask.client as usize]
            .counts
            .on_alloc(reserved, ask.size);
        state.live.insert_new(addr, block);
        let slot = block as usize;
        let tracked = info.is_some();
        let serial = state.next_serial;
        state.next_serial += 1;
        let live = Live {
            size: ask.size,
            serial,
            stream: ask.stream,
            client: ask.client,
            // At most MAX_POOL_ALIGN (4096).
            align: ask.align as u16,
            owned,
            tracked,
        };
        if state.meta.len() <= slot {
            grow_meta(&mut state.meta, slot);
        }
        // Field by field: the compiler builds a whole `Live` on the stack and copies it.
        let entry = &mut state.meta[slot];
        entry.size = live.size;
        entry.serial = live.serial;
        entry.stream = live.stream;
        entry.client = live.client;
        entry.align = live.align;
        entry.owned = live.owned;
        entry.tracked = live.tracked;
        if let Some(info) = info {
            store_info(&mut state.info, slot, info);
        }
        if log {
            let tag = tracked
                .then(|| state.info[slot].as_ref()?.tag.clone())
                .flatten();
            // A copy made here: a reference to the caller's would keep it on the stack.
            let ask = *ask;
            let tag = tag.as_deref();
            self.emit(state, PoolAction::Allocate, &ask, addr, reserved, tag, None);
        }
    }

    /// Makes `stream` wait for the home stream if the home stream freed anything since its
    /// last wait.
    fn order_after_home(
        &self,
        state: &mut State,
        streams: &dyn StreamSync,
        stream: StreamId,
        home: StreamId,
    ) -> Result<(), Error> {
        let epoch = state.home_epoch;
        let slot = state.waited.iter().position(|(s, _)| *s == stream);
        let last = slot.map_or(0, |i| state.waited[i].1);
        if last < epoch {
            self.stream_call("order_after", || streams.order_after(stream, home))?;
            match slot {
                Some(i) => state.waited[i].1 = epoch,
                None => state.waited.push((stream, epoch)),
            }
        }
        Ok(())
    }

    /// Returns parked blocks whose events completed to the free lists; the bytes reclaimed.
    ///
    /// An event that cannot be queried (the driver reports an error, or the stream runtime
    /// panics) sets aside its own block for good: nothing says the stream is done with it, so
    /// it is never handed out again. The pool carries on with the rest; the block is logged
    /// (target `devarena::pool`, level `error`) and counted in [`PoolStats::quarantined`].
    fn reclaim_parked(&self, state: &mut State) -> usize {
        let mut reclaimed = 0;
        let State {
            parked,
            tlsf,
            pending,
            quarantined,
            ..
        } = state;
        for (stream, queue) in parked.iter_mut() {
            while let Some(front) = queue.front() {
                let complete = self.stream_call("is_complete", || front.event.is_complete());
                match complete {
                    Ok(false) => break,
                    Ok(true) => {
                        let Some(parked) = queue.pop_front() else {
                            break;
                        };
                        match &parked.heap {
                            None => tlsf.free(parked.block),
                            Some(heap) => heap.state.lock_wait().tlsf.free(parked.block),
                        };
                        *pending -= parked.bytes;
                        reclaimed += parked.bytes;
                    }
                    Err(error) => {
                        let Some(parked) = queue.pop_front() else {
                            break;
                        };
                        *pending -= parked.bytes;
                        *quarantined += parked.bytes;
                        log::error!(
                            target: "devarena::pool",
                            "pool `{}`: the event of a block of {} bytes freed on stream {stream} \
                             could not be queried ({error}); the block is set aside for good \
                             and the pool carries on",
                            self.name,
                            parked.bytes
                        );
                    }
                }
            }
        }
        parked.retain(|(_, queue)| !queue.is_empty());
        if parked.is_empty() {
            self.flags.fetch_and(!PARKED, Ordering::Relaxed);
        }
        reclaimed
    }

    fn exhausted(&self, state: &mut State, ask: &Ask, limit: &'static str) -> Error {
        // The figures of the pool with every thread heap given back: the largest free block
        // counts merged blocks only.
        self.dissolve_all(state);
        state.tlsf.flush();
        let c = &state.clients[ask.client as usize];
        let (limit_bytes, in_use) = match limit {
            "quota" => (c.quota, c.counts.in_use),
            _ => (self.capacity, state.counts.in_use),
        };
        Error::PoolExhausted {
            client: String::from(&*c.name),
            requested: ask.size,
            align: ask.align,
            limit,
            limit_bytes,
            in_use,
            free: state.tlsf.free_bytes() as usize,
            largest_free: state.tlsf.largest_free() as usize,
            pending: state.pending,
        }
    }

    /// Frees `addr`. `caller`: the client asking (`None`: the pool itself, which may free any
    /// allocation). `from_slice`: the call comes from the [`PoolSlice`] that owns it.
    #[inline(always)]
    pub(super) fn deallocate(
        &self,
        caller: Option<u32>,
        req: FreeRequest,
        from_slice: bool,
    ) -> Result<(), Error> {
        let FreeRequest { addr, size, stream } = req;
        // As for `allocate`: the home stream or no stream runtime, known before the call
        // where the caller passes no stream.
        let home = match stream {
            None => true,
            Some(stream) => self.streams.is_none() || stream == self.home,
        };
        let stream = stream.unwrap_or(self.home);
        if home
            && size.is_none()
            && self.flags.load(Ordering::Relaxed) & HEAPS != 0
            && self.deallocate_on_thread_heap(caller, addr, from_slice)
        {
            return Ok(());
        }
        let mut state = self.lock()?;
        if home
            && size.is_none()
            && self
                .deallocate_fast(&mut state, caller, addr, stream, from_slice)
                .is_some()
        {
            return Ok(());
        }
        let result = self.deallocate_general(&mut state, caller, addr, size, stream, from_slice);
        // The backtrace (if any) is freed outside the lock.
        self.unlock_and_deliver(state, result).map(drop)
    }

    /// A free on the calling thread's heap, where it has one and the allocation is there:
    /// whether it freed.
    #[inline(never)]
    fn deallocate_on_thread_heap(&self, caller: Option<u32>, addr: u64, from_slice: bool) -> bool {
        match self.on_thread_heap(|heap| self.heap_deallocate_fast(heap, caller, addr, from_slice))
        {
            Some(Some(over)) => {
                if over {
                    self.shrink();
                }
                true
            }
            _ => false,
        }
    }

    /// The common case: a live allocation that `caller` may free, untracked, freed on the
    /// home stream or without a stream runtime (checked by the caller). It changes nothing
    /// unless it frees; `None`
    /// sends the call down [`deallocate_general`](Self::deallocate_general).
    #[inline(always)]
    fn deallocate_fast(
        &self,
        state: &mut State,
        caller: Option<u32>,
        addr: u64,
        stream: StreamId,
        from_slice: bool,
    ) -> Option<()> {
        let slot = state.live.find(addr)?;
        let block = state.live.value_at(slot);
        let live = state.meta[block as usize];
        if live.tracked
            || (live.owned && !from_slice)
            || caller.is_some_and(|caller| caller != live.client)
            || state.sink.is_some()
            || state.graphs.owns_blocks()
        {
            return None;
        }
        state.live.remove_at(slot);
        self.commit_free(state, addr, block, &live, stream, None, None);
        Some(())
    }

    /// Every free the fast path does not take: tracked allocations, other streams, and every
    /// refusal. Returns what tracking recorded, to be dropped outside the lock.
    #[inline(never)]
    fn deallocate_general(
        &self,
        state: &mut State,
        caller: Option<u32>,
        addr: u64,
        size: Option<usize>,
        stream: StreamId,
        from_slice: bool,
    ) -> Result<Option<Box<LiveInfo>>, Error> {
        let Some(block) = state.live.get(addr) else {
            return self.deallocate_on_heap(state, caller, addr, size, stream, from_slice);
        };
        let live = state.meta[block as usize];
        self.check_free(state, caller, addr, size, &live, from_slice)?;
        // A block a graph owns is held for it (`engine/graph.rs`).
        if state.graphs.owns_blocks() {
            if let Some(owner) = state.graphs.owner(addr) {
                return self.free_graph_block(state, addr, block, &live, stream, owner);
            }
        }
        // Record the event before changing anything, so a failing stream runtime leaves the
        // allocation live and the pool as it was.
        let event = match &self.streams {
            Some(streams) if stream != self.home => {
                Some(self.stream_call("record", || streams.record(stream))?)
            }
            _ => None,
        };
        let removed = state.live.remove(addr);
        debug_assert_eq!(removed, Some(block));
        let info = if live.tracked {
            state.info[block as usize].take()
        } else {
            None
        };
        let tag = info.as_ref().and_then(|i| i.tag.as_deref());
        self.commit_free(state, addr, block, &live, stream, event, tag);
        Ok(info)
    }

    /// Whether `caller` may free `live`, the live allocation at `addr`, with a free that names
    /// `size`.
    fn check_free(
        &self,
        state: &State,
        caller: Option<u32>,
        addr: u64,
        size: Option<usize>,
        live: &Live,
        from_slice: bool,
    ) -> Result<(), Error> {
        if (live.owned && !from_slice) || caller.is_some_and(|caller| caller != live.client) {
            return Err(self.refused_free(state, caller, addr, live, from_slice));
        }
        if let Some(size) = size.filter(|&size| size != live.size) {
            return Err(self.wrong_size(state, addr, size, live));
        }
        Ok(())
    }

    /// A free of an address that is no live allocation of the pool's index: one of a thread
    /// heap's (any thread's), or an unknown address.
    #[cold]
    #[inline(never)]
    fn deallocate_on_heap(
        &self,
        state: &mut State,
        caller: Option<u32>,
        addr: u64,
        size: Option<usize>,
        stream: StreamId,
        from_slice: bool,
    ) -> Result<Option<Box<LiveInfo>>, Error> {
        let unknown = |state: &State| Err(Self::unknown_address(state, caller, addr));
        let Some(heap) = Self::span_owner(state, addr) else {
            return unknown(state);
        };
        let found = {
            let h = heap.state.lock_wait();
            h.live.get(addr).map(|block| h.meta[block as usize])
        };
        let Some(live) = found else {
            return unknown(state);
        };
        self.check_free(state, caller, addr, size, &live, from_slice)?;
        // As in `deallocate_general`: the event first, with the heap unlocked (a callback
        // never runs with a heap locked).
        let event = match &self.streams {
            Some(streams) if stream != self.home => {
                Some(self.stream_call("record", || streams.record(stream))?)
            }
            _ => None,
        };
        let mut guard = heap.state.lock_wait();
        let h = &mut *guard;
        // The heap's thread may have freed it, and allocated there again, meanwhile.
        let Some(slot) = h.live.find(addr) else {
            return unknown(state);
        };
        let block = h.live.value_at(slot);
        let live = h.meta[block as usize];
        self.check_free(state, caller, addr, size, &live, from_slice)?;
        h.live.remove_at(slot);
        let reserved = match event {
            Some(event) => {
                let bytes = h.tlsf.block_size(block) as usize;
                self.park(state, stream, Some(heap.clone()), block, bytes, event);
                bytes
            }
            None => h.tlsf.release(block) as usize,
        };
        h.uncount(&live, reserved);
        drop(guard);
        if state.sink.is_some() {
            let ask = Ask {
                client: live.client,
                size: live.size,
                align: live.align as usize,
                stream,
            };
            self.emit(state, PoolAction::Free, &ask, addr, reserved, None, None);
        }
        Ok(None)
    }

    /// Returns the block of a freed allocation (already out of the address map) to the free
    /// lists, or parks it until `event` completes; counts it; logs it.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn commit_free(
        &self,
        state: &mut State,
        addr: u64,
        block: u32,
        live: &Live,
        stream: StreamId,
        event: Option<Box<dyn StreamEvent>>,
        tag: Option<&str>,
    ) {
        let reserved = match event {
            Some(event) => {
                let reserved = state.tlsf.block_size(block) as usize;
                self.park(state, stream, None, block, reserved, event);
                reserved
            }
            None => {
                if self.streams.is_some() {
                    state.home_epoch += 1;
                }
                state.tlsf.release(block) as usize
            }
        };
        state.counts.on_free_bytes(reserved);
        state.clients[live.client as usize]
            .counts
            .on_free(reserved, live.size);
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

    #[cold]
    #[inline(never)]
    fn unknown_address(state: &State, caller: Option<u32>, addr: u64) -> Error {
        Error::UnknownAddress {
            addr,
            client: String::from(&*state.clients[caller.unwrap_or(0) as usize].name),
        }
    }

    /// A free that names another size than the live allocation at `addr` asked for: most
    /// likely a stale free of an address that has been handed out again since.
    #[cold]
    #[inline(never)]
    fn wrong_size(&self, state: &State, addr: u64, size: usize, live: &Live) -> Error {
        let owner = &state.clients[live.client as usize].name;
        Error::invalid(format!(
            "pool `{}`: a free of {addr:#x} names {size} bytes, but the live allocation there \
             (client `{owner}`, allocation #{}) asked for {} bytes: probably a stale free of an \
             address handed out again; nothing was freed",
            self.name, live.serial, live.size
        ))
    }

    /// Why `caller` may not free the live allocation at `addr`.
    #[cold]
    #[inline(never)]
    fn refused_free(
        &self,
        state: &State,
        caller: Option<u32>,
        addr: u64,
        live: &Live,
        from_slice: bool,
    ) -> Error {
        let owner = &state.clients[live.client as usize].name;
        if live.owned && !from_slice {
            return Error::invalid(format!(
                "pool `{}`: address {addr:#x} belongs to a PoolSlice of client `{owner}`; drop \
                 the slice to free it",
                self.name
            ));
        }
        let caller = caller.map_or_else(String::new, |c| {
            String::from(&*state.clients[c as usize].name)
        });
        Error::invalid(format!(
            "pool `{}`: client `{caller}` cannot free {addr:#x}: it belongs to client `{owner}`",
            self.name
        ))
    }

    /// Parks a block freed on another stream until `event` completes.
    #[cold]
    #[inline(never)]
    fn park(
        &self,
        state: &mut State,
        stream: StreamId,
        heap: Option<Arc<ThreadHeap>>,
        block: u32,
        bytes: usize,
        event: Box<dyn StreamEvent>,
    ) {
        let parked = Parked {
            heap,
            block,
            bytes,
            event,
        };
        self.flags.fetch_or(PARKED, Ordering::Relaxed);
        state.pending += bytes;
        match state.parked.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, queue)) => queue.push_back(parked),
            None => state.parked.push((stream, VecDeque::from([parked]))),
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
        loop {
            if self
                .delivering
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                return;
            }
            loop {
                // Taken one at a time, so that a sink that calls the pool finds it unlocked.
                let Some(record) = self.lock_wait().outbox.pop_front() else {
                    break;
                };
                if !record.deliver(&self.name) && !self.sink_panicked.swap(true, Ordering::Relaxed)
                {
                    log::error!(
                        target: "devarena::pool",
                        "pool `{}`: the event sink panicked on a `{}` event at {:#x}; the pool \
                         carries on, and drops each event whose sink panics (reported once)",
                        self.name,
                        record.action,
                        record.addr
                    );
                }
            }
            self.delivering.store(false, Ordering::Release);
            if self.lock_wait().outbox.is_empty() {
                return;
            }
        }
    }

    /// Unmaps chunks of a growable region that hold no live byte until at most `keep` bytes
    /// stay mapped; returns the bytes unmapped (always 0 for a classic region).
    ///
    /// Stream order: a block freed on the home stream is free at once, while work queued
    /// there may still use it; a block freed on another stream is parked until its event
    /// completes, so it is safe once free. The home stream is therefore synchronized before
    /// anything is unmapped, outside the lock so that other threads keep allocating; if a free
    /// on the home stream came in meanwhile (its work may be queued after the wait), the wait
    /// is repeated, and after [`TRIM_TRIES`] tries done under the lock.
    pub(super) fn trim_to(&self, keep: usize) -> Result<usize, Error> {
        if !self.growable {
            return Ok(0);
        }
        for _ in 0..TRIM_TRIES {
            let epoch = {
                let mut state = self.lock()?;
                if !self.prepare_trim(&mut state, keep) {
                    return Ok(0);
                }
                state.home_epoch
            };
            self.synchronize_home()?;
            let mut state = self.lock()?;
            if state.home_epoch == epoch {
                return Self::unmap_free(&mut state, keep);
            }
        }
        let mut state = self.lock()?;
        if !self.prepare_trim(&mut state, keep) {
            return Ok(0);
        }
        if let Some(streams) = &self.streams {
            self.stream_call("synchronize", || streams.synchronize(self.home))?;
        }
        Self::unmap_free(&mut state, keep)
    }

    /// Where more than `keep` bytes are mapped: gives every thread heap back, merges what
    /// waits in the reuse cache and takes back parked blocks whose events have completed;
    /// whether more than `keep` bytes are mapped.
    fn prepare_trim(&self, state: &mut State, keep: usize) -> bool {
        // Nothing to give back: the heaps and the reuse cache stay as they are.
        if state.mapping.mapped_bytes() <= keep {
            return false;
        }
        self.dissolve_all(state);
        state.tlsf.flush();
        if !state.parked.is_empty() {
            self.reclaim_parked(state);
        }
        state.mapping.mapped_bytes() > keep
    }

    /// Unmaps the chunks inside free blocks (none of which queued work can still touch).
    fn unmap_free(state: &mut State, keep: usize) -> Result<usize, Error> {
        state.tlsf.flush();
        let State { tlsf, mapping, .. } = state;
        mapping.trim(tlsf.free_ranges(), keep)
    }

    /// Waits for everything queued on the home stream so far, without the lock (nothing to
    /// wait for without a stream runtime: frees are then reusable at once).
    fn synchronize_home(&self) -> Result<(), Error> {
        let Some(streams) = &self.streams else {
            return Ok(());
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            streams.synchronize(self.home)
        }))
        .unwrap_or_else(|_| {
            Err(Error::invalid(format!(
                "pool `{}`: the stream runtime panicked in `synchronize`",
                self.name
            )))
        })
    }

    /// Waits for the home stream, takes back parked blocks whose events have completed, and
    /// trims to the release threshold; returns the bytes unmapped.
    pub(super) fn synchronize(&self) -> Result<usize, Error> {
        self.synchronize_home()?;
        let keep = {
            let mut state = self.lock()?;
            if !state.parked.is_empty() {
                self.reclaim_parked(&mut state);
            }
            state.mapping.release_threshold
        };
        self.trim_to(keep)
    }

    /// Bytes [`synchronize`](Self::synchronize) leaves mapped.
    pub(super) fn release_threshold(&self) -> usize {
        self.lock_wait().mapping.release_threshold
    }

    pub(super) fn set_release_threshold(&self, bytes: usize) {
        self.lock_wait().mapping.release_threshold = bytes;
    }

    pub(super) fn stats(&self) -> PoolStats {
        let mut state = self.lock_wait();
        // Every thread heap gives its spans back, and what waits in the reuse cache is merged,
        // so that the free blocks described are the ones that exist (and every count is the
        // pool's own).
        self.dissolve_all(&mut state);
        state.tlsf.flush();
        let mapping = state.mapping.stats();
        let mut clients = Counters::default();
        for c in &state.clients {
            clients.requested += c.counts.requested;
            clients.allocations += c.counts.allocations;
            clients.frees += c.counts.frees;
            clients.failures += c.counts.failures;
        }
        PoolStats {
            capacity: self.capacity,
            in_use: state.counts.in_use,
            requested: clients.requested,
            peak: state.counts.peak,
            allocations: clients.allocations,
            frees: clients.frees,
            failures: clients.failures,
            live: state.live.len() as u64,
            free: state.tlsf.free_bytes() as usize,
            pending: state.pending,
            quarantined: state.quarantined,
            largest_free: state.tlsf.largest_free() as usize,
            free_blocks: state.tlsf.free_blocks(),
            mapped: mapping.mapped,
            peak_mapped: mapping.peak_mapped,
            chunk: mapping.chunk,
            maps: mapping.maps,
            unmaps: mapping.unmaps,
            reused: state.tlsf.reused() + state.reused,
        }
    }

    pub(super) fn leak_report(&self) -> LeakReport {
        let mut state = self.lock_wait();
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
        if !self.lock_wait().outbox.is_empty() {
            self.deliver();
        }
        if self.log_leaks_on_drop {
            let report = self.leak_report();
            if !report.is_empty() {
                log::warn!(target: "devarena::pool", "{report}");
            }
        }
        self.drop_heaps();
    }
}

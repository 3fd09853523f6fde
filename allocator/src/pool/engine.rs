//! The engine: everything behind the pool's lock, and the allocation and free paths.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::backtrace::Backtrace;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Instant, SystemTime};

use super::addr_map::AddrMap;
use super::counters::Counters;
use super::events::{self, EventSink, PoolAction, Record};
use super::graph::Graphs;
use super::lock::{Lock, LockGuard, Reentrant};
use super::region::{Region, RegionOwner};
use super::stats::{ClientStats, Leak, LeakReport, PoolStats, Tracking};
use super::stream::{StreamEvent, StreamId, StreamSync};
use super::tlsf::Tlsf;
use super::vmm::Mapping;
use super::{
    AllocRequest, DEFAULT_POOL_ALIGN, FreeRequest, MAX_POOL_ALIGN, effective_align, reserved_bytes,
};
use crate::backend::MemoryKind;
use crate::error::Error;

// Graph reservations: the engine's side lives in `engine/graph.rs`.
mod graph;

/// How often [`Shared::trim_to`] waits for the home stream outside the lock before it waits
/// under it (each retry means a free on the home stream came in during the wait).
const TRIM_TRIES: usize = 3;

/// What tracking keeps for one allocation.
struct LiveInfo {
    tag: Option<String>,
    at: Instant,
    backtrace: Option<Backtrace>,
}

/// One live allocation, kept at its block's index. Plain data (no drop glue), so that writing
/// it on allocation and reading it on free are a few moves; what tracking records lives in
/// [`State::info`], touched only for an allocation made with tracking on.
#[derive(Clone, Copy, Default)]
struct Live {
    size: usize,
    serial: u64,
    stream: StreamId,
    client: u32,
    /// The alignment in effect (at most [`MAX_POOL_ALIGN`]).
    align: u16,
    /// Owned by a [`PoolSlice`]: only the slice frees it.
    owned: bool,
    /// Its block's entry of [`State::info`] holds what tracking recorded.
    tracked: bool,
}

/// A block freed on a stream other than the home stream, waiting for its event.
struct Parked {
    block: u32,
    bytes: usize,
    event: Box<dyn StreamEvent>,
}

/// One client: a name, a quota, its counters.
pub(super) struct ClientState {
    pub(super) name: Arc<str>,
    pub(super) quota: usize,
    pub(super) counts: Counters,
}

impl ClientState {
    pub(super) fn new(name: &str, quota: usize) -> Self {
        ClientState {
            name: Arc::from(name),
            quota,
            counts: Counters::default(),
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
struct State {
    tlsf: Tlsf,
    /// Address of every live allocation → its block.
    live: AddrMap,
    /// What is known about the live allocation in each block (indexed like the TLSF blocks;
    /// entries of free blocks are stale).
    meta: Vec<Live>,
    /// What tracking recorded, by block, for the live allocations whose `tracked` is set
    /// (`None` everywhere else; empty while tracking has never been on).
    info: Vec<Option<Box<LiveInfo>>>,
    pub(super) clients: Vec<ClientState>,
    /// The pool's own counters: every client's together.
    counts: Counters,
    /// Parked blocks, one FIFO per stream (events on one stream complete in order).
    parked: Vec<(StreamId, VecDeque<Parked>)>,
    pending: usize,
    /// Bytes of parked blocks whose events could not be queried: never handed out again.
    quarantined: usize,
    /// Bumped by every free on the home stream with a stream runtime present.
    home_epoch: u64,
    /// For each other stream: the `home_epoch` at its last wait on the home stream.
    waited: Vec<(StreamId, u64)>,
    sink: Option<Arc<dyn EventSink>>,
    /// Events recorded and not yet delivered, in the order the pool did things.
    outbox: VecDeque<Record>,
    /// Which chunks of the region are backed by memory (all of a classic region).
    mapping: Mapping,
    /// Graph reservations: the blocks graphs own and hold (`pool/graph.rs`).
    graphs: Graphs,
}

/// What never changes after creation, beside the lock.
pub(super) struct Shared {
    state: Lock<State>,
    pub(super) name: String,
    pub(super) capacity: usize,
    pub(super) base: u64,
    pub(super) memory: MemoryKind,
    pub(super) backend: &'static str,
    tracking: AtomicU8,
    pub(super) streams: Option<Arc<dyn StreamSync>>,
    pub(super) home: StreamId,
    log_leaks_on_drop: bool,
    /// A thread is handing the outbox to the sinks (see [`deliver`](Shared::deliver)).
    delivering: AtomicBool,
    /// A sink has panicked (reported once).
    sink_panicked: AtomicBool,
    /// Whether memory is mapped on demand (and can be trimmed).
    pub(super) growable: bool,
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
}

/// A block the TLSF index handed out for a request: its index, address and size.
struct Taken {
    block: u32,
    addr: u64,
    reserved: usize,
}

/// The parts of a request that an event and an error report.
#[derive(Clone, Copy)]
struct Ask {
    client: u32,
    size: usize,
    align: usize,
    stream: StreamId,
}

impl Shared {
    /// A pool over `region`, with one client: the pool's own, named after it, without quota.
    pub(super) fn new(settings: Settings, region: Region) -> Self {
        let Region {
            base,
            capacity,
            memory,
            backend,
            owner,
            mut mapping,
        } = region;
        let growable = mapping.is_growable();
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
            sink: settings.sink,
            outbox: VecDeque::new(),
            mapping,
            graphs: Graphs::default(),
        };
        Shared {
            state: Lock::new(state),
            name: settings.name,
            capacity,
            base,
            memory,
            backend,
            tracking: AtomicU8::new(settings.tracking as u8),
            streams: settings.streams,
            home: settings.home,
            log_leaks_on_drop: settings.log_leaks_on_drop,
            delivering: AtomicBool::new(false),
            sink_panicked: AtomicBool::new(false),
            growable,
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
        self.lock_wait().clients[client as usize].stats()
    }

    /// Every client's counters, the pool's own client first.
    pub(super) fn all_client_stats(&self) -> Vec<ClientStats> {
        self.lock_wait()
            .clients
            .iter()
            .map(ClientState::stats)
            .collect()
    }

    /// Replaces the event sink.
    pub(super) fn set_sink(&self, sink: Option<Arc<dyn EventSink>>) {
        self.lock_wait().sink = sink;
    }

    /// Changes what is recorded for new allocations.
    pub(super) fn set_tracking(&self, tracking: Tracking) {
        self.tracking.store(tracking as u8, Ordering::Relaxed);
    }

    /// Returns parked blocks whose events completed; the bytes reclaimed.
    pub(super) fn reclaim(&self) -> Result<usize, Error> {
        Ok(self.reclaim_parked(&mut *self.lock()?))
    }

    /// Takes the lock for an allocation, a free or a reclaim: an error instead of waiting for
    /// ever when the calling thread is inside one of this pool's stream-runtime callbacks.
    #[inline(always)]
    fn lock(&self) -> Result<LockGuard<'_, State>, Error> {
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
    fn lock_wait(&self) -> LockGuard<'_, State> {
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
        match self.tracking.load(Ordering::Relaxed) {
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
        if let (0, Some(align), true) = (self.tracking.load(Ordering::Relaxed), align, home) {
            let stream = req.stream.unwrap_or(self.home);
            let mut state = self.lock()?;
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
            return self.unlock_and_deliver(state, result);
        }
        let req = AllocRequest { ..req };
        self.allocate_other(client, &req, owned)
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
        let info = match self.tracking.load(Ordering::Relaxed) {
            0 => None,
            _ => Some(self.record_info(req.tag)),
        };
        let mut state = self.lock()?;
        let result = self.allocate_general(&mut state, client, req, stream, owned, info);
        self.unlock_and_deliver(state, result)
    }

    /// Releases the lock, then delivers the events the call recorded (if any).
    #[inline(always)]
    fn unlock_and_deliver<R>(&self, state: LockGuard<'_, State>, result: R) -> R {
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
        if !state.parked.is_empty() || state.sink.is_some() {
            return None;
        }
        let reserved = reserved_bytes(ask.size).filter(|&r| r <= self.capacity)?;
        if !state.clients[ask.client as usize].allows(reserved) {
            return None;
        }
        let (block, addr) = state.tlsf.allocate(reserved as u64, ask.align as u64)?;
        // Memory behind the block: mapped already, or the general path maps it.
        if !state.mapping.covers(addr, reserved as u64) {
            state.tlsf.free(block);
            return None;
        }
        let taken = Taken {
            block,
            addr,
            reserved,
        };
        self.commit_allocation(state, ask, owned, None, taken);
        Some(addr)
    }

    /// Every allocation the fast path does not take: tracking on, a bad alignment, parked
    /// blocks, another stream, and every failure.
    #[inline(never)]
    fn allocate_general(
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
    fn allocation_failed(
        &self,
        state: &mut State,
        ask: &Ask,
        tag: Option<&str>,
        error: Error,
    ) -> Error {
        state.counts.on_failure();
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
        if !state.clients[ask.client as usize].allows(reserved) {
            return Err(self.exhausted(state, ask, "quota"));
        }
        if let Some(streams) = &self.streams {
            if ask.stream != self.home {
                self.stream_call("validate", || streams.validate(ask.stream))?;
                self.order_after_home(state, &**streams, ask.stream, self.home)?;
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
            return Err(self.exhausted(state, ask, "capacity"));
        };
        // Memory behind the block: map what is missing; when that fails, the block goes back
        // and the pool is as it was.
        let (block, addr) = if state.mapping.covers(addr, reserved as u64) {
            (block, addr)
        } else {
            self.map_block(state, block, addr, reserved, align)?
        };
        let taken = Taken {
            block,
            addr,
            reserved,
        };
        self.commit_allocation(state, ask, owned, info, taken);
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
    #[inline(always)]
    fn commit_allocation(
        &self,
        state: &mut State,
        ask: &Ask,
        owned: bool,
        info: Option<Box<LiveInfo>>,
        taken: Taken,
    ) {
        let Taken {
            block,
            addr,
            reserved,
        } = taken;
        state.counts.on_alloc(reserved, ask.size);
        state.clients[ask.client as usize]
            .counts
            .on_alloc(reserved, ask.size);
        state.live.insert_new(addr, block);
        let slot = block as usize;
        let tracked = info.is_some();
        let live = Live {
            size: ask.size,
            serial: state.counts.allocations,
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
        if state.sink.is_some() {
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
                        tlsf.free(parked.block);
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
        reclaimed
    }

    fn exhausted(&self, state: &mut State, ask: &Ask, limit: &'static str) -> Error {
        // The largest free block counts merged blocks only.
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
            return Err(Self::unknown_address(state, caller, addr));
        };
        let live = state.meta[block as usize];
        if (live.owned && !from_slice) || caller.is_some_and(|caller| caller != live.client) {
            return Err(self.refused_free(state, caller, addr, &live, from_slice));
        }
        if let Some(size) = size.filter(|&size| size != live.size) {
            return Err(self.wrong_size(state, addr, size, &live));
        }
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
                Self::park(state, stream, block, reserved, event);
                reserved
            }
            None => {
                if self.streams.is_some() {
                    state.home_epoch += 1;
                }
                state.tlsf.release(block) as usize
            }
        };
        state.counts.on_free(reserved, live.size);
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
        state: &mut State,
        stream: StreamId,
        block: u32,
        bytes: usize,
        event: Box<dyn StreamEvent>,
    ) {
        let parked = Parked {
            block,
            bytes,
            event,
        };
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

    /// Merges what waits in the reuse cache and takes back parked blocks whose events have
    /// completed; whether more than `keep` bytes are mapped.
    fn prepare_trim(&self, state: &mut State, keep: usize) -> bool {
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
        // What waits in the reuse cache is merged first, so that the free blocks described are
        // the ones that exist.
        state.tlsf.flush();
        let mapping = state.mapping.stats();
        PoolStats {
            capacity: self.capacity,
            in_use: state.counts.in_use,
            requested: state.counts.requested,
            peak: state.counts.peak,
            allocations: state.counts.allocations,
            frees: state.counts.frees,
            failures: state.counts.failures,
            live: state.live.len() as u64,
            free: state.tlsf.free_bytes() as usize,
            pending: state.pending,
            quarantined: state.quarantined,
            largest_free: state.tlsf.largest_free() as usize,
            free_blocks: state.tlsf.free_blocks(),
            reused: state.tlsf.reused(),
            mapped: mapping.mapped,
            peak_mapped: mapping.peak_mapped,
            chunk: mapping.chunk,
            maps: mapping.maps,
            unmaps: mapping.unmaps,
        }
    }

    pub(super) fn leak_report(&self) -> LeakReport {
        let state = self.lock_wait();
        let now = Instant::now();
        let info = |block: u32| -> Option<&LiveInfo> {
            state.meta[block as usize]
                .tracked
                .then(|| state.info[block as usize].as_deref())?
        };
        let mut leaks: Vec<Leak> = state
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
        leaks.sort_by_key(|l| l.addr);
        LeakReport {
            pool: self.name.clone(),
            capacity: self.capacity,
            leaks,
        }
    }
}

/// Makes room for `meta[slot]` (the TLSF index made a new block).
#[cold]
#[inline(never)]
fn grow_meta(meta: &mut Vec<Live>, slot: usize) {
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
            let live = self.lock_wait().live.len();
            if live > 0 {
                log::warn!(target: "devarena::pool", "{}", self.leak_report());
            }
        }
    }
}

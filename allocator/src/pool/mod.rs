//! A runtime pool: one region reserved at creation, sub-allocated under the TensorRT
//! `IGpuAllocator` contract.
//!
//! Compile-time layouts ([`Arena`](crate::Arena)) serve buffers whose sizes are known ahead.
//! Memory whose size is known only at run time (weights loaded at start, workspaces that depend
//! on input shapes) comes from a [`Pool`]: it reserves **one** region on a
//! [`Backend`] when it is made and hands out pieces of it. It is what a TensorRT
//! `IGpuAllocator` or a PyTorch pluggable allocator needs:
//!
//! * `allocate(size, align)` returns an address; `deallocate(addr)` needs no size (the pool
//!   keeps its own map). Every call is thread-safe ([`Pool`] and [`PoolClient`] are `Send +
//!   Sync`).
//! * Alignment: any power of two up to [`MAX_ALIGN`] (4096); `0` means "any", which is 256
//!   ([`DEFAULT_POOL_ALIGN`]); anything else is an [`Error::InvalidArgument`] naming the number.
//!   Every block starts on a 256-byte boundary and spans a multiple of 256 bytes, like
//!   `cudaMalloc`'s.
//! * **Size 0** is a valid request: it takes one 256-byte block and returns a unique, aligned
//!   address inside the region that must be freed like any other (so a caller that treats a
//!   null pointer as out of memory, as TensorRT does, never sees one).
//! * The capacity is a **hard cap**, and [`Pool::client`] shares one pool between several users
//!   under per-client **quotas**. A request over either fails with
//!   [`Error::PoolExhausted`] naming the client, the request, the limit and what is free; nothing
//!   already allocated is disturbed.
//! * All metadata lives on the host, never inside the region (which may be device memory).
//! * Allocation and free are O(1): a two-level segregated fit (TLSF) index with bitmaps,
//!   coalescing free neighbours, behind one lock (a compare-and-swap to take it, a store to
//!   release it). A free block of [`guaranteed_fit`] bytes always satisfies a request.
//! * Sizes round up to their size class ([`reserved_bytes`]: less than 1/32 more above 8 KiB),
//!   so that a freed block can wait whole in a bounded **reuse cache** and serve the next
//!   request of its class without a search, a split or a merge ([`PoolBuilder::reuse`]).
//!   Everything waiting merges before a request would fail and before [`Pool::stats`]
//!   describes the free blocks: the cache changes the cost of a call, not what succeeds.
//!
//! Observability: [`Pool::stats`] (current, peak, counts, requested vs reserved, largest free
//! block, fragmentation), a tracking mode ([`Tracking`]) that records each live allocation's tag
//! and optionally a backtrace, [`Pool::leak_report`] on demand and logged on drop, and an event
//! log of allocations, frees and failures to the `log` facade ([`LogEvents`]), a callback, or a
//! CSV file in RMM's replay-log format ([`CsvEventLog`]). Stream ordering for device pools (when
//! a freed block may be reused, and on which stream) is described in the [`stream`] module.
//!
//! # Backends and devices
//!
//! [`Pool::host`] reserves host memory; [`Pool::new_in`] (or [`PoolBuilder::build_in`]) takes
//! any [`Backend`] that is `Send + Sync`. A device pool that serves several streams also gets a
//! [`StreamSync`] ([`PoolBuilder::streams`]); its [`PoolSlice`]s are not host memory and convert
//! to device views instead. With the `cuda` feature, `Pool::cuda(stream, capacity)` (or
//! `PoolBuilder::build_cuda(stream)`) does all of that: one `cuMemAlloc` region, the CUDA
//! events of `pool::cuda::CudaStreams`, `stream` as the home stream; and
//! `PoolSlice::device_view(&stream)` / `device_view_mut(&stream)` give cudarc views.
//!
//! # Performance
//!
//! `cargo bench -p devarena --bench pool_pairs` runs alloc+free pairs (64 live, sizes
//! log-uniform in 256 B … 4 MiB) against the system allocator and prints the median ns per pair
//! for 1 and 4 threads (`-- --json` for a machine-readable form), with the pool's reuse cache on
//! (the default) and off; with `--features cuda` on a GPU it adds a pool on device memory and
//! `cuMemAllocAsync` / `cuMemFreeAsync` in the same run.
//!
//! The common case is one straight path: a valid alignment, tracking off, nothing parked on
//! another stream, the home stream, within quota and capacity. `allocate` and `deallocate` are
//! `#[inline]`, so it inlines into the caller. On the benchmark's workload, where 93% of the
//! requests find a block of their class in the reuse cache, a pair takes about 380
//! instructions, the benchmark's own loop and both lock round trips included, and 0.5
//! mispredicted branches (callgrind; about 520 and 1.5 with the cache off). Tracking,
//! event sinks, other streams and every failure take a general path, kept out of line, that
//! decides the same way and reports why. Threads that share a pool serialize on its lock; a
//! waiter backs off before it looks again, so that the thread holding the lock keeps it, and the
//! pool's state in its caches, for a run of calls.
//!
//! # Example
//!
//! ```
//! use devarena::{Error, Pool};
//! use devarena::pool::Tracking;
//!
//! // One 64 MiB region; two models share it, each under a quota.
//! let pool = Pool::builder(64 << 20).name("engines").tracking(Tracking::Tags).build_host()?;
//! let detector = pool.client("detector", 48 << 20);
//! let classifier = pool.client("classifier", 32 << 20);
//!
//! // The IGpuAllocator face: addresses in, addresses out.
//! let weights = detector.allocate(40 << 20, 0)?;
//! assert_eq!(weights % 256, 0);
//! let workspace = classifier.allocate(1000, 4096)?;
//! assert_eq!(workspace % 4096, 0);
//!
//! // Over a quota: an error that names the client and the numbers; nothing else changes.
//! let err = detector.allocate(16 << 20, 0).unwrap_err();
//! assert!(matches!(err, Error::PoolExhausted { limit: "quota", .. }));
//! assert!(err.to_string().contains("detector"));
//!
//! // Typed, freed on drop; host pools give `&mut [T]`.
//! {
//!     let mut scores = classifier.alloc_slice::<f32>(1024)?;
//!     scores.as_mut_slice()?.fill(0.5);
//!     assert_eq!(pool.stats().live, 3);
//! }
//!
//! let stats = pool.stats();
//! assert_eq!((stats.live, stats.in_use), (2, (40 << 20) + 1024));
//! assert_eq!(stats.requested, (40 << 20) + 1000);
//!
//! // What is still live, by client (and tag, and backtrace when tracking asks for it).
//! let report = pool.leak_report();
//! assert_eq!(report.leaks.len(), 2);
//! println!("{report}");
//!
//! detector.deallocate(weights)?;
//! classifier.deallocate(workspace)?;
//! assert_eq!(pool.stats().largest_free, 64 << 20);
//! # Ok::<(), Error>(())
//! ```

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use std::backtrace::Backtrace;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Instant, SystemTime};

use crate::backend::{Allocation, Backend, HostBackend, MemoryKind};
use crate::error::Error;

mod addr_map;
#[cfg(feature = "cuda")]
pub mod cuda;
mod events;
mod lock;
mod slice;
mod stats;
pub mod stream;
mod tlsf;

pub use events::{
    CSV_HEADER, CsvEventLog, EventSink, LogEvents, PoolAction, PoolEvent, format_time,
};
pub use slice::PoolSlice;
pub use stats::{ClientStats, Leak, LeakReport, PoolStats, Tracking};
pub use stream::{ManualStreams, StreamEvent, StreamId, StreamSync};

use addr_map::AddrMap;
use lock::{Lock, LockGuard};
use tlsf::{GRANULE, Tlsf};

/// The largest alignment a pool hands out.
pub const MAX_ALIGN: usize = 4096;
/// The alignment of a request that asks for `0` ("any"), and the smallest any block has.
pub const DEFAULT_POOL_ALIGN: usize = 256;
/// Every block is a multiple of this many bytes (and starts at a multiple of it).
pub const BLOCK_GRANULE: usize = GRANULE as usize;
/// How many freed blocks wait for reuse by default (see [`PoolBuilder::reuse`]).
pub const DEFAULT_REUSE_BLOCKS: usize = 2048;
/// The alignment the pool asks its backend for (it aligns the region itself).
const REGION_ALIGN: usize = 16;

/// The smallest free block that guarantees an allocation of `size` bytes at `align` succeeds
/// (when the client's quota allows it): [`reserved_bytes`] of the size, plus the worst
/// alignment padding, rounded up to the start of the next TLSF size class (at most 1/32
/// more). `None` when the numbers overflow or `align` is not valid.
///
/// A request can also succeed with less (a block that happens to be aligned, or an exact fit);
/// it is this bound that the pool promises.
///
/// ```
/// use devarena::pool::guaranteed_fit;
/// assert_eq!(guaranteed_fit(1, 0), Some(256));
/// assert_eq!(guaranteed_fit(1000, 4096), Some(1024 + 4096 - 256));
/// assert_eq!(guaranteed_fit(1 << 20, 0), Some(1 << 20));
/// assert_eq!(guaranteed_fit((1 << 20) + 1, 0), Some((1 << 20) + (1 << 15)));
/// ```
pub fn guaranteed_fit(size: usize, align: usize) -> Option<usize> {
    let align = effective_align(align)?;
    let reserved = reserved_bytes(size)?;
    tlsf::guaranteed_fit(reserved as u64, align as u64).and_then(|b| usize::try_from(b).ok())
}

/// The bytes a request of `size` takes from a pool (256 for `0`): `size` rounded up to 256,
/// then up to its size class. Up to 8 KiB every multiple of 256 is a class; above, a power of
/// two is split into 32 classes, so the second rounding adds less than 1/32 (about 1.1% on
/// average for sizes spread evenly on a log scale). Every block of a class then has one size,
/// which is what lets a freed block be handed out again whole (see [`PoolBuilder::reuse`]).
/// `None` on overflow.
///
/// ```
/// use devarena::pool::reserved_bytes;
/// assert_eq!(reserved_bytes(0), Some(256));
/// assert_eq!(reserved_bytes(257), Some(512));
/// assert_eq!(reserved_bytes(8192), Some(8192));
/// assert_eq!(reserved_bytes(1 << 20), Some(1 << 20));
/// assert_eq!(reserved_bytes((1 << 20) + 1), Some((1 << 20) + (1 << 15)));
/// assert_eq!(reserved_bytes(usize::MAX), None);
/// ```
#[inline]
pub fn reserved_bytes(size: usize) -> Option<usize> {
    let granule = BLOCK_GRANULE;
    let rounded = size.max(1).checked_add(granule - 1)? & !(granule - 1);
    usize::try_from(tlsf::class_size(rounded as u64)?).ok()
}

/// The alignment a request gets: `0` → 256, a power of two up to 4096 → itself (at least 256);
/// anything else → `None`.
#[inline]
fn effective_align(align: usize) -> Option<usize> {
    match align {
        0 => Some(DEFAULT_POOL_ALIGN),
        a if a.is_power_of_two() && a <= MAX_ALIGN => Some(a),
        _ => None,
    }
}

/// One allocation request, for [`PoolClient::allocate_with`]: size, alignment, stream and tag.
///
/// ```
/// use devarena::pool::{AllocRequest, Pool, StreamId, Tracking};
///
/// let pool = Pool::builder(1 << 20).tracking(Tracking::Tags).build_host()?;
/// let addr = pool.allocate_with(AllocRequest::new(4000, 512).tag("kv-cache"))?;
/// assert_eq!(pool.leak_report().leaks[0].tag.as_deref(), Some("kv-cache"));
/// pool.deallocate(addr)?;
/// # Ok::<(), devarena::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocRequest<'a> {
    /// Bytes (0 is allowed: see the [module docs](self)).
    pub size: usize,
    /// Alignment: 0 ("any", i.e. 256) or a power of two up to 4096.
    pub align: usize,
    /// The stream the memory will be used on; `None` for the pool's home stream.
    pub stream: Option<StreamId>,
    /// A label kept with the allocation while tracking is on (shows in the leak report).
    pub tag: Option<&'a str>,
}

impl<'a> AllocRequest<'a> {
    /// `size` bytes at `align`, on the home stream, untagged.
    pub fn new(size: usize, align: usize) -> Self {
        AllocRequest {
            size,
            align,
            stream: None,
            tag: None,
        }
    }

    /// For use on `stream`.
    pub fn on(self, stream: StreamId) -> Self {
        AllocRequest {
            stream: Some(stream),
            ..self
        }
    }

    /// With a tag (kept only while tracking is on).
    pub fn tag(self, tag: &'a str) -> Self {
        AllocRequest {
            tag: Some(tag),
            ..self
        }
    }
}

/// Owns the region a pool reserved; frees it on drop. Erases the backend's type so that
/// [`Pool`] is not generic.
trait RegionOwner: Send + Sync {}

struct OwnedRegion<B: Backend> {
    backend: B,
    allocation: Allocation,
}

impl<B: Backend + Send + Sync> RegionOwner for OwnedRegion<B> {}

impl<B: Backend> Drop for OwnedRegion<B> {
    fn drop(&mut self) {
        // SAFETY: the allocation came from this backend's `allocate` and is freed once, here:
        // the owner is dropped only when the last handle to the pool goes, so no address the
        // pool handed out can be used through the pool afterwards.
        if let Err(error) = unsafe { self.backend.deallocate(&self.allocation) } {
            log::error!(
                target: "devarena::pool",
                "freeing a pool's region of {} bytes at {:#x} failed: {error}",
                self.allocation.bytes,
                self.allocation.addr
            );
        }
    }
}

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
    /// The alignment in effect (at most [`MAX_ALIGN`]).
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

struct ClientState {
    name: Arc<str>,
    quota: usize,
    in_use: usize,
    requested: usize,
    peak: usize,
    allocations: u64,
    frees: u64,
    failures: u64,
}

impl ClientState {
    fn new(name: &str, quota: usize) -> Self {
        ClientState {
            name: Arc::from(name),
            quota,
            in_use: 0,
            requested: 0,
            peak: 0,
            allocations: 0,
            frees: 0,
            failures: 0,
        }
    }

    fn stats(&self) -> ClientStats {
        ClientStats {
            name: String::from(&*self.name),
            quota: self.quota,
            in_use: self.in_use,
            requested: self.requested,
            peak: self.peak,
            allocations: self.allocations,
            frees: self.frees,
            failures: self.failures,
            // Every allocation is freed at most once.
            live: self.allocations - self.frees,
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
    clients: Vec<ClientState>,
    in_use: usize,
    requested: usize,
    peak: usize,
    allocations: u64,
    frees: u64,
    failures: u64,
    /// Parked blocks, one FIFO per stream (events on one stream complete in order).
    parked: Vec<(StreamId, VecDeque<Parked>)>,
    pending: usize,
    /// Bumped by every free on the home stream with a stream runtime present.
    home_epoch: u64,
    /// For each other stream: the `home_epoch` at its last wait on the home stream.
    waited: Vec<(StreamId, u64)>,
    sink: Option<Arc<dyn EventSink>>,
}

/// What never changes after creation, beside the lock.
struct Shared {
    state: Lock<State>,
    name: String,
    capacity: usize,
    base: u64,
    memory: MemoryKind,
    backend: &'static str,
    tracking: AtomicU8,
    streams: Option<Arc<dyn StreamSync>>,
    home: StreamId,
    log_leaks_on_drop: bool,
    // Dropped last: the region outlives every other field.
    _region: Box<dyn RegionOwner>,
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
    #[inline(always)]
    fn lock(&self) -> LockGuard<'_, State> {
        // Every user callback (event sinks, stream runtimes) runs when the state is
        // consistent, so a panic in one unwinds through the guard and leaves nothing
        // half-done.
        self.state.lock()
    }

    fn tracking(&self) -> Tracking {
        match self.tracking.load(Ordering::Relaxed) {
            0 => Tracking::Off,
            1 => Tracking::Tags,
            _ => Tracking::Backtraces,
        }
    }

    // Inlined into each public entry point: the call and its argument passing cost about 20
    // instructions of the fast path.
    #[inline(always)]
    fn allocate(&self, client: u32, req: AllocRequest<'_>, owned: bool) -> Result<u64, Error> {
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
            let mut state = self.lock();
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
            return self.allocate_general(&mut state, client, &req, stream, owned, None);
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
        let mut state = self.lock();
        self.allocate_general(&mut state, client, req, stream, owned, info)
    }

    /// The common case: a valid alignment, tracking off, the home stream (or no stream
    /// runtime) (all three checked by the caller), nothing parked, within capacity and quota,
    /// and a free block found. It changes nothing until it has a block; `None` sends the
    /// request down [`allocate_general`](Self::allocate_general), which decides the same way
    /// and reports why a request fails.
    #[inline(always)]
    fn allocate_fast(&self, state: &mut State, ask: &Ask, owned: bool) -> Option<u64> {
        if !state.parked.is_empty() {
            return None;
        }
        let reserved = reserved_bytes(ask.size).filter(|&r| r <= self.capacity)?;
        let c = &state.clients[ask.client as usize];
        // A client never holds more than its quota.
        debug_assert!(c.in_use <= c.quota);
        if reserved > c.quota - c.in_use {
            return None;
        }
        let (block, addr) = state.tlsf.allocate(reserved as u64, ask.align as u64)?;
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
             {MAX_ALIGN}, or 0 for {DEFAULT_POOL_ALIGN})",
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
        state.failures += 1;
        state.clients[ask.client as usize].failures += 1;
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
            Self::reclaim_parked(state)?;
        }
        let reserved = match reserved_bytes(ask.size) {
            Some(r) if r <= self.capacity => r,
            _ => return Err(self.exhausted(state, ask, "capacity")),
        };
        let c = &state.clients[ask.client as usize];
        if reserved > c.quota - c.in_use.min(c.quota) {
            return Err(self.exhausted(state, ask, "quota"));
        }
        if let Some(streams) = &self.streams {
            if ask.stream != self.home {
                Self::order_after_home(state, &**streams, ask.stream, self.home)?;
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
        let taken = Taken {
            block,
            addr,
            reserved,
        };
        self.commit_allocation(state, ask, owned, info, taken);
        Ok(addr)
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
        state.allocations += 1;
        state.live.insert_new(addr, block);
        let slot = block as usize;
        let tracked = info.is_some();
        let live = Live {
            size: ask.size,
            serial: state.allocations,
            stream: ask.stream,
            client: ask.client,
            // At most MAX_ALIGN (4096).
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
        state.in_use += reserved;
        state.requested += ask.size;
        state.peak = state.peak.max(state.in_use);
        let c = &mut state.clients[ask.client as usize];
        c.in_use += reserved;
        c.requested += ask.size;
        c.peak = c.peak.max(c.in_use);
        c.allocations += 1;
        if state.sink.is_some() {
            let tag = tracked
                .then(|| state.info[slot].as_ref()?.tag.as_deref())
                .flatten();
            // A copy made here: a reference to the caller's would keep it on the stack.
            let ask = *ask;
            self.emit(state, PoolAction::Allocate, &ask, addr, reserved, tag, None);
        }
    }

    /// Makes `stream` wait for the home stream if the home stream freed anything since its
    /// last wait.
    fn order_after_home(
        state: &mut State,
        streams: &dyn StreamSync,
        stream: StreamId,
        home: StreamId,
    ) -> Result<(), Error> {
        let epoch = state.home_epoch;
        let slot = state.waited.iter().position(|(s, _)| *s == stream);
        let last = slot.map_or(0, |i| state.waited[i].1);
        if last < epoch {
            streams.order_after(stream, home)?;
            match slot {
                Some(i) => state.waited[i].1 = epoch,
                None => state.waited.push((stream, epoch)),
            }
        }
        Ok(())
    }

    /// Returns parked blocks whose events completed to the free lists; the bytes reclaimed.
    fn reclaim_parked(state: &mut State) -> Result<usize, Error> {
        let mut reclaimed = 0;
        let mut result = Ok(());
        for (_, queue) in state.parked.iter_mut() {
            while let Some(front) = queue.front() {
                match front.event.is_complete() {
                    Ok(true) => {
                        let parked = queue.pop_front().expect("front exists");
                        state.tlsf.free(parked.block);
                        state.pending -= parked.bytes;
                        reclaimed += parked.bytes;
                    }
                    Ok(false) => break,
                    Err(error) => {
                        result = Err(error);
                        break;
                    }
                }
            }
            if result.is_err() {
                break;
            }
        }
        state.parked.retain(|(_, queue)| !queue.is_empty());
        result.map(|()| reclaimed)
    }

    fn exhausted(&self, state: &mut State, ask: &Ask, limit: &'static str) -> Error {
        // The largest free block counts merged blocks only.
        state.tlsf.flush();
        let c = &state.clients[ask.client as usize];
        let (limit_bytes, in_use) = match limit {
            "quota" => (c.quota, c.in_use),
            _ => (self.capacity, state.in_use),
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
    fn deallocate(
        &self,
        caller: Option<u32>,
        addr: u64,
        stream: Option<StreamId>,
        from_slice: bool,
    ) -> Result<(), Error> {
        // As for `allocate`: the home stream or no stream runtime, known before the call
        // where the caller passes no stream.
        let home = match stream {
            None => true,
            Some(stream) => self.streams.is_none() || stream == self.home,
        };
        let stream = stream.unwrap_or(self.home);
        let mut state = self.lock();
        if home
            && self
                .deallocate_fast(&mut state, caller, addr, stream, from_slice)
                .is_some()
        {
            return Ok(());
        }
        let info = self.deallocate_general(&mut state, caller, addr, stream, from_slice)?;
        drop(state);
        // The backtrace (if any) is freed outside the lock.
        drop(info);
        Ok(())
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
        // Record the event before changing anything, so a failing stream runtime leaves the
        // allocation live and the pool as it was.
        let event = match &self.streams {
            Some(streams) if stream != self.home => Some(streams.record(stream)?),
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
        state.in_use -= reserved;
        state.requested -= live.size;
        state.frees += 1;
        let c = &mut state.clients[live.client as usize];
        c.in_use -= reserved;
        c.requested -= live.size;
        c.frees += 1;
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

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        state: &State,
        action: PoolAction,
        ask: &Ask,
        addr: u64,
        reserved: usize,
        tag: Option<&str>,
        error: Option<&Error>,
    ) {
        if let Some(sink) = &state.sink {
            sink.event(&PoolEvent {
                pool: &self.name,
                action,
                addr,
                size: ask.size,
                reserved,
                align: ask.align,
                client: &state.clients[ask.client as usize].name,
                tag,
                stream: ask.stream,
                time: SystemTime::now(),
                thread: events::thread_number(),
                error,
            });
        }
    }

    fn stats(&self) -> PoolStats {
        let mut state = self.lock();
        // What waits in the reuse cache is merged first, so that the free blocks described are
        // the ones that exist.
        state.tlsf.flush();
        PoolStats {
            capacity: self.capacity,
            in_use: state.in_use,
            requested: state.requested,
            peak: state.peak,
            allocations: state.allocations,
            frees: state.frees,
            failures: state.failures,
            live: state.live.len() as u64,
            free: state.tlsf.free_bytes() as usize,
            pending: state.pending,
            largest_free: state.tlsf.largest_free() as usize,
            free_blocks: state.tlsf.free_blocks(),
            reused: state.tlsf.reused(),
        }
    }

    fn leak_report(&self) -> LeakReport {
        let state = self.lock();
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
        if self.log_leaks_on_drop {
            let live = self.lock().live.len();
            if live > 0 {
                log::warn!(target: "devarena::pool", "{}", self.leak_report());
            }
        }
    }
}

/// Builds a [`Pool`]: capacity, name, tracking, event log, stream runtime.
///
/// ```
/// use std::sync::Arc;
/// use devarena::pool::{LogEvents, Pool, Tracking};
///
/// let pool = Pool::builder(256 << 20)
///     .name("trt-engine")
///     .tracking(Tracking::Backtraces)
///     .events(Arc::new(LogEvents))
///     .build_host()?;
/// assert_eq!(pool.name(), "trt-engine");
/// assert_eq!(pool.capacity(), 256 << 20);
/// # Ok::<(), devarena::Error>(())
/// ```
pub struct PoolBuilder {
    capacity: usize,
    name: String,
    tracking: Tracking,
    sink: Option<Arc<dyn EventSink>>,
    streams: Option<Arc<dyn StreamSync>>,
    home: StreamId,
    log_leaks_on_drop: bool,
    reuse: Option<(usize, usize)>,
}

impl fmt::Debug for PoolBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuilder")
            .field("capacity", &self.capacity)
            .field("name", &self.name)
            .field("tracking", &self.tracking)
            .field("events", &self.sink.is_some())
            .field("streams", &self.streams)
            .field("home", &self.home)
            .field("log_leaks_on_drop", &self.log_leaks_on_drop)
            .field("reuse", &self.reuse)
            .finish()
    }
}

impl PoolBuilder {
    /// A pool of `capacity` bytes (rounded down to a multiple of 256), named `"pool"`, no
    /// tracking, no event log, no stream runtime, leaks logged on drop.
    pub fn new(capacity: usize) -> Self {
        PoolBuilder {
            capacity,
            name: String::from("pool"),
            tracking: Tracking::Off,
            sink: None,
            streams: None,
            home: StreamId::DEFAULT,
            log_leaks_on_drop: true,
            reuse: None,
        }
    }

    /// The pool's name: in errors, reports and the event log. Also the name of the pool's own
    /// client (what [`Pool::allocate`] allocates as).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// What to record about each live allocation.
    pub fn tracking(mut self, tracking: Tracking) -> Self {
        self.tracking = tracking;
        self
    }

    /// Sends every allocation, free and failure to `sink` ([`LogEvents`], a [`CsvEventLog`], or
    /// a closure).
    pub fn events(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Makes the pool stream-aware: `home` is the stream the pool belongs to, `sync` records
    /// and queries events (see [`StreamSync`]).
    pub fn streams(mut self, sync: Arc<dyn StreamSync>, home: StreamId) -> Self {
        self.streams = Some(sync);
        self.home = home;
        self
    }

    /// Whether dropping the pool with live allocations logs the leak report at `warn` (on by
    /// default).
    pub fn log_leaks_on_drop(mut self, on: bool) -> Self {
        self.log_leaks_on_drop = on;
        self
    }

    /// How many freed blocks, and how many bytes, may wait unmerged for a request of the same
    /// size class (`0, 0`: none, every free merges at once). By default
    /// [`DEFAULT_REUSE_BLOCKS`] blocks and half the capacity.
    ///
    /// A freed block normally merges with its free neighbours at once. With reuse on, it first
    /// waits whole: the next request of its size class (see [`reserved_bytes`]) takes it
    /// without a search or a split, which is most of the cost of an allocation and a free.
    /// Blocks leave the cache oldest first when `blocks` newer ones have been freed, merge at
    /// once when they would take the cache past `bytes`, and all merge before a request would
    /// fail and before [`Pool::stats`] describes the free blocks. Nothing else shows the
    /// cache: a waiting block is free memory in every count, quotas included, and a request
    /// that fits in the pool with every free block merged succeeds.
    ///
    /// ```
    /// use devarena::Pool;
    ///
    /// let pool = Pool::builder(1 << 20).reuse(0, 0).build_host()?;
    /// let a = pool.allocate(3000, 0)?;
    /// pool.deallocate(a)?;
    /// let b = pool.allocate(3000, 0)?;
    /// assert_eq!(pool.stats().reused, 0);
    /// # pool.deallocate(b)?;
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn reuse(mut self, blocks: usize, bytes: usize) -> Self {
        self.reuse = Some((blocks, bytes));
        self
    }

    /// Reserves the region on a fresh [`HostBackend`].
    pub fn build_host(self) -> Result<Pool, Error> {
        self.build_in(HostBackend::new())
    }

    /// Reserves the region on `backend`: one allocation of the capacity, freed when the last
    /// handle to the pool (the pool, a client, a slice) goes.
    pub fn build_in<B: Backend + Send + Sync + 'static>(self, backend: B) -> Result<Pool, Error> {
        let capacity = self.capacity & !(BLOCK_GRANULE - 1);
        if capacity == 0 {
            return Err(Error::invalid(format!(
                "pool `{}`: a capacity of {} bytes is below the smallest block, {BLOCK_GRANULE} \
                 bytes",
                self.name, self.capacity
            )));
        }
        let name = backend.name();
        // One granule more than the capacity at a small alignment, and the pool uses the
        // 256-aligned `capacity` bytes inside: a host backend then gets the memory from
        // `calloc`, whose large blocks are untouched zero pages until used, instead of an
        // aligned allocation that is zeroed byte by byte up front.
        let bytes = capacity.checked_add(BLOCK_GRANULE).ok_or_else(|| {
            Error::invalid(format!(
                "pool `{}`: a capacity of {capacity} bytes overflows usize",
                self.name
            ))
        })?;
        let allocation = backend.allocate(bytes, REGION_ALIGN)?;
        let region = OwnedRegion {
            backend,
            allocation,
        };
        let base = allocation.addr.next_multiple_of(GRANULE);
        if base.checked_add(capacity as u64).is_none() {
            return Err(Error::invalid(format!(
                "pool `{}`: backend `{name}` returned a region at {:#x} whose {bytes} bytes \
                 overflow the address space",
                self.name, allocation.addr
            )));
        }
        let memory = region.backend.memory();
        let (reuse_blocks, reuse_bytes) =
            self.reuse.unwrap_or((DEFAULT_REUSE_BLOCKS, capacity / 2));
        let state = State {
            tlsf: Tlsf::new(base, capacity as u64, reuse_blocks, reuse_bytes as u64),
            live: AddrMap::with_capacity(64),
            meta: Vec::with_capacity(128),
            info: Vec::new(),
            clients: alloc::vec![ClientState::new(&self.name, usize::MAX)],
            in_use: 0,
            requested: 0,
            peak: 0,
            allocations: 0,
            frees: 0,
            failures: 0,
            parked: Vec::new(),
            pending: 0,
            home_epoch: 0,
            waited: Vec::new(),
            sink: self.sink,
        };
        let shared = Arc::new(Shared {
            state: Lock::new(state),
            name: self.name,
            capacity,
            base,
            memory,
            backend: name,
            tracking: AtomicU8::new(self.tracking as u8),
            streams: self.streams,
            home: self.home,
            log_leaks_on_drop: self.log_leaks_on_drop,
            _region: Box::new(region),
        });
        Ok(Pool {
            own: PoolClient { shared, id: 0 },
        })
    }
}

/// One region, sub-allocated: see the [module docs](self).
///
/// `Pool` is `Send + Sync`; [`Pool::client`] hands out cloneable handles that share it. The
/// region is freed when the pool and every client and slice made from it are gone; live
/// allocations at that point are logged as leaks.
pub struct Pool {
    own: PoolClient,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.own.shared;
        f.debug_struct("Pool")
            .field("name", &s.name)
            .field("backend", &s.backend)
            .field("base", &format_args!("{:#x}", s.base))
            .field("capacity", &s.capacity)
            .field("home", &s.home)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of `capacity` bytes of host memory (rounded down to a multiple of 256).
    pub fn host(capacity: usize) -> Result<Pool, Error> {
        PoolBuilder::new(capacity).build_host()
    }

    /// A pool of `capacity` bytes reserved on `backend` with default settings.
    pub fn new_in<B: Backend + Send + Sync + 'static>(
        backend: B,
        capacity: usize,
    ) -> Result<Pool, Error> {
        PoolBuilder::new(capacity).build_in(backend)
    }

    /// A builder for the other settings.
    pub fn builder(capacity: usize) -> PoolBuilder {
        PoolBuilder::new(capacity)
    }

    /// A handle that allocates from this pool as client `name`, under `quota` bytes (counted
    /// as reserved bytes, like [`PoolStats::in_use`]; `usize::MAX` for none). Clones share the
    /// client. Quotas may add up to more than the capacity; the capacity stays the hard cap.
    pub fn client(&self, name: &str, quota: usize) -> PoolClient {
        let mut state = self.own.shared.lock();
        state.clients.push(ClientState::new(name, quota));
        let id = (state.clients.len() - 1) as u32;
        PoolClient {
            shared: self.own.shared.clone(),
            id,
        }
    }

    /// The pool's own client (named after the pool, no quota: only the capacity limits it):
    /// what the pool's `allocate` uses.
    pub fn own_client(&self) -> &PoolClient {
        &self.own
    }

    /// Allocates `size` bytes at `align` (0 = 256) for the home stream; returns the address.
    #[inline]
    pub fn allocate(&self, size: usize, align: usize) -> Result<u64, Error> {
        self.own.allocate(size, align)
    }

    /// Allocates for use on `stream`.
    pub fn allocate_on(&self, size: usize, align: usize, stream: StreamId) -> Result<u64, Error> {
        self.own.allocate_on(size, align, stream)
    }

    /// Allocates with every option ([`AllocRequest`]).
    pub fn allocate_with(&self, request: AllocRequest<'_>) -> Result<u64, Error> {
        self.own.allocate_with(request)
    }

    /// Frees any client's allocation at `addr`, on the home stream. An address the pool did not
    /// hand out, or already freed, is an [`Error::UnknownAddress`] and changes nothing.
    #[inline]
    pub fn deallocate(&self, addr: u64) -> Result<(), Error> {
        self.own.shared.deallocate(None, addr, None, false)
    }

    /// Frees any client's allocation at `addr` on `stream` (see [`StreamSync`] for when the
    /// block is reused).
    pub fn deallocate_on(&self, addr: u64, stream: StreamId) -> Result<(), Error> {
        self.own.shared.deallocate(None, addr, Some(stream), false)
    }

    /// A typed slice of `len` elements from the pool's own client, freed on drop.
    pub fn alloc_slice<T: crate::Element>(&self, len: usize) -> Result<PoolSlice<T>, Error> {
        self.own.alloc_slice(len)
    }

    /// Returns blocks freed on other streams whose events have completed to the free lists
    /// now (allocation does this too); the bytes reclaimed.
    pub fn reclaim(&self) -> Result<usize, Error> {
        Shared::reclaim_parked(&mut self.own.shared.lock())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.own.shared.stats()
    }

    /// Every client's counters, the pool's own client first.
    pub fn client_stats(&self) -> Vec<ClientStats> {
        self.own
            .shared
            .lock()
            .clients
            .iter()
            .map(ClientState::stats)
            .collect()
    }

    /// Every live allocation, by address.
    pub fn leak_report(&self) -> LeakReport {
        self.own.shared.leak_report()
    }

    /// Changes what is recorded for allocations made from now on.
    pub fn set_tracking(&self, tracking: Tracking) {
        self.own
            .shared
            .tracking
            .store(tracking as u8, Ordering::Relaxed);
    }

    /// What is recorded for new allocations.
    pub fn tracking(&self) -> Tracking {
        self.own.shared.tracking()
    }

    /// Replaces the event sink (`None` stops the event log).
    pub fn set_events(&self, sink: Option<Arc<dyn EventSink>>) {
        self.own.shared.lock().sink = sink;
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.own.shared.name
    }

    /// Bytes the pool manages (its hard cap).
    pub fn capacity(&self) -> usize {
        self.own.shared.capacity
    }

    /// Start address of the region (host address or `CUdeviceptr`).
    pub fn base(&self) -> u64 {
        self.own.shared.base
    }

    /// Whether `addr` lies inside the region (not whether it is live).
    pub fn contains(&self, addr: u64) -> bool {
        let s = &self.own.shared;
        addr >= s.base && addr - s.base < s.capacity as u64
    }

    /// The backend's name ("host", "cuda", ...).
    pub fn backend_name(&self) -> &'static str {
        self.own.shared.backend
    }

    /// Whether the region is host memory that [`PoolSlice`] may hand out as `&mut [T]`.
    pub fn is_host(&self) -> bool {
        self.own.shared.memory == MemoryKind::Host
    }

    /// The kind of memory the region is.
    pub fn memory(&self) -> MemoryKind {
        self.own.shared.memory
    }

    /// The stream the pool belongs to ([`StreamId::DEFAULT`] without a stream runtime).
    pub fn home_stream(&self) -> StreamId {
        self.own.shared.home
    }
}

/// A handle on a [`Pool`] for one client: a name and a quota. Cloneable, `Send + Sync`; keeps
/// the pool's region alive.
#[derive(Clone)]
pub struct PoolClient {
    shared: Arc<Shared>,
    id: u32,
}

impl fmt::Debug for PoolClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        let c = &state.clients[self.id as usize];
        f.debug_struct("PoolClient")
            .field("pool", &self.shared.name)
            .field("name", &c.name)
            .field("quota", &c.quota)
            .field("in_use", &c.in_use)
            .finish()
    }
}

impl PoolClient {
    /// Allocates `size` bytes at `align` (0 = 256) for the home stream; returns the address.
    #[inline]
    pub fn allocate(&self, size: usize, align: usize) -> Result<u64, Error> {
        self.shared
            .allocate(self.id, AllocRequest::new(size, align), false)
    }

    /// Allocates for use on `stream`.
    pub fn allocate_on(&self, size: usize, align: usize, stream: StreamId) -> Result<u64, Error> {
        self.shared
            .allocate(self.id, AllocRequest::new(size, align).on(stream), false)
    }

    /// Allocates with every option ([`AllocRequest`]).
    pub fn allocate_with(&self, request: AllocRequest<'_>) -> Result<u64, Error> {
        self.shared.allocate(self.id, request, false)
    }

    /// Frees this client's allocation at `addr` on the home stream. An address that is not a
    /// live allocation is an [`Error::UnknownAddress`]; another client's allocation is an
    /// [`Error::InvalidArgument`]; either changes nothing.
    #[inline]
    pub fn deallocate(&self, addr: u64) -> Result<(), Error> {
        self.shared.deallocate(Some(self.id), addr, None, false)
    }

    /// Frees this client's allocation at `addr` on `stream`.
    pub fn deallocate_on(&self, addr: u64, stream: StreamId) -> Result<(), Error> {
        self.shared
            .deallocate(Some(self.id), addr, Some(stream), false)
    }

    /// A typed slice of `len` elements for the home stream, aligned to at least 256 bytes and
    /// to `T`, freed on drop.
    pub fn alloc_slice<T: crate::Element>(&self, len: usize) -> Result<PoolSlice<T>, Error> {
        PoolSlice::new_in(self, len, None)
    }

    /// A typed slice of `len` elements for use on `stream`, freed on `stream` on drop.
    pub fn alloc_slice_on<T: crate::Element>(
        &self,
        len: usize,
        stream: StreamId,
    ) -> Result<PoolSlice<T>, Error> {
        PoolSlice::new_in(self, len, Some(stream))
    }

    /// The client's name.
    pub fn name(&self) -> String {
        String::from(&*self.shared.lock().clients[self.id as usize].name)
    }

    /// The client's counters.
    pub fn stats(&self) -> ClientStats {
        self.shared.lock().clients[self.id as usize].stats()
    }

    /// The whole pool's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.shared.stats()
    }

    /// Whether the pool's region is host memory.
    pub fn is_host(&self) -> bool {
        self.shared.memory == MemoryKind::Host
    }

    /// The kind of memory the pool's region is.
    pub fn memory(&self) -> MemoryKind {
        self.shared.memory
    }

    /// The pool's backend ("host", "cuda", ...).
    pub fn backend_name(&self) -> &'static str {
        self.shared.backend
    }

    pub(crate) fn allocate_owned(
        &self,
        size: usize,
        align: usize,
        stream: Option<StreamId>,
    ) -> Result<u64, Error> {
        let request = AllocRequest {
            size,
            align,
            stream,
            tag: None,
        };
        self.shared.allocate(self.id, request, true)
    }

    pub(crate) fn free_owned(&self, addr: u64, stream: StreamId) -> Result<(), Error> {
        self.shared
            .deallocate(Some(self.id), addr, Some(stream), true)
    }

    pub(crate) fn home_stream(&self) -> StreamId {
        self.shared.home
    }
}

//! [`PoolBuilder`]: the settings of a pool, and reserving its region.

use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use core::fmt;

use super::engine::{Settings, Shared};
use super::lock::{caught, panic_message};
use super::region::{Region, RegionKind};
use super::{
    BLOCK_GRANULE, DEFAULT_REUSE_BLOCKS, DEFAULT_THREAD_HEAP_SHARE, EventSink, MAX_POOL_CAPACITY,
    MAX_REUSE_BLOCKS, Pool, StreamId, StreamSync, Tracking,
};
use crate::backend::{Backend, HostBackend, VirtualMemory};
use crate::error::Error;

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
    region: Option<RegionKind>,
    chunk: Option<usize>,
    release_threshold: usize,
    thread_heaps: Option<usize>,
    eager_thread_heaps: bool,
    exact_peaks: bool,
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
            .field("region", &self.region)
            .field("chunk", &self.chunk)
            .field("release_threshold", &self.release_threshold)
            .field("thread_heaps", &self.thread_heaps)
            .field("eager_thread_heaps", &self.eager_thread_heaps)
            .field("exact_peaks", &self.exact_peaks)
            .finish()
    }
}

impl PoolBuilder {
    /// A pool of `capacity` bytes (rounded down to a multiple of 256, at most
    /// [`MAX_POOL_CAPACITY`]), named `"pool"`, no tracking, no event log, no stream runtime,
    /// leaks logged on drop.
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
            region: None,
            chunk: None,
            release_threshold: usize::MAX,
            thread_heaps: None,
            eager_thread_heaps: false,
            exact_peaks: true,
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

    /// Sends every allocation, free and failure to `sink` ([`LogEvents`](super::LogEvents), a [`CsvEventLog`](super::CsvEventLog), or
    /// a closure).
    pub fn events(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Makes the pool stream-aware: `home` is the stream the pool belongs to, `sync` records
    /// and queries events (see [`StreamSync`]).
    ///
    /// Without a stream runtime every free is a free on the home stream: the block is handed
    /// out again at once, on any stream, and a growable region may unmap it at the next trim.
    /// Code that queued device work on a block's raw address must wait for that work before it
    /// frees it. Device views of [`PoolSlice`](super::PoolSlice)s, which let safe code queue
    /// work, need the pool's own CUDA runtime (`PoolBuilder::build_cuda`, with the `cuda`
    /// feature): a runtime of another kind orders reuse on its own word.
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
    /// waits whole: the next request of its size class (see [`reserved_bytes`](super::reserved_bytes)) takes it
    /// without a search or a split, which is most of the cost of an allocation and a free.
    /// `blocks` is at most [`MAX_REUSE_BLOCKS`] (a larger number is an
    /// error when the pool is built); `bytes` may be anything, the capacity bounds it anyway.
    /// Blocks leave the cache oldest first when `blocks` newer ones have been freed, merge at
    /// once when they would take the cache past `bytes`, and all merge before a request would
    /// fail; [`Pool::stats`] describes the free blocks as they would be merged, without
    /// merging them. Nothing else shows the cache: a waiting block is free memory in every
    /// count, quotas included, and a request that fits in the pool with every free block
    /// merged succeeds. (`blocks` is rounded up to a power of two, the length of the ring that
    /// orders the waiting blocks. A thread heap's cache keeps at most
    /// [`DEFAULT_REUSE_BLOCKS`] blocks, or `blocks` if fewer, and on a growable region no more
    /// bytes than the most the heap has had in use, or 64 KiB if that is more.)
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

    /// How the region holds its memory: [`RegionKind::Growable`] (reserved addresses, memory
    /// mapped on demand) or [`RegionKind::Classic`] (one allocation of the capacity, made up
    /// front). By default device pools (`build_cuda`, with the `cuda` feature) grow, and
    /// [`build_in`](Self::build_in) (a [`Backend`] makes single allocations) is classic;
    /// [`build_mapped`](Self::build_mapped) is growable by nature.
    ///
    /// ```
    /// use devarena::pool::{Pool, RegionKind};
    ///
    /// let pool = Pool::builder(1 << 20).region(RegionKind::Classic).build_host()?;
    /// assert_eq!(pool.region_kind(), RegionKind::Classic);
    /// // A single-allocation backend cannot grow a region: refused with the reason.
    /// let err = Pool::builder(1 << 20).region(RegionKind::Growable).build_host().unwrap_err();
    /// assert!(err.to_string().contains("build_mapped"));
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn region(mut self, kind: RegionKind) -> Self {
        self.region = Some(kind);
        self
    }

    /// Bytes per chunk of a growable region: a power of two, a multiple of the granularity of
    /// the virtual memory (an error at build otherwise). By default what the virtual memory
    /// recommends (2 MiB on an H200). The device memory a growable pool holds stays within
    /// the bytes its live blocks touch, rounded out to chunks: larger chunks mean fewer
    /// driver calls when the pool grows, and more memory held around the blocks.
    pub fn chunk(mut self, bytes: usize) -> Self {
        self.chunk = Some(bytes);
        self
    }

    /// Bytes a growable pool may keep mapped, live ones included, when it synchronizes
    /// ([`Pool::synchronize`]), as `cudaMemPoolAttrReleaseThreshold` does for the driver's
    /// pools: there, chunks with no live byte are unmapped until at most this many bytes stay
    /// mapped (or none such is left). By default `usize::MAX`: memory goes back on
    /// [`Pool::trim`] and [`Pool::trim_to`], and when a request finds the device out of memory
    /// (free chunks are unmapped to map the ones it needs); `0` gives back every free chunk at
    /// each synchronize. [`Pool::set_release_threshold`] changes it later.
    pub fn release_threshold(mut self, bytes: usize) -> Self {
        self.release_threshold = bytes;
        self
    }

    /// How many free bytes the thread heaps may keep, all together (`0`: no thread heaps,
    /// every thread uses the pool's own index under its lock); each heap keeps its share. By
    /// default the capacity ([`DEFAULT_THREAD_HEAP_SHARE`]); a
    /// heap's reuse cache holds up to half its share.
    /// On a growable region a heap maps memory as the pool does, as its blocks reach new chunks,
    /// and its reuse cache holds no more than the most the heap has had in use (at least
    /// 64 KiB), so that the
    /// memory a heap maps follows its use rather than its share of the capacity.
    ///
    /// A thread that finds the pool's lock taken by another gets a heap of its own (and from
    /// then on, while any thread has one, so does every thread that allocates; with a stream
    /// runtime, a thread also gets one for each other stream it allocates on): spans of
    /// the region (a sixteenth of the capacity at a time, between 64 KiB and 1 GiB and at
    /// most half its share, or what a larger request needs) where it allocates and frees under a lock of its own, so that
    /// threads sharing a pool stop waiting for each other. A heap asks the pool for more only
    /// now and then: a span, a lease of bytes under the peak and the quotas, a batch of serial
    /// numbers. When more than its share is free in its spans, it gives back spans nothing
    /// uses, then the spans with the most free bytes, in pieces. Before a request would fail
    /// every heap gives all its spans back (other threads' included), and a thread that exits
    /// gives its heaps back; [`Pool::stats`] describes the free blocks as they would be then,
    /// without taking anything back: heaps change the cost of a call, not what succeeds, nor
    /// any count (peaks aside, with [`exact_peaks`](Self::exact_peaks)`(false)`). With a stream runtime a
    /// thread has a heap for each stream it allocates on, which reuses its blocks on that
    /// stream at once, without an event (a thread on a stream of its own then never takes
    /// the pool's lock in the common case); the free blocks such a heap gives back wait for
    /// its stream (counted as `pending`) unless a request needs them, which makes the home
    /// stream wait for that stream instead (a stream capturing a graph cannot be waited for:
    /// there they stay `pending` until the capture ends). See the [module docs](super#threads).
    ///
    /// **Near the capacity, heaps step aside.** Heaps split the free memory among themselves
    /// and the pool's index, and each part fragments on its own. Where a heap of the home
    /// stream finds nothing for a request, even after merging its reuse cache, and the pool's
    /// index has no room left for a span and holds fewer free bytes than four spans (a pool
    /// with room in smaller pieces is fragmented, not full: there a heap takes a smaller
    /// span), every home-stream heap is given back and the pool's
    /// index serves the home stream alone for a while (4,096 allocations, twice as long for
    /// each time it happens again within a second of the last one's end, up to about four
    /// million), as in a pool
    /// without heaps; then heaps come back. In the pool benchmark (sizes up to 4 MiB, two
    /// threads, peak in use about 100 MiB) a pair took 35–36 ns with a capacity of 1 GiB
    /// (heaps never step aside there; 74 ns with `thread_heaps(0)`), and with 192 MiB 87–92 ns,
    /// as with `thread_heaps(0)`, where heaps that stayed took 355–385 ns (see
    /// `BENCHMARKS.md`). Heaps serve best while each one's share is several times what its
    /// thread has in use: below that, a pool with heaps is as fast as one without, not faster.
    /// A pool that has had more than two home-stream heaps at once steps aside only once its
    /// peak has passed half its capacity: with many threads one lock is slower than heaps
    /// near the capacity, but heaps that stay there fail requests the pool's one index would
    /// serve (eight threads, peak in use about 260 MiB: a pool of 384 MiB failed an
    /// allocation in 26 of 32 runs of the benchmark with heaps that stayed, in 7 of 32 with
    /// heaps that step aside; in a later batch 7 of 30, as often as without heaps: 8 of 30). Near the capacity a pool
    /// shared by many threads is slow either way (on an H100 host, eight threads at 416–448
    /// MiB took 2.5–3.3 µs a pair stepping aside and 2.0–5.0 µs on heaps that stayed, which
    /// failed 2 runs of 8; 0.5–0.9 µs at 768 MiB; 60 ns with room): give such a pool room.
    /// Pools with [`eager_thread_heaps`](Self::eager_thread_heaps) keep their heaps.
    ///
    /// ```
    /// use devarena::Pool;
    ///
    /// let pool = Pool::builder(64 << 20).thread_heaps(16 << 20).build_host()?;
    /// std::thread::scope(|s| {
    ///     for _ in 0..4 {
    ///         s.spawn(|| {
    ///             for i in 0..1000 {
    ///                 let a = pool.allocate(256 << (i % 8), 0).unwrap();
    ///                 pool.deallocate(a).unwrap();
    ///             }
    ///         });
    ///     }
    /// });
    /// let stats = pool.stats();
    /// assert_eq!((stats.allocations, stats.frees, stats.in_use), (4000, 4000, 0));
    /// assert_eq!(stats.largest_free, 64 << 20);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn thread_heaps(mut self, max_free_bytes: usize) -> Self {
        self.thread_heaps = Some(max_free_bytes);
        self
    }

    /// Whether every thread gets its heap at its first allocation, instead of once some thread
    /// has found the pool's lock taken (off by default; a heap for a stream other than the home
    /// stream comes with the first request there either way, unless the stream captures a
    /// graph then or a graph reservation on it awaits its capture, is CUDA's per-thread default
    /// stream, or the stream runtime refuses it; and none while tracking or an event sink is
    /// on). For pools known to serve several threads
    /// at once; a pool used this way by one thread places its blocks in spans, not as the
    /// pool's own index would.
    ///
    /// ```
    /// use devarena::Pool;
    ///
    /// let pool = Pool::builder(1 << 20).eager_thread_heaps(true).build_host()?;
    /// let a = pool.allocate(1000, 0)?;
    /// assert_eq!(pool.thread_heaps(), 1);
    /// pool.deallocate(a)?;
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn eager_thread_heaps(mut self, on: bool) -> Self {
        self.eager_thread_heaps = on;
        self
    }

    /// Whether [`PoolStats::peak`](super::PoolStats::peak) and each client's peak stay exact
    /// while threads allocate on heaps of their own (on by default).
    ///
    /// Exact peaks cost coordination: a heap may allocate only within the headroom below the
    /// peak reached so far, which heaps pass among themselves through a spare (an atomic
    /// counter, without the pool's lock); where none is left the pool takes back every heap's
    /// unused headroom (locking each heap) before it counts a new peak. While the pool's use
    /// is near its peak, that happens often. With `false`, a heap takes headroom beyond its
    /// need in chunks (1/256 of the capacity, or twice the largest request for which it asked
    /// the pool, up to 1/32 of the capacity, if that is more) and gives back what it holds
    /// beyond three chunks now and then, and a peak counts the headroom heaps hold: at least
    /// the peak reached (never above the capacity), and above it by at most the heaps' unused
    /// headroom. Exact either way
    /// without thread heaps; quotas stay exact either way (a request is refused only with
    /// every heap's headroom taken back).
    ///
    /// ```
    /// use devarena::Pool;
    ///
    /// let pool = Pool::builder(1 << 20).exact_peaks(false).build_host()?;
    /// let a = pool.allocate(1000, 0)?;
    /// assert_eq!(pool.stats().peak, 1024); // one thread, no heaps: exact
    /// pool.deallocate(a)?;
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn exact_peaks(mut self, exact: bool) -> Self {
        self.exact_peaks = exact;
        self
    }

    /// Reserves the region on a fresh [`HostBackend`].
    pub fn build_host(self) -> Result<Pool, Error> {
        self.build_in(HostBackend::new())
    }

    /// Reserves the region on `backend`: one allocation of the capacity, freed when the last
    /// handle to the pool (the pool, a client, a slice) goes. A classic region: asking for a
    /// [`RegionKind::Growable`] one here is an error (see [`build_mapped`](Self::build_mapped)).
    /// With the CUDA stream runtime (`CudaStreams`), memory of one of devarena's CUDA backends
    /// must be of the runtime's context (an error otherwise).
    pub fn build_in<B: Backend + Send + Sync + 'static>(self, backend: B) -> Result<Pool, Error> {
        if self.region == Some(RegionKind::Growable) {
            return Err(Error::invalid(format!(
                "pool `{}`: backend `{}` makes single allocations and cannot grow a region; \
                 use `build_mapped` with a `VirtualMemory` (or `build_cuda`), or \
                 `RegionKind::Classic`",
                self.name,
                backend.name()
            )));
        }
        let capacity = self.checked_capacity()?;
        #[cfg(feature = "cuda")]
        super::cuda::check_contexts(&self.name, self.streams.as_ref(), &backend)?;
        let region = Region::reserve(&self.name, backend, capacity)?;
        self.finish(region)
    }

    /// Reserves addresses for the capacity on `vm` and maps memory under them in chunks as
    /// allocations reach them (a [`RegionKind::Growable`] region): the pool holds the memory
    /// its live blocks touch, rounded out to chunks, and [`Pool::trim`] gives back chunks with
    /// no live byte. The reservation is freed when the last handle to the pool goes. With the
    /// CUDA stream runtime (`CudaStreams`), `CudaVirtualMemory` must be of the runtime's
    /// context (an error otherwise).
    ///
    /// ```
    /// use devarena::backend::HostVirtualMemory;
    /// use devarena::pool::{Pool, RegionKind};
    ///
    /// // 64 MiB of addresses, mapped in 64 KiB chunks on demand.
    /// let pool = Pool::builder(64 << 20).build_mapped(HostVirtualMemory::new(64 << 10)?)?;
    /// assert_eq!(pool.region_kind(), RegionKind::Growable);
    /// assert_eq!(pool.stats().mapped, 0);
    /// let a = pool.allocate(100 << 10, 0)?; // 100 KiB: two chunks
    /// assert_eq!(pool.stats().mapped, 128 << 10);
    /// pool.deallocate(a)?;
    /// assert_eq!(pool.trim()?, 128 << 10);
    /// assert_eq!(pool.stats().mapped, 0);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn build_mapped<V: VirtualMemory + 'static>(self, vm: V) -> Result<Pool, Error> {
        if self.region == Some(RegionKind::Classic) {
            // (The backend's name, where asking for it does not panic.)
            let name = caught(|| vm.name()).unwrap_or("the virtual-memory backend");
            return Err(Error::invalid(format!(
                "pool `{}`: `{name}` maps memory on demand and makes no classic region; use \
                 `build_in` with a `Backend` for `RegionKind::Classic`",
                self.name,
            )));
        }
        let capacity = self.checked_capacity()?;
        #[cfg(feature = "cuda")]
        super::cuda::check_contexts(&self.name, self.streams.as_ref(), &vm)?;
        let region = Region::reserve_mapped(&self.name, vm, capacity, self.chunk)?;
        self.finish(region)
    }

    /// The pool's name, as set so far.
    #[cfg(feature = "cuda")]
    pub(super) fn pool_name(&self) -> &str {
        &self.name
    }

    /// The region kind asked for, if any.
    #[cfg(feature = "cuda")]
    pub(super) fn region_asked(&self) -> Option<RegionKind> {
        self.region
    }

    /// Checks the settings before anything is reserved; returns the capacity rounded down to
    /// a multiple of [`BLOCK_GRANULE`].
    fn checked_capacity(&self) -> Result<usize, Error> {
        let capacity = self.capacity & !(BLOCK_GRANULE - 1);
        if capacity == 0 {
            return Err(Error::invalid(format!(
                "pool `{}`: a capacity of {} bytes is below the smallest block, {BLOCK_GRANULE} \
                 bytes",
                self.name, self.capacity
            )));
        }
        if capacity > MAX_POOL_CAPACITY {
            return Err(Error::invalid(format!(
                "pool `{}`: a capacity of {} bytes is over the most a pool indexes, \
                 {MAX_POOL_CAPACITY} bytes ({} blocks of {BLOCK_GRANULE} bytes, numbered with 32 \
                 bits)",
                self.name,
                self.capacity,
                MAX_POOL_CAPACITY / BLOCK_GRANULE
            )));
        }
        if let Some(streams) = &self.streams {
            // (Asked before anything is reserved; a panic of the runtime is an error too.)
            let home = self.home;
            let per_thread = caught(|| streams.is_per_thread(home)).map_err(|payload| {
                let said = match panic_message(payload.payload()) {
                    Some(message) => format!(": {message}"),
                    None => String::new(),
                };
                Error::invalid(format!(
                    "pool `{}`: the stream runtime panicked in `is_per_thread` for home stream \
                     {home}{said}",
                    self.name
                ))
            })?;
            if per_thread {
                return Err(Error::invalid(format!(
                    "pool `{}`: home stream {home} is a different stream on each thread (CUDA's \
                     per-thread default stream): blocks freed there by one thread would be \
                     handed to another thread's stream; make the pool's home a stream of its own",
                    self.name
                )));
            }
        }
        if let Some((blocks, _)) = self.reuse.filter(|&(blocks, _)| blocks > MAX_REUSE_BLOCKS) {
            return Err(Error::invalid(format!(
                "pool `{}`: reuse of {blocks} freed blocks is over the most, \
                 {MAX_REUSE_BLOCKS} (8 bytes of bookkeeping each)",
                self.name
            )));
        }
        Ok(capacity)
    }

    /// The pool over `region`, with the other settings.
    fn finish(self, region: Region) -> Result<Pool, Error> {
        let (reuse_blocks, reuse_bytes) = self
            .reuse
            .unwrap_or((DEFAULT_REUSE_BLOCKS, region.capacity / 2));
        let settings = Settings {
            name: self.name,
            tracking: self.tracking,
            sink: self.sink,
            streams: self.streams,
            home: self.home,
            log_leaks_on_drop: self.log_leaks_on_drop,
            reuse_blocks,
            reuse_bytes,
            release_threshold: self.release_threshold,
            heap_bytes: self
                .thread_heaps
                .unwrap_or(region.capacity / DEFAULT_THREAD_HEAP_SHARE),
            eager_heaps: self.eager_thread_heaps,
            exact_peaks: self.exact_peaks,
        };
        Ok(Pool::from_shared(Arc::new_cyclic(|this| {
            Shared::new(settings, region, this.clone())
        })))
    }
}

//! A runtime pool: one region reserved at creation (whole, or as addresses that are backed by
//! memory as they are used), sub-allocated under the TensorRT `IGpuAllocator` contract.
//!
//! Compile-time layouts ([`Arena`](crate::Arena)) serve buffers whose sizes are known ahead.
//! Memory whose size is known only at run time (weights loaded at start, workspaces that depend
//! on input shapes) comes from a [`Pool`]: it reserves **one** region on a
//! [`Backend`](crate::Backend) when it is made and hands out pieces of it. It is what a TensorRT
//! `IGpuAllocator` or a PyTorch pluggable allocator needs:
//!
//! * `allocate(size, align)` returns an address; `deallocate(addr)` needs no size (the pool
//!   keeps its own map). Every call is thread-safe ([`Pool`] and [`PoolClient`] are `Send +
//!   Sync`).
//! * Alignment: any power of two up to [`MAX_POOL_ALIGN`] (4096); `0` means "any", which is 256
//!   ([`DEFAULT_POOL_ALIGN`]); anything else is an [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming the number.
//!   Every block starts on a 256-byte boundary and spans a multiple of 256 bytes, like
//!   `cudaMalloc`'s.
//! * **Size 0** is a valid request: it takes one 256-byte block and returns a unique, aligned
//!   address inside the region that must be freed like any other (so a caller that treats a
//!   null pointer as out of memory, as TensorRT does, never sees one).
//! * The capacity is a **hard cap**, and [`Pool::client`] shares one pool between several users
//!   under per-client **quotas**. A request over either fails with
//!   [`Error::PoolExhausted`](crate::Error::PoolExhausted) naming the client, the request, the limit and what is free; nothing
//!   already allocated is disturbed.
//! * All metadata lives on the host, never inside the region (which may be device memory).
//! * Allocation and free are O(1): a two-level segregated fit (TLSF) index with bitmaps,
//!   coalescing free neighbours, behind one lock (a compare-and-swap to take it, a store to
//!   release it). A free block of [`guaranteed_fit`] bytes always satisfies a request.
//! * Threads that share a pool do not wait for each other: a thread that finds the lock taken
//!   gets a **thread heap** of its own, an index over spans of the region, and allocates and
//!   frees there under a lock only it takes in the common case ([`PoolBuilder::thread_heaps`]);
//!   from then on, so does every thread that allocates on the pool.
//!   Every heap gives its spans back before a request would fail, and when its thread exits:
//!   heaps change the cost of a call, not what succeeds, nor a count (see below; peaks
//!   aside, with [`PoolBuilder::exact_peaks`]`(false)`).
//! * Sizes round up to their size class ([`reserved_bytes`]: less than 1/32 more above 8 KiB),
//!   so that a freed block can wait whole in a bounded **reuse cache** and serve the next
//!   request of its class without a search, a split or a merge ([`PoolBuilder::reuse`]).
//!   Everything waiting merges before a request would fail, and [`Pool::stats`] describes
//!   the free blocks as merged (without merging them): the cache changes the cost of a call,
//!   not what succeeds, nor what the statistics say.
//!
//! Observability: [`Pool::stats`] (current, peak, counts, requested vs reserved, largest free
//! block, fragmentation), a tracking mode ([`Tracking`]) that records each live allocation's tag
//! and optionally a backtrace, [`Pool::leak_report`] on demand and logged on drop, and an event
//! log of allocations, frees and failures to the `log` facade ([`LogEvents`]), a callback, or a
//! CSV file in RMM's replay-log format ([`CsvEventLog`]). Stream ordering for device pools (when
//! a freed block may be reused, and on which stream) is described in the [`stream`] module.
//!
//! User code the pool runs — an event sink, a stream runtime ([`StreamSync`]), the `log` crate's
//! logger (called at times while the pool holds its lock: mapping chunks, setting a block
//! aside) — may call the pool: an event sink runs outside the lock and is served; from a stream
//! runtime or a logger under the lock, allocations and frees return an error and statistics,
//! reports and settings are cut short (the logger's record is lost), instead of waiting for
//! ever on the lock their own thread holds. A panic there is caught; the pool stays usable.
//! The pool keeps its metadata in host memory from the global allocator, which it calls with
//! its locks held: a pool cannot serve as the process's `#[global_allocator]` (a call back
//! from there would wait for ever on the lock its thread holds).
//!
//! # Backends and devices
//!
//! [`Pool::host`] reserves host memory; [`Pool::new_in`] (or [`PoolBuilder::build_in`]) takes
//! any [`Backend`](crate::Backend) that is `Send + Sync`. A device pool that serves several streams also gets a
//! [`StreamSync`] ([`PoolBuilder::streams`]); its [`PoolSlice`]s are not host memory and convert
//! to device views instead. With the `cuda` feature, `Pool::cuda(stream, capacity)` (or
//! `PoolBuilder::build_cuda(stream)`) does all of that: a growable region on the device (see
//! below), the CUDA events of `pool::cuda::CudaStreams`, `stream` as the home stream; and
//! `PoolSlice::device_view(&stream)` / `device_view_mut(&stream)` give cudarc views.
//!
//! On a host pool, code that writes through a raw address the pool handed out (unsafe code:
//! a pointer made from the address) must leave every byte it writes initialized, padding
//! included (`MaybeUninit` bytes or a struct with padding copied in whole break this): a
//! block freed there is handed out again, and a [`PoolSlice`] reads the bytes it finds as
//! values of its element type, from safe code.
//!
//! # Regions: classic and growable
//!
//! A pool's region is one of two [`RegionKind`]s. Both keep the addresses where they are for
//! the pool's life (views, slices and captured CUDA graphs stay valid), the capacity as a hard
//! cap, and O(1) calls.
//!
//! * **Classic**: one backend allocation of the whole capacity, made with the pool and held
//!   until it goes. Host pools and [`PoolBuilder::build_in`] make one; so does
//!   `build_cuda` with `.region(RegionKind::Classic)` (one `cuMemAlloc`), for memory that
//!   must be a single classic allocation (RDMA registration, CUDA IPC).
//! * **Growable**, the default of device pools: addresses for the whole capacity are
//!   reserved on a [`VirtualMemory`](crate::backend::VirtualMemory) (for CUDA,
//!   `cuMemAddressReserve`, which costs no device memory), and memory is mapped under them in
//!   chunks ([`PoolBuilder::chunk`]; 2 MiB on an H200) when an allocation first reaches them:
//!   a check of one bitmap word on the fast path, driver calls only when the pool grows. So the
//!   capacity can be the whole device, and the pool holds what its blocks touch.
//!   [`Pool::trim`] unmaps every chunk that holds no live byte, once the home stream has run
//!   past the frees (blocks freed on other streams count only once their events have
//!   completed); [`Pool::synchronize`] does so down to a release threshold
//!   ([`PoolBuilder::release_threshold`]), as `cudaMemPoolAttrReleaseThreshold` does. When the
//!   device has no memory left for a chunk, the request looks for free memory that is mapped
//!   already, wherever it lies (the thread heaps give their spans back first, the reuse cache
//!   merges); then the pool gives every chunk inside a free block back to the device, after
//!   waiting for the home stream without its lock (as `trim` does; not while the home stream
//!   or the request's stream captures a graph), and the request is made again, once, as a
//!   caching allocator empties its cache before it fails. Only then does the request fail, with
//!   [`Error::OutOfMemory`](crate::Error::OutOfMemory) naming the driver's error; the pool is
//!   as it was but for the chunks it gave back. [`PoolStats`] count the bytes mapped, their
//!   peak, and the chunks mapped and unmapped; `cuMemGetInfo` sees exactly the mapped bytes.
//!
//! Freed blocks that wait in the reuse cache stay mapped, and while they wait, requests of
//! other sizes are placed around them: a growable region maps the addresses a classic one
//! would touch, which with the cache can be well above the peak in use (the pool benchmark's
//! random workload: 3.4 x with the cache, 1.08 x without; see `BENCHMARKS.md`).
//! [`PoolBuilder::reuse`]`(0, 0)` keeps the footprint tight where that matters more than the
//! cache's nanoseconds.
//!
//! # Threads
//!
//! A pool used by one thread at a time on its home stream works on its own index, block for
//! block as described above. When a thread finds the pool's lock taken, or allocates on a
//! stream other than the home stream, and from then on whenever a thread allocates while
//! another has a heap (or at its first allocation, with
//! [`PoolBuilder::eager_thread_heaps`]), it gets a heap of its own for that pool and the
//! request's stream (so one request on another stream moves the thread's home-stream
//! requests to a heap too, about a quarter more instructions a pair than the pool's index): it
//! takes a span of the region (a sixteenth of the capacity, between 64 KiB and 1 GiB and at
//! most half the heap's share, or what a larger request needs) and allocates and frees that stream's requests in its spans, with a
//! reuse cache of its own, under a lock that other threads take only to take headroom back or
//! to give spans back. It asks the
//! pool, under the pool's lock, only now and then: for a span, for a lease of bytes (below),
//! for a batch of serial numbers. What users rely on holds exactly as with one thread:
//!
//! * **The cap.** Before a request fails, every heap, other threads' included, gives its spans
//!   back: spans nothing uses go back whole, the others are cut into the blocks they hold, the
//!   free ones merged with their free neighbours, live ones carrying on at their addresses. A
//!   request that would succeed with every heap given back succeeds. Near the capacity, where
//!   a home-stream heap finds nothing for a request and the pool's index has little free and
//!   no room for a span, the home-stream heaps step aside (with more than two threads, once
//!   the pool's peak has passed half its capacity):
//!   given back for good, they leave the home stream to the pool's index for a while, as in a
//!   pool without heaps (see [`PoolBuilder::thread_heaps`]), instead of splitting what little
//!   is free.
//! * **Quotas and peaks.** A heap allocates within leases of the pool's bytes and of each
//!   client's, taken from the headroom below the peak (and the quota). Headroom no heap holds
//!   waits in a spare that heaps take from and give back to without the pool's lock (one
//!   atomic operation, now and then, on a shard of the spare that is mostly the heap's own);
//!   past that a heap asks the pool, and where no headroom
//!   is left the pool takes back every heap's unused leases and the spare before it counts a
//!   new peak or refuses a quota. Peaks stay exact at a cost: near its peak a pool shared by
//!   many threads coordinates more often. [`PoolBuilder::exact_peaks`]`(false)` lets heaps
//!   take headroom in chunks and counts it in the peaks instead (quotas stay exact).
//! * **Statistics, leaks, events.** [`Pool::stats`], client statistics and leak reports add
//!   up every heap with all of them locked for a moment, and take nothing back: the free
//!   blocks are described as they would be with every heap's spans given back and merged, so
//!   a thread that reads them while others work does not take the others' heaps away.
//!   Tracking and event sinks take the general path under the pool's lock, heaps or not; a
//!   sink switched on is seen by every heap before [`Pool::set_events`] returns. Parked
//!   blocks do not stop the heaps: they come back whenever a path takes the pool's lock (a
//!   heap's slow path included).
//! * **Streams.** A thread has a heap for each stream it allocates on (with a stream runtime;
//!   without one all streams are one), and a heap hands its blocks out again on its own stream
//!   only, at once, as the pool's own index does for the home stream: a thread working on a
//!   stream of its own allocates and frees there without the pool's lock and without an
//!   event. A block freed on any other stream (the home stream included, for a heap of
//!   another stream) is parked as before and returns to its heap when its event completes. A
//!   heap of another stream takes its spans after that stream waits for the home stream's
//!   frees, as any block of the pool's index handed to another stream. Its freed blocks reach
//!   the pool's index when it gives spans back: before a request would fail for want of them
//!   and before a trim, the home stream is made to wait for the heap's stream (a wait the
//!   driver adds, no thread blocks) and they are free at once; otherwise (a heap over its
//!   bound, the thread's exit), or where that wait cannot be made (a stream that
//!   captures a graph), they are parked until an event on the heap's stream completes, and
//!   count as `pending` meanwhile; a request that would fail without them makes the home
//!   stream wait for that stream and takes them. A thread gets a heap for another stream at
//!   its first request there (on the pool's index a free there would record an event), unless
//!   that stream is capturing a graph then, a [`GraphReservation`] on it awaits its capture,
//!   or the runtime refuses it or cannot say whether it captures (the pool's index serves it;
//!   the heap comes with a later request). A heap serves its stream without asking whether it
//!   captures, as the pool's index serves the home stream: a free there during a capture is
//!   handed out again at once, though the graph may replay work that used the block. A
//!   [`GraphReservation`] (and `Pool::capture`) therefore gives back every thread's heap for
//!   its stream when it is opened, and no heap takes a span of that stream until its capture
//!   is over (see [`graph`]), so that plain requests on the stream during the capture take the
//!   pool's index, which refuses a free on a capturing stream. Heaps of a stream whose capture
//!   was begun without a reservation are not given back. CUDA's per-thread default stream, a
//!   different stream on each thread, gets no heap.
//! * **Thread exit, pool drop.** A thread's heaps are listed in a thread-local that holds each
//!   pool weakly; when the thread exits, each heap of a pool still alive is given back. A pool
//!   dropped first empties its heaps (its leak report lists their live allocations).
//!
//! * **Growable regions.** A heap's spans are addresses; memory is mapped under them as its
//!   blocks reach new chunks. A heap reads which chunks are mapped without the pool's lock (a
//!   bitmap the pool writes under it) and takes the pool's lock only to map the chunks a block
//!   reaches first. When mapping fails, the block goes back to the heap and the request goes
//!   on as on the pool's own index (every heap gives its spans back, then free chunks go back
//!   to the device) before it fails with [`Error::OutOfMemory`](crate::Error::OutOfMemory).
//!   [`Pool::trim`] gives every heap back before it unmaps anything, so no heap holds a span
//!   over a chunk being unmapped. Each heap reuses only its own freed blocks, which costs
//!   memory (see "Performance" below).
//!
//! Heaps bound the free bytes they keep (the capacity by default, shared among them; a heap's
//! reuse cache holds up to half its share): past it a heap gives back spans nothing uses, then
//! the spans with the most free bytes.
//! [`Pool::thread_heaps`] counts them.
//!
//! # CUDA graphs
//!
//! A graph replays the addresses its capture was given, whenever it runs, for as long as it
//! lives. A [`GraphReservation`] keeps a graph's blocks for it: allocated for the graph's
//! stream without recording anything on that stream (which may be capturing), held when freed
//! while the graph lives, and handed out again only after the replays queued before the graph
//! went are done. With the `cuda` feature, `Pool::capture(&stream, |c| ..)` captures work into a
//! `PoolGraph` whose temporaries come from the pool that way; it is an `unsafe fn`, as any
//! other memory the graph reaches stays the caller's to keep until the last replay.
//! [`Pool::allocate_for_capture`] serves owners that keep such blocks allocated themselves
//! (PyTorch's graph pools). The [`graph`] module has the rules. While no graph owns a block,
//! the fast paths pay one check (in the free path) for it.
//!
//! # Performance
//!
//! `cargo bench -p devarena --bench pool_pairs` runs alloc+free pairs (64 live, sizes
//! log-uniform in 256 B … 4 MiB) against the system allocator and prints the median ns per pair
//! for 1 and 4 threads (`-- --threads 1,2,4,8` for others) and each row's aggregate throughput
//! against one thread (`-- --json` for a machine-readable form), with the pool as built by
//! default, with a heap for every thread, with leased peaks, with its reuse cache off, and with
//! a pool of its own for every thread (nothing shared: what the machine allows); with
//! `--features cuda` on a GPU it adds a pool on device memory (classic and growable) and
//! `cuMemAllocAsync` / `cuMemFreeAsync` in the same run.
//!
//! The common case is one straight path: a valid alignment, tracking off, nothing parked on
//! another stream, the home stream, within quota and capacity. `allocate` and `deallocate` are
//! `#[inline]`, so it inlines into the caller. On the benchmark's workload, where 93% of the
//! requests find a block of their class in the reuse cache, a pair takes about 345
//! instructions, the benchmark's own loop and both lock round trips included (callgrind;
//! about 540 with the cache off). Tracking, event sinks, other streams and every failure take
//! a general path, kept out of line, that decides the same way and reports why. A thread on a
//! heap takes its own lock instead, and its pairs cost about a quarter more instructions
//! (about 440); threads that meet on the pool's lock before they have heaps back off before
//! they look again, so that the thread holding the lock keeps it, and the pool's state in its
//! caches, for a run of calls.
//!
//! Heaps on a growable region each map memory where their own blocks go and reuse only their
//! own freed blocks, so a growable pool shared by busy threads holds about what each thread's
//! peak needs, added up, rather than the peak of their sum: on the benchmark's workload with
//! 8 threads, 2.1 × the pool's peak in use with the reuse cache off (1.06 × on one index),
//! 7 to 8 × with it on (2.3 × on one index) before a heap's cache was bounded by what the
//! heap has had in use; since then, on the H200's growable device pool, 4.7 to 4.9 × (8.9 to
//! 9.1 × before). [`Pool::trim`] gives it back;
//! [`PoolBuilder::thread_heaps`]`(0)` keeps every thread on the pool's own index, and its
//! footprint.
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

use crate::plan::CUDA_ALIGN;

mod addr_map;
mod builder;
#[cfg(feature = "cuda")]
mod capture;
mod counters;
#[cfg(feature = "cuda")]
pub mod cuda;
mod engine;
mod events;
pub mod graph;
mod handles;
mod lock;
mod region;
mod slice;
mod stats;
pub mod stream;
mod thread_heap;
mod tlsf;
mod vmm;

pub use builder::PoolBuilder;
#[cfg(feature = "cuda")]
pub use capture::{PoolCapture, PoolGraph};
pub use events::{
    CSV_HEADER, CsvEventLog, EventSink, LogEvents, PoolAction, PoolEvent, format_time,
};
pub use graph::{GraphReservation, GraphStats};
pub use handles::{Pool, PoolClient};
pub use region::RegionKind;
pub use slice::PoolSlice;
pub use stats::{ClientStats, Leak, LeakReport, PoolStats, Tracking};
pub use stream::{ManualStreams, StreamEvent, StreamId, StreamSync};

/// The largest alignment a pool hands out (a page: what TensorRT and PyTorch ask for at most).
/// Layouts accept far larger ones ([`plan::MAX_ALIGN`](crate::plan::MAX_ALIGN)).
pub const MAX_POOL_ALIGN: usize = 4096;
/// The alignment of a request that asks for `0` ("any"), and the smallest any block has: what
/// `cudaMalloc` guarantees ([`CUDA_ALIGN`]).
pub const DEFAULT_POOL_ALIGN: usize = CUDA_ALIGN;
/// Every block is a multiple of this many bytes (and starts at a multiple of it): the
/// [`CUDA_ALIGN`] granule.
pub const BLOCK_GRANULE: usize = CUDA_ALIGN;
/// The largest capacity a pool takes: 768 GiB, 3 × 2³⁰ blocks of [`BLOCK_GRANULE`] bytes
/// (on a target whose `usize` is narrower, the largest multiple of the granule). The pool's
/// index numbers its blocks with 32 bits; this leaves room for its spare slots below that
/// limit however the region is cut (checked at compile time where the index numbers them).
/// A larger capacity is an [`Error::InvalidArgument`] from the builder.
///
/// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
pub const MAX_POOL_CAPACITY: usize = {
    let most = (3u64 << 30) * BLOCK_GRANULE as u64;
    if most > usize::MAX as u64 {
        usize::MAX & !(BLOCK_GRANULE - 1)
    } else {
        most as usize
    }
};
/// How many freed blocks wait for reuse by default (see [`PoolBuilder::reuse`]).
pub const DEFAULT_REUSE_BLOCKS: usize = 2048;
/// The thread heaps keep at most `1 / DEFAULT_THREAD_HEAP_SHARE` of the capacity in free bytes
/// all together by default (see [`PoolBuilder::thread_heaps`]): the whole capacity, so that a
/// thread alone on a heap caches freed blocks for reuse as the pool's own index does (half the
/// capacity), and two heaps a quarter each. (With half the capacity, two threads of the pool
/// benchmark took 86.8% of their blocks whole from their caches instead of 93.4%, and paid
/// 2.5–3.7 ns more a pair.)
pub const DEFAULT_THREAD_HEAP_SHARE: usize = 1;
/// The most freed blocks that may wait for reuse (see [`PoolBuilder::reuse`]): the ring that
/// remembers them takes 8 bytes a block, 8 MiB at this limit.
pub const MAX_REUSE_BLOCKS: usize = 1 << 20;

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
        a if a.is_power_of_two() && a <= MAX_POOL_ALIGN => Some(a),
        _ => None,
    }
}

/// One free, for [`Pool::deallocate_with`] and [`PoolClient::deallocate_with`]: the address,
/// and optionally the size it was allocated with and the stream of the free.
///
/// An address API cannot tell a double free from the free of an address that was handed out
/// again in between: after `free(a); b = allocate(..)` returns `a` again, a second `free(a)`
/// frees `b`'s block, as with `cudaFree`. Naming the size catches most such stale frees (the
/// new allocation rarely asked for the same size); [`PoolSlice`] rules them out, since only
/// the slice frees its block, once.
///
/// ```
/// use devarena::pool::{FreeRequest, Pool};
///
/// let pool = Pool::builder(1 << 20).reuse(0, 0).build_host()?;
/// let a = pool.allocate(1000, 0)?;
/// pool.deallocate(a)?;
/// let b = pool.allocate(3000, 0)?; // the same address, handed out again
/// assert_eq!(a, b);
/// // A stale free of `a` names the size `a` had: refused, `b` stays live.
/// assert!(pool.deallocate_with(FreeRequest::new(a).size(1000)).is_err());
/// assert_eq!(pool.stats().live, 1);
/// pool.deallocate_with(FreeRequest::new(b).size(3000))?;
/// # Ok::<(), devarena::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeRequest {
    /// The address the allocation returned.
    pub addr: u64,
    /// The size the allocation asked for; `None` to skip the check.
    pub size: Option<usize>,
    /// The stream of the free; `None` for the pool's home stream.
    pub stream: Option<StreamId>,
}

impl FreeRequest {
    /// The free of `addr` on the home stream, without a size check.
    pub fn new(addr: u64) -> Self {
        FreeRequest {
            addr,
            size: None,
            stream: None,
        }
    }

    /// Checks that the live allocation at the address asked for `size` bytes; refused (and
    /// nothing freed) when it did not.
    pub fn size(self, size: usize) -> Self {
        FreeRequest {
            size: Some(size),
            ..self
        }
    }

    /// On `stream` (see [`StreamSync`] for when the block is reused).
    pub fn on(self, stream: StreamId) -> Self {
        FreeRequest {
            stream: Some(stream),
            ..self
        }
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

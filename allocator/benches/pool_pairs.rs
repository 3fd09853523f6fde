//! Pool benchmark: alloc+free pairs against the system allocator.
//!
//! Workload (per thread): 64 live allocations; each operation frees a random one of them and
//! allocates a new one in its place (one alloc+free pair), sizes log-uniform in
//! [256 B, 4 MiB], alignment 256; 20,000 operations per round. The sizes and victims are drawn
//! before timing from a fixed seed, so every allocator sees the same sequence. Reported: the
//! median over rounds of ns per pair (one thread's elapsed time / its operations) and the
//! aggregate pairs per second (every thread's operations over the time from the first thread's
//! start to the last one's end), for 1 and 4 threads; with more than one thread, also in how
//! many rounds the threads ran at the same time (all had started before the first finished: on
//! a machine with few or busy CPUs one thread may run its whole script before another starts,
//! and then neither figure measures contention).
//!
//! Each thread count runs on threads started once, each with its worker (a pool client, a
//! stream) for every round, as a server's threads would: a pool's thread heaps and clients
//! live across rounds, and only the pairs are timed. `--fresh-threads` starts new threads
//! (and workers) for every round instead, as this benchmark did before: each round then also
//! makes and gives back every thread's heap and starts every client's peak from nothing.
//!
//! With the `cuda` feature and a GPU, five device columns run in the same process: a
//! `devarena::Pool` whose region is one `cuMemAlloc` on the device (classic, "cuda"), the same
//! pool on a growable region ("cuda-vmm": addresses reserved, device memory mapped in chunks
//! as the workload first reaches it, so the warm-up round maps and the timed rounds should
//! not), the classic pool with each thread allocating and freeing on a stream of its own
//! ("a stream per thread": as built by default, a heap for each thread and stream from its
//! first request on that stream; and "a stream per thread, one index", without thread heaps,
//! where every free on a stream other than the home stream records an event and parks its
//! block until the event completes), and `cuMemAllocAsync` / `cuMemFreeAsync` (each thread on its own stream, the
//! device's memory pool with its release threshold raised to `u64::MAX` so freed memory stays pooled;
//! the stream is synchronized at the end of the timed part). After the table: the growable
//! pool's ns/pair over the classic one's, and what growing and trimming cost: 1 GiB allocated
//! as 64 blocks of 16 MiB into a fresh growable pool, for several chunk sizes, then freed and
//! trimmed, beside one `cuMemAlloc` of 1 GiB. Without a GPU they are skipped with a note.
//!
//! ```text
//! cargo bench -p devarena --bench pool_pairs                   # host columns, table
//! cargo bench -p devarena --features cuda --bench pool_pairs   # + device columns
//! cargo bench -p devarena --bench pool_pairs -- --json         # one JSON document
//! options: --rounds N  --ops N  --live N  --threads 1,4  --fresh-threads  --only NAME
//!          --passes N (every column and thread count runs N times in turn, its rounds
//!          pooled: N × rounds)  --per-round (each pass's rounds on stderr)
//!          --pin 0,1,… (thread t of every column on the t-th CPU of the list, cyclically)
//!          --capacity-mib N (the shared pools' capacity, instead of room for every thread's
//!          live set at the largest size twice over: to see them near their cap)
//!          --stats-every-us N (a monitoring thread reads each pool's statistics every N µs
//!          while the threads run; how long each read took is printed after the table)
//! (columns whose name contains NAME, or one of `A|B|…`; ratios need the baselines,
//! "std::alloc" and "cuMemAllocAsync")
//! ```
//!
//! Host columns: the system allocator (the baseline), a `devarena::Pool` on host memory as
//! built by default, the same pool with a heap for every thread (`thread heaps`), with peaks
//! that count leases (`leased peaks`), without thread heaps (`one index`,
//! `PoolBuilder::thread_heaps(0)`: every thread on the pool's one index and lock, what heaps
//! buy) and with its reuse cache off (`PoolBuilder::reuse(0, 0)`: every free merges at once),
//! a pool of its own for every thread (`one per thread`: nothing
//! shared, so its scaling is what the machine allows this work, the ceiling for threads that
//! share a pool), the `offset-allocator` crate behind a mutex, and the pool on a growable
//! region over `HostVirtualMemory` (the host stand-in for a device's virtual memory, 2 MiB
//! chunks), with and without the reuse cache: what checking chunks adds to a pair, and how much
//! memory a growable region maps for this workload. (The stand-in fills every chunk it maps,
//! which page-faults it in: a map costs far more there than on a device, so any mapping left in
//! the timed rounds shows.) After the table, each pool reports how many of its allocations took
//! a freed block whole from the reuse cache and, when it grew, what it mapped.
//!
//! Every allocator is an [`AllocatorUnderTest`] measured by [`measure`]; [`allocators`] lists
//! them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use devarena::Pool;
use devarena::backend::HostVirtualMemory;
use devarena::pool::PoolClient;

/// An allocator the benchmark can drive.
trait AllocatorUnderTest: Sync {
    /// The column name.
    fn name(&self) -> String;
    /// One thread's handle (a pool client, a stream, ...), made before timing starts.
    fn worker(&self, thread: usize) -> Box<dyn Worker + '_>;
    /// A line for the notes after every run (what the allocator itself counted).
    fn summary(&self) -> Option<String> {
        None
    }
    /// What a monitoring thread reads while the workers run (`--stats-every-us`): nothing
    /// for an allocator without statistics.
    fn observe(&self) {}
}

/// One thread's view of an allocator under test.
trait Worker {
    /// Allocates `size` bytes at 256-byte alignment; `None` on failure (which aborts the run).
    fn alloc(&mut self, size: usize) -> Option<u64>;
    /// Frees an address `alloc` returned for `size` bytes.
    fn free(&mut self, addr: u64, size: usize);
    /// Waits for outstanding work (a stream synchronize on a device); inside the timed region.
    fn finish(&mut self) {}
}

// ---------------------------------------------------------------------------------------------
// The allocators.

/// A `devarena::Pool` (host, or device when built on a device backend): one shared pool, each
/// thread its own client.
struct DevarenaPool {
    pool: Pool,
    /// Beside the backend in the column name (`""` for the default configuration).
    label: &'static str,
    /// The most threads seen with a heap of their own on the pool (at a worker's end).
    heaps: AtomicUsize,
}

impl DevarenaPool {
    fn new(pool: Pool, label: &'static str) -> Self {
        DevarenaPool {
            pool,
            label,
            heaps: AtomicUsize::new(0),
        }
    }
}

struct PoolWorker<'a> {
    client: PoolClient,
    of: &'a DevarenaPool,
}

impl Drop for PoolWorker<'_> {
    fn drop(&mut self) {
        // After the timed part: how many threads had a heap of their own.
        self.of
            .heaps
            .fetch_max(self.of.pool.thread_heaps(), Ordering::Relaxed);
    }
}

impl AllocatorUnderTest for DevarenaPool {
    fn name(&self) -> String {
        format!("devarena Pool ({}{})", self.pool.backend_name(), self.label)
    }
    fn worker(&self, thread: usize) -> Box<dyn Worker + '_> {
        Box::new(PoolWorker {
            client: self.pool.client(&format!("thread-{thread}"), usize::MAX),
            of: self,
        })
    }
    fn observe(&self) {
        black_box(self.pool.stats());
    }
    fn summary(&self) -> Option<String> {
        let s = self.pool.stats();
        (s.allocations > 0).then(|| {
            let mut line = format!(
                "{}: {} of {} allocations ({:.1}%) took a freed block whole from a reuse \
                 cache; up to {} thread heaps at once; peak {} MiB of {} MiB",
                self.name(),
                s.reused,
                s.allocations,
                100.0 * s.reused as f64 / s.allocations as f64,
                self.heaps.load(Ordering::Relaxed),
                s.peak >> 20,
                s.capacity >> 20,
            );
            if s.maps > 0 {
                // Every chunk mapped once and never unmapped: mapping happened on growth only.
                line += &format!(
                    "; {} chunks of {} MiB mapped in all ({} MiB mapped now, {} unmapped), \
                     peak in use {} MiB",
                    s.maps,
                    s.chunk >> 20,
                    s.mapped >> 20,
                    s.unmaps,
                    s.peak >> 20
                );
            }
            line
        })
    }
}

impl Worker for PoolWorker<'_> {
    fn alloc(&mut self, size: usize) -> Option<u64> {
        self.client.allocate(size, 256).ok()
    }
    fn free(&mut self, addr: u64, _size: usize) {
        self.client
            .deallocate(addr)
            .expect("free a live allocation");
    }
}

/// A `devarena::Pool` on host memory for each thread, made by the thread that uses it: what
/// one thread's pairs cost when nothing is shared.
struct PoolPerThread {
    live: usize,
}

impl AllocatorUnderTest for PoolPerThread {
    fn name(&self) -> String {
        "devarena Pool (host, one per thread)".into()
    }
    fn worker(&self, thread: usize) -> Box<dyn Worker + '_> {
        // Room for one thread's live set at the largest size, twice over, as for the shared
        // pools.
        let capacity = (2 * self.live * (4 << 20)).next_power_of_two();
        let pool = Pool::builder(capacity)
            .name(format!("bench-own-{thread}"))
            .build_host()
            .expect("reserve the pool's region");
        Box::new(OwnPoolWorker { pool })
    }
}

struct OwnPoolWorker {
    pool: Pool,
}

impl Worker for OwnPoolWorker {
    fn alloc(&mut self, size: usize) -> Option<u64> {
        self.pool.allocate(size, 256).ok()
    }
    fn free(&mut self, addr: u64, _size: usize) {
        self.pool.deallocate(addr).expect("free a live allocation");
    }
}

/// The machine's CPUs as Linux describes them (online CPUs, cores, sockets): whether the
/// threads of a run have cores of their own or share them with hyperthreads.
fn cpu_topology() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let read = |cpu: usize, what: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}"))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut cores = std::collections::BTreeSet::new();
    let mut sockets = std::collections::BTreeSet::new();
    for cpu in 0..cpus {
        if let (Some(socket), Some(core)) = (read(cpu, "physical_package_id"), read(cpu, "core_id"))
        {
            cores.insert((socket.clone(), core));
            sockets.insert(socket);
        }
    }
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    if cores.is_empty() {
        return format!("cpus: {cpus} available ({model}); topology unknown");
    }
    format!(
        "cpus: {cpus} available, {} cores in {} socket(s) ({model})",
        cores.len(),
        sockets.len()
    )
}

/// The system allocator (`std::alloc::System`, glibc malloc here): the host baseline.
struct SystemAlloc;

struct SystemWorker;

impl AllocatorUnderTest for SystemAlloc {
    fn name(&self) -> String {
        "std::alloc (System)".into()
    }
    fn worker(&self, _thread: usize) -> Box<dyn Worker + '_> {
        Box::new(SystemWorker)
    }
}

impl Worker for SystemWorker {
    fn alloc(&mut self, size: usize) -> Option<u64> {
        let layout = Layout::from_size_align(size, 256).ok()?;
        // SAFETY: the layout has a non-zero size (the workload's sizes are at least 256).
        let ptr = unsafe { System.alloc(layout) };
        (!ptr.is_null()).then_some(ptr as u64)
    }
    fn free(&mut self, addr: u64, size: usize) {
        let layout = Layout::from_size_align(size, 256).expect("valid layout");
        // SAFETY: `addr` came from `alloc` with this same layout and is freed once.
        unsafe { System.dealloc(addr as usize as *mut u8, layout) }
    }
}

/// The `offset-allocator` crate (a port of Sebastian Aaltonen's OffsetAllocator) under the same
/// contract as the pool: a `Mutex`, an address map (its free needs its own handle), 256-byte
/// units (its sizes are `u32`, so units are how it reaches past 4 GiB). It has no alignment
/// parameter: 256 comes from the unit.
struct OffsetAllocator {
    inner: Mutex<(
        offset_allocator::Allocator,
        HashMap<u64, offset_allocator::Allocation>,
    )>,
}

struct OffsetWorker<'a> {
    of: &'a OffsetAllocator,
}

impl OffsetAllocator {
    fn new(capacity: usize) -> Self {
        OffsetAllocator {
            inner: Mutex::new((
                offset_allocator::Allocator::new((capacity / 256) as u32),
                HashMap::with_capacity(1024),
            )),
        }
    }
}

impl AllocatorUnderTest for OffsetAllocator {
    fn name(&self) -> String {
        "offset-allocator 0.2".into()
    }
    fn worker(&self, _thread: usize) -> Box<dyn Worker + '_> {
        Box::new(OffsetWorker { of: self })
    }
}

impl Worker for OffsetWorker<'_> {
    fn alloc(&mut self, size: usize) -> Option<u64> {
        let mut guard = self.of.inner.lock().unwrap();
        let (allocator, map) = &mut *guard;
        let a = allocator.allocate(size.div_ceil(256) as u32)?;
        let addr = a.offset as u64 * 256;
        map.insert(addr, a);
        Some(addr)
    }
    fn free(&mut self, addr: u64, _size: usize) {
        let mut guard = self.of.inner.lock().unwrap();
        let (allocator, map) = &mut *guard;
        let a = map.remove(&addr).expect("free a live allocation");
        allocator.free(a);
    }
}

/// Every column, the host baseline first; then the device columns when there is a GPU (with
/// `notes` saying why not otherwise).
fn allocators(
    capacity: usize,
    live: usize,
    notes: &mut Vec<String>,
) -> Vec<Box<dyn AllocatorUnderTest>> {
    let mut all: Vec<Box<dyn AllocatorUnderTest>> = vec![
        Box::new(SystemAlloc),
        Box::new(DevarenaPool::new(
            Pool::builder(capacity)
                .name("bench")
                .build_host()
                .expect("reserve the pool's region"),
            "",
        )),
        // The same pool with a heap for every thread from its first call (not only when it
        // meets another on the pool's lock): what a thread heap's path costs, on any machine.
        Box::new(DevarenaPool::new(
            Pool::builder(capacity)
                .name("bench-heaps")
                .eager_thread_heaps(true)
                .build_host()
                .expect("reserve the pool's region"),
            ", thread heaps",
        )),
        // The same pool with peaks that count the headroom thread heaps hold: heaps ask the
        // pool for headroom in chunks instead of whenever use nears the peak.
        Box::new(DevarenaPool::new(
            Pool::builder(capacity)
                .name("bench-leased-peaks")
                .exact_peaks(false)
                .build_host()
                .expect("reserve the pool's region"),
            ", leased peaks",
        )),
        // The same pool without thread heaps: every thread on the pool's one index and lock,
        // as before heaps existed (what heaps buy, and how the lock itself fares contended).
        Box::new(DevarenaPool::new(
            Pool::builder(capacity)
                .name("bench-one-index")
                .thread_heaps(0)
                .build_host()
                .expect("reserve the pool's region"),
            ", one index",
        )),
        // The same pool with every free merged at once: what the reuse cache saves.
        Box::new(DevarenaPool::new(
            Pool::builder(capacity)
                .name("bench-no-reuse")
                .reuse(0, 0)
                .build_host()
                .expect("reserve the pool's region"),
            ", no reuse",
        )),
        Box::new(OffsetAllocator::new(capacity)),
        // A pool of its own for every thread: no state shared between threads at all, so its
        // `x 1 thr` is what the machine allows this work (cores, caches, clock), the ceiling
        // for threads that share one pool.
        Box::new(PoolPerThread { live }),
        // The pool on a growable region over the host stand-in for a device's virtual memory:
        // what checking (and, in the warm-up round, mapping) chunks adds to each pair.
        Box::new(DevarenaPool::new(
            Pool::builder(capacity)
                .name("bench-vm")
                .build_mapped(HostVirtualMemory::new(2 << 20).expect("a valid granularity"))
                .expect("reserve the pool's addresses"),
            "",
        )),
        // The same without the reuse cache: the memory a growable region then holds.
        Box::new(DevarenaPool::new(
            Pool::builder(capacity)
                .name("bench-vm-no-reuse")
                .reuse(0, 0)
                .build_mapped(HostVirtualMemory::new(2 << 20).expect("a valid granularity"))
                .expect("reserve the pool's addresses"),
            ", no reuse",
        )),
    ];
    device::push_columns(capacity, &mut all, notes);
    all
}

#[cfg(not(feature = "cuda"))]
mod device {
    use super::AllocatorUnderTest;

    pub const ASYNC_NAME: &str = "cuMemAllocAsync";
    pub const CLASSIC_NAME: &str = "devarena Pool (cuda)";
    pub const GROWABLE_NAME: &str = "devarena Pool (cuda-vmm)";

    pub fn push_columns(
        _capacity: usize,
        _all: &mut Vec<Box<dyn AllocatorUnderTest>>,
        notes: &mut Vec<String>,
    ) {
        notes.push("device columns skipped: built without the `cuda` feature".into());
    }
}

#[cfg(feature = "cuda")]
mod device {
    //! The device columns: a pool on a `cuMemAlloc` region, and the driver's stream-ordered
    //! allocator.

    use std::sync::Arc;

    use std::time::Instant;

    use cudarc::driver::{CudaContext, result, sys};
    use devarena::Pool;
    use devarena::backend::cuda::{CudaStream, cuda_stream, describe_device, driver_error};
    use devarena::pool::RegionKind;

    use super::{AllocatorUnderTest, DevarenaPool, PoolWorker, Worker};

    /// The column name of `cuMemAllocAsync` / `cuMemFreeAsync`.
    pub const ASYNC_NAME: &str = "cuMemAllocAsync";
    /// The column names of the device pools, classic and growable.
    pub const CLASSIC_NAME: &str = "devarena Pool (cuda)";
    pub const GROWABLE_NAME: &str = "devarena Pool (cuda-vmm)";

    pub fn push_columns(
        capacity: usize,
        all: &mut Vec<Box<dyn AllocatorUnderTest>>,
        notes: &mut Vec<String>,
    ) {
        let stream = match cuda_stream(0) {
            Ok(stream) => stream,
            Err(e) => {
                notes.push(format!("device columns skipped: no CUDA device ({e})"));
                return;
            }
        };
        match describe_device(&stream) {
            Ok(d) => notes.push(format!("device: {d}")),
            Err(e) => notes.push(format!("device: (not described: {e})")),
        }
        match Pool::builder(capacity)
            .name("bench-cuda")
            .region(RegionKind::Classic)
            .build_cuda(stream.clone())
        {
            Ok(pool) => all.push(Box::new(DevarenaPool::new(pool, ""))),
            Err(e) => notes.push(format!("{CLASSIC_NAME} skipped: {e}")),
        }
        match Pool::builder(capacity)
            .name("bench-cuda-vmm")
            .region(RegionKind::Growable)
            .build_cuda(stream.clone())
        {
            Ok(pool) => all.push(Box::new(DevarenaPool::new(pool, ""))),
            Err(e) => notes.push(format!("{GROWABLE_NAME} skipped: {e}")),
        }
        // Each thread on a stream of its own, as `cuMemAllocAsync` below: the pool as built by
        // default (each thread gets a heap for its stream at its first request there), and
        // the same without thread heaps (the pool's index alone, where a free on a stream other
        // than the home stream records an event and parks its block).
        for (heaps, label) in [
            (true, ", a stream per thread"),
            (false, ", a stream per thread, one index"),
        ] {
            let builder = Pool::builder(capacity)
                .name("bench-cuda-streams")
                .region(RegionKind::Classic);
            let builder = if heaps {
                builder
            } else {
                builder.thread_heaps(0)
            };
            match builder.build_cuda(stream.clone()) {
                Ok(pool) => all.push(Box::new(PerStream {
                    pool: DevarenaPool::new(pool, label),
                    ctx: stream.context().clone(),
                })),
                Err(e) => notes.push(format!("{CLASSIC_NAME}{label} skipped: {e}")),
            }
        }
        growth_notes(&stream, notes);
        match StreamOrdered::new(&stream) {
            Ok(async_alloc) => all.push(Box::new(async_alloc)),
            Err(e) => notes.push(format!("{ASYNC_NAME} skipped: {e}")),
        }
    }

    /// What growing and trimming cost: 1 GiB as 64 blocks of 16 MiB into a fresh growable pool
    /// (every block maps its chunks), freed and trimmed, per chunk size; and one `cuMemAlloc`
    /// of 1 GiB (a classic region of that size) beside it. One line each in `notes`.
    fn growth_notes(stream: &std::sync::Arc<CudaStream>, notes: &mut Vec<String>) {
        const GIB: usize = 1 << 30;
        const BLOCK: usize = 16 << 20;
        let t = Instant::now();
        match Pool::builder(GIB)
            .region(RegionKind::Classic)
            .build_cuda(stream.clone())
        {
            Ok(pool) => {
                let made = t.elapsed();
                let t = Instant::now();
                drop(pool);
                notes.push(format!(
                    "growth: a classic region of 1 GiB (one cuMemAlloc): {:.2} ms to make, \
                     {:.2} ms to free",
                    made.as_secs_f64() * 1e3,
                    t.elapsed().as_secs_f64() * 1e3
                ));
            }
            Err(e) => notes.push(format!("growth: classic region skipped: {e}")),
        }
        for chunk in [2usize << 20, 8 << 20, 32 << 20, 128 << 20] {
            let pool = match Pool::builder(2 * GIB)
                .chunk(chunk)
                .build_cuda(stream.clone())
            {
                Ok(pool) => pool,
                Err(e) => {
                    notes.push(format!(
                        "growth with {} MiB chunks skipped: {e}",
                        chunk >> 20
                    ));
                    continue;
                }
            };
            let t = Instant::now();
            let blocks: Result<Vec<u64>, _> =
                (0..GIB / BLOCK).map(|_| pool.allocate(BLOCK, 0)).collect();
            let grew = t.elapsed();
            let blocks = match blocks {
                Ok(blocks) => blocks,
                Err(e) => {
                    notes.push(format!(
                        "growth with {} MiB chunks failed: {e}",
                        chunk >> 20
                    ));
                    continue;
                }
            };
            for b in blocks {
                pool.deallocate(b).expect("free a live block");
            }
            let t = Instant::now();
            let trimmed = pool.trim();
            let trim = t.elapsed();
            let s = pool.stats();
            notes.push(format!(
                "growth: 1 GiB as {} blocks of 16 MiB, {} MiB chunks: {:.2} ms mapping {} chunks \
                 ({:.1} us per chunk, {:.2} ms per GiB); trim {:.2} ms{}",
                GIB / BLOCK,
                chunk >> 20,
                grew.as_secs_f64() * 1e3,
                s.maps,
                grew.as_secs_f64() * 1e6 / s.maps.max(1) as f64,
                grew.as_secs_f64() * 1e3 * GIB as f64 / s.peak_mapped.max(1) as f64,
                trim.as_secs_f64() * 1e3,
                match trimmed {
                    Ok(bytes) => format!(" ({} MiB unmapped)", bytes >> 20),
                    Err(e) => format!(" (failed: {e})"),
                }
            ));
        }
    }

    /// `cuMemAllocAsync` / `cuMemFreeAsync` from the device's current memory pool, whose
    /// release threshold is raised to `u64::MAX` so that freed memory stays in the pool.
    struct StreamOrdered {
        ctx: Arc<CudaContext>,
    }

    impl StreamOrdered {
        fn new(stream: &Arc<CudaStream>) -> Result<Self, String> {
            let ctx = stream.context().clone();
            if !ctx.has_async_alloc() {
                return Err("the device has no memory pools".into());
            }
            ctx.bind_to_thread()
                .map_err(|e| driver_error("cuCtxSetCurrent", e).to_string())?;
            // SAFETY: the device comes from a live context; `threshold` is the u64 that
            // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD reads.
            unsafe {
                let pool = result::device::get_mem_pool(ctx.cu_device())
                    .map_err(|e| driver_error("cuDeviceGetMemPool", e).to_string())?;
                let mut threshold = u64::MAX;
                result::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                )
                .map_err(|e| driver_error("cuMemPoolSetAttribute", e).to_string())?;
            }
            Ok(StreamOrdered { ctx })
        }
    }

    /// A device pool whose threads each allocate and free on a stream of their own,
    /// registered with the pool.
    struct PerStream {
        pool: DevarenaPool,
        ctx: Arc<CudaContext>,
    }

    /// A pool worker on a stream of its own (kept alive while it works).
    struct PerStreamWorker<'a> {
        on: PoolWorker<'a>,
        stream: devarena::pool::StreamId,
        _stream: Arc<CudaStream>,
    }

    impl AllocatorUnderTest for PerStream {
        fn name(&self) -> String {
            self.pool.name()
        }
        fn worker(&self, thread: usize) -> Box<dyn Worker + '_> {
            let stream = self.ctx.new_stream().expect("cuStreamCreate");
            let id = self
                .pool
                .pool
                .register_stream(&stream)
                .expect("register the thread's stream");
            Box::new(PerStreamWorker {
                on: PoolWorker {
                    client: self
                        .pool
                        .pool
                        .client(&format!("thread-{thread}"), usize::MAX),
                    of: &self.pool,
                },
                stream: id,
                _stream: stream,
            })
        }
        fn summary(&self) -> Option<String> {
            self.pool.summary()
        }
    }

    impl Worker for PerStreamWorker<'_> {
        fn alloc(&mut self, size: usize) -> Option<u64> {
            self.on.client.allocate_on(size, 256, self.stream).ok()
        }
        fn free(&mut self, addr: u64, _size: usize) {
            self.on
                .client
                .deallocate_on(addr, self.stream)
                .expect("free a live allocation");
        }
    }

    struct StreamOrderedWorker {
        stream: Arc<CudaStream>,
    }

    impl AllocatorUnderTest for StreamOrdered {
        fn name(&self) -> String {
            ASYNC_NAME.into()
        }
        fn worker(&self, _thread: usize) -> Box<dyn Worker + '_> {
            // Made on the thread that uses it: the context is bound there from now on.
            let stream = self.ctx.new_stream().expect("cuStreamCreate");
            Box::new(StreamOrderedWorker { stream })
        }
    }

    impl Worker for StreamOrderedWorker {
        fn alloc(&mut self, size: usize) -> Option<u64> {
            // SAFETY: the context is bound on this thread (`new_stream` bound it) and the
            // stream is alive; the memory is only passed back to `free`.
            unsafe { result::malloc_async(self.stream.cu_stream(), size) }.ok()
        }
        fn free(&mut self, addr: u64, _size: usize) {
            // SAFETY: `addr` came from `cuMemAllocAsync` and is freed once, on its stream.
            unsafe { result::free_async(addr, self.stream.cu_stream()) }.expect("cuMemFreeAsync");
        }
        fn finish(&mut self) {
            self.stream.synchronize().expect("cuStreamSynchronize");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The workload.

#[derive(Clone, Copy)]
struct Config {
    rounds: usize,
    ops: usize,
    live: usize,
    /// New threads (and workers) for every round, instead of the same ones throughout.
    fresh_threads: bool,
    /// Thread `t` runs on CPU `pin[t % pin.len()]` (empty: wherever the scheduler puts it).
    pin: &'static [usize],
    /// A monitoring thread reads the allocator's statistics every this many microseconds
    /// while the workers run (0: none).
    stats_every_us: u64,
}

/// SplitMix64: a fixed, dependency-free random sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Log-uniform in [lo, hi].
    fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
        ((l + u * (h - l)).exp() as usize).clamp(lo, hi)
    }
}

/// One thread's pre-drawn sequence: the initial sizes, then (victim, new size) per operation.
struct Script {
    initial: Vec<usize>,
    ops: Vec<(usize, usize)>,
}

fn script(cfg: Config, seed: u64) -> Script {
    let mut rng = Rng(seed);
    let initial = (0..cfg.live)
        .map(|_| rng.log_uniform(256, 4 << 20))
        .collect();
    let ops = (0..cfg.ops)
        .map(|_| {
            let victim = (rng.next() % cfg.live as u64) as usize;
            (victim, rng.log_uniform(256, 4 << 20))
        })
        .collect();
    Script { initial, ops }
}

/// The calling thread's on-CPU time (`CLOCK_THREAD_CPUTIME_ID`), on Linux: on a machine shared
/// with other work, wall time also counts the time the thread waited for a CPU.
#[cfg(target_os = "linux")]
fn thread_cpu_time() -> Option<Duration> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` from the C library writes one `struct timespec` (two 64-bit
    // fields on x86-64 and aarch64 Linux) through the valid pointer it is given.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_time() -> Option<Duration> {
    None
}

/// Pins the calling thread to `cpu` (Linux; elsewhere nothing): on a virtual machine whose
/// vCPUs run at different speeds from one moment to the next, columns whose threads run on the
/// same vCPUs, in turn, compare like with like.
#[cfg(target_os = "linux")]
fn pin_to(cpu: usize) {
    unsafe extern "C" {
        fn sched_setaffinity(pid: i32, size: usize, mask: *const u64) -> i32;
    }
    let mut mask = [0u64; 16];
    let Some(word) = mask.get_mut(cpu / 64) else {
        panic!(
            "--pin: CPU {cpu} is beyond the {} this benchmark can name",
            16 * 64
        );
    };
    *word |= 1 << (cpu % 64);
    // SAFETY: `sched_setaffinity` reads `size` bytes of CPU mask from the valid pointer it is
    // given (`mask`, 16 words); pid 0 is the calling thread.
    let rc = unsafe { sched_setaffinity(0, core::mem::size_of_val(&mask), mask.as_ptr()) };
    assert_eq!(rc, 0, "--pin: the thread could not be pinned to CPU {cpu}");
}

#[cfg(not(target_os = "linux"))]
fn pin_to(_cpu: usize) {}

/// Pins thread `t` of a measurement as `--pin` says.
fn pin_thread(cfg: Config, t: usize) {
    if !cfg.pin.is_empty() {
        pin_to(cfg.pin[t % cfg.pin.len()]);
    }
}

/// Wall and on-CPU time of one thread's timed part.
#[derive(Clone, Copy)]
struct Timing {
    wall: Duration,
    cpu: Option<Duration>,
    start: Instant,
    end: Instant,
}

/// The start line of a round's timed part. Its waiters spin (yielding once they have spun for
/// a millisecond or so), so that every thread starts within about a microsecond of the last
/// one's arrival: `std::sync::Barrier` wakes its sleeping waiters one at a time through the
/// kernel, tens of microseconds apart, and on rounds of about a millisecond that skew counted
/// as lost aggregate throughput (a pool per thread, sharing nothing, measured 1.47× with two
/// threads on two CPUs instead of 2.0×).
struct SpinBarrier {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    /// A thread of the run panicked (an allocation failed): the others stop waiting for it.
    broken: AtomicBool,
}

/// Marks the barrier broken when its thread unwinds, so that no other thread waits for ever.
struct BreakOnPanic<'a>(&'a SpinBarrier);

impl Drop for BreakOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.broken.store(true, Ordering::Release);
        }
    }
}

impl SpinBarrier {
    fn new(threads: usize) -> Self {
        SpinBarrier {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
        }
    }

    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            // Reset before the release: a thread that leaves sees it.
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if self.broken.load(Ordering::Acquire) {
                panic!("another thread of the run failed before the start");
            }
            if spins < 1 << 20 {
                core::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Runs one thread's script on `worker`; returns the time of the timed part.
fn run_script(worker: &mut dyn Worker, script: &Script, start: &SpinBarrier) -> Timing {
    let _break_on_panic = BreakOnPanic(start);
    let mut live: Vec<(u64, usize)> = script
        .initial
        .iter()
        .map(|&size| (worker.alloc(size).expect("initial allocation"), size))
        .collect();
    start.wait();
    let cpu0 = thread_cpu_time();
    let t0 = Instant::now();
    for &(victim, size) in &script.ops {
        let (addr, old) = live[victim];
        worker.free(addr, old);
        let addr = worker.alloc(size).unwrap_or_else(|| {
            panic!("allocation of {size} bytes failed: the benchmark's capacity is too small")
        });
        live[victim] = (black_box(addr), size);
    }
    worker.finish();
    let wall = t0.elapsed();
    let cpu = thread_cpu_time()
        .zip(cpu0)
        .map(|(b, a)| b.saturating_sub(a));
    for (addr, size) in live {
        worker.free(addr, size);
    }
    Timing {
        wall,
        cpu,
        start: t0,
        end: t0 + wall,
    }
}

/// One measurement, per round: ns per pair (mean over threads) by wall clock and by on-CPU
/// time, and aggregate pairs per second.
struct Measured {
    ns_per_pair: Vec<f64>,
    cpu_ns_per_pair: Vec<f64>,
    pairs_per_sec: Vec<f64>,
    /// Rounds in which every thread had started before the first one finished.
    overlapped: usize,
    /// Microseconds each read of the monitoring thread took (`--stats-every-us`).
    observe_us: Vec<f64>,
}

impl Measured {
    /// Adds another pass's rounds.
    fn absorb(&mut self, other: Measured) {
        self.ns_per_pair.extend(other.ns_per_pair);
        self.cpu_ns_per_pair.extend(other.cpu_ns_per_pair);
        self.pairs_per_sec.extend(other.pairs_per_sec);
        self.overlapped += other.overlapped;
        self.observe_us.extend(other.observe_us);
    }
}

/// A monitoring thread that reads `alloc`'s statistics every `every_us` microseconds until
/// `done` is set (none when `every_us` is 0), and records how long each read took in
/// `observed`.
fn spawn_monitor<'scope, 'env>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    alloc: &'env dyn AllocatorUnderTest,
    done: &'env AtomicBool,
    every_us: u64,
    observed: &'env Mutex<Vec<f64>>,
) {
    if every_us > 0 {
        s.spawn(move || {
            let mut took = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                alloc.observe();
                took.push(t0.elapsed().as_secs_f64() * 1e6);
                std::thread::sleep(Duration::from_micros(every_us));
            }
            observed.lock().unwrap().extend(took);
        });
    }
}

fn measure(alloc: &dyn AllocatorUnderTest, threads: usize, cfg: Config) -> Measured {
    let scripts: Vec<Script> = (0..threads)
        .map(|t| script(cfg, 0xDE7A_4E4A + t as u64))
        .collect();
    let done = AtomicBool::new(false);
    let observed = Mutex::new(Vec::new());
    // Round 0 warms up (page faults, allocator caches) and is not reported.
    let rounds: Vec<Vec<Timing>> = if cfg.fresh_threads {
        (0..=cfg.rounds)
            .map(|_| {
                let start = SpinBarrier::new(threads);
                std::thread::scope(|s| {
                    done.store(false, Ordering::Relaxed);
                    spawn_monitor(s, alloc, &done, cfg.stats_every_us, &observed);
                    let handles: Vec<_> = scripts
                        .iter()
                        .enumerate()
                        .map(|(t, script)| {
                            let start = &start;
                            s.spawn(move || {
                                pin_thread(cfg, t);
                                let mut worker = alloc.worker(t);
                                run_script(&mut *worker, script, start)
                            })
                        })
                        .collect();
                    let timings = handles.into_iter().map(|h| h.join().unwrap()).collect();
                    done.store(true, Ordering::Relaxed);
                    timings
                })
            })
            .collect()
    } else {
        // The same threads, each with its worker, for every round: the barrier in
        // `run_script` starts each round's timed part on every thread at once.
        let start = SpinBarrier::new(threads);
        let per_thread: Vec<Vec<Timing>> = std::thread::scope(|s| {
            spawn_monitor(s, alloc, &done, cfg.stats_every_us, &observed);
            let handles: Vec<_> = scripts
                .iter()
                .enumerate()
                .map(|(t, script)| {
                    let start = &start;
                    s.spawn(move || {
                        pin_thread(cfg, t);
                        let mut worker = alloc.worker(t);
                        (0..=cfg.rounds)
                            .map(|_| run_script(&mut *worker, script, start))
                            .collect::<Vec<Timing>>()
                    })
                })
                .collect();
            let per_thread = handles.into_iter().map(|h| h.join().unwrap()).collect();
            done.store(true, Ordering::Relaxed);
            per_thread
        });
        (0..=cfg.rounds)
            .map(|r| per_thread.iter().map(|rounds| rounds[r]).collect())
            .collect()
    };
    let mut measured = Measured {
        ns_per_pair: Vec::new(),
        cpu_ns_per_pair: Vec::new(),
        pairs_per_sec: Vec::new(),
        overlapped: 0,
        observe_us: Vec::new(),
    };
    for timings in rounds.iter().skip(1) {
        let first_start = timings.iter().map(|t| t.start).min().expect("a thread");
        let last_start = timings.iter().map(|t| t.start).max().expect("a thread");
        let first_end = timings.iter().map(|t| t.end).min().expect("a thread");
        let last_end = timings.iter().map(|t| t.end).max().expect("a thread");
        if last_start < first_end {
            measured.overlapped += 1;
        }
        let per_pair = |d: Duration| d.as_nanos() as f64 / cfg.ops as f64;
        let mean = |f: &dyn Fn(&Timing) -> Option<f64>| {
            timings
                .iter()
                .map(f)
                .sum::<Option<f64>>()
                .map(|s| s / threads as f64)
        };
        measured
            .ns_per_pair
            .extend(mean(&|t| Some(per_pair(t.wall))));
        measured
            .cpu_ns_per_pair
            .extend(mean(&|t| t.cpu.map(per_pair)));
        measured
            .pairs_per_sec
            .push((threads * cfg.ops) as f64 / (last_end - first_start).as_secs_f64());
    }
    measured.observe_us = observed.into_inner().unwrap();
    measured
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut cfg = Config {
        rounds: 11,
        ops: 20_000,
        live: 64,
        fresh_threads: false,
        pin: &[],
        stats_every_us: 0,
    };
    let mut threads = vec![1usize, 4];
    let mut json = false;
    let mut per_round = false;
    let mut passes = 1usize;
    let mut only: Option<String> = None;
    let mut capacity_mib: Option<usize> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match arg.as_str() {
            "--json" => json = true,
            "--per-round" => per_round = true,
            "--pin" => {
                let cpus: Vec<usize> = value("--pin")
                    .split(',')
                    .map(|c| c.parse().expect("--pin 0,1,2"))
                    .collect();
                cfg.pin = Vec::leak(cpus);
            }
            "--fresh-threads" => cfg.fresh_threads = true,
            "--stats-every-us" => {
                cfg.stats_every_us = value("--stats-every-us")
                    .parse()
                    .expect("--stats-every-us N")
            }
            "--only" => only = Some(value("--only")),
            "--capacity-mib" => {
                capacity_mib = Some(value("--capacity-mib").parse().expect("--capacity-mib N"))
            }
            "--rounds" => cfg.rounds = value("--rounds").parse().expect("--rounds N"),
            "--passes" => passes = value("--passes").parse().expect("--passes N"),
            "--ops" => cfg.ops = value("--ops").parse().expect("--ops N"),
            "--live" => cfg.live = value("--live").parse().expect("--live N"),
            "--threads" => {
                threads = value("--threads")
                    .split(',')
                    .map(|t| t.parse().expect("--threads 1,4"))
                    .collect()
            }
            // `cargo bench` passes `--bench`; filters are not used.
            _ => {}
        }
    }
    assert!(
        cfg.rounds > 0 && cfg.ops > 0 && cfg.live > 0 && passes > 0,
        "rounds, ops, live and passes must be > 0"
    );
    let max_threads = threads.iter().copied().max().unwrap_or(1);
    // Room for every thread's live set at the largest size, twice over (fragmentation);
    // `--capacity-mib` sets it instead, to see the shared pools near their cap.
    let capacity = capacity_mib.map_or_else(
        || (2 * max_threads * cfg.live * (4 << 20)).next_power_of_two(),
        |mib| mib << 20,
    );
    let mut notes = Vec::new();
    notes.push(cpu_topology());
    let allocators = allocators(capacity, cfg.live, &mut notes);

    // With several passes, every allocator runs once per pass and thread count, in turn, and
    // its rounds from all passes are pooled: a drift of the machine (clocks, placement, a
    // neighbour on a shared host) over the run then spreads over every column and every
    // thread count, instead of favouring what ran first. The thread counts take turns within
    // a pass, so that a column's one-thread rounds, the denominator of its scaling, come from
    // the same stretches of time as its rounds on more threads.
    let selected = |alloc: &dyn AllocatorUnderTest| {
        only.as_ref()
            .is_none_or(|o| o.split('|').any(|name| alloc.name().contains(name)))
    };
    let mut pooled: Vec<Vec<Option<Measured>>> = threads
        .iter()
        .map(|_| allocators.iter().map(|_| None).collect())
        .collect();
    for _ in 0..passes {
        for (&t, pooled) in threads.iter().zip(&mut pooled) {
            for (alloc, pool) in allocators.iter().zip(pooled.iter_mut()) {
                if !selected(&**alloc) {
                    continue;
                }
                let m = measure(&**alloc, t, cfg);
                if per_round {
                    // Every round of this pass, to tell a drift within a run from one
                    // between runs.
                    let rounds: Vec<String> =
                        m.ns_per_pair.iter().map(|ns| format!("{ns:.1}")).collect();
                    eprintln!("round ns/pair: {} x{t}: {}", alloc.name(), rounds.join(" "));
                }
                match pool {
                    Some(p) => p.absorb(m),
                    None => *pool = Some(m),
                }
            }
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for (&t, pooled) in threads.iter().zip(pooled) {
        for (alloc, m) in allocators.iter().zip(pooled) {
            let Some(m) = m else { continue };
            if !m.observe_us.is_empty() {
                notes.push(format!(
                    "{} x{t}: {} reads of the statistics while the threads ran, median {:.1} \
                     us, longest {:.1} us",
                    alloc.name(),
                    m.observe_us.len(),
                    median(&m.observe_us),
                    m.observe_us.iter().copied().fold(0.0, f64::max),
                ));
            }
            rows.push(Row {
                name: alloc.name(),
                threads: t,
                ns: median(&m.ns_per_pair),
                cpu_ns: (!m.cpu_ns_per_pair.is_empty()).then(|| median(&m.cpu_ns_per_pair)),
                pairs_per_sec: median(&m.pairs_per_sec),
                overlapped: m.overlapped,
            });
        }
    }
    notes.extend(allocators.iter().filter_map(|a| a.summary()));
    let baseline_name = allocators[0].name();
    let baseline = |threads: usize| {
        rows.iter()
            .find(|r| r.threads == threads && r.name == baseline_name)
            .map(|r| r.ns)
            .unwrap_or(f64::NAN)
    };
    // Aggregate throughput against the same allocator on one thread in this run: how it
    // scales with threads (needs `1` in `--threads`).
    let scaling = |r: &Row| {
        rows.iter()
            .find(|o| o.threads == 1 && o.name == r.name)
            .map(|o| r.pairs_per_sec / o.pairs_per_sec)
    };
    // The device baseline, when the device columns ran.
    let async_baseline = |threads: usize| {
        rows.iter()
            .find(|r| r.threads == threads && r.name == device::ASYNC_NAME)
            .map(|r| r.ns)
    };

    if json {
        let entries: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"allocator\":\"{}\",\"threads\":{},\"median_ns_per_pair\":{:.2},\
                     \"median_cpu_ns_per_pair\":{},\"median_pairs_per_sec\":{:.0},\
                     \"scaling_vs_one_thread\":{},\
                     \"rounds_overlapped\":{},\"speedup_vs_system\":{:.3},\
                     \"speedup_vs_cumemallocasync\":{}}}",
                    r.name,
                    r.threads,
                    r.ns,
                    r.cpu_ns.map_or("null".to_string(), |c| format!("{c:.2}")),
                    r.pairs_per_sec,
                    scaling(r).map_or("null".to_string(), |x| format!("{x:.3}")),
                    r.overlapped,
                    baseline(r.threads) / r.ns,
                    async_baseline(r.threads)
                        .map_or("null".to_string(), |a| format!("{:.3}", a / r.ns))
                )
            })
            .collect();
        let notes: Vec<String> = notes
            .iter()
            .map(|n| format!("\"{}\"", n.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        println!(
            "{{\"workload\":{{\"live\":{},\"ops\":{},\"rounds\":{},\"passes\":{},\"fresh_threads\":{},\"sizes\":\"log-uniform [256 B, 4 MiB]\",\"align\":256}},\"notes\":[{}],\"results\":[{}]}}",
            cfg.live,
            cfg.ops,
            cfg.rounds,
            passes,
            cfg.fresh_threads,
            notes.join(","),
            entries.join(",")
        );
        return;
    }
    println!(
        "alloc+free pairs: {} live, {} ops/round, sizes log-uniform [256 B, 4 MiB], align 256, \
         median of {} rounds{} (ns/pair: wall clock per thread; cpu: the thread's on-CPU time); {}",
        cfg.live,
        cfg.ops,
        cfg.rounds * passes,
        if passes > 1 {
            format!(" ({passes} passes over the columns in turn)")
        } else {
            String::new()
        },
        if cfg.fresh_threads {
            "new threads every round"
        } else {
            "the same threads for every round"
        }
    );
    for note in &notes {
        println!("{note}");
    }
    println!();
    let device_ran = rows.iter().any(|r| r.name == device::ASYNC_NAME);
    print!(
        "{:<36} {:>7} {:>10} {:>10} {:>15} {:>9} {:>8} {:>11}",
        "allocator",
        "threads",
        "ns/pair",
        "cpu ns",
        "Mpairs/s (all)",
        "x 1 thr",
        "overlap",
        "vs system"
    );
    if device_ran {
        print!(" {:>11}", "vs async");
    }
    println!();
    for r in &rows {
        let cpu = r.cpu_ns.map_or("-".to_string(), |c| format!("{c:.1}"));
        let overlap = if r.threads > 1 {
            format!("{}/{}", r.overlapped, cfg.rounds * passes)
        } else {
            "-".to_string()
        };
        // "-" where `--only` left the baseline out.
        let vs_system = baseline(r.threads) / r.ns;
        let vs_system = if vs_system.is_nan() {
            "-".to_string()
        } else {
            format!("{vs_system:.2}x")
        };
        let scaled = scaling(r).map_or("-".to_string(), |x| format!("{x:.2}x"));
        print!(
            "{:<36} {:>7} {:>10.1} {:>10} {:>15.2} {:>9} {:>8} {:>11}",
            r.name,
            r.threads,
            r.ns,
            cpu,
            r.pairs_per_sec / 1e6,
            scaled,
            overlap,
            vs_system
        );
        if device_ran {
            match async_baseline(r.threads) {
                Some(a) => print!(" {:>10.2}x", a / r.ns),
                None => print!(" {:>11}", "-"),
            }
        }
        println!();
    }
    if device_ran {
        println!(
            "\nvs system: std::alloc's ns/pair over this row's; vs async: {}'s (same threads)",
            device::ASYNC_NAME
        );
    }
    if threads.iter().any(|&t| t > 1) {
        println!(
            "x 1 thr: aggregate pairs/s over the same allocator's on one thread in this run; \
             overlap: rounds in which every thread had started before the first one finished"
        );
    }
    for line in growable_vs_classic(&rows, &threads) {
        println!("{line}");
    }
}

/// The growable pools' ns/pair over the classic ones', per thread count (where both ran).
fn growable_vs_classic(rows: &[Row], threads: &[usize]) -> Vec<String> {
    let ns = |name: &str, t: usize| {
        rows.iter()
            .find(|r| r.threads == t && r.name == name)
            .map(|r| r.ns)
    };
    let pairs = [
        (HOST_GROWABLE_NAME, HOST_CLASSIC_NAME),
        (device::GROWABLE_NAME, device::CLASSIC_NAME),
    ];
    pairs
        .iter()
        .flat_map(|&pair| threads.iter().map(move |&t| (pair, t)))
        .filter_map(|((growable, classic), t)| {
            let (g, c) = (ns(growable, t)?, ns(classic, t)?);
            Some(format!(
                "{growable} vs {classic}, {t} thread(s): {g:.1} / {c:.1} ns per pair = {:.3}x",
                g / c
            ))
        })
        .collect()
}

/// The column names of the host pool, classic and on the stand-in's growable region.
const HOST_CLASSIC_NAME: &str = "devarena Pool (host)";
const HOST_GROWABLE_NAME: &str = "devarena Pool (host-vm)";

/// One line of the table.
struct Row {
    name: String,
    threads: usize,
    ns: f64,
    cpu_ns: Option<f64>,
    pairs_per_sec: f64,
    overlapped: usize,
}

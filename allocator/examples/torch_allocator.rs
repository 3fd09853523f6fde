//! devarena's pool as a PyTorch allocator: a C ABI for `torch.cuda.memory.CUDAPluggableAllocator`.
//!
//! ```text
//! cargo build --release -p devarena --features cuda --example torch_allocator
//! # → target/release/examples/libtorch_allocator.so
//! ```
//!
//! ```python
//! import torch
//! alloc = torch.cuda.memory.CUDAPluggableAllocator(
//!     "libtorch_allocator.so", "devarena_torch_alloc", "devarena_torch_free")
//! pool = torch.cuda.MemPool(alloc.allocator())
//! with torch.cuda.use_mem_pool(pool):
//!     x = torch.randn(1 << 20, device="cuda")   # memory from devarena's pool
//! ```
//!
//! Used through `MemPool` / `use_mem_pool`, PyTorch's caching allocator asks this library for
//! its segments (2 MiB, 20 MiB, or the size of a large tensor rounded to 2 MiB) and
//! sub-allocates tensors inside them; a null from [`devarena_torch_alloc`] becomes a
//! `torch.OutOfMemoryError` there. As PyTorch's allocator itself, set before anything touches
//! the device, every tensor comes from the pool and goes back to it when freed, with no cache
//! in between, so the device holds what the tensors need:
//!
//! ```python
//! import torch
//! alloc = torch.cuda.memory.CUDAPluggableAllocator(
//!     "libtorch_allocator.so", "devarena_torch_alloc", "devarena_torch_free")
//! torch.cuda.memory.change_current_allocator(alloc)   # first: PyTorch swaps only an unused one
//! x = torch.randn(1 << 20, device="cuda")             # memory from devarena's pool
//! ```
//!
//! # One pool per device
//!
//! The first allocation on a device creates its pool (thread-safe, once), in the device's
//! **primary context**, the context the CUDA runtime and so PyTorch use, so the addresses are
//! valid in PyTorch's kernels. The pool's region is growable: addresses for the whole capacity
//! are reserved up front and device memory is mapped under them in 2 MiB chunks as allocations
//! reach them, so the pool holds what PyTorch uses, not its capacity. The environment says:
//!
//! * `DEVARENA_POOL_BYTES`: the capacity, in bytes, with an optional binary suffix (`K`, `M`,
//!   `G`, `T`, also written `KiB`, `MiB`, ...): `8G`, `512MiB`, `1073741824`. A hard cap:
//!   beyond it allocations fail (PyTorch raises `torch.OutOfMemoryError`). Unset: the device's
//!   total memory (it costs nothing until used), rounded down to 2 MiB.
//! * `DEVARENA_REGION=classic`: one `cuMemAlloc` of the whole capacity when the pool is made,
//!   instead (for memory that must be one classic allocation: RDMA registration, CUDA IPC);
//!   with `DEVARENA_POOL_BYTES` unset, the capacity is then 80% of the device's free memory.
//!
//! Freed blocks merge with their free neighbours at once (no reuse cache): PyTorch's calls come
//! microseconds apart, and the footprint is what this library is for.
//!
//! When the device runs out of memory while the pool maps a chunk, the allocation returns null
//! and PyTorch raises `torch.OutOfMemoryError`, as it does at the cap; the pool is unchanged.
//! [`devarena_torch_trim`] gives back the memory of every chunk that no live allocation uses
//! (after `torch.cuda.empty_cache()` has returned PyTorch's cached segments, for instance).
//!
//! A pool that cannot be created (bad variable, no device, the driver failing) is reported
//! once on stderr and every allocation on that device returns null.
//!
//! # Streams
//!
//! PyTorch passes the current stream of the allocation (a `cudaStream_t`, which is a
//! `CUstream`; `0` for the legacy default stream that PyTorch uses unless a side stream is
//! current) and the same stream again when it frees. Each pool's home stream is the legacy
//! default stream `0`: a segment freed there is reusable at once (stream order); one allocated
//! for another stream makes that stream wait for the home stream's earlier frees
//! (`cuStreamWaitEvent`); one freed on another stream is reused only after an event recorded
//! at the free has completed. Nothing here blocks the host.
//!
//! # Diagnostics
//!
//! * `DEVARENA_VERBOSE=1`: one line on stderr when a pool is created, and one per failed
//!   allocation with the pool's reason (client, request, what is free).
//! * `DEVARENA_EVENT_LOG=path`: every allocation and free in RMM's replay-log CSV
//!   (`Thread,Time,Action,Pointer,Size,Stream`); with several devices, `path.<device>`.
//! * [`devarena_torch_stats`] fills a C struct with a pool's counters (memory mapped now and at
//!   most included); [`devarena_torch_report`] prints the counters and the leak report (every
//!   live allocation with its size, age and stream) on stderr.
//!
//! No function here unwinds into C: every entry point catches panics and turns them into a
//! null, an error code, or a line on stderr.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

use devarena::Pool;
use devarena::backend::cuda::{default_stream, mem_info};
use devarena::pool::{AllocRequest, CsvEventLog, RegionKind, StreamId, Tracking};

/// Devices with a pool slot.
const MAX_DEVICES: usize = 64;
/// Alignment of every segment handed to PyTorch. The caching allocator places tensors at
/// multiples of 512 bytes inside a segment; 512-aligned segments keep every tensor 512-aligned,
/// as with `cudaMalloc`.
const SEGMENT_ALIGN: usize = 512;
/// The default capacity of a classic region: this share of the free memory, in percent.
const DEFAULT_SHARE_PERCENT: usize = 80;
/// The default capacity is rounded down to this.
const DEFAULT_ROUNDING: usize = 2 << 20;

/// A device's pool, or why there is none.
type Slot = OnceLock<Result<Pool, String>>;

static POOLS: [Slot; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

fn verbose() -> bool {
    static VERBOSE: OnceLock<bool> = OnceLock::new();
    *VERBOSE.get_or_init(|| std::env::var("DEVARENA_VERBOSE").is_ok_and(|v| v == "1"))
}

/// Parses `DEVARENA_POOL_BYTES`: digits and an optional binary suffix.
fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "DEVARENA_POOL_BYTES={text:?}: unknown unit {other:?} (use bytes, or K, M, G, T)"
            ));
        }
    };
    let n: usize = number.parse().map_err(|_| {
        format!("DEVARENA_POOL_BYTES={text:?}: expected a number of bytes, e.g. 8G or 536870912")
    })?;
    n.checked_mul(1usize << shift)
        .ok_or_else(|| format!("DEVARENA_POOL_BYTES={text:?} overflows usize"))
}

/// Parses `DEVARENA_REGION`: `growable` (the default) or `classic`.
fn parse_region(text: &str) -> Result<RegionKind, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "growable" | "" => Ok(RegionKind::Growable),
        "classic" => Ok(RegionKind::Classic),
        other => Err(format!(
            "DEVARENA_REGION={other:?}: expected `growable` (the default) or `classic`"
        )),
    }
}

/// The region kind of a new pool.
fn region() -> Result<RegionKind, String> {
    match std::env::var("DEVARENA_REGION") {
        Ok(text) => parse_region(&text),
        Err(std::env::VarError::NotPresent) => Ok(RegionKind::Growable),
        Err(e) => Err(format!("DEVARENA_REGION: {e}")),
    }
}

/// The capacity of a new pool of `kind` on the device of `stream`.
fn capacity(
    stream: &devarena::backend::cuda::CudaStream,
    kind: RegionKind,
) -> Result<usize, String> {
    match std::env::var("DEVARENA_POOL_BYTES") {
        Ok(text) => parse_bytes(&text),
        Err(std::env::VarError::NotPresent) => {
            let (free, total) = mem_info(stream).map_err(|e| e.to_string())?;
            let bytes = match kind {
                // Addresses only: the whole device costs nothing until used.
                RegionKind::Growable => total,
                RegionKind::Classic => free / 100 * DEFAULT_SHARE_PERCENT,
            };
            Ok(bytes / DEFAULT_ROUNDING * DEFAULT_ROUNDING)
        }
        Err(e) => Err(format!("DEVARENA_POOL_BYTES: {e}")),
    }
}

fn create_pool(device: usize) -> Result<Pool, String> {
    let stream = default_stream(device).map_err(|e| e.to_string())?;
    let kind = region()?;
    let capacity = capacity(&stream, kind)?;
    let mut builder = Pool::builder(capacity)
        .name(format!("torch-cuda:{device}"))
        .region(kind)
        // Every free merges at once: the tightest footprint. PyTorch's calls come microseconds
        // apart, so what the reuse cache saves (tens of nanoseconds a pair) does not show, and
        // blocks waiting unmerged would keep address space, and so memory, from other sizes.
        .reuse(0, 0)
        .tracking(Tracking::Tags)
        .log_leaks_on_drop(false);
    if let Some(path) = std::env::var_os("DEVARENA_EVENT_LOG") {
        let mut path = std::path::PathBuf::from(path);
        if device > 0 {
            path.as_mut_os_string().push(format!(".{device}"));
        }
        let log = CsvEventLog::create(&path)
            .map_err(|e| format!("DEVARENA_EVENT_LOG={}: {e}", path.display()))?;
        builder = builder.events(Arc::new(log));
    }
    builder.build_cuda(stream).map_err(|e| e.to_string())
}

/// The pool of `device`, created on first use; `None` (reported once) when it cannot be.
fn pool_for(device: i32) -> Option<&'static Pool> {
    let Some(index) = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES) else {
        eprintln!("devarena: device {device} is outside 0..{MAX_DEVICES}");
        return None;
    };
    let slot = POOLS[index].get_or_init(|| {
        let result = create_pool(index);
        match &result {
            Ok(pool) if verbose() => eprintln!(
                "devarena: pool `{}`: {} bytes ({:.2} GiB) of device memory at {:#x}, {}",
                pool.name(),
                pool.capacity(),
                pool.capacity() as f64 / (1u64 << 30) as f64,
                pool.base(),
                match pool.region_kind() {
                    RegionKind::Growable => format!(
                        "growable: mapped in chunks of {} bytes as used",
                        pool.stats().chunk
                    ),
                    RegionKind::Classic => "classic: one cuMemAlloc, held".to_string(),
                }
            ),
            Ok(_) => {}
            Err(reason) => eprintln!(
                "devarena: no pool for cuda:{index}, every allocation there returns null: {reason}"
            ),
        }
        result
    });
    slot.as_ref().ok()
}

/// Registers a stream PyTorch hands over with the pool's stream runtime, the first time.
fn register(pool: &Pool, stream: StreamId) {
    if let Some(streams) = pool.cuda_streams() {
        if !streams.is_registered(stream) {
            // SAFETY: PyTorch passes the current stream of `device`, a live stream of the
            // primary context the pool was made in; PyTorch keeps its streams for the life of
            // the process (they come from its stream pool and are never destroyed).
            unsafe { streams.register_raw(stream) };
        }
    }
}

/// An existing pool of `device` (frees and queries never create one).
fn existing_pool(device: i32) -> Option<&'static Pool> {
    let index = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES)?;
    POOLS[index].get()?.as_ref().ok()
}

/// Allocates `size` bytes on `device` for use on `stream` (a `cudaStream_t`); null on failure
/// (the pool's capacity is exhausted, no pool could be made) and for a panic.
#[unsafe(no_mangle)]
pub extern "C" fn devarena_torch_alloc(
    size: usize,
    device: i32,
    stream: *mut c_void,
) -> *mut c_void {
    let stream = StreamId(stream as usize as u64);
    let result = catch_unwind(|| {
        let pool = pool_for(device)?;
        register(pool, stream);
        // The tag names the stream in the leak report.
        let tag = format!("stream {stream}");
        let request = AllocRequest::new(size, SEGMENT_ALIGN).on(stream).tag(&tag);
        match pool.allocate_with(request) {
            Ok(addr) => Some(addr),
            Err(error) => {
                if verbose() {
                    eprintln!(
                        "devarena: devarena_torch_alloc({size}, cuda:{device}, stream {stream}) \
                         failed: {error}"
                    );
                }
                None
            }
        }
    });
    match result {
        Ok(Some(addr)) => addr as usize as *mut c_void,
        Ok(None) | Err(_) => std::ptr::null_mut(),
    }
}

/// Frees `ptr` (from [`devarena_torch_alloc`] on `device`) on `stream`. A null is ignored; an
/// address the pool does not know is reported on stderr and changes nothing.
#[unsafe(no_mangle)]
pub extern "C" fn devarena_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: i32,
    stream: *mut c_void,
) {
    let addr = ptr as usize as u64;
    let stream = StreamId(stream as usize as u64);
    if addr == 0 {
        return;
    }
    let outcome = catch_unwind(|| {
        let Some(pool) = existing_pool(device) else {
            eprintln!(
                "devarena: devarena_torch_free({addr:#x}, {size}, cuda:{device}): that device \
                 has no pool"
            );
            return;
        };
        register(pool, stream);
        if let Err(error) = pool.deallocate_on(addr, stream) {
            eprintln!("devarena: devarena_torch_free({addr:#x}, {size}, cuda:{device}): {error}");
        }
    });
    if outcome.is_err() {
        eprintln!("devarena: devarena_torch_free({addr:#x}): a panic was caught");
    }
}

/// A pool's counters, for C and Python (`ctypes`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevarenaTorchStats {
    /// Start of the pool's region (a `CUdeviceptr`).
    pub base: u64,
    /// Bytes the pool manages.
    pub capacity: u64,
    /// Bytes held by live allocations (rounded up to 256 each).
    pub in_use: u64,
    /// Most bytes ever held at once.
    pub peak: u64,
    /// Successful allocations so far.
    pub allocations: u64,
    /// Frees so far.
    pub frees: u64,
    /// Failed allocations so far.
    pub failures: u64,
    /// Live allocations.
    pub live: u64,
    /// The largest free block.
    pub largest_free: u64,
    /// Bytes freed on other streams, waiting for their events.
    pub pending: u64,
    /// Bytes of device memory the pool holds now (the capacity for a classic region).
    pub mapped: u64,
    /// The most it has held.
    pub peak_mapped: u64,
    /// Bytes per chunk of mapping (the capacity for a classic region).
    pub chunk: u64,
    /// Chunks mapped so far.
    pub maps: u64,
    /// Chunks unmapped so far.
    pub unmaps: u64,
}

/// Fills `*out` with the counters of `device`'s pool. Returns 0 on success, 1 when the device
/// has no pool (yet), -1 for a null `out`, a device out of range, or a panic.
///
/// # Safety
///
/// `out` must be null or point to writable memory for one `DevarenaTorchStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devarena_torch_stats(device: i32, out: *mut DevarenaTorchStats) -> i32 {
    if out.is_null() || usize::try_from(device).map_or(true, |d| d >= MAX_DEVICES) {
        return -1;
    }
    let stats = catch_unwind(|| {
        existing_pool(device).map(|pool| {
            let s = pool.stats();
            DevarenaTorchStats {
                base: pool.base(),
                capacity: s.capacity as u64,
                in_use: s.in_use as u64,
                peak: s.peak as u64,
                allocations: s.allocations,
                frees: s.frees,
                failures: s.failures,
                live: s.live,
                largest_free: s.largest_free as u64,
                pending: s.pending as u64,
                mapped: s.mapped as u64,
                peak_mapped: s.peak_mapped as u64,
                chunk: s.chunk as u64,
                maps: s.maps,
                unmaps: s.unmaps,
            }
        })
    });
    match stats {
        Ok(Some(stats)) => {
            // SAFETY: `out` is non-null and, by the caller's contract, writable for one value.
            unsafe { out.write(stats) };
            0
        }
        Ok(None) => 1,
        Err(_) => -1,
    }
}

/// Gives back the device memory of every chunk of `device`'s pool that no live allocation
/// uses, until at most `keep` bytes stay mapped (0: all it can); waits for the pool's home
/// stream (the legacy default stream) first. Returns the bytes given back, or -1 when the
/// device has no pool, the trim failed (reported on stderr) or a panic was caught.
#[unsafe(no_mangle)]
pub extern "C" fn devarena_torch_trim(device: i32, keep: u64) -> i64 {
    let result = catch_unwind(|| {
        let pool = existing_pool(device)?;
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        match pool.trim_to(keep) {
            Ok(bytes) => Some(bytes as i64),
            Err(error) => {
                eprintln!("devarena: devarena_torch_trim(cuda:{device}): {error}");
                None
            }
        }
    });
    result.ok().flatten().unwrap_or(-1)
}

/// Prints the counters and the leak report (every live allocation: address, size, stream) of
/// `device`'s pool on stderr. Returns the number of live allocations, or -1 when the device has
/// no pool or a panic was caught.
#[unsafe(no_mangle)]
pub extern "C" fn devarena_torch_report(device: i32) -> i64 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let pool = existing_pool(device)?;
        let stats = pool.stats();
        eprintln!("devarena: pool `{}`: {stats}", pool.name());
        eprintln!("{}", pool.leak_report());
        Some(stats.live as i64)
    }));
    result.ok().flatten().unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::{RegionKind, parse_bytes, parse_region};

    #[test]
    fn the_region_kind_parses() {
        assert_eq!(parse_region("growable"), Ok(RegionKind::Growable));
        assert_eq!(parse_region(" Classic "), Ok(RegionKind::Classic));
        assert!(
            parse_region("elastic")
                .unwrap_err()
                .contains("DEVARENA_REGION")
        );
    }

    #[test]
    fn pool_bytes_parse_with_binary_units() {
        assert_eq!(parse_bytes("1073741824"), Ok(1 << 30));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes(" 8 GiB "), Ok(8 << 30));
        assert_eq!(parse_bytes("512k"), Ok(512 << 10));
        assert!(
            parse_bytes("8 furlongs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_bytes("").unwrap_err().contains("expected a number"));
        assert!(
            parse_bytes("99999999999T")
                .unwrap_err()
                .contains("overflows")
        );
    }
}

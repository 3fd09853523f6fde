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
//! Every entry point leaves the calling thread's current CUDA context (PyTorch's current
//! device) as it found it, although the pool binds its device's context for its own calls:
//! PyTorch frees a tensor of one device from threads whose current device is another.
//!
//! Two limits of the pluggable-allocator contract, which PyTorch's own allocator covers with
//! `cudaFree`'s wait for the whole device and with `record_stream`:
//!
//! * `Tensor.record_stream(s)` reaches no allocator that Python sets
//!   (`CUDAPluggableAllocator` takes no `record_stream` function): a tensor used on a side
//!   stream and freed from another must be ordered by the program (an event, or
//!   `torch.cuda.synchronize()`) before its memory is freed, as its segment is reused in the
//!   order of the stream it is freed on.
//! * A segment that a CUDA graph reads but that was allocated before its capture (an input
//!   made during warm-up) is freed like any other, in its stream's order, not after the
//!   graph's replays on other streams: synchronize before `torch.cuda.empty_cache()` while
//!   replays on other streams may still run. (Segments allocated during a capture wait for
//!   the device, below.)
//!
//! # CUDA graphs
//!
//! `torch.cuda.graph(g, pool=mem_pool.id)` with a `MemPool` of this library captures into
//! devarena's memory: PyTorch's caching allocator serves the graph from the `MemPool`'s private
//! pool and asks this library for a new segment when that pool is short, **in the middle of the
//! capture**, on the capturing stream (in relaxed capture mode). What happens then:
//!
//! * The allocation sees that its stream is capturing (`cuStreamIsCapturing`) and takes the
//!   pool's capture path (`Pool::allocate_for_capture`): no event is recorded on the capturing
//!   stream and it is made to wait for nothing — either would be recorded into PyTorch's graph
//!   or invalidate the capture. If the pool's home stream freed segments since the last such
//!   wait, the host waits for the home stream instead (the legacy default stream; legal while a
//!   non-blocking stream captures, which PyTorch's capture streams are). A growable pool maps
//!   memory there if it needs to, in relaxed capture mode (`cuMemCreate`/`cuMemMap`/
//!   `cuMemSetAccess` are refused in the other modes).
//! * PyTorch keeps the segment for the graph's life and frees it when the graph is gone and the
//!   `MemPool` (or graph pool) is released and emptied. The free waits for the device to be idle
//!   first (replays may have run on any stream; PyTorch's own path would call `cudaFree`, which
//!   waits too), then gives the segment back to the pool.
//! * Nothing a capture forbids is done while a capture this library saw (a stream that
//!   allocated while capturing) may be open: a free whose stream is capturing (a graph being
//!   captured could be using the segment, and no event can be recorded there) and a free of a
//!   captured segment (waiting for the device is refused during any capture, and invalidates
//!   it) are delayed, and done by the first call that finds those captures ended
//!   (`cuStreamIsCapturing` of their streams). PyTorch frees no segment during its captures
//!   but where an allocation fails; a capture this library never saw (no allocation came from
//!   it) cannot be waited for.
//!
//! [`devarena_torch_capture_stats`] counts all of it.
//!
//! **Warm up on the threads that capture.** cuBLAS and cuDNN handles are made per thread on
//! first use, and making one (`cublasCreate`, `cudnnCreate`) during a capture invalidates it:
//! every later call on the capture fails with "operation failed due to a previous error during
//! capture", whatever allocator serves it. Autograd runs a CUDA backward on a device thread of
//! its own unless multithreading is off (`torch.autograd.set_multithreading_enabled(False)`,
//! which `use_mem_pool` needs so that backward allocates from the `MemPool`): warm-up and
//! capture must run backward on the same threads. `DEVARENA_TORCH_TRACE=1` (below) tells such
//! a failure from one of this library's: its exit lines say the capture was still active.
//!
//! # Diagnostics
//!
//! * `DEVARENA_VERBOSE=1`: one line on stderr when a pool is created, one per failed
//!   allocation with the pool's reason (client, request, what is free), and one per segment
//!   allocated while its stream was capturing a graph.
//! * `DEVARENA_TRACE=1`: one line on stderr per call of [`devarena_torch_alloc`] and
//!   [`devarena_torch_free`], with the stream, the address and the calling thread.
//! * `DEVARENA_TORCH_TRACE=1`: the capture trace, for a capture that ends invalidated
//!   ("operation failed due to a previous error during capture"): two lines per call of
//!   [`devarena_torch_alloc`], [`devarena_torch_free`] and [`devarena_torch_trim`], at entry
//!   (`torch-trace: >`) and at exit (`torch-trace: <`, with the address or the reason), each
//!   with the calling thread and the capture status of the caller's stream and of the other
//!   streams seen capturing (`cuStreamGetCaptureInfo`, legal during a capture: `none`,
//!   `active#<capture id>` or `INVALIDATED#<capture id>`; the default streams are not asked,
//!   and `<--` marks a call during which a capture turned invalidated), and between them one line
//!   per driver call the pool made (`torch-trace:   devarena::driver cuStreamSynchronize(stream
//!   0x0)`, ...). A call during which the status turns to invalidated says so at its exit line;
//!   a call whose entry line already says `INVALIDATED` was preceded by someone else's illegal
//!   call.
//! * `DEVARENA_EVENT_LOG=path`: every allocation and free in RMM's replay-log CSV
//!   (`Thread,Time,Action,Pointer,Size,Stream`); with several devices, `path.<device>`.
//! * [`devarena_torch_stats`] fills a C struct with a pool's counters (memory mapped now and at
//!   most included), and its return code tells a device that has no pool yet (1) from one
//!   whose pool could not be created (2); [`devarena_torch_report`] prints the counters and the
//!   leak report (every live allocation with its size, age and stream) on stderr.
//! * [`devarena_torch_free`] checks every free against the pool: an address not handed out on
//!   that device (or freed already), or a size other than the one PyTorch allocated it with, is
//!   refused and said on stderr. A stale pointer whose address was handed out again is caught
//!   whenever the new segment's size differs.
//!
//! No function here unwinds into C: every entry point catches panics and turns them into a
//! null, an error code, or a line on stderr, and a line on stderr is written so that a failing
//! stderr loses it instead of panicking.
//!
//! The logic behind the entry points (`torch_allocator/abi.rs`) needs no GPU: its tests, and
//! the fuzz target `torch_abi`, run it on host pools.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

use devarena::Pool;
use devarena::backend::cuda::{default_stream, mem_info};
use devarena::pool::{CsvEventLog, RegionKind, StreamId, Tracking};

#[path = "torch_allocator/abi.rs"]
mod abi;
pub use abi::{
    DevarenaTorchCaptureStats, DevarenaTorchStats, MAX_DEVICES, SEGMENT_ALIGN,
    STATS_INVALID_ARGUMENT, STATS_NO_POOL_YET, STATS_OK, STATS_PANIC, STATS_POOL_FAILED,
};
use abi::{LiveStream, Pools, parse_region, report_stderr};

/// The default capacity of a classic region: this share of the free memory, in percent.
const DEFAULT_SHARE_PERCENT: usize = 80;
/// The default capacity is rounded down to this.
const DEFAULT_ROUNDING: usize = 2 << 20;

static POOLS: Pools = Pools::new();

/// The calling thread's current CUDA context, made current again on drop. Every entry point
/// that may call the driver holds one: the pool binds its device's context to the calling
/// thread, and PyTorch frees a tensor of one device from a thread whose current device is
/// another (`raw_delete` takes no device guard), so without it the thread's current device
/// would change under PyTorch (`torch.cuda.current_device()`, and every later
/// `device="cuda"`). Nothing when no driver is loaded.
struct KeepCurrentContext(Option<cudarc::driver::sys::CUcontext>);

impl KeepCurrentContext {
    fn new() -> Self {
        if !devarena::backend::cuda::driver_present() {
            return KeepCurrentContext(None);
        }
        let current = cudarc::driver::result::ctx::get_current().ok();
        KeepCurrentContext(current.map(|c| c.unwrap_or(std::ptr::null_mut())))
    }
}

impl Drop for KeepCurrentContext {
    fn drop(&mut self) {
        let Some(saved) = self.0 else { return };
        let now = cudarc::driver::result::ctx::get_current()
            .ok()
            .map(|c| c.unwrap_or(std::ptr::null_mut()));
        if now != Some(saved) {
            // SAFETY: `saved` was the thread's current context (or none) on entry, and
            // nothing here destroys a context: PyTorch's are primary contexts it retains.
            if let Err(e) = unsafe { cudarc::driver::result::ctx::set_current(saved) } {
                report_stderr(&format!(
                    "devarena_torch: the caller's current CUDA context could not be made \
                     current again: {e:?}"
                ));
            }
        }
    }
}

fn verbose() -> bool {
    static VERBOSE: OnceLock<bool> = OnceLock::new();
    *VERBOSE.get_or_init(|| std::env::var("DEVARENA_VERBOSE").is_ok_and(|v| v == "1"))
}

fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var("DEVARENA_TRACE").is_ok_and(|v| v == "1"))
}

/// `DEVARENA_TORCH_TRACE=1`: the capture trace (see the crate docs, "Diagnostics"). The first
/// call that reads it installs the stderr logger for the driver calls.
fn torch_trace() -> bool {
    static TORCH_TRACE: OnceLock<bool> = OnceLock::new();
    *TORCH_TRACE.get_or_init(|| {
        let on = std::env::var("DEVARENA_TORCH_TRACE").is_ok_and(|v| v == "1");
        if on {
            // Fails only when some logger is installed already: then that one gets the lines.
            if log::set_logger(&DRIVER_LOG).is_ok() {
                log::set_max_level(log::LevelFilter::Trace);
            }
        }
        on
    })
}

/// The logger of `DEVARENA_TORCH_TRACE=1`: every driver call the pool makes while a capture
/// may be open (target `devarena::driver`), and the pool's warnings and errors, one line each
/// on stderr with the calling thread, in order with the entry and exit lines.
struct DriverLog;

static DRIVER_LOG: DriverLog = DriverLog;

impl log::Log for DriverLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.target() == "devarena::driver" || metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            report_stderr(&format!(
                "torch-trace:   {} {} [{}]",
                record.target(),
                record.args(),
                thread_tag()
            ));
        }
    }

    fn flush(&self) {}
}

/// The capture status of `stream` for a trace line: `cuStreamGetCaptureInfo` of the caller's
/// stream, which the driver allows during any capture and which changes nothing, and of the
/// other streams this library saw capturing (a call on another stream, the legacy one say,
/// shows what it did to their captures). The legacy and per-thread default streams are not
/// asked (the legacy stream answers with an error while a blocking stream captures), nor is
/// anything before the device has a pool.
fn capture_status(device: i32, live: LiveStream) -> String {
    let stream = live.id();
    let Some(torch) = POOLS.existing(device) else {
        return "no pool yet, not queried".into();
    };
    let Some(streams) = torch.pool().cuda_streams() else {
        return "no CUDA streams, not queried".into();
    };
    let status = |s: StreamId| match streams.capture_status(s) {
        Ok(status) => status.to_string(),
        Err(error) => format!("query failed: {error}"),
    };
    let mut text = if stream.raw() <= 2 {
        "default stream, not queried".to_string()
    } else {
        if !streams.is_registered(stream) {
            // SAFETY: a `LiveStream` is a live stream of the primary context of the device it
            // is used with, this pool's, alive while the pool uses it (`LiveStream::new`).
            unsafe { streams.register_raw(stream) };
        }
        status(stream)
    };
    // Ended captures are left out: their streams stay on the list until a free looks.
    for other in torch.seen_capturing().into_iter().filter(|&s| s != stream) {
        let other_status = status(other);
        if other_status != "none" {
            text.push_str(&format!("; seen capturing: stream {other} {other_status}"));
        }
    }
    text
}

/// The entry and exit lines of `DEVARENA_TORCH_TRACE=1` around `call`.
fn traced<R>(
    device: i32,
    stream: LiveStream,
    what: impl Fn() -> String,
    call: impl FnOnce() -> R,
    outcome: impl FnOnce(&R) -> String,
) -> R {
    if !torch_trace() {
        return call();
    }
    let before = capture_status(device, stream);
    report_stderr(&format!(
        "torch-trace: > {} [{}] capture {before}",
        what(),
        thread_tag()
    ));
    let result = call();
    let after = capture_status(device, stream);
    let flipped = if before != after && after.contains("INVALIDATED") {
        " <-- a capture was invalidated during this call"
    } else {
        ""
    };
    report_stderr(&format!(
        "torch-trace: < {} -> {} [{}] capture {after}{flipped}",
        what(),
        outcome(&result),
        thread_tag()
    ));
    result
}

/// A small number naming the calling thread, for trace lines.
fn thread_tag() -> String {
    format!("{:?}", std::thread::current().id())
}

/// Creates the pool of `device`: its region from `DEVARENA_REGION`, its capacity from
/// `DEVARENA_POOL_BYTES` or the device's memory, its event log from `DEVARENA_EVENT_LOG`.
fn create_pool(device: usize) -> Result<Pool, String> {
    let stream = default_stream(device).map_err(|e| e.to_string())?;
    let kind = match std::env::var("DEVARENA_REGION") {
        Ok(text) => parse_region(&text)?,
        Err(std::env::VarError::NotPresent) => RegionKind::Growable,
        Err(e) => return Err(format!("DEVARENA_REGION: {e}")),
    };
    let capacity = abi::capacity(std::env::var("DEVARENA_POOL_BYTES"), || {
        let (free, total) = mem_info(&stream).map_err(|e| e.to_string())?;
        let bytes = match kind {
            // Addresses only: the whole device costs nothing until used.
            RegionKind::Growable => total,
            RegionKind::Classic => free / 100 * DEFAULT_SHARE_PERCENT,
        };
        Ok(bytes / DEFAULT_ROUNDING * DEFAULT_ROUNDING)
    })?;
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

/// Allocates `size` bytes on `device` for use on `stream` (a `cudaStream_t`); null on failure
/// (the pool's capacity is exhausted, no pool could be made) and for a panic.
///
/// # Safety
///
/// `stream` is the legacy or per-thread default stream, or a live stream of `device`'s primary
/// context that stays alive while the pool may use it (as PyTorch's streams do): the pool
/// passes it to the driver.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devarena_torch_alloc(
    size: usize,
    device: i32,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller's contract above is `LiveStream::new`'s.
    let live = unsafe { LiveStream::new(StreamId(stream as usize as u64)) };
    let stream = live.id();
    let result = catch_unwind(|| {
        let _current = KeepCurrentContext::new();
        let what = || format!("devarena_torch_alloc({size}, cuda:{device}, stream {stream})");
        let allocated = || POOLS.alloc(size, device, live, create_pool, verbose(), &report_stderr);
        let outcome = |r: &Result<u64, String>| match r {
            Ok(addr) => format!("{addr:#x}"),
            Err(reason) => format!("null ({reason})"),
        };
        let addr = match traced(device, live, what, allocated, outcome) {
            Ok(addr) => addr,
            Err(reason) => {
                if verbose() {
                    report_stderr(&reason);
                }
                0
            }
        };
        if trace() {
            report_stderr(&format!(
                "trace: devarena_torch_alloc({size}, cuda:{device}, stream {stream}) -> {addr:#x} \
                 [{}]",
                thread_tag()
            ));
        }
        addr
    });
    match result {
        Ok(addr) => addr as usize as *mut c_void,
        Err(_) => {
            report_stderr("devarena_torch_alloc: a panic was caught; returning null");
            std::ptr::null_mut()
        }
    }
}

/// Frees `ptr` (from [`devarena_torch_alloc`] on `device`, of `size` bytes) on `stream`. A null
/// is ignored. An address this library did not hand out on `device`, or freed already, or a
/// `size` other than the one it was allocated with (a stale or foreign pointer), is reported on
/// stderr and changes nothing.
///
/// # Safety
///
/// `stream`: as for [`devarena_torch_alloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devarena_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: i32,
    stream: *mut c_void,
) {
    let addr = ptr as usize as u64;
    // SAFETY: the caller's contract above is `LiveStream::new`'s.
    let live = unsafe { LiveStream::new(StreamId(stream as usize as u64)) };
    let stream = live.id();
    let outcome = catch_unwind(|| {
        let _current = KeepCurrentContext::new();
        let what =
            || format!("devarena_torch_free({addr:#x}, {size}, cuda:{device}, stream {stream})");
        let freed = || POOLS.free(addr, size, device, live);
        let told = |r: &Result<(), String>| match r {
            Ok(()) => "freed".to_string(),
            Err(reason) => format!("refused ({reason})"),
        };
        let result = traced(device, live, what, freed, told);
        if trace() {
            let outcome = if result.is_ok() { "freed" } else { "refused" };
            report_stderr(&format!(
                "trace: devarena_torch_free({addr:#x}, {size}, cuda:{device}, stream {stream}): \
                 {outcome} [{}]",
                thread_tag()
            ));
        }
        if let Err(reason) = result {
            report_stderr(&reason);
        }
    });
    if outcome.is_err() {
        report_stderr(&format!(
            "devarena_torch_free({addr:#x}): a panic was caught"
        ));
    }
}

/// Fills `*out` with the counters of `device`'s pool. Returns:
///
/// | code | constant | meaning |
/// | ---: | --- | --- |
/// | 0 | [`STATS_OK`] | `*out` holds the counters |
/// | 1 | [`STATS_NO_POOL_YET`] | nothing was allocated on the device yet, so it has no pool |
/// | 2 | [`STATS_POOL_FAILED`] | creating the device's pool failed (said on stderr then) |
/// | -1 | [`STATS_INVALID_ARGUMENT`] | `out` is null, or `device` is outside `0..64` |
/// | -2 | [`STATS_PANIC`] | a panic was caught |
///
/// `*out` is written only for 0.
///
/// # Safety
///
/// `out` must be null or point to writable memory for one `DevarenaTorchStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devarena_torch_stats(device: i32, out: *mut DevarenaTorchStats) -> i32 {
    if out.is_null() {
        return STATS_INVALID_ARGUMENT;
    }
    match catch_unwind(|| {
        let _current = KeepCurrentContext::new();
        POOLS.stats(device)
    }) {
        Ok(Ok(stats)) => {
            // SAFETY: `out` is non-null and, by the caller's contract, writable for one value.
            unsafe { out.write(stats) };
            STATS_OK
        }
        Ok(Err(code)) => code,
        Err(_) => STATS_PANIC,
    }
}

/// Fills `*out` with what happened to `device`'s segments allocated while their stream was
/// capturing a CUDA graph (see `DevarenaTorchCaptureStats`). Returns the codes of
/// [`devarena_torch_stats`]; `*out` is written only for 0.
///
/// # Safety
///
/// `out` must be null or point to writable memory for one `DevarenaTorchCaptureStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn devarena_torch_capture_stats(
    device: i32,
    out: *mut DevarenaTorchCaptureStats,
) -> i32 {
    if out.is_null() {
        return STATS_INVALID_ARGUMENT;
    }
    match catch_unwind(|| {
        let _current = KeepCurrentContext::new();
        POOLS.capture_stats(device)
    }) {
        Ok(Ok(stats)) => {
            // SAFETY: `out` is non-null and, by the caller's contract, writable for one value.
            unsafe { out.write(stats) };
            STATS_OK
        }
        Ok(Err(code)) => code,
        Err(_) => STATS_PANIC,
    }
}

/// Prints the counters and the leak report (every live allocation: address, size, stream) of
/// `device`'s pool on stderr. Returns the number of live allocations, or -1 when the device has
/// no pool or a panic was caught.
#[unsafe(no_mangle)]
pub extern "C" fn devarena_torch_report(device: i32) -> i64 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let _current = KeepCurrentContext::new();
        let (text, live) = POOLS.report(device)?;
        report_stderr(&text);
        Some(live)
    }));
    result.ok().flatten().unwrap_or(-1)
}

/// Gives back the device memory of every chunk of `device`'s pool that no live allocation
/// uses, until at most `keep` bytes stay mapped (0: all it can); waits for the pool's home
/// stream (the legacy default stream) first. Returns the bytes given back, or -1 when the
/// device has no pool, the trim failed (reported on stderr) or a panic was caught.
#[unsafe(no_mangle)]
pub extern "C" fn devarena_torch_trim(device: i32, keep: u64) -> i64 {
    let result = catch_unwind(|| {
        let _current = KeepCurrentContext::new();
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        let what = || format!("devarena_torch_trim(cuda:{device}, {keep})");
        let told = |r: &Result<usize, String>| format!("{r:?}");
        // The home stream (the legacy default stream) is the one it waits for: not queried.
        match traced(
            device,
            LiveStream::LEGACY,
            what,
            || POOLS.trim(device, keep),
            told,
        ) {
            Ok(bytes) => Some(i64::try_from(bytes).unwrap_or(i64::MAX)),
            Err(reason) => {
                report_stderr(&reason);
                None
            }
        }
    });
    result.ok().flatten().unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entry points leave the calling thread's current context as they found it: none,
    /// or a context of the device's (a non-primary one here, as a second device's would be),
    /// although the pool binds the device's primary context for its driver calls.
    #[test]
    fn the_entry_points_leave_the_current_context_as_they_found_it() {
        if !devarena::backend::cuda::driver_present()
            || devarena::backend::cuda::device_count().unwrap_or(0) == 0
        {
            assert!(
                std::env::var("DEVARENA_REQUIRE_GPU").as_deref() != Ok("1"),
                "DEVARENA_REQUIRE_GPU=1, but there is no CUDA device"
            );
            println!("skipped: no CUDA device");
            return;
        }
        use cudarc::driver::result::ctx;
        let current = || ctx::get_current().unwrap();
        let other = cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
        for (name, set) in [("none", std::ptr::null_mut()), ("another", other.cu_ctx())] {
            // SAFETY: null (no context) or a live context of this process.
            unsafe { ctx::set_current(set) }.unwrap();
            let expect = current();
            // SAFETY: the legacy default stream; a pointer this call returned, freed once.
            let p = unsafe { devarena_torch_alloc(4096, 0, std::ptr::null_mut()) };
            assert!(!p.is_null());
            assert_eq!(current(), expect, "{name}: after an allocation");
            // SAFETY: as above.
            unsafe { devarena_torch_free(p, 4096, 0, std::ptr::null_mut()) };
            assert_eq!(current(), expect, "{name}: after a free");
            assert!(devarena_torch_trim(0, 0) >= 0);
            assert_eq!(current(), expect, "{name}: after a trim");
        }
        // SAFETY: no context.
        unsafe { ctx::set_current(std::ptr::null_mut()) }.unwrap();
        drop(other);
    }
}

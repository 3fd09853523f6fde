//! The logic behind the C entry points, free of CUDA: a table of per-device pools, the frees
//! checked against the size each segment was allocated with, segments allocated while their
//! stream captures a CUDA graph, the return codes, and the parsing of `DEVARENA_POOL_BYTES`.
//! The entry points in `torch_allocator.rs` pass it a function that creates a device's CUDA
//! pool; tests and the fuzz target `torch_abi` pass one that creates a host pool, so all of
//! this runs without a GPU.

use std::collections::BTreeSet;
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use devarena::pool::{AllocRequest, FreeRequest, RegionKind, StreamId};
use devarena::{Error, Pool};

/// A stream handle the pools may pass to the driver (through a CUDA pool's stream runtime,
/// which registers it at its first use): what PyTorch hands over with each call. Only `unsafe`
/// code that vouches for the handle makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveStream(StreamId);

impl LiveStream {
    /// The legacy default stream, which every context has.
    pub const LEGACY: LiveStream = LiveStream(StreamId::DEFAULT);

    /// # Safety
    ///
    /// `stream` is the legacy (0) or per-thread (2) default stream, or a stream of the primary
    /// context of every device it is used with that stays alive for as long as the pools may
    /// use it (PyTorch never destroys its streams). A host pool, which has no CUDA stream
    /// runtime, never passes it to the driver.
    pub unsafe fn new(stream: StreamId) -> Self {
        LiveStream(stream)
    }

    /// The stream's id.
    pub fn id(self) -> StreamId {
        self.0
    }
}

/// Devices with a pool slot.
pub const MAX_DEVICES: usize = 64;
/// Alignment of every segment handed to PyTorch. The caching allocator places tensors at
/// multiples of 512 bytes inside a segment; 512-aligned segments keep every tensor 512-aligned,
/// as with `cudaMalloc`.
pub const SEGMENT_ALIGN: usize = 512;

/// `devarena_torch_stats`: the counters were written.
pub const STATS_OK: i32 = 0;
/// `devarena_torch_stats`: the device has no pool yet (nothing was allocated on it).
pub const STATS_NO_POOL_YET: i32 = 1;
/// `devarena_torch_stats`: creating the device's pool failed (reported on stderr then); every
/// allocation on it returns null.
pub const STATS_POOL_FAILED: i32 = 2;
/// `devarena_torch_stats`: a null `out`, or a device outside `0..MAX_DEVICES`.
pub const STATS_INVALID_ARGUMENT: i32 = -1;
/// `devarena_torch_stats`: a panic was caught (nothing was written).
pub const STATS_PANIC: i32 = -2;

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

/// What happened to segments allocated while their stream was capturing a CUDA graph, for C
/// and Python (`ctypes`): `devarena_torch_capture_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevarenaTorchCaptureStats {
    /// Segments allocated while their stream was capturing (PyTorch's graph pool growing in
    /// the middle of a capture).
    pub allocations: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Those not freed yet.
    pub live: u64,
    /// Those freed (after the device went idle).
    pub freed: u64,
    /// Frees (of any segment) that came while a capture this library saw was open: their stream
    /// was capturing, or the segment was allocated during a capture and freeing it waits for
    /// the device, which no capture allows. They were delayed until every such capture had
    /// ended.
    pub deferred_frees: u64,
    /// Frees of captured segments refused because waiting for the device failed.
    pub failed_waits: u64,
    /// Delayed frees still waiting for a capture to end.
    pub deferred: u64,
}

/// The counters behind [`DevarenaTorchCaptureStats`].
#[derive(Debug, Default)]
struct CaptureCounters {
    allocations: AtomicU64,
    bytes: AtomicU64,
    freed: AtomicU64,
    deferred_frees: AtomicU64,
    failed_waits: AtomicU64,
}

/// A free delayed until no capture this library saw is open.
#[derive(Debug, Clone, Copy)]
struct DeferredFree {
    addr: u64,
    size: usize,
    stream: StreamId,
}

/// A device's pool. Each segment handed to PyTorch is a live allocation of the pool that
/// remembers the size PyTorch asked for, which PyTorch passes again when it frees: a free
/// whose size differs is a stale or foreign pointer, and the pool refuses it.
///
/// **Graph captures.** PyTorch grows a graph's private pool in the middle of a capture: it
/// asks for a segment on the capturing stream (in relaxed capture mode). Such a segment comes
/// from [`Pool::allocate_for_capture`]: no event is recorded on the capturing stream and it
/// waits for nothing (either would end up in the graph, or invalidate it); the host waits for
/// the home stream's earlier frees instead. PyTorch keeps the segment for the graph's life and
/// frees it once the graph and its pool are released; replays may have run on any stream, so
/// the free first waits for the device to be idle, as the `cudaFree` PyTorch would otherwise
/// call does.
///
/// **Frees while a capture is open.** Nothing the driver refuses during a capture is done
/// while a capture this library saw (a stream that allocated while capturing) may still be
/// open: a free on a capturing stream (its event would be recorded into the graph, and the
/// graph may use the segment) and a free of a captured segment (waiting for the device is
/// refused, and invalidates every capture of the context) are delayed, and done at the first
/// call of this library that finds every such capture ended (`cuStreamIsCapturing` of those
/// streams, a query every capture allows). PyTorch has forgotten the segment by then; it stays
/// allocated, and listed in the leak report, until that call.
#[derive(Debug)]
pub struct TorchPool {
    pool: Pool,
    /// Segments allocated while their stream was capturing, not freed yet.
    captured: Mutex<BTreeSet<u64>>,
    /// Streams seen capturing (by an allocation), until they are seen not capturing.
    capturing_streams: Mutex<Vec<StreamId>>,
    /// Frees delayed until no stream of `capturing_streams` captures.
    deferred: Mutex<Vec<DeferredFree>>,
    capture: CaptureCounters,
}

impl TorchPool {
    /// Wraps a new pool.
    pub fn new(pool: Pool) -> Self {
        TorchPool {
            pool,
            captured: Mutex::new(BTreeSet::new()),
            capturing_streams: Mutex::new(Vec::new()),
            deferred: Mutex::new(Vec::new()),
            capture: CaptureCounters::default(),
        }
    }

    fn captured(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.captured.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn capturing_streams(&self) -> std::sync::MutexGuard<'_, Vec<StreamId>> {
        self.capturing_streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn deferred(&self) -> std::sync::MutexGuard<'_, Vec<DeferredFree>> {
        self.deferred.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The streams seen capturing (by an allocation) and not yet seen ended.
    pub fn seen_capturing(&self) -> Vec<StreamId> {
        self.capturing_streams().clone()
    }

    /// Remembers a stream seen capturing.
    fn saw_capture(&self, stream: StreamId) {
        let mut streams = self.capturing_streams();
        if !streams.contains(&stream) {
            streams.push(stream);
        }
    }

    /// Whether a capture this library saw may still be open: the streams seen capturing are
    /// asked again (`cuStreamIsCapturing` of each, legal during any capture), and those that
    /// ended are forgotten. A stream that cannot be asked counts as capturing.
    fn capture_open(&self) -> bool {
        let mut streams = self.capturing_streams();
        streams.retain(|&s| self.capturing(s).unwrap_or(true));
        !streams.is_empty()
    }

    /// Delays a free until no capture this library saw is open.
    fn defer(&self, free: DeferredFree) {
        self.deferred().push(free);
        self.capture.deferred_frees.fetch_add(1, Ordering::Relaxed);
    }

    /// Does the delayed frees once no capture this library saw is open (nothing otherwise);
    /// what went wrong with each is said through `report`.
    fn run_deferred(&self, report: &dyn Fn(&str)) {
        if self.deferred().is_empty() || self.capture_open() {
            return;
        }
        let frees = std::mem::take(&mut *self.deferred());
        for f in frees {
            if let Err(reason) = self.free_now(f) {
                report(&format!("a delayed free: {reason}"));
            }
        }
    }

    /// Frees now: a captured segment once the device is idle (replays of its graph may run
    /// on any stream), any other on its stream.
    fn free_now(&self, f: DeferredFree) -> Result<(), String> {
        let call = format!(
            "devarena_torch_free({:#x}, {}, stream {})",
            f.addr, f.size, f.stream
        );
        let captured = self.captured().contains(&f.addr);
        if captured {
            if let Err(error) = self.wait_idle() {
                self.capture.failed_waits.fetch_add(1, Ordering::Relaxed);
                return Err(format!(
                    "{call}: a segment allocated during a graph capture is freed once the device \
                     is idle, and waiting for it failed: {error}; nothing freed"
                ));
            }
        }
        // Out of the set before the free: once freed, the address may be handed out again at
        // once, to another thread's capture, which puts it back; taken out after, that entry
        // would go. Put back where the free fails (the address is still this segment's).
        if captured {
            self.captured().remove(&f.addr);
        }
        let request = FreeRequest::new(f.addr).size(f.size).on(f.stream);
        if let Err(error) = self.pool.deallocate_with(request) {
            if captured {
                self.captured().insert(f.addr);
            }
            return Err(match error {
                Error::UnknownAddress { .. } => format!(
                    "{call}: not a live allocation of this device's pool (freed already, or never \
                 allocated here); nothing freed"
                ),
                error => format!("{call}: {error}"),
            });
        }
        if captured {
            self.capture.freed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether `stream` is capturing a CUDA graph (never, for a pool without a stream
    /// runtime).
    fn capturing(&self, stream: StreamId) -> Result<bool, String> {
        match self.pool.stream_runtime() {
            Some(streams) => streams
                .is_capturing(stream)
                .map_err(|e| format!("is stream {stream} capturing? {e}")),
            None => Ok(false),
        }
    }

    /// Waits until nothing queued on the pool's device can still run (`cuCtxSynchronize`);
    /// nothing to wait for on a host pool.
    fn wait_idle(&self) -> Result<(), String> {
        #[cfg(feature = "cuda")]
        if let Some(streams) = self.pool.cuda_streams() {
            return streams.synchronize_device().map_err(|e| e.to_string());
        }
        Ok(())
    }

    /// The capture counters as the C struct.
    pub fn capture_stats(&self) -> DevarenaTorchCaptureStats {
        let c = &self.capture;
        DevarenaTorchCaptureStats {
            allocations: c.allocations.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            live: self.captured().len() as u64,
            freed: c.freed.load(Ordering::Relaxed),
            deferred_frees: c.deferred_frees.load(Ordering::Relaxed),
            failed_waits: c.failed_waits.load(Ordering::Relaxed),
            deferred: self.deferred().len() as u64,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Segments handed out and not freed.
    pub fn segments(&self) -> usize {
        self.pool.stats().live as usize
    }

    /// Makes a stream PyTorch hands over usable by the pool's stream runtime, the first time.
    fn register(&self, stream: LiveStream) {
        #[cfg(feature = "cuda")]
        if let Some(streams) = self.pool.cuda_streams() {
            if !streams.is_registered(stream.id()) {
                // SAFETY: a `LiveStream` is the legacy or per-thread default stream or a live
                // stream of the primary context of the device it is used with, this pool's
                // (see `LiveStream::new`), alive while the pool uses it.
                unsafe { streams.register_raw(stream.id()) };
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = stream;
    }

    /// The pool's counters as the C struct.
    pub fn stats(&self) -> DevarenaTorchStats {
        let s = self.pool.stats();
        DevarenaTorchStats {
            base: self.pool.base(),
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
    }
}

/// One slot per device: empty until the first allocation there, then the pool or why there
/// is none.
#[derive(Debug)]
pub struct Pools {
    slots: [OnceLock<Result<TorchPool, String>>; MAX_DEVICES],
}

impl Default for Pools {
    fn default() -> Self {
        Self::new()
    }
}

impl Pools {
    /// No pool on any device.
    pub const fn new() -> Self {
        Pools {
            slots: [const { OnceLock::new() }; MAX_DEVICES],
        }
    }

    fn slot(&self, device: i32) -> Option<&OnceLock<Result<TorchPool, String>>> {
        usize::try_from(device)
            .ok()
            .and_then(|index| self.slots.get(index))
    }

    /// The pool of `device` if it was created (frees and queries never create one).
    pub fn existing(&self, device: i32) -> Option<&TorchPool> {
        self.slot(device)?.get()?.as_ref().ok()
    }

    /// Allocates `size` bytes on `device` for `stream`, creating the device's pool on first
    /// use with `create(device)`; what went wrong otherwise. `report` gets the one line said
    /// when a pool is created (with `verbose`) or cannot be.
    pub fn alloc(
        &self,
        size: usize,
        device: i32,
        stream: LiveStream,
        create: impl FnOnce(usize) -> Result<Pool, String>,
        verbose: bool,
        report: &dyn Fn(&str),
    ) -> Result<u64, String> {
        let slot = self
            .slot(device)
            .ok_or_else(|| format!("device {device} is outside 0..{MAX_DEVICES}"))?;
        let index = device as usize;
        let created = slot.get_or_init(|| {
            let result = create(index).map(TorchPool::new);
            match &result {
                Ok(p) if verbose => report(&format!(
                    "pool `{}`: {} bytes ({:.2} GiB) at {:#x}",
                    p.pool.name(),
                    p.pool.capacity(),
                    p.pool.capacity() as f64 / (1u64 << 30) as f64,
                    p.pool.base()
                )),
                Ok(_) => {}
                Err(reason) => report(&format!(
                    "no pool for cuda:{index}, every allocation there returns null: {reason}"
                )),
            }
            result
        });
        let torch = created
            .as_ref()
            .map_err(|reason| format!("cuda:{index} has no pool: {reason}"))?;
        torch.register(stream);
        let stream = stream.id();
        let call = format!("devarena_torch_alloc({size}, cuda:{device}, stream {stream})");
        let capturing = torch
            .capturing(stream)
            .map_err(|error| format!("{call} failed: {error}"))?;
        if capturing {
            torch.saw_capture(stream);
        } else {
            torch.run_deferred(report);
        }
        // The tag names the stream in the leak report.
        let tag = match capturing {
            true => format!("stream {stream}, capture"),
            false => format!("stream {stream}"),
        };
        let request = AllocRequest::new(size, SEGMENT_ALIGN).on(stream).tag(&tag);
        let result = match capturing {
            true => torch.pool.allocate_for_capture(request),
            false => torch.pool.allocate_with(request),
        };
        let addr = result.map_err(|error| {
            let during = if capturing { " during a capture" } else { "" };
            format!("{call} failed{during}: {error}")
        })?;
        if capturing {
            torch.captured().insert(addr);
            torch.capture.allocations.fetch_add(1, Ordering::Relaxed);
            torch
                .capture
                .bytes
                .fetch_add(size as u64, Ordering::Relaxed);
            if verbose {
                report(&format!(
                    "{call} -> {addr:#x}: the stream is capturing a graph (no event on it, the \
                     home stream drained on the host)"
                ));
            }
        }
        Ok(addr)
    }

    /// Frees `addr` on `device`, on `stream`, given the `size` it was allocated with. Null is
    /// ignored. An address not handed out on that device (or freed already), or a size other
    /// than the one recorded, is refused: nothing changes and the reason comes back. A free
    /// that a capture would not allow is delayed (see [`TorchPool`]) and checked when it is
    /// done: a refusal then is said through `report_stderr`.
    pub fn free(
        &self,
        addr: u64,
        size: usize,
        device: i32,
        stream: LiveStream,
    ) -> Result<(), String> {
        if addr == 0 {
            return Ok(());
        }
        let call = format!("devarena_torch_free({addr:#x}, {size}, cuda:{device})");
        let torch = self
            .existing(device)
            .ok_or_else(|| format!("{call}: that device has no pool"))?;
        torch.register(stream);
        let stream = stream.id();
        let free = DeferredFree { addr, size, stream };
        let capturing = torch
            .capturing(stream)
            .map_err(|e| format!("{call}: {e}"))?;
        if capturing {
            // Its event would be recorded into the graph, which may use the segment.
            torch.saw_capture(stream);
            torch.defer(free);
            return Ok(());
        }
        // Waiting for the device (a captured segment's free) is refused during any capture.
        if torch.captured().contains(&addr) && torch.capture_open() {
            torch.defer(free);
            return Ok(());
        }
        torch.run_deferred(&report_stderr);
        torch.free_now(free)
    }

    /// The capture counters of `device`'s pool, or the code that says why there are none (as
    /// for [`stats`](Self::stats)).
    pub fn capture_stats(&self, device: i32) -> Result<DevarenaTorchCaptureStats, i32> {
        match self.slot(device).ok_or(STATS_INVALID_ARGUMENT)?.get() {
            None => Err(STATS_NO_POOL_YET),
            Some(Err(_)) => Err(STATS_POOL_FAILED),
            Some(Ok(torch)) => Ok(torch.capture_stats()),
        }
    }

    /// Gives back the memory of the chunks of `device`'s pool that no live allocation uses,
    /// until at most `keep` bytes stay mapped; the bytes given back.
    pub fn trim(&self, device: i32, keep: usize) -> Result<usize, String> {
        let call = format!("devarena_torch_trim(cuda:{device}, {keep})");
        let torch = self
            .existing(device)
            .ok_or_else(|| format!("{call}: that device has no pool"))?;
        torch
            .pool
            .trim_to(keep)
            .map_err(|error| format!("{call}: {error}"))
    }

    /// The counters of `device`'s pool, or the code that says why there are none
    /// ([`STATS_NO_POOL_YET`], [`STATS_POOL_FAILED`], [`STATS_INVALID_ARGUMENT`]).
    pub fn stats(&self, device: i32) -> Result<DevarenaTorchStats, i32> {
        match self.slot(device).ok_or(STATS_INVALID_ARGUMENT)?.get() {
            None => Err(STATS_NO_POOL_YET),
            Some(Err(_)) => Err(STATS_POOL_FAILED),
            Some(Ok(torch)) => Ok(torch.stats()),
        }
    }

    /// The counters and the leak report of `device`'s pool as text, with the number of live
    /// allocations; `None` without a pool.
    pub fn report(&self, device: i32) -> Option<(String, i64)> {
        let torch = self.existing(device)?;
        let stats = torch.pool.stats();
        let text = format!(
            "pool `{}`: {stats}; {} segments held by PyTorch\n{}",
            torch.pool.name(),
            torch.segments(),
            torch.pool.leak_report()
        );
        Some((text, stats.live as i64))
    }
}

/// Writes `devarena: <message>` on stderr. Never panics and never unwinds (a closed or failing
/// stderr loses the line), so the entry points may call it anywhere.
pub fn report_stderr(message: &str) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _ = writeln!(std::io::stderr().lock(), "devarena: {message}");
    }));
}

/// Parses `DEVARENA_POOL_BYTES`: decimal digits and an optional binary unit (`K`, `M`, `G`,
/// `T`, also written `KB`/`KiB`, ...; `B` or none for bytes), blanks around either allowed.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
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
pub fn parse_region(text: &str) -> Result<RegionKind, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "growable" | "" => Ok(RegionKind::Growable),
        "classic" => Ok(RegionKind::Classic),
        other => Err(format!(
            "DEVARENA_REGION={other:?}: expected `growable` (the default) or `classic`"
        )),
    }
}

/// The capacity of a new pool: `DEVARENA_POOL_BYTES` parsed when set (`var` is what
/// `std::env::var` returned), else `default()` (a share of the device's free memory).
pub fn capacity(
    var: Result<String, std::env::VarError>,
    default: impl FnOnce() -> Result<usize, String>,
) -> Result<usize, String> {
    match var {
        Ok(text) => parse_bytes(&text),
        Err(std::env::VarError::NotPresent) => default(),
        Err(e) => Err(format!("DEVARENA_POOL_BYTES: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// A stream id for the host pools of these tests, which have no CUDA stream runtime.
    fn live(stream: StreamId) -> LiveStream {
        // SAFETY: host pools never pass the id to the driver (`LiveStream::new`).
        unsafe { LiveStream::new(stream) }
    }

    fn host(capacity: usize) -> impl FnOnce(usize) -> Result<Pool, String> {
        move |device| {
            Pool::builder(capacity)
                .name(format!("torch-host:{device}"))
                .tracking(devarena::pool::Tracking::Tags)
                .log_leaks_on_drop(false)
                .build_host()
                .map_err(|e| e.to_string())
        }
    }

    fn quiet(_: &str) {}

    /// A captured segment freed (no capture open) while another thread's capture gets the same
    /// address as soon as the pool has freed it: the new segment stays captured, and its own
    /// free waits for the device. (Before, the first free took the address out of the captured
    /// set after the pool's free, which erased the new segment's entry.) An event sink, which
    /// runs inside the free once the pool has freed the block, stands in for the other thread.
    #[test]
    fn a_captured_segment_handed_out_again_during_its_own_free_stays_captured() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64};

        use devarena::pool::{ManualStreams, PoolAction, PoolEvent};

        static POOLS: Pools = Pools::new();
        let (home, first, second) = (StreamId(0), StreamId(0x5000), StreamId(0x6000));
        let streams = Arc::new(ManualStreams::new());
        let runtime = streams.clone();
        let armed = Arc::new(AtomicBool::new(false));
        let got = Arc::new(AtomicU64::new(0));
        let (sink_armed, sink_got, sink_streams) = (armed.clone(), got.clone(), streams.clone());
        let sink = Arc::new(move |e: &PoolEvent<'_>| {
            if e.action == PoolAction::Free && sink_armed.swap(false, Ordering::SeqCst) {
                sink_streams.begin_capture(second);
                let addr = POOLS
                    .alloc(2 << 20, 0, live(second), |_| unreachable!(), false, &quiet)
                    .unwrap();
                sink_got.store(addr, Ordering::SeqCst);
            }
        });
        let create = move |_device: usize| {
            Pool::builder(4 << 20)
                .streams(runtime, home)
                .events(sink)
                .log_leaks_on_drop(false)
                .build_host()
                .map_err(|e| e.to_string())
        };
        streams.begin_capture(first);
        let g = POOLS
            .alloc(2 << 20, 0, live(first), create, false, &quiet)
            .unwrap();
        streams.end_capture(first);
        assert_eq!(POOLS.capture_stats(0).unwrap().live, 1);
        armed.store(true, Ordering::SeqCst);
        POOLS.free(g, 2 << 20, 0, live(home)).unwrap();
        assert_eq!(
            got.load(Ordering::SeqCst),
            g,
            "the second capture got the same address"
        );
        let stats = POOLS.capture_stats(0).unwrap();
        assert_eq!((stats.live, stats.freed), (1, 1), "{stats:?}");
        streams.end_capture(second);
        POOLS.free(g, 2 << 20, 0, live(home)).unwrap();
        let stats = POOLS.capture_stats(0).unwrap();
        assert_eq!((stats.live, stats.freed), (0, 2), "{stats:?}");
    }

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
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(
            parse_bytes("8 furlongs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_bytes("").unwrap_err().contains("expected a number"));
        assert!(parse_bytes("-1").unwrap_err().contains("unknown unit"));
        assert!(
            parse_bytes("99999999999T")
                .unwrap_err()
                .contains("overflows")
        );
        assert!(
            parse_bytes("18446744073709551616")
                .unwrap_err()
                .contains("expected a number")
        );
    }

    #[test]
    fn capacity_reads_the_variable_or_falls_back() {
        assert_eq!(capacity(Ok("2M".into()), || Ok(7)), Ok(2 << 20));
        assert_eq!(
            capacity(Err(std::env::VarError::NotPresent), || Ok(7)),
            Ok(7)
        );
        let bad = std::env::VarError::NotUnicode(std::ffi::OsString::from("x"));
        assert!(
            capacity(Err(bad), || Ok(7))
                .unwrap_err()
                .contains("DEVARENA_POOL_BYTES")
        );
        assert!(capacity(Ok("1X".into()), || Ok(7)).is_err());
    }

    #[test]
    fn a_free_with_another_size_is_refused_and_changes_nothing() {
        let pools = Pools::new();
        let s = LiveStream::LEGACY;
        let a = pools
            .alloc(3 << 20, 0, s, host(64 << 20), false, &quiet)
            .unwrap();
        assert_eq!(a % SEGMENT_ALIGN as u64, 0);
        let before = pools.stats(0).unwrap();
        let err = pools.free(a, 2 << 20, 0, s).unwrap_err();
        assert!(
            err.contains("names 2097152 bytes") && err.contains("asked for 3145728 bytes"),
            "{err}"
        );
        assert_eq!(
            pools.stats(0).unwrap(),
            before,
            "a refused free changes nothing"
        );
        assert_eq!(pools.existing(0).unwrap().segments(), 1);
        pools.free(a, 3 << 20, 0, s).unwrap();
        assert_eq!(pools.stats(0).unwrap().live, 0);
        // Freed already: refused, even with the right size.
        let again = pools.free(a, 3 << 20, 0, s).unwrap_err();
        assert!(again.contains("not a live allocation"), "{again}");
        assert_eq!(pools.stats(0).unwrap().frees, 1);
    }

    #[test]
    fn a_stale_free_after_reuse_is_caught_by_its_size() {
        let pools = Pools::new();
        let s = LiveStream::LEGACY;
        // Room for one 512-aligned segment of 4 MiB wherever the host region starts.
        let a = pools
            .alloc(4 << 20, 0, s, host((4 << 20) + 4096), false, &quiet)
            .unwrap();
        pools.free(a, 4 << 20, 0, s).unwrap();
        // The same address goes to a segment of another size...
        let b = pools.alloc(2 << 20, 0, s, host(0), false, &quiet).unwrap();
        assert_eq!(a, b);
        // ...and a stale free of the first segment does not free it.
        assert!(pools.free(a, 4 << 20, 0, s).is_err());
        assert_eq!(pools.stats(0).unwrap().live, 1);
        pools.free(b, 2 << 20, 0, s).unwrap();
    }

    #[test]
    fn frees_on_other_devices_and_null_are_handled() {
        let pools = Pools::new();
        let s = LiveStream::LEGACY;
        assert_eq!(pools.free(0, 0, 5, s), Ok(()), "null is ignored");
        assert!(pools.free(0x1000, 1, 5, s).unwrap_err().contains("no pool"));
        assert!(
            pools
                .free(0x1000, 1, -1, s)
                .unwrap_err()
                .contains("no pool")
        );
        let a = pools
            .alloc(1000, 1, s, host(1 << 20), false, &quiet)
            .unwrap();
        assert!(
            pools.free(a, 1000, 0, s).is_err(),
            "another device's pointer"
        );
        pools.free(a, 1000, 1, s).unwrap();
        assert!(
            pools
                .alloc(1, MAX_DEVICES as i32, s, host(1 << 20), false, &quiet)
                .unwrap_err()
                .contains("outside")
        );
        assert!(pools.alloc(1, -3, s, host(1 << 20), false, &quiet).is_err());
    }

    #[test]
    fn zero_and_huge_sizes_never_panic_and_change_nothing_when_refused() {
        let pools = Pools::new();
        let s = LiveStream::LEGACY;
        // Zero bytes: a segment of its own (PyTorch frees whatever it got).
        let a = pools.alloc(0, 0, s, host(1 << 20), false, &quiet).unwrap();
        assert_eq!(a % SEGMENT_ALIGN as u64, 0);
        let before = pools.stats(0).unwrap();
        for huge in [usize::MAX, usize::MAX - 4095, 1 << 62, (1 << 20) + 1] {
            let e = pools.alloc(huge, 0, s, host(0), false, &quiet).unwrap_err();
            assert!(e.contains(&huge.to_string()), "{e}");
        }
        assert_eq!(pools.stats(0).unwrap().live, before.live);
        assert_eq!(pools.stats(0).unwrap().in_use, before.in_use);
        pools.free(a, 0, 0, s).unwrap();
        assert!(pools.free(a, 0, 0, s).is_err(), "a double free is refused");
        assert!(pools.free(u64::MAX, usize::MAX, 0, s).is_err());
        assert_eq!(pools.stats(0).unwrap().live, 0);
    }

    #[test]
    fn stats_codes_tell_no_pool_yet_from_a_failed_pool() {
        let pools = Pools::new();
        let said = RefCell::new(Vec::new());
        let report = |line: &str| said.borrow_mut().push(line.to_string());
        assert_eq!(pools.stats(0), Err(STATS_NO_POOL_YET));
        assert_eq!(pools.stats(-1), Err(STATS_INVALID_ARGUMENT));
        assert_eq!(pools.stats(MAX_DEVICES as i32), Err(STATS_INVALID_ARGUMENT));
        let failing = |_| Err::<Pool, _>("DEVARENA_POOL_BYTES=\"8 furlongs\": unknown unit".into());
        let err = pools
            .alloc(4096, 0, LiveStream::LEGACY, failing, false, &report)
            .unwrap_err();
        assert!(err.contains("furlongs"), "{err}");
        assert_eq!(pools.stats(0), Err(STATS_POOL_FAILED));
        assert_eq!(
            said.borrow().len(),
            1,
            "the failure is reported once: {said:?}"
        );
        assert!(said.borrow()[0].contains("no pool for cuda:0"));
        // Later allocations fail without creating or reporting again.
        assert!(
            pools
                .alloc(4096, 0, LiveStream::LEGACY, host(1 << 20), false, &report)
                .is_err()
        );
        assert_eq!(said.borrow().len(), 1);
        assert_eq!(pools.stats(0), Err(STATS_POOL_FAILED));
        // Another device is unaffected; creating it verbosely says so once.
        pools
            .alloc(4096, 1, LiveStream::LEGACY, host(1 << 20), true, &report)
            .unwrap();
        assert_eq!(said.borrow().len(), 2);
        let stats = pools.stats(1).unwrap();
        assert_eq!((stats.live, stats.capacity), (1, 1 << 20));
        let (text, live) = pools.report(1).unwrap();
        assert_eq!(live, 1);
        assert!(text.contains("1 segments held by PyTorch"), "{text}");
        assert!(pools.report(0).is_none());
        assert_ne!(STATS_NO_POOL_YET, STATS_POOL_FAILED);
    }

    #[test]
    fn an_exhausted_pool_returns_an_error_and_keeps_serving() {
        let pools = Pools::new();
        let s = LiveStream::LEGACY;
        let a = pools
            .alloc(512 << 10, 0, s, host(1 << 20), false, &quiet)
            .unwrap();
        let err = pools
            .alloc(600 << 10, 0, s, host(0), false, &quiet)
            .unwrap_err();
        assert!(err.contains("capacity"), "{err}");
        pools.free(a, 512 << 10, 0, s).unwrap();
        let b = pools
            .alloc(600 << 10, 0, s, host(0), false, &quiet)
            .unwrap();
        pools.free(b, 600 << 10, 0, s).unwrap();
        assert_eq!(pools.stats(0).unwrap().failures, 1);
    }

    #[test]
    fn segments_allocated_during_a_capture_ask_nothing_of_the_capturing_stream() {
        use devarena::pool::ManualStreams;
        use std::sync::Arc;

        let pools = Pools::new();
        let (home, capture) = (StreamId(0), StreamId(0x5000));
        let streams = Arc::new(ManualStreams::new());
        let runtime = streams.clone();
        let create = move |device: usize| {
            Pool::builder(64 << 20)
                .name(format!("torch-host:{device}"))
                .streams(runtime, home)
                .tracking(devarena::pool::Tracking::Tags)
                .log_leaks_on_drop(false)
                .build_host()
                .map_err(|e| e.to_string())
        };
        let said = RefCell::new(Vec::new());
        let report = |line: &str| said.borrow_mut().push(line.to_string());
        // Eager work: a segment freed on the home stream (PyTorch's empty_cache).
        let a = pools
            .alloc(4 << 20, 0, live(home), create, false, &report)
            .unwrap();
        pools.free(a, 4 << 20, 0, live(home)).unwrap();

        streams.begin_capture(capture);
        let g = pools
            .alloc(20 << 20, 0, live(capture), host(0), true, &report)
            .unwrap();
        assert!(
            said.borrow().iter().any(|l| l.contains("capturing")),
            "{said:?}"
        );
        // The home stream was drained on the host; nothing was asked of the capturing stream.
        assert_eq!(streams.synchronized(), vec![home]);
        assert!(streams.refused().is_empty(), "{:?}", streams.refused());
        assert!(streams.waits().is_empty());
        let stats = pools.existing(0).unwrap().capture_stats();
        assert_eq!(
            (stats.allocations, stats.bytes, stats.live),
            (1, 20 << 20, 1)
        );

        // A free while the stream captures is delayed: the graph may use the segment, and
        // nothing may be asked of the capturing stream.
        pools.free(g, 20 << 20, 0, live(capture)).unwrap();
        assert_eq!(pools.stats(0).unwrap().live, 1);
        let stats = pools.capture_stats(0).unwrap();
        assert_eq!(
            (stats.deferred_frees, stats.deferred, stats.freed),
            (1, 1, 0)
        );
        assert!(streams.refused().is_empty(), "{:?}", streams.refused());
        // Still capturing: a call on another stream does not run it either.
        let c = pools
            .alloc(4096, 0, live(home), host(0), false, &report)
            .unwrap();
        assert_eq!(pools.capture_stats(0).unwrap().deferred, 1);
        streams.end_capture(capture);

        // After the capture: the next call frees it (a host pool has no device to wait for).
        pools.free(c, 4096, 0, live(home)).unwrap();
        let stats = pools.capture_stats(0).unwrap();
        assert_eq!(
            (
                stats.live,
                stats.freed,
                stats.deferred_frees,
                stats.deferred,
                stats.failed_waits
            ),
            (0, 1, 1, 0, 0)
        );
        assert_eq!(pools.stats(0).unwrap().live, 0);
        assert_eq!(pools.capture_stats(1), Err(STATS_NO_POOL_YET));
        assert_eq!(pools.capture_stats(-1), Err(STATS_INVALID_ARGUMENT));
        // An ordinary segment for that stream now: an event at its free, as before.
        let b = pools
            .alloc(1 << 20, 0, live(capture), host(0), false, &report)
            .unwrap();
        pools.free(b, 1 << 20, 0, live(capture)).unwrap();
        assert_eq!(streams.pending(capture), 2);
    }

    #[test]
    fn a_captured_segment_freed_while_another_capture_is_open_waits_for_it_to_end() {
        use devarena::pool::ManualStreams;
        use std::sync::Arc;

        let pools = Pools::new();
        let (home, first, second) = (StreamId(0), StreamId(0x5000), StreamId(0x6000));
        let streams = Arc::new(ManualStreams::new());
        let runtime = streams.clone();
        let create = move |device: usize| {
            Pool::builder(64 << 20)
                .name(format!("torch-host:{device}"))
                .streams(runtime, home)
                .log_leaks_on_drop(false)
                .build_host()
                .map_err(|e| e.to_string())
        };
        // A segment of a first graph, and an ordinary one on the second stream.
        let plain = pools
            .alloc(1 << 20, 0, live(second), create, false, &quiet)
            .unwrap();
        streams.begin_capture(first);
        let g = pools
            .alloc(2 << 20, 0, live(first), host(0), false, &quiet)
            .unwrap();
        streams.end_capture(first);

        // A second capture opens and allocates; meanwhile the first graph's segment is freed
        // (on its own stream, which no longer captures): waiting for the device would
        // invalidate the open capture, so the free waits instead.
        streams.begin_capture(second);
        let h = pools
            .alloc(2 << 20, 0, live(second), host(0), false, &quiet)
            .unwrap();
        pools.free(g, 2 << 20, 0, live(first)).unwrap();
        // The ordinary segment, freed on the capturing stream: delayed too (no event there).
        pools.free(plain, 1 << 20, 0, live(second)).unwrap();
        let stats = pools.capture_stats(0).unwrap();
        assert_eq!((stats.deferred, stats.freed, stats.live), (2, 0, 2));
        assert!(streams.refused().is_empty(), "{:?}", streams.refused());
        // Statistics leave this thread's heap for the second stream (where the ordinary
        // segment was allocated) as it is: nothing is given back, so no event is asked of the
        // capturing stream.
        assert_eq!(pools.stats(0).unwrap().live, 3);
        assert!(streams.refused().is_empty(), "{:?}", streams.refused());

        // A bad free is still refused at once when nothing stops it.
        assert!(pools.free(0x10, 1, 0, live(home)).is_err());
        assert_eq!(pools.capture_stats(0).unwrap().deferred, 2);

        // The capture ends; the next call does the delayed frees, then its own.
        streams.end_capture(second);
        pools.free(h, 2 << 20, 0, live(second)).unwrap();
        let stats = pools.capture_stats(0).unwrap();
        assert_eq!(
            (
                stats.deferred,
                stats.deferred_frees,
                stats.freed,
                stats.live
            ),
            (0, 2, 2, 0)
        );
        assert_eq!(pools.stats(0).unwrap().live, 0);
        // Both segments of the second stream were freed on it once it no longer captured: the
        // one allocated during the capture (by the pool's index) with an event there, as any
        // free of the pool's index on a stream other than the home stream; the ordinary one
        // in the heap for that stream that allocated it, which reuses it there without one.
        assert_eq!(streams.pending(second), 1);
    }

    #[test]
    fn report_stderr_never_panics() {
        report_stderr("a line from the tests");
    }
}

//! The pool on a device: a stream runtime on CUDA events ([`CudaStreams`]), the constructors
//! of a device pool, and device views of pool slices. The driver calls themselves are the
//! backend's (`backend::cuda`).

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::Any;
use std::sync::Mutex;

use super::{Pool, PoolBuilder, PoolSlice, RegionKind, StreamEvent, StreamId, StreamSync};
use crate::backend::cuda::event::{RecordedEvent, synchronize_context};
use crate::backend::cuda::{
    CaptureStatus, CudaBackend, CudaContext, CudaStream, CudaVirtualMemory, DeviceView,
    DeviceViewMut, capture_status_raw, is_capturing_raw, pointer_info,
};
use crate::error::Error;
use crate::layout::Element;

/// The [`StreamId`] of a stream: its raw `CUstream` handle (`0` for the legacy default stream).
pub fn stream_id(stream: &CudaStream) -> StreamId {
    StreamId(stream.cu_stream() as usize as u64)
}

/// The pool's stream runtime on CUDA events: `cuEventRecord` when a block is freed on a stream
/// other than the pool's home stream, `cuEventQuery` to see whether it may be reused, and
/// `cuEventRecord` + `cuStreamWaitEvent` to order a stream after the home stream.
///
/// Streams are named by their raw handles ([`StreamId`]), so streams that cudarc does not own
/// (a `cudaStream_t` from PyTorch) work too. A raw handle reaches the driver only once the
/// stream is **registered**: [`register`](Self::register) (or [`Pool::register_stream`]) keeps
/// a cudarc stream alive for as long as the runtime lives; [`register_raw`](Self::register_raw)
/// takes the caller's word for a handle. The special handles `0` and `1` (the legacy default
/// stream) and `2` (the per-thread default stream) need no registration. Any other handle is
/// an error naming it: a number made up in safe code never reaches `cuEventRecord`.
///
/// Every call binds the context to the calling thread first and never calls back into the
/// pool; none blocks the host but [`synchronize`](StreamSync::synchronize), which waits for
/// the stream's work (an event recorded on it, `cuEventSynchronize`).
///
/// **Captures.** A stream that is capturing a CUDA graph (`cuStreamIsCapturing`) is never
/// made to wait or synchronized, and no event recorded on it is kept: recording an event on
/// it, making it wait, or synchronizing it is an error that names the stream, asked before
/// anything is queued and, where an event was recorded, asked again after (another thread may
/// have begun a capture in between: see `refuse_capturing`), so the capture stays intact and
/// the pool as it was. The driver calls themselves run in relaxed capture mode, so a capture
/// open on another stream (in global mode, as PyTorch's are) neither refuses them nor is
/// invalidated by them. One exception the runtime cannot help: while a *blocking* stream
/// (not `CU_STREAM_NON_BLOCKING`) captures, the driver refuses any record on the legacy
/// default stream (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`) and invalidates that capture; a pool
/// whose streams include the legacy default stream needs non-blocking streams for captures
/// (PyTorch's capture streams are).
#[derive(Debug)]
pub struct CudaStreams {
    ctx: Arc<CudaContext>,
    /// Registered streams; the cudarc ones are kept alive here.
    known: Mutex<Vec<(StreamId, Option<Arc<CudaStream>>)>>,
}

/// Handles every context knows: the legacy default stream (`0`, `CU_STREAM_LEGACY` = `1`) and
/// the per-thread default stream (`CU_STREAM_PER_THREAD` = `2`).
const SPECIAL_STREAMS: [u64; 3] = [0, 1, 2];

impl CudaStreams {
    /// A stream runtime for streams of `ctx`, with no stream registered yet.
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        CudaStreams {
            ctx,
            known: Mutex::new(Vec::new()),
        }
    }

    /// The context the streams belong to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Vec<(StreamId, Option<Arc<CudaStream>>)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a stream of this runtime's context (kept alive while the runtime lives);
    /// returns its id. An error for a stream of another context: of another device, or
    /// another context of the same device (the pool's addresses mean nothing there).
    pub fn register(&self, stream: &Arc<CudaStream>) -> Result<StreamId, Error> {
        let (theirs, ours) = (stream.context(), &self.ctx);
        if theirs.cu_ctx() != ours.cu_ctx() {
            return Err(Error::invalid(format!(
                "stream {} belongs to {}, not to the pool's context (device {})",
                stream_id(stream),
                other_context(theirs, ours),
                ours.ordinal()
            )));
        }
        let id = stream_id(stream);
        let mut known = self.known();
        if !known.iter().any(|(k, _)| *k == id) {
            known.push((id, Some(stream.clone())));
        }
        Ok(id)
    }

    /// Registers a raw stream handle.
    ///
    /// # Safety
    ///
    /// `stream` must be a stream of this runtime's context that stays alive for as long as
    /// this runtime (and the pool it serves) may be asked to use it.
    pub unsafe fn register_raw(&self, stream: StreamId) {
        let mut known = self.known();
        if !known.iter().any(|(k, _)| *k == stream) {
            known.push((stream, None));
        }
    }

    /// Whether the driver may be handed `stream`: a special handle or a registered stream.
    pub fn is_registered(&self, stream: StreamId) -> bool {
        SPECIAL_STREAMS.contains(&stream.raw()) || self.known().iter().any(|(k, _)| *k == stream)
    }

    fn check(&self, stream: StreamId) -> Result<(), Error> {
        if self.is_registered(stream) {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "stream {stream} is not registered with the pool's stream runtime: register it \
             with `Pool::register_stream` (or `CudaStreams::register`) before using it"
        )))
    }

    /// Blocks the calling thread until nothing queued on the context's streams can still run
    /// (`cuCtxSynchronize`), as `cudaFree` does before it gives memory back: for memory that
    /// work on any stream may have used (a graph's, replayed on streams the pool never saw).
    pub fn synchronize_device(&self) -> Result<(), Error> {
        synchronize_context(&self.ctx)
    }

    /// The capture status of a registered stream, capture id included
    /// (`cuStreamGetCaptureInfo`): a query the driver allows during any capture, which changes
    /// nothing (for diagnostics; see [`capture_status_raw`] about the legacy default stream).
    pub fn capture_status(&self, stream: StreamId) -> Result<CaptureStatus, Error> {
        self.check(stream)?;
        // SAFETY: a special handle or a registered, live stream of this context.
        unsafe { capture_status_raw(&self.ctx, stream.raw()) }
    }

    /// Whether a registered stream is capturing.
    fn capturing(&self, stream: StreamId) -> Result<bool, Error> {
        self.check(stream)?;
        // SAFETY: a special handle or a registered, live stream of this context.
        unsafe { is_capturing_raw(&self.ctx, stream.raw()) }
    }

    /// An error when `stream` is capturing: `what` (an event recorded on it, a wait, a
    /// synchronize) would be recorded into the graph or refused by the driver, which would
    /// invalidate the capture. Asking first leaves the capture intact.
    ///
    /// The question and the call after it are two driver calls: another thread may begin a
    /// capture on the stream in between. What then reaches the capture is refused by the
    /// driver or can never pass for the stream's work being done, so no block is handed out
    /// early: an event recorded into the capture fails every query (the pool sets a freed
    /// block behind it aside; a query while the capture is open also invalidates the
    /// capture) and, once the capture is over, every wait for it. So
    /// [`record`](StreamSync::record), [`order_after`](StreamSync::order_after) and
    /// [`synchronize`](StreamSync::synchronize) (an event and a wait for it) record through
    /// [`record_outside_captures`](Self::record_outside_captures), which asks again after the
    /// record and refuses where the stream captures now: no query of such an event, no
    /// wait for it while the capture is open (which would pull the waiter into the capture),
    /// no `cuStreamSynchronize` of a capturing stream. What is left is a capture that began
    /// and ended between the record and the second question: its event fails every query
    /// and wait, and a block freed behind it is set aside. A wait in a capture for an event
    /// recorded outside it fails (`order_after` asks about the waiter again just before it
    /// waits, which narrows that window to one driver call); the allocation or free that made
    /// the call gets the error (what the driver does:
    /// `pool_graph_gpu::deliberate_api_error_events_that_cross_a_capture_boundary_never_order_streams_unseen`).
    fn refuse_capturing(&self, stream: StreamId, what: &str) -> Result<(), Error> {
        if !self.capturing(stream)? {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "stream {stream} is capturing a CUDA graph: the pool cannot {what} it (the capture \
             would record it); blocks a graph uses are allocated through a `GraphReservation` \
             (or `Pool::allocate_for_capture`) and freed on the capturing stream, or after the \
             capture"
        )))
    }

    /// An event recorded on `stream` outside any capture: `stream` is asked whether it
    /// captures before the record and again after it, and refused (`what`: what the caller
    /// would do) either time. A capture begun in between may hold the event; the pool would
    /// park a block behind it, and its first query, while the capture is open, would
    /// invalidate the capture (`CUDA_ERROR_CAPTURED_EVENT`) and set the block aside. Refused
    /// instead, the event goes without a query (destroying it is allowed during a capture),
    /// and the caller gets the error: a free by address changes nothing; a slice's free parks
    /// its block behind the refusal, set aside, as for any failed record.
    fn record_outside_captures(
        &self,
        stream: StreamId,
        what: &str,
    ) -> Result<RecordedEvent, Error> {
        self.refuse_capturing(stream, what)?;
        // SAFETY: the handle is a special handle or a registered stream of this context
        // (`refuse_capturing` checked), alive (kept here, or vouched for by `register_raw`'s
        // caller).
        let event = unsafe { RecordedEvent::record(&self.ctx, stream.raw())? };
        self.refuse_capturing(stream, what)?;
        Ok(event)
    }
}

/// An event recorded by [`CudaStreams`].
#[derive(Debug)]
struct CudaPoolEvent(RecordedEvent);

impl StreamEvent for CudaPoolEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        self.0.is_complete()
    }
}

impl StreamSync for CudaStreams {
    fn validate(&self, stream: StreamId) -> Result<(), Error> {
        self.check(stream)
    }

    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        let event = self.record_outside_captures(stream, "record an event on")?;
        Ok(Box::new(CudaPoolEvent(event)))
    }

    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.refuse_capturing(waiter, "make wait")?;
        // (Recorded in a capture begun on `producer`, a wait for the event would pull
        // `waiter` into that capture, the driver's fork, instead of ordering it.)
        let event = self.record_outside_captures(producer, "record an event on")?;
        // And the waiter, asked last, just before its wait: a capture begun on it since the
        // first question would take the wait in for an event recorded outside it, which the
        // driver refuses (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`). (Narrowed, not closed: one
        // driver call apart.)
        self.refuse_capturing(waiter, "make wait")?;
        // SAFETY: a special handle or a registered, live stream of this context.
        unsafe { event.make_wait(waiter.raw()) }
    }

    fn is_capturing(&self, stream: StreamId) -> Result<bool, Error> {
        self.capturing(stream)
    }

    fn is_per_thread(&self, stream: StreamId) -> bool {
        stream.raw() == crate::backend::cuda::PER_THREAD_STREAM
    }

    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        // Not `cuStreamSynchronize`, which a capture begun on the stream since the question
        // would not survive: a wait for an event recorded before any capture open now.
        self.record_outside_captures(stream, "synchronize")?
            .synchronize()
    }
}

impl PoolBuilder {
    /// A pool on `stream`'s device, stream-aware ([`CudaStreams`]) with `stream` as its home
    /// stream. The region is growable by default: addresses for the whole capacity reserved
    /// with the virtual memory API ([`CudaVirtualMemory`]), device memory mapped in chunks of
    /// [`chunk`](Self::chunk) bytes (2 MiB on an H200) as allocations reach them, given back by
    /// [`Pool::trim`]. With [`RegionKind::Classic`] it is one `cuMemAlloc` of the capacity
    /// ([`CudaBackend::new`]), made up front: what RDMA registration and CUDA IPC need. A device
    /// without the virtual memory API gets a classic region unless a growable one was asked
    /// for (then it is an error), and a warning in the log.
    ///
    /// ```no_run
    /// use devarena::backend::cuda::cuda_stream;
    /// use devarena::pool::{Pool, RegionKind, Tracking};
    ///
    /// let stream = cuda_stream(0)?;
    /// let pool = Pool::builder(1 << 30)
    ///     .name("engines")
    ///     .tracking(Tracking::Tags)
    ///     .build_cuda(stream.clone())?;
    /// assert_eq!(pool.backend_name(), "cuda-vmm");
    /// assert_eq!(pool.stats().mapped, 0); // nothing until an allocation reaches it
    ///
    /// // One cuMemAlloc of the capacity, up front (for RDMA or IPC).
    /// let classic = Pool::builder(1 << 30)
    ///     .region(RegionKind::Classic)
    ///     .build_cuda(stream)?;
    /// assert_eq!(classic.backend_name(), "cuda");
    /// assert_eq!(classic.stats().mapped, 1 << 30);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn build_cuda(self, stream: Arc<CudaStream>) -> Result<Pool, Error> {
        let streams = Arc::new(CudaStreams::new(stream.context().clone()));
        let home = streams.register(&stream)?;
        let builder = self.streams(streams, home);
        let kind = match builder.region_asked() {
            Some(kind) => kind,
            // A device without the virtual memory API gets the classic region it can have.
            None if !CudaVirtualMemory::supported(&stream)? => {
                log::warn!(
                    target: "devarena::pool",
                    "device {} has no virtual memory API: pool `{}` takes its capacity in one \
                     cuMemAlloc",
                    stream.context().ordinal(),
                    builder.pool_name()
                );
                RegionKind::Classic
            }
            None => RegionKind::Growable,
        };
        match kind {
            RegionKind::Growable => builder.build_mapped(CudaVirtualMemory::new(stream)?),
            RegionKind::Classic => builder.build_in(CudaBackend::new(stream)),
        }
    }
}

impl Pool {
    /// A pool of up to `capacity` bytes of device memory on `stream`'s device, home stream
    /// `stream`: a growable region, whose device memory follows its use (see
    /// [`PoolBuilder::build_cuda`] for a classic region and the other settings). Nothing is
    /// mapped until allocations reach it, so `capacity` may be as large as the device: it is
    /// the hard cap, and costs only address space.
    ///
    /// In the common case allocation and free call the driver only to map memory where the
    /// pool grows into space it never used (or gave back), to record an event when a block is
    /// freed on a stream other than the home stream (a thread heap's block on its own stream
    /// excepted), to have a stream wait for the home stream (`cuEventRecord`,
    /// `cuStreamWaitEvent`) before it is handed a block freed there (see
    /// [`crate::pool::stream`]), and to ask whether a stream captures (`cuStreamIsCapturing`)
    /// at a thread's first request on a stream other than the home stream. Slower paths also
    /// query the events of parked blocks, order the home stream after a stream whose heap
    /// gives its blocks back, record events on the home stream for frees made while a trim or
    /// a capture waits for it, and, for a request that finds the device full, wait for the
    /// home stream and unmap free chunks. [`Pool::trim`] gives back chunks with no live byte.
    /// [`PoolSlice::device_view`] and [`PoolSlice::device_view_mut`] turn typed slices into
    /// views for cudarc.
    ///
    /// ```no_run
    /// use devarena::backend::cuda::cuda_stream;
    /// use devarena::Pool;
    ///
    /// let stream = cuda_stream(0)?;
    /// let pool = Pool::cuda(stream.clone(), 256 << 20)?;
    /// let mut xs = pool.alloc_slice::<f32>(1 << 20)?;
    /// xs.device_view_mut(&stream)?.upload(&vec![1.0; 1 << 20])?;
    /// assert_eq!(xs.device_view(&stream)?.to_vec()?[12345], 1.0);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn cuda(stream: Arc<CudaStream>, capacity: usize) -> Result<Pool, Error> {
        PoolBuilder::new(capacity).build_cuda(stream)
    }
}

impl Pool {
    /// The pool's stream runtime, when it is [`CudaStreams`] (pools made by
    /// [`Pool::cuda`] and [`PoolBuilder::build_cuda`]).
    pub fn cuda_streams(&self) -> Option<&CudaStreams> {
        cuda_streams(self.stream_runtime())
    }

    /// Registers `stream` with the pool's stream runtime, so that blocks may be allocated for
    /// it and freed on it (see [`CudaStreams`]); returns its id. An error for a pool without
    /// [`CudaStreams`] and for a stream of another device.
    ///
    /// ```no_run
    /// use devarena::backend::cuda::cuda_stream;
    /// use devarena::Pool;
    ///
    /// let stream = cuda_stream(0)?;
    /// let pool = Pool::cuda(stream.clone(), 64 << 20)?;
    /// let copy_stream = stream.context().new_stream().map_err(|e| {
    ///     devarena::backend::cuda::driver_error("cuStreamCreate", e)
    /// })?;
    /// let id = pool.register_stream(&copy_stream)?;
    /// let addr = pool.allocate_on(1 << 20, 0, id)?;
    /// pool.deallocate_on(addr, id)?;
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn register_stream(&self, stream: &Arc<CudaStream>) -> Result<StreamId, Error> {
        match self.cuda_streams() {
            Some(streams) => streams.register(stream),
            None => Err(Error::invalid(format!(
                "pool `{}` has no CUDA stream runtime to register a stream with",
                self.name()
            ))),
        }
    }
}

/// At a pool's build: where its stream runtime is [`CudaStreams`] and its memory comes from
/// one of devarena's CUDA backends, both must be of one context. A runtime of another context
/// (another device's, or `CudaContext::new_non_primary`'s of the same device) would order the
/// blocks' reuse and the region's teardown on streams that are not the memory's.
pub(super) fn check_contexts(
    name: &str,
    streams: Option<&Arc<dyn StreamSync>>,
    backend: &dyn Any,
) -> Result<(), Error> {
    let Some(runtime) = cuda_streams(streams) else {
        return Ok(());
    };
    use crate::backend::cuda::{ManagedBackend, PinnedBackend};
    let memory = if let Some(b) = backend.downcast_ref::<CudaBackend>() {
        b.stream()
    } else if let Some(b) = backend.downcast_ref::<ManagedBackend>() {
        b.stream()
    } else if let Some(b) = backend.downcast_ref::<PinnedBackend>() {
        b.stream()
    } else if let Some(vm) = backend.downcast_ref::<CudaVirtualMemory>() {
        vm.stream()
    } else {
        return Ok(());
    };
    let (theirs, ours) = (memory.context(), runtime.context());
    if theirs.cu_ctx() == ours.cu_ctx() {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "pool `{name}`: its memory belongs to {}, its stream runtime (`CudaStreams`) to device \
         {}'s context: build both on one context (`Pool::cuda` does)",
        other_context(theirs, ours),
        ours.ordinal()
    )))
}

/// Names `theirs`, a context that is not `ours`: another device's, or another context of the
/// same device (`CudaContext::new_non_primary`).
fn other_context(theirs: &CudaContext, ours: &CudaContext) -> String {
    if theirs.ordinal() == ours.ordinal() {
        format!("another context of device {}", theirs.ordinal())
    } else {
        format!("device {}'s context", theirs.ordinal())
    }
}

/// A pool's stream runtime, where it is [`CudaStreams`].
fn cuda_streams(streams: Option<&Arc<dyn StreamSync>>) -> Option<&CudaStreams> {
    let streams: &dyn Any = streams?.as_ref();
    streams.downcast_ref::<CudaStreams>()
}

impl<T: Element> PoolSlice<T> {
    /// Checks that the slice may be viewed on `stream` and returns its device address.
    fn device_addr_for(&self, stream: &CudaStream) -> Result<u64, Error> {
        let client = self.client();
        if !client.memory().is_device_addressable() {
            return Err(Error::invalid(format!(
                "pool slice at {:#x} lives in `{}` memory, which has no device view",
                self.addr(),
                client.backend_name()
            )));
        }
        // A view lets safe code queue work on the slice's stream (copies, memsets): the block
        // must have been handed out in that stream's order, and its free must wait for that
        // work. Only the pool's own CUDA stream runtime is trusted with that: a pool without a
        // stream runtime hands every free out again at once, on any stream, and another
        // runtime's events are its own word.
        let streams = client.shared().streams.as_ref();
        let Some(runtime) = cuda_streams(streams) else {
            return Err(Error::invalid(format!(
                "pool slice at {:#x}: pool `{}` {}, so nothing orders the reuse of its blocks \
                 after the work a view queues; device views need the pool's own CUDA stream \
                 runtime (`Pool::cuda`, `PoolBuilder::build_cuda`)",
                self.addr(),
                client.shared().name,
                if streams.is_some() {
                    "has a stream runtime other than `CudaStreams`"
                } else {
                    "has no stream runtime"
                }
            )));
        };
        // The same context as the pool's, not only the same device: the handles of the
        // default streams (`0`, `1`, `2`) name a stream of every context, and another
        // context's kernels cannot reach the pool's memory.
        let (theirs, ours) = (stream.context(), runtime.context());
        if theirs.cu_ctx() != ours.cu_ctx() {
            return Err(Error::invalid(format!(
                "pool slice at {:#x}: the stream belongs to {}, not to pool `{}`'s context \
                 (device {})",
                self.addr(),
                other_context(theirs, ours),
                client.shared().name,
                ours.ordinal()
            )));
        }
        let id = stream_id(stream);
        if id != self.stream() {
            return Err(Error::invalid(format!(
                "pool slice at {:#x} was allocated for stream {}, not stream {id}: a view is \
                 ordered on its slice's stream, and kernels launched on another stream with it \
                 would not be (allocate the slice with `alloc_slice_on` for the other stream)",
                self.addr(),
                self.stream()
            )));
        }
        let info = pointer_info(stream, self.addr())?;
        let ordinal = stream.context().ordinal();
        if info.device_ordinal != Some(ordinal) {
            return Err(Error::invalid(format!(
                "pool slice at {:#x} lives on device {:?}, the stream on device {ordinal}",
                self.addr(),
                info.device_ordinal
            )));
        }
        Ok(self.addr())
    }

    /// A read-only device view of the slice, ordered on `stream`: the stream the slice was
    /// allocated for (the pool's home stream for [`Pool::alloc_slice`]). The view borrows the
    /// slice, so the slice cannot be freed while a view of it lives.
    ///
    /// An error when the pool is not device memory, has not the pool's own CUDA stream runtime
    /// ([`Pool::cuda`], [`PoolBuilder::build_cuda`]: only it orders every reuse of a block
    /// after the work queued on it), `stream` is not the slice's stream, or `stream` belongs
    /// to another context than the pool's (another device's, or another context of the same
    /// device: the default streams' handles name a stream of every context).
    ///
    /// Work a view queues while its stream captures a graph with cudarc's own
    /// `CudaStream::begin_capture` is recorded into a graph that does not borrow the slice: a
    /// replay after the slice is freed writes memory the pool has handed out again (cudarc's
    /// own buffers have the same hole). Capture a pool's work with [`Pool::capture`] (see its
    /// `# Safety`).
    pub fn device_view<'a>(
        &'a self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<DeviceView<'a, T>, Error> {
        let ptr = self.device_addr_for(stream)?;
        // SAFETY: the slice's `len` elements are live device memory of `stream`'s context
        // (checked above), aligned for `T`; the view borrows the slice, which cannot be freed
        // or written through the pool while the borrow lasts.
        Ok(unsafe { DeviceView::from_raw(ptr, self.len(), stream) })
    }

    /// A mutable device view of the slice, ordered on `stream` (see
    /// [`device_view`](Self::device_view)); `&mut self` makes it the only view.
    pub fn device_view_mut<'a>(
        &'a mut self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<DeviceViewMut<'a, T>, Error> {
        let ptr = self.device_addr_for(stream)?;
        // SAFETY: as for `device_view`, and `&mut self` makes this the only view.
        Ok(unsafe { DeviceViewMut::from_raw(ptr, self.len(), stream) })
    }
}

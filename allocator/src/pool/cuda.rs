//! The pool on a device: a stream runtime on CUDA events ([`CudaStreams`]), the constructors
//! of a device pool, and device views of pool slices. The driver calls themselves are the
//! backend's (`backend::cuda`).

use alloc::boxed::Box;
use alloc::format;
use alloc::sync::Arc;

use super::{Pool, PoolBuilder, PoolSlice, StreamEvent, StreamId, StreamSync};
use crate::backend::cuda::event::RecordedEvent;
use crate::backend::cuda::{
    CudaBackend, CudaContext, CudaStream, DeviceView, DeviceViewMut, pointer_info,
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
/// (a `cudaStream_t` from PyTorch, the legacy default stream `0`, the per-thread default stream
/// `2`) work too; they must belong to this context. Every call binds the context to the calling
/// thread first, never blocks the host and never calls back into the pool.
#[derive(Debug, Clone)]
pub struct CudaStreams {
    ctx: Arc<CudaContext>,
}

impl CudaStreams {
    /// A stream runtime for streams of `ctx`.
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        CudaStreams { ctx }
    }

    /// The context the streams belong to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
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
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        // SAFETY: the stream handle is one the caller named as a stream of this context.
        let event = unsafe { RecordedEvent::record(&self.ctx, stream.raw())? };
        Ok(Box::new(CudaPoolEvent(event)))
    }

    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        // SAFETY: both handles are ones the caller named as streams of this context.
        unsafe { RecordedEvent::record(&self.ctx, producer.raw())?.make_wait(waiter.raw()) }
    }
}

impl PoolBuilder {
    /// Reserves the region with `cuMemAlloc` on `stream`'s device ([`CudaBackend::new`]) and
    /// makes the pool stream-aware ([`CudaStreams`]) with `stream` as its home stream.
    ///
    /// ```no_run
    /// use devarena::backend::cuda::cuda_stream;
    /// use devarena::pool::{Pool, Tracking};
    ///
    /// let stream = cuda_stream(0)?;
    /// let pool = Pool::builder(1 << 30)
    ///     .name("engines")
    ///     .tracking(Tracking::Tags)
    ///     .build_cuda(stream)?;
    /// assert_eq!(pool.backend_name(), "cuda");
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn build_cuda(self, stream: Arc<CudaStream>) -> Result<Pool, Error> {
        let home = stream_id(&stream);
        let streams = Arc::new(CudaStreams::new(stream.context().clone()));
        self.streams(streams, home)
            .build_in(CudaBackend::new(stream))
    }
}

impl Pool {
    /// A pool of `capacity` bytes of device memory: one `cuMemAlloc` on `stream`'s device,
    /// home stream `stream` (see [`PoolBuilder::build_cuda`] for the other settings).
    ///
    /// Allocation and free never call the driver, except to record an event when a block is
    /// freed on another stream (see [`crate::pool::stream`]). [`PoolSlice::device_view`] and
    /// [`PoolSlice::device_view_mut`] turn typed slices into views for cudarc.
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
        let id = stream_id(stream);
        if id != self.stream() {
            return Err(Error::invalid(format!(
                "pool slice at {:#x} was allocated for stream {}, not stream {id}: a view is \
                 ordered on its slice's stream (allocate it with `alloc_slice_on` for the other \
                 stream, or pass the view to work on the other stream, which then waits)",
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
    /// An error when the pool is not device memory, `stream` is not the slice's stream, or the
    /// memory is on another device than `stream`.
    pub fn device_view<'a>(
        &'a self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<DeviceView<'a, T>, Error> {
        let ptr = self.device_addr_for(stream)?;
        // SAFETY: the slice's `len` elements are live device memory of `stream`'s device
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

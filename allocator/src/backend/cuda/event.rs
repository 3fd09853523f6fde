//! Events on streams named by their raw handles (`CUstream` as an integer), for code that
//! orders streams it does not own: a `cudaStream_t` from PyTorch, the legacy default stream
//! `0`, the per-thread default stream `2`. The pool's stream runtime (`pool::cuda`) is built on
//! these.
//!
//! Every call here runs in relaxed capture mode (`cuThreadExchangeStreamCaptureMode`): none of them touches a
//! capturing stream (the pool refuses those first), so a capture open elsewhere, on this
//! thread or in global mode on another, neither refuses them nor is invalidated by them.

use alloc::sync::Arc;
use core::mem::ManuallyDrop;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};

use super::driver::drv;
use super::graph::{relaxed_capture, trace_call};
use crate::error::Error;

/// An event recorded on a stream (`cuEventRecord` of a fresh event created with
/// `CU_EVENT_DISABLE_TIMING`); destroyed (`cuEventDestroy`) on drop.
#[derive(Debug)]
pub struct RecordedEvent {
    // Destroyed by hand (in relaxed capture mode) in `drop`.
    event: ManuallyDrop<CudaEvent>,
}

impl Drop for RecordedEvent {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again.
        let event = unsafe { ManuallyDrop::take(&mut self.event) };
        trace_call(
            "cuEventDestroy",
            format_args!("event {:p}", event.cu_event()),
        );
        // `cuEventDestroy` may come in the middle of someone's capture (the pool reclaims a
        // block, and drops its event, while PyTorch captures): relaxed mode, as for the other
        // calls here, so that the capture neither refuses it nor is invalidated by it.
        relaxed_capture(move || drop(event));
    }
}

impl RecordedEvent {
    /// Records a fresh event on the stream whose raw handle is `stream`.
    ///
    /// # Safety
    ///
    /// `stream` must be a live stream of `ctx` (or one of the special handles `0`, `1`, `2`).
    pub unsafe fn record(ctx: &Arc<CudaContext>, stream: u64) -> Result<Self, Error> {
        trace_call("cuEventRecord", format_args!("stream {stream:#x}"));
        relaxed_capture(|| {
            // `new_event` binds the context.
            let event = ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(drv("cuEventCreate"))?;
            // SAFETY: the event is alive (owned here); the caller vouches for the stream
            // handle, a stream of this context, which is bound.
            unsafe { result::event::record(event.cu_event(), stream as usize as sys::CUstream) }
                .map_err(drv("cuEventRecord"))?;
            Ok(RecordedEvent {
                event: ManuallyDrop::new(event),
            })
        })
    }

    /// Whether every piece of work queued on the stream before the record has finished
    /// (`cuEventQuery`: `CUDA_SUCCESS` → `true`, `CUDA_ERROR_NOT_READY` → `false`, anything
    /// else → `Err`). Never blocks.
    pub fn is_complete(&self) -> Result<bool, Error> {
        trace_call(
            "cuEventQuery",
            format_args!("event {:p}", self.event.cu_event()),
        );
        relaxed_capture(|| {
            self.event
                .context()
                .bind_to_thread()
                .map_err(drv("cuCtxSetCurrent"))?;
            self.event.try_is_complete().map_err(drv("cuEventQuery"))
        })
    }

    /// Makes the stream whose raw handle is `waiter` wait for the event
    /// (`cuStreamWaitEvent`): work queued on it afterwards runs after the recorded work.
    ///
    /// # Safety
    ///
    /// `waiter` must be a live stream of the event's context (or a special handle).
    pub unsafe fn make_wait(&self, waiter: u64) -> Result<(), Error> {
        trace_call("cuStreamWaitEvent", format_args!("stream {waiter:#x}"));
        relaxed_capture(|| {
            self.event
                .context()
                .bind_to_thread()
                .map_err(drv("cuCtxSetCurrent"))?;
            // SAFETY: the caller vouches for the handle; the event is alive. Destroying the
            // event right after the wait is allowed: the wait keeps what it needs.
            unsafe {
                result::stream::wait_event(
                    waiter as usize as sys::CUstream,
                    self.event.cu_event(),
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .map_err(drv("cuStreamWaitEvent"))
        })
    }
}

/// Makes `waiter` wait for everything queued on `producer` so far (an event recorded on
/// `producer`, waited on by `waiter`); nothing when they are the same stream.
pub fn order_streams(waiter: &CudaStream, producer: &CudaStream) -> Result<(), Error> {
    if waiter.cu_stream() == producer.cu_stream() {
        return Ok(());
    }
    waiter.join(producer).map_err(drv("cuStreamWaitEvent"))
}

/// A backend whose device views are ordered on one stream.
///
/// # Safety
///
/// [`stream`](Self::stream) is the stream every device view the backend hands out
/// (`Backend::base_mut`, `Backend::base_ref`) orders its work on, and the stream the backend
/// waits for before its memory is freed or touched by the host. Arenas rely on it to order
/// other streams' work with the arena's (`Arena::views_mut_on`) and to capture and replay the
/// arena's work (`Arena::capture`): a wrong stream would let work on another stream race with
/// the arena's, its host views or its free.
pub unsafe trait StreamOrdered {
    /// The stream the backend's views are ordered on.
    fn stream(&self) -> &Arc<CudaStream>;
}

/// Blocks the calling thread until everything queued so far on the stream whose raw handle is
/// `stream` has finished (`cuStreamSynchronize`).
///
/// # Safety
///
/// `stream` must be a live stream of `ctx` (or one of the special handles `0`, `1`, `2`).
pub unsafe fn synchronize_raw(ctx: &Arc<CudaContext>, stream: u64) -> Result<(), Error> {
    trace_call("cuStreamSynchronize", format_args!("stream {stream:#x}"));
    relaxed_capture(|| {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the caller vouches for the handle, a stream of this context, which is bound.
        unsafe { result::stream::synchronize(stream as usize as sys::CUstream) }
            .map_err(drv("cuStreamSynchronize"))
    })
}

/// Blocks the calling thread until everything queued on every stream of `ctx` has finished
/// (`cuCtxSynchronize`): what `cudaFree` waits for. The driver refuses it while a stream of
/// the context is capturing, and that capture is invalidated: call it only when none may be
/// (its callers check the stream they were given first). It runs in relaxed capture mode, so
/// that a capture in global mode in another context is neither refused nor invalidated by it.
pub fn synchronize_context(ctx: &Arc<CudaContext>) -> Result<(), Error> {
    trace_call("cuCtxSynchronize", format_args!("device {}", ctx.ordinal()));
    relaxed_capture(|| {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        ctx.synchronize().map_err(drv("cuCtxSynchronize"))
    })
}

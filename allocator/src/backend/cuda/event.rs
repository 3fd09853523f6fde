//! Events on streams named by their raw handles (`CUstream` as an integer), for code that
//! orders streams it does not own: a `cudaStream_t` from PyTorch, the legacy default stream
//! `0`, the per-thread default stream `2`. The pool's stream runtime (`pool::cuda`) is built on
//! these.
//!
//! Every call on raw handles here runs in relaxed capture mode
//! (`cuThreadExchangeStreamCaptureMode`): none of them touches a capturing stream (the pool
//! refuses those first), so a capture open elsewhere, on this thread or in global mode on
//! another, neither refuses them nor is invalidated by them. ([`order_streams`], which orders
//! an arena's streams, may make a capturing stream wait: its wait is a call of the capture's
//! own, made as usual.)

use alloc::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use super::driver::{bind_context, drv};
use super::graph::{relaxed_capture, trace_call};
use crate::error::Error;

/// An event recorded on a stream (`cuEventRecord` of a fresh event created with
/// `CU_EVENT_DISABLE_TIMING`); destroyed (`cuEventDestroy`) on drop.
///
/// Held as the driver's handle, with its context, rather than as cudarc's `CudaEvent`: every
/// cudarc call binds the context with `bind_to_thread`, which first returns (and clears) an
/// error that cudarc recorded in the context object earlier (a failed call in some drop of the
/// user's), so the pool's next look at its event would fail for that, and set its block aside,
/// and the user's error would be gone. Nothing here goes through those calls.
#[derive(Debug)]
pub struct RecordedEvent {
    event: sys::CUevent,
    /// Kept alive while the event lives.
    ctx: Arc<CudaContext>,
}

// SAFETY: a driver event handle may be used and destroyed from any thread (the driver API is
// thread-safe); the context it belongs to is held alive by the `Arc`.
unsafe impl Send for RecordedEvent {}
// SAFETY: as above; `&self` methods only query the event and make streams wait for it,
// which the driver allows from several threads at once.
unsafe impl Sync for RecordedEvent {}

impl Drop for RecordedEvent {
    fn drop(&mut self) {
        trace_call("cuEventDestroy", format_args!("event {:p}", self.event));
        // `cuEventDestroy` may come in the middle of someone's capture (the pool reclaims a
        // block, and drops its event, while PyTorch captures): relaxed mode, as for the other
        // calls here, so that the capture neither refuses it nor is invalidated by it.
        relaxed_capture(|| {
            let destroyed = bind_context(&self.ctx).and_then(|()| {
                // SAFETY: the event was created in this context, is destroyed once, here,
                // and never used again.
                unsafe { result::event::destroy(self.event) }.map_err(drv("cuEventDestroy"))
            });
            // (The pool drops its events as callbacks of its lock, which catch a logger that
            // panics or calls back into the pool.)
            if let Err(e) = destroyed {
                log::warn!(target: "devarena::driver", "an event was not destroyed: {e}");
            }
        });
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
            bind_context(ctx)?;
            let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(drv("cuEventCreate"))?;
            // Owned from here: destroyed on every path out.
            let event = RecordedEvent {
                event,
                ctx: ctx.clone(),
            };
            // SAFETY: the event is alive (owned here); the caller vouches for the stream
            // handle, a stream of this context, which is bound.
            unsafe { result::event::record(event.event, stream as usize as sys::CUstream) }
                .map_err(drv("cuEventRecord"))?;
            Ok(event)
        })
    }

    /// Whether every piece of work queued on the stream before the record has finished
    /// (`cuEventQuery`: `CUDA_SUCCESS` → `true`, `CUDA_ERROR_NOT_READY` → `false`, anything
    /// else → `Err`). Never blocks.
    pub fn is_complete(&self) -> Result<bool, Error> {
        trace_call("cuEventQuery", format_args!("event {:p}", self.event));
        relaxed_capture(|| {
            bind_context(&self.ctx)?;
            // SAFETY: a live event of the bound context.
            match unsafe { result::event::query(self.event) } {
                Ok(()) => Ok(true),
                Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
                Err(e) => Err(drv("cuEventQuery")(e)),
            }
        })
    }

    /// Blocks the calling thread until every piece of work queued on the stream before the
    /// record has finished (`cuEventSynchronize`); the error of a failed piece of work, or
    /// of an event recorded into a capture, as `Err`.
    pub fn synchronize(&self) -> Result<(), Error> {
        trace_call("cuEventSynchronize", format_args!("event {:p}", self.event));
        relaxed_capture(|| {
            bind_context(&self.ctx)?;
            // SAFETY: a live event of the bound context.
            unsafe { result::event::synchronize(self.event) }.map_err(drv("cuEventSynchronize"))
        })
    }

    /// Makes the stream whose raw handle is `waiter` wait for the event
    /// (`cuStreamWaitEvent`): work queued on it afterwards runs after the recorded work.
    ///
    /// # Safety
    ///
    /// `waiter` must be a live stream of the event's context (or a special handle).
    pub unsafe fn make_wait(&self, waiter: u64) -> Result<(), Error> {
        relaxed_capture(|| {
            // SAFETY: the caller vouches for the handle, a stream of the event's context.
            unsafe { self.wait_in(&self.ctx, waiter) }
        })
    }

    /// `cuStreamWaitEvent` of the stream whose raw handle is `waiter`, in `ctx` (bound first:
    /// the default streams' handles name a stream of every context).
    ///
    /// # Safety
    ///
    /// `waiter` must be a live stream of `ctx` (or a special handle).
    unsafe fn wait_in(&self, ctx: &CudaContext, waiter: u64) -> Result<(), Error> {
        trace_call("cuStreamWaitEvent", format_args!("stream {waiter:#x}"));
        bind_context(ctx)?;
        // SAFETY: the caller vouches for the handle, a stream of the bound context; the event
        // is alive (waiting on an event of another context is allowed). Destroying the event
        // right after the wait is allowed: the wait keeps what it needs.
        unsafe {
            result::stream::wait_event(
                waiter as usize as sys::CUstream,
                self.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(drv("cuStreamWaitEvent"))
    }
}

/// Makes `waiter` wait for everything queued on `producer` so far (an event recorded on
/// `producer`, waited on by `waiter`); nothing when they are the same stream: the same handle
/// in the same context (the default streams' handles name a stream of every context).
pub fn order_streams(waiter: &CudaStream, producer: &CudaStream) -> Result<(), Error> {
    if same_stream(waiter, producer) {
        return Ok(());
    }
    // SAFETY: `producer` is a live stream of its own context.
    let event = unsafe { RecordedEvent::record(producer.context(), producer.cu_stream() as u64) }?;
    // SAFETY: `waiter` is a live stream of its own context.
    unsafe { event.wait_in(waiter.context(), waiter.cu_stream() as u64) }
}

/// Whether `a` and `b` are one stream: the same handle in the same context.
pub(crate) fn same_stream(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream() && a.context().cu_ctx() == b.context().cu_ctx()
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
        bind_context(ctx)?;
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
        bind_context(ctx)?;
        result::ctx::synchronize().map_err(drv("cuCtxSynchronize"))
    })
}

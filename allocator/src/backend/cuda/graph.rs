//! CUDA graphs by stream capture: a capture begun on a stream ([`StreamCapture`]), ended into
//! an instantiated executable graph ([`GraphExec`]) that is launched on that stream (or on
//! another stream of its context, named when the capture ends). The
//! arena's graphs (`Arena::capture`, `ArenaGraph`) are built on these; launching is `unsafe`
//! here because only the layer above knows which memory a graph reaches.
//!
//! **Capture mode: thread-local** (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`). While a capture is
//! open, the driver refuses the calls that cannot be recorded into a graph on the capturing
//! thread: `cuMemAlloc`, synchronous copies, `cuStreamSynchronize` of the capturing stream
//! (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and the capture is invalidated). Global mode would
//! refuse them on *every* thread of the process while any capture is open (a pool growing on
//! another thread would fail); relaxed mode would let a `cuMemAlloc` through, unseen by the
//! graph, which is exactly the allocation a replayed graph must not depend on.
//!
//! The capture is ended on every path: by [`StreamCapture::end`], or on drop (an error or a
//! panic in the code being captured), which discards what was captured; either way the stream
//! leaves capture mode and is usable again. Ending does not go through cudarc's
//! `CudaStream::end_capture`: that binds the context with `bind_to_thread`, which first returns
//! any error a drop recorded in the context (a failed synchronize during the capture, say) and
//! would then leave the stream capturing.

use alloc::format;
use alloc::sync::Arc;
use core::marker::PhantomData;

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use super::driver::{bind, driver_error, drv};
use crate::error::Error;

/// The mode of every capture devarena begins (see the module docs).
const MODE: sys::CUstreamCaptureMode =
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;

/// Whether `stream` is capturing (`cuStreamIsCapturing`: a capture is active, or was
/// invalidated and not yet ended).
///
/// ```no_run
/// use devarena::backend::cuda::{cuda_stream, is_capturing};
///
/// let stream = cuda_stream(0)?;
/// assert!(!is_capturing(&stream)?);
/// # Ok::<(), devarena::Error>(())
/// ```
pub fn is_capturing(stream: &CudaStream) -> Result<bool, Error> {
    bind(stream)?;
    // SAFETY: the stream is alive (borrowed) and its context is bound.
    let status = unsafe { result::stream::is_capturing(stream.cu_stream()) }
        .map_err(drv("cuStreamIsCapturing"))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Whether the stream whose raw handle is `stream` is capturing (`cuStreamIsCapturing`), for
/// code that names streams by handle (the pool's stream runtime).
///
/// # Safety
///
/// `stream` must be a live stream of `ctx` (or one of the special handles `0`, `1`, `2`).
pub(crate) unsafe fn is_capturing_raw(ctx: &Arc<CudaContext>, stream: u64) -> Result<bool, Error> {
    trace_call("cuStreamIsCapturing", format_args!("stream {stream:#x}"));
    super::driver::bind_context(ctx)?;
    // SAFETY: the caller vouches for the handle, a stream of this context, which is bound.
    let status = unsafe { result::stream::is_capturing(stream as usize as sys::CUstream) }
        .map_err(drv("cuStreamIsCapturing"))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// What `cuStreamGetCaptureInfo` says about a stream: not capturing, capturing (with the
/// capture's process-unique id), or capturing but invalidated by a refused call (the capture
/// must still be ended, and ends with an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    /// The stream is not capturing.
    None,
    /// The stream is capturing into the capture `id`.
    Active {
        /// The capture's id, unique in the process.
        id: u64,
    },
    /// The stream's capture `id` was invalidated: an illegal call was made while it was open.
    Invalidated {
        /// The capture's id, unique in the process.
        id: u64,
    },
}

impl core::fmt::Display for CaptureStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CaptureStatus::None => write!(f, "none"),
            CaptureStatus::Active { id } => write!(f, "active#{id}"),
            CaptureStatus::Invalidated { id } => write!(f, "INVALIDATED#{id}"),
        }
    }
}

/// The capture status of the stream whose raw handle is `stream` (`cuStreamGetCaptureInfo`).
///
/// A query the driver allows in the middle of a capture, in any capture mode, also on the
/// capturing stream itself, and it changes nothing. Do not ask it about the legacy default
/// stream (`0`, `1`) for diagnostics: while a blocking stream captures, the driver answers
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` for it.
///
/// # Safety
///
/// `stream` must be a live stream of `ctx` (or one of the special handles `0`, `1`, `2`).
pub unsafe fn capture_status_raw(
    ctx: &Arc<CudaContext>,
    stream: u64,
) -> Result<CaptureStatus, Error> {
    super::driver::bind_context(ctx)?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    // SAFETY: the caller vouches for the handle, a stream of this context, which is bound;
    // both out-pointers are valid; the graph, dependency and edge outputs are optional (null).
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream as usize as sys::CUstream,
            &mut status,
            &mut id,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
    }
    .result()
    .map_err(drv("cuStreamGetCaptureInfo"))?;
    use sys::CUstreamCaptureStatus as S;
    Ok(match status {
        S::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active { id },
        S::CU_STREAM_CAPTURE_STATUS_INVALIDATED => CaptureStatus::Invalidated { id },
        _ => CaptureStatus::None,
    })
}

/// Runs `f` with the calling thread in relaxed capture mode (`cuThreadExchangeStreamCaptureMode`),
/// and puts the thread's mode back afterwards (also when `f` panics).
///
/// While a capture is open in thread-local or global mode, the driver refuses "potentially
/// unsafe" calls on the capturing thread (global mode: on every thread) and invalidates the
/// capture: `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuEventQuery`, `cuStreamSynchronize`
/// of another stream. The pool makes such calls while someone else may be capturing (PyTorch
/// captures in global mode and asks its allocator for memory in the middle of a capture), and
/// none of them touches the capturing stream: mapping memory, querying events recorded outside
/// the capture, waiting for streams that are not capturing. Relaxed mode lets them through
/// without disturbing the capture; what conflicts with a capture itself (anything queued on the
/// capturing stream, querying an event recorded inside it) is still refused by the driver, and
/// the pool never asks for it.
pub(crate) fn relaxed_capture<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the thread's previous mode back on drop.
    struct Restore(Option<sys::CUstreamCaptureMode>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(mut mode) = self.0.take() {
                // SAFETY: a valid pointer to a mode; the call only swaps a thread-local value.
                let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
            }
        }
    }
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: as above. When the exchange fails (no driver), the mode is left as it was.
    let swapped = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result();
    let _restore = Restore(swapped.ok().map(|()| mode));
    f()
}

/// One `trace` line (target `devarena::driver`) for a driver call that may come while a
/// capture is open, before it is made, with what it names (a stream: `0` is the legacy default
/// stream): what a capture that ends invalidated can be checked against. Nothing is formatted
/// unless the level is on.
pub(crate) fn trace_call(call: &str, what: core::fmt::Arguments<'_>) {
    log::trace!(target: "devarena::driver", "{call}({what})");
}

/// Makes the stream's context current without cudarc's `bind_to_thread`, which would first
/// return (and clear) an error some drop recorded in the context.
fn make_current(stream: &CudaStream) -> Result<(), DriverError> {
    super::driver::make_current(stream.context())
}

/// The CUDA error name of a driver error, for messages.
fn error_name(e: DriverError) -> alloc::string::String {
    e.error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as u32))
}

/// A non-blocking stream made for one capture, outside cudarc's count of the context's streams:
/// cudarc's `new_stream` synchronizes the whole context to make the first stream it counts
/// (waiting for all of the device's work, and refused, with the capture disturbed, while any
/// thread captures a graph), and `fork` queues an event on the stream it forks from. Made and
/// destroyed in relaxed capture mode (neither touches a capturing stream).
///
/// Destroyed on drop where this value holds the only handle to it and it is not capturing;
/// otherwise (a clone of its `Arc` kept elsewhere, a view's `stream()` cloned; a capture that
/// could not be ended) it is leaked, never destroyed, rather than leave a handle to a destroyed
/// stream.
pub(crate) struct PrivateStream {
    stream: Arc<CudaStream>,
}

impl PrivateStream {
    /// A new non-blocking stream in `like`'s context.
    pub(crate) fn new(like: &CudaStream) -> Result<Self, Error> {
        make_current(like).map_err(drv("cuCtxSetCurrent"))?;
        trace_call("cuStreamCreate", format_args!("non-blocking"));
        let raw =
            relaxed_capture(|| result::stream::create(result::stream::StreamKind::NonBlocking))
                .map_err(drv("cuStreamCreate"))?;
        // SAFETY: `raw` is a live stream of `like`'s context (made current above); this value
        // destroys it, and only once no wrapper of it but its own is left (see `drop`).
        let stream = unsafe { like.context().wrap_borrowed_stream(raw) };
        Ok(PrivateStream { stream })
    }

    /// The stream (cudarc's wrapper, which does not destroy it).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Drop for PrivateStream {
    fn drop(&mut self) {
        // No other handle to the wrapper, strong or weak (`get_mut` checks both at once, as
        // `Arc::make_mut` does, and orders every other handle's last use before this): none
        // can be made any more (that takes one), so nothing can name the stream after it is
        // destroyed.
        if Arc::get_mut(&mut self.stream).is_none() {
            log::debug!(
                target: "devarena::driver",
                "a capture's stream is leaked: a handle to it is still held"
            );
            return;
        }
        let raw = self.stream.cu_stream();
        // A capture that could not be ended leaves the stream capturing: not destroyed then.
        // SAFETY: a live stream (held), of the context bound below or already current.
        let capturing =
            make_current(&self.stream).and_then(|()| unsafe { result::stream::is_capturing(raw) });
        if capturing != Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE) {
            log::warn!(
                target: "devarena::driver",
                "a capture's stream is leaked: it is still capturing, or the driver cannot say"
            );
            return;
        }
        trace_call(
            "cuStreamDestroy",
            format_args!("stream {:#x}", raw as usize),
        );
        // SAFETY: the stream was made by `new` and is destroyed once, here, with no handle
        // to it left but this value's (checked above). Work still queued on it finishes first
        // (the driver defers the release).
        let destroyed = relaxed_capture(|| unsafe { result::stream::destroy(raw) });
        if let Err(e) = destroyed {
            log::warn!(
                target: "devarena::driver",
                "a capture's stream could not be destroyed: {}",
                error_name(e)
            );
        }
    }
}

/// A capture open on a stream, in thread-local mode. [`end`](Self::end) turns it into a
/// [`GraphExec`]; dropping it instead ends the capture and discards the graph.
///
/// Not `Send`: a thread-local capture must be ended on the thread that began it.
pub(crate) struct StreamCapture {
    stream: Arc<CudaStream>,
    open: bool,
    _thread: PhantomData<*const ()>,
}

impl StreamCapture {
    /// Begins capturing `stream` (`cuStreamBeginCapture`). The legacy default stream cannot
    /// capture, nor can a stream that is capturing already: both are errors.
    pub(crate) fn begin(stream: &Arc<CudaStream>) -> Result<Self, Error> {
        stream
            .begin_capture(MODE)
            .map_err(drv("cuStreamBeginCapture"))?;
        Ok(StreamCapture {
            stream: stream.clone(),
            open: true,
            _thread: PhantomData,
        })
    }

    /// Ends the capture after the captured code returned `recorded`: its error discards the
    /// capture and comes back unchanged; otherwise [`end`](Self::end).
    pub(crate) fn finish(self, recorded: Result<(), Error>) -> Result<GraphExec, Error> {
        self.finish_for(recorded, None)
    }

    /// [`finish`](Self::finish), with the graph uploaded to and replayed on `replay` (a stream
    /// of the capture's context) instead of the capturing stream, where one is given.
    pub(crate) fn finish_for(
        mut self,
        recorded: Result<(), Error>,
        replay: Option<Arc<CudaStream>>,
    ) -> Result<GraphExec, Error> {
        match recorded {
            Ok(()) => self.end(replay),
            Err(e) => {
                self.discard();
                Err(e)
            }
        }
    }

    /// Ends the capture (`cuStreamEndCapture`), instantiates the graph
    /// (`cuGraphInstantiateWithFlags`) and uploads it to the device (`cuGraphUpload`, so the
    /// first launch pays no setup). A capture that was invalidated by a refused call is an
    /// error naming `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and the refused call's error when
    /// the context recorded one.
    pub(crate) fn end(mut self, replay: Option<Arc<CudaStream>>) -> Result<GraphExec, Error> {
        let stream = self.stream.clone();
        debug_assert!(
            replay
                .as_ref()
                .is_none_or(|r| r.context() == stream.context()),
            "a graph replays in the context it was captured in"
        );
        let elsewhere = replay.is_some();
        make_current(&stream).map_err(drv("cuCtxSetCurrent"))?;
        self.open = false;
        // SAFETY: the stream is alive and capturing (begun by `begin`, on this thread).
        let graph = match unsafe { result::stream::end_capture(stream.cu_stream()) } {
            Ok(graph) => graph,
            Err(e) => {
                let error = self.capture_error(e);
                self.ensure_ended();
                return Err(error);
            }
        };
        if graph.is_null() {
            return Err(Error::invalid(
                "cuStreamEndCapture succeeded but returned no graph",
            ));
        }
        let graph = OwnedGraph(graph);
        let mut nodes = 0usize;
        // SAFETY: `graph` is a live graph; a null node array asks for the count only.
        unsafe { sys::cuGraphGetNodes(graph.0, core::ptr::null_mut(), &mut nodes) }
            .result()
            .map_err(drv("cuGraphGetNodes"))?;
        // SAFETY: `graph` is a live graph of the bound context; the executable graph is
        // independent of it once made, so `graph` is destroyed on return.
        let exec = unsafe { result::graph::instantiate(graph.0, sys::CUgraphInstantiate_flags(0)) }
            .map_err(drv("cuGraphInstantiate"))?;
        let exec = GraphExec {
            exec,
            nodes,
            stream: replay.unwrap_or(stream),
        };
        // A replay stream other than the capture's that began capturing meanwhile (someone
        // else's capture) would record the upload: skipped there (where the driver cannot
        // say, too); the first launch then pays for it.
        // SAFETY: the replay stream is alive (held) and of the bound context.
        let captured = elsewhere
            && unsafe { result::stream::is_capturing(exec.stream.cu_stream()) }
                != Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        if !captured {
            // SAFETY: a live executable graph and its stream.
            unsafe { result::graph::upload(exec.exec, exec.stream.cu_stream()) }
                .map_err(drv("cuGraphUpload"))?;
        }
        Ok(exec)
    }

    /// The error of a failed `cuStreamEndCapture`, naming the error a refused call recorded in
    /// the context (a drop that could not return it) when there is one; the record is cleared,
    /// so it does not surface again in an unrelated call.
    fn capture_error(&self, e: DriverError) -> Error {
        let mut error = driver_error("cuStreamEndCapture", e);
        if let Err(recorded) = self.stream.context().check_err() {
            if let Error::Driver { text, .. } = &mut error {
                text.push_str(&format!(
                    "; a call during the capture failed with {} (reported by a drop)",
                    error_name(recorded)
                ));
            }
        }
        error
    }

    /// Ends the capture and throws away what it recorded.
    fn discard(&mut self) {
        if !self.open {
            return;
        }
        self.open = false;
        if let Err(e) = make_current(&self.stream) {
            log::error!(
                target: "devarena::graph",
                "ending a failed capture: cuCtxSetCurrent failed with {}",
                error_name(e)
            );
            return;
        }
        // SAFETY: the stream is alive and capturing (begun by `begin`, on this thread). An
        // invalidated capture ends with an error and no graph: expected here.
        if let Ok(graph) = unsafe { result::stream::end_capture(self.stream.cu_stream()) } {
            if !graph.is_null() {
                drop(OwnedGraph(graph));
            }
        }
        // Errors that drops recorded during the capture belong to it: the caller gets the
        // capture's own error, and the next call on the context must not see them.
        let _ = self.stream.context().check_err();
        self.ensure_ended();
    }

    /// Logs a stream still capturing after its capture was ended (nothing more can be done).
    fn ensure_ended(&self) {
        match is_capturing(&self.stream) {
            Ok(false) => {}
            Ok(true) => log::error!(
                target: "devarena::graph",
                "the stream is still capturing after cuStreamEndCapture"
            ),
            Err(e) => log::error!(
                target: "devarena::graph",
                "querying the capture status after ending a capture: {e}"
            ),
        }
    }
}

impl Drop for StreamCapture {
    fn drop(&mut self) {
        self.discard();
    }
}

impl core::fmt::Debug for StreamCapture {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StreamCapture")
            .field("stream", &self.stream.cu_stream())
            .field("open", &self.open)
            .finish()
    }
}

/// A captured graph, destroyed (`cuGraphDestroy`) on drop.
struct OwnedGraph(sys::CUgraph);

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        // SAFETY: a live graph, destroyed once, here.
        if let Err(e) = unsafe { result::graph::destroy(self.0) } {
            log::error!(target: "devarena::graph", "cuGraphDestroy failed: {}", error_name(e));
        }
    }
}

/// An instantiated graph (`CUgraphExec`) launched on its replay stream (the stream it was
/// captured on, or the one [`StreamCapture::finish_for`] was given); destroyed
/// (`cuGraphExecDestroy`) on drop, which lets a launch in flight finish first.
///
/// Neither `Send` nor `Sync`: the driver does not synchronize graph objects between threads.
pub(crate) struct GraphExec {
    exec: sys::CUgraphExec,
    nodes: usize,
    stream: Arc<CudaStream>,
}

impl GraphExec {
    /// Queues one replay on the replay stream (`cuGraphLaunch`): ordered after everything
    /// queued on the stream before, and before everything queued after. A stream that is
    /// capturing (someone else's capture, begun through cudarc) is refused: the replay would be
    /// recorded into a graph that outlives what this one's owner keeps alive.
    ///
    /// # Safety
    ///
    /// Every buffer the captured work reaches must be live, and nothing may access it
    /// concurrently (no host access, no unordered work on another stream) until the replay
    /// completes.
    pub(crate) unsafe fn launch(&self) -> Result<(), Error> {
        bind(&self.stream)?;
        // SAFETY: the stream is alive (held) and its context bound.
        let status = unsafe { result::stream::is_capturing(self.stream.cu_stream()) }
            .map_err(drv("cuStreamIsCapturing"))?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::invalid(
                "a graph replay was launched on a stream that is capturing: it would be recorded \
                 into another graph instead of running",
            ));
        }
        // SAFETY: a live executable graph of the stream's context; the caller vouches for the
        // memory it reaches.
        unsafe { result::graph::launch(self.exec, self.stream.cu_stream()) }
            .map_err(drv("cuGraphLaunch"))
    }

    /// The number of nodes captured (kernels, copies, memsets, ...).
    pub(crate) fn nodes(&self) -> usize {
        self.nodes
    }

    /// The stream the graph replays on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if let Err(e) = make_current(&self.stream) {
            log::error!(
                target: "devarena::graph",
                "destroying a graph: cuCtxSetCurrent failed with {}",
                error_name(e)
            );
            return;
        }
        // SAFETY: a live executable graph, destroyed once, here; a replay still in flight
        // completes first (the driver frees it asynchronously).
        if let Err(e) = unsafe { result::graph::exec_destroy(self.exec) } {
            log::error!(
                target: "devarena::graph",
                "cuGraphExecDestroy failed: {}",
                error_name(e)
            );
        }
    }
}

impl core::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GraphExec")
            .field("nodes", &self.nodes)
            .field("stream", &self.stream.cu_stream())
            .finish()
    }
}

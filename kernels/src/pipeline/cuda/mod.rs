//! The pipeline's PTX kernels and their launch wrappers (feature `cuda`).
//!
//! [`PipelineKernels::load`] loads the embedded PTX into a context once; each stage is then one
//! method taking a stream and device buffers whose address and length the kernels may trust,
//! [`TrustedDevicePtr`] (cudarc's own `CudaSlice` and views, or the views of a devarena arena
//! or pool slice on the CUDA backend): cudarc's [`DevicePtr`](cudarc::driver::DevicePtr) /
//! [`DevicePtrMut`] are safe traits, so a type of the caller's implementing them alone could
//! name any address.
//! [`PipelineKernels::run_frame`] runs every stage on a [`FrameBuffers`], which an arena's views
//! convert into:
//!
//! ```no_run
//! use devarena::Arena;
//! use devarena::backend::cuda::{CudaBackend, cuda_stream};
//! use devarena_kernels::pipeline::cuda::PipelineKernels;
//! use devarena_kernels::pipeline::{Frame, FrameBuffers, ImageSize};
//!
//! let size = ImageSize::new(640, 480); // any size up to `MAX_PIXELS` pixels
//! let rgb = vec![128u8; size.pixels() * 3];
//! let stream = cuda_stream(0)?;
//! let kernels = PipelineKernels::load(stream.context())?;
//! let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone()))?;
//! let mut views = arena.views_mut();
//! views.rgb.slice_mut(..rgb.len())?.upload(&rgb)?;
//! kernels.run_frame(&stream, size, FrameBuffers::from(&mut views), None)?;
//! # Ok::<(), devarena::Error>(())
//! ```
//!
//! [`PipelineKernels::run_frame_staged`] runs the same kernels on an aliased
//! [`FrameStaged`] arena, each stage on its own stage views.
//!
//! **Graphs.** [`PipelineKernels::capture_frame`] and [`PipelineKernels::capture_frame_staged`]
//! capture the same launches, for one image size, into a CUDA graph of the arena
//! ([`ArenaGraph`]): the input is uploaded between replays ([`upload_input`],
//! [`upload_input_staged`]) and each frame is then one `graph.launch()`. The graph runs the very
//! kernels with the very arguments of an eager frame, in the same order on the same stream, so
//! its outputs are bit-identical to the eager run's:
//!
//! ```no_run
//! use devarena::Arena;
//! use devarena::backend::cuda::{CudaBackend, cuda_stream};
//! use devarena_kernels::pipeline::cuda::{PipelineKernels, upload_input};
//! use devarena_kernels::pipeline::{Frame, ImageSize};
//!
//! let size = ImageSize::new(256, 256);
//! let stream = cuda_stream(0)?;
//! let kernels = PipelineKernels::load(stream.context())?;
//! let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream))?;
//! let mut graph = kernels.capture_frame(&mut arena, size)?;
//! for frame in 0..100u8 {
//!     upload_input(&mut graph, size, &vec![frame; size.pixels() * 3])?;
//!     graph.launch()?;
//! }
//! graph.synchronize()?;
//! # Ok::<(), devarena::Error>(())
//! ```
//!
//! The kernels compute the same bits as [`super::host`] (see `kernels/cuda/pipeline.cu`).
//! Every wrapper checks buffer lengths and contexts first and returns
//! [`Error::InvalidArgument`]; driver failures come back as [`Error::Driver`]. A buffer on
//! another stream than the launch's is ordered with it both ways by the wrapper itself (the
//! launch after the buffer's stream's work so far, the buffer's stream's later work, its free
//! included, after the launch): two events per such stream, none when every buffer is on the
//! launch's stream. CUDA's per-thread default stream is refused, as a launch's stream and as a
//! buffer's: it names another stream on each thread. The per-stage
//! wrappers take buffers of exactly the image's size (cut a larger view with `slice`/
//! `slice_mut`); the frame-level entry points take buffers of at least that size and cut them.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtrMut, DeviceSlice,
    LaunchConfig, PushKernelArg, result, sys,
};
use cudarc::nvrtc::Ptx;
use devarena::backend::DirectViews;
use devarena::backend::cuda::{
    CudaMut, DeviceViewMut, StreamOrdered, TrustedDevicePtr, is_per_thread, order_streams,
    synchronize_stream,
};
use devarena::{Arena, ArenaGraph, Capture, Error, Stage as LayoutStage};

use super::{
    BLOCK_2D, Frame, FrameBuffers, FrameOutputs, FrameStaged, HIST_BINS, ImageSize, MAX_ROWS,
    Stage, check_len, check_room, invalid,
};

/// The pipeline's PTX (compute_75, JIT-compiled by the driver for the GPU at hand), generated
/// from `kernels/cuda/pipeline.cu` by `kernels/build-ptx.sh`.
pub const PTX: &str = include_str!("../../../ptx/pipeline.ptx");

/// Threads per block of the 1-D kernels.
const BLOCK_1D: u32 = 256;
/// Most blocks the grid-stride histogram launches.
const HIST_MAX_BLOCKS: u32 = 1024;

/// A [`DriverError`](cudarc::driver::DriverError) as a devarena [`Error`], with the CUDA error
/// name and text (devarena's own conversion).
pub use devarena::backend::cuda::driver_error;

/// Why the per-thread default stream is refused, after "… on ".
const PER_THREAD_WHY: &str = "CUDA's per-thread default stream, which names another stream on \
    each thread: a buffer allocated or freed on it on one thread is not ordered with a launch \
    on another; use a stream of your own (`cuda_stream`, `CudaContext::new_stream`)";

/// Names `theirs`, a context that is not `ours`: another device's, or another context of the
/// same device (`CudaContext::new_non_primary`).
fn which_context(theirs: &CudaContext, ours: &CudaContext) -> String {
    if theirs.ordinal() == ours.ordinal() {
        format!("another context of device {}", theirs.ordinal())
    } else {
        format!("device {}'s context", theirs.ordinal())
    }
}

/// Checks a buffer's stream (`theirs`): not the per-thread default stream, and of `ctx`, the
/// context where `where_` ("the kernels run", "the stream") is.
fn check_buffer_stream(
    stage: &str,
    name: &str,
    theirs: &CudaStream,
    ctx: &Arc<CudaContext>,
    where_: &str,
) -> Result<(), Error> {
    if is_per_thread(theirs) {
        return Err(invalid(format!(
            "{stage}: `{name}` is ordered on {PER_THREAD_WHY}"
        )));
    }
    if theirs.context() != ctx {
        return Err(invalid(format!(
            "{stage}: `{name}` lives in {}, {where_} in device {}'s",
            which_context(theirs.context(), ctx),
            ctx.ordinal()
        )));
    }
    Ok(())
}

/// Orders a launch on one stream with the streams of the buffers it takes, where those are
/// other streams: the launch after the work each buffer's stream has queued so far (its
/// allocation, its upload), and each buffer's stream, from then on, after the launch (its
/// free, above all). cudarc's event tracking alone does not: it orders buffers and streams of
/// one `CudaContext` object in multi-stream mode, and two objects of the same context (two
/// `CudaContext::new` of one device; every [`cuda_stream`](devarena::backend::cuda::cuda_stream)
/// makes its own) track nothing between them, so a buffer of one freed after a launch on a
/// stream of the other would be freed under the kernel. The wrappers join the streams
/// themselves: two events per other stream, nothing where every buffer is on the launch's
/// stream.
struct CrossStreams<'a> {
    stream: &'a CudaStream,
    /// The buffers' streams that are not `stream`, each once.
    others: [Option<Arc<CudaStream>>; 8],
}

impl<'a> CrossStreams<'a> {
    /// Makes `stream` wait for the work queued so far on each buffer's stream (`buffers`:
    /// their streams, at most eight) that is another stream.
    fn join(stream: &'a CudaStream, buffers: &[&Arc<CudaStream>]) -> Result<Self, Error> {
        let mut joined = CrossStreams {
            stream,
            others: Default::default(),
        };
        let mut count = 0;
        for &theirs in buffers {
            let seen = |s: &Arc<CudaStream>| s.cu_stream() == theirs.cu_stream();
            if theirs.cu_stream() == stream.cu_stream() || joined.others.iter().flatten().any(seen)
            {
                continue;
            }
            let Some(slot) = joined.others.get_mut(count) else {
                return Err(invalid(format!(
                    "a launch takes buffers of more than {} other streams",
                    joined.others.len()
                )));
            };
            // (The driver's calls, not cudarc's `join`, which first hands out an error cudarc
            // recorded in the buffer's context object earlier, and fails for it.)
            order_streams(stream, theirs)?;
            // Once `stream` waits for it: the launch may follow, so the way back is owed.
            *slot = Some(theirs.clone());
            count += 1;
        }
        Ok(joined)
    }

    /// Runs `launch`, then [`rejoin`](Self::rejoin)s: the launch's error first, else the
    /// rejoin's. (Where `launch` panics, the rejoin runs as `self` drops.)
    fn around(mut self, launch: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
        let launched = launch();
        let rejoined = self.rejoin();
        launched.and(rejoined)
    }

    /// After the launch (also a failed one, which may have queued part of its work): makes
    /// each buffer's other stream wait for it. Where the driver refuses that, waits for
    /// `stream` here instead, so that nothing queued on the buffers' streams later (their
    /// free) can overtake the launch, and returns the error.
    fn rejoin(&mut self) -> Result<(), Error> {
        let mut failed = None;
        for theirs in self.others.iter_mut().filter_map(Option::take) {
            if let Err(e) = order_streams(&theirs, self.stream) {
                failed.get_or_insert(e);
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => {
                synchronize_stream(self.stream)?;
                Err(e)
            }
        }
    }
}

impl Drop for CrossStreams<'_> {
    fn drop(&mut self) {
        // Only where `around` did not rejoin (its launch panicked): the streams are owed
        // their way back all the same.
        let _ = self.rejoin();
    }
}

/// Every buffer's stream of a frame, with the buffer's name, `rgb` first.
fn frame_streams<'s, B8, BF, BU>(
    b: &'s FrameBuffers<'_, B8, BF, BU>,
) -> [(&'static str, &'s Arc<CudaStream>); 8]
where
    B8: DeviceSlice<u8>,
    BF: DeviceSlice<f32>,
    BU: DeviceSlice<u32>,
{
    [
        ("rgb", b.rgb.stream()),
        ("gray", b.gray.stream()),
        ("scratch", b.scratch.stream()),
        ("blurred", b.blurred.stream()),
        ("magnitude", b.magnitude.stream()),
        ("hist", b.hist.stream()),
        ("threshold", b.threshold.stream()),
        ("mask", b.mask.stream()),
    ]
}

/// Downloads every stage output of a frame of `outputs.size` from a frame's device buffers
/// (cudarc slices, arena views, each holding at least that frame: the first `pixels` elements
/// are copied) into `outputs`, and waits for the copies.
pub fn download_outputs<B8, BF, BU>(
    stream: &Arc<CudaStream>,
    b: &FrameBuffers<'_, B8, BF, BU>,
    outputs: &mut FrameOutputs,
) -> Result<(), Error>
where
    B8: TrustedDevicePtr<u8>,
    BF: TrustedDevicePtr<f32>,
    BU: TrustedDevicePtr<u32>,
{
    let o = outputs;
    let size = o.size;
    check_len("outputs", "hist", b.hist.len(), o.hist.len(), None)?;
    check_len("outputs", "threshold", b.threshold.len(), 1, None)?;
    if is_per_thread(stream) {
        return Err(invalid(format!(
            "outputs: the download was asked to run on {PER_THREAD_WHY}"
        )));
    }
    // (Every buffer but `rgb`, which the download leaves alone.)
    let named = frame_streams(b);
    for &(name, theirs) in &named[1..] {
        check_buffer_stream("outputs", name, theirs, stream.context(), "the stream")?;
    }
    let streams = named.map(|(_, theirs)| theirs);
    let joined = CrossStreams::join(stream, &streams[1..])?;
    let mut threshold = [0u32];
    joined.around(|| {
        let queued = (|| {
            download_prefix(stream, "gray", &*b.gray, &mut o.gray, size)?;
            download_prefix(stream, "scratch", &*b.scratch, &mut o.scratch, size)?;
            download_prefix(stream, "blurred", &*b.blurred, &mut o.blurred, size)?;
            download_prefix(stream, "magnitude", &*b.magnitude, &mut o.magnitude, size)?;
            download_prefix(stream, "hist", &*b.hist, &mut o.hist, size)?;
            download_prefix(stream, "threshold", &*b.threshold, &mut threshold, size)?;
            download_prefix(stream, "mask", &*b.mask, &mut o.mask, size)
        })();
        // Also when a later buffer was refused: the copies queued before it write into
        // `outputs`, which must not be handed back before they are done.
        // (The driver's own wait: cudarc's first hands out an error recorded earlier in the
        // context object, without waiting, and the copies would run on into `outputs`.)
        let waited = synchronize_stream(stream);
        queued.and(waited)
    })?;
    o.threshold = threshold[0];
    Ok(())
}

/// Queues a copy of the first `dst.len()` elements of `src` into `dst` on `stream`; the caller
/// synchronizes the stream before it releases `dst`.
fn download_prefix<T>(
    stream: &CudaStream,
    name: &str,
    src: &impl TrustedDevicePtr<T>,
    dst: &mut [T],
    size: ImageSize,
) -> Result<(), Error> {
    check_room("outputs", name, src.len(), dst.len(), size)?;
    if dst.is_empty() {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    let (ptr, _read) = src.device_ptr(stream);
    // SAFETY: `src` holds at least `dst.len()` elements of `T` (checked above) in the stream's
    // context (checked by `download_outputs`, which orders `stream` after the buffer's own
    // stream); `dst` stays borrowed until the caller's synchronize.
    unsafe { result::memcpy_dtoh_async(dst, ptr, stream.cu_stream()) }
        .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))
}

/// Raw device addresses of every buffer of one frame, for [`PipelineKernels::run_frame_raw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawFrame {
    /// `3 · pixels` bytes.
    pub rgb: sys::CUdeviceptr,
    /// `pixels` floats.
    pub gray: sys::CUdeviceptr,
    /// `pixels` floats.
    pub scratch: sys::CUdeviceptr,
    /// `pixels` floats.
    pub blurred: sys::CUdeviceptr,
    /// `pixels` floats.
    pub magnitude: sys::CUdeviceptr,
    /// 256 counters.
    pub hist: sys::CUdeviceptr,
    /// One counter.
    pub threshold: sys::CUdeviceptr,
    /// `pixels` bytes.
    pub mask: sys::CUdeviceptr,
}

/// Timing events around every stage (made once, recorded every frame: timing a frame makes
/// no allocation).
#[derive(Debug)]
pub struct StageEvents {
    events: Vec<CudaEvent>,
}

impl StageEvents {
    /// One timing event before the first stage and one after each stage.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, Error> {
        let events = (0..=Stage::ALL.len())
            .map(|_| ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| driver_error("cuEventCreate", e))?;
        Ok(StageEvents { events })
    }

    fn record(&self, i: usize, stream: &CudaStream) -> Result<(), Error> {
        self.events[i]
            .record(stream)
            .map_err(|e| driver_error("cuEventRecord", e))
    }

    /// Milliseconds each stage took in the frame last recorded, in [`Stage::ALL`] order (waits
    /// for the frame to finish).
    pub fn elapsed_ms(&self) -> Result<[f32; 7], Error> {
        let mut out = [0.0; 7];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.events[i]
                .elapsed_ms(&self.events[i + 1])
                .map_err(|e| driver_error("cuEventElapsedTime", e))?;
        }
        Ok(out)
    }
}

/// The pipeline's kernels, loaded into one context.
#[derive(Debug)]
pub struct PipelineKernels {
    ctx: Arc<CudaContext>,
    rgb_to_gray: CudaFunction,
    blur_rows: CudaFunction,
    blur_columns: CudaFunction,
    sobel: CudaFunction,
    histogram: CudaFunction,
    otsu_threshold: CudaFunction,
    edge_mask: CudaFunction,
}

fn grid_1d(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(BLOCK_1D), 1, 1),
        block_dim: (BLOCK_1D, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn grid_2d(size: ImageSize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (size.width as u32).div_ceil(BLOCK_2D.0),
            (size.height as u32).div_ceil(BLOCK_2D.1),
            1,
        ),
        block_dim: (BLOCK_2D.0, BLOCK_2D.1, 1),
        shared_mem_bytes: 0,
    }
}

impl PipelineKernels {
    /// Loads the embedded PTX into `ctx` (the driver JIT-compiles it for the device).
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self, Error> {
        let module = ctx
            .load_module(Ptx::from_src(PTX))
            .map_err(|e| driver_error("cuModuleLoadData", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| driver_error("cuModuleGetFunction", e))
        };
        Ok(PipelineKernels {
            ctx: ctx.clone(),
            rgb_to_gray: f("rgb_to_gray")?,
            blur_rows: f("blur_rows")?,
            blur_columns: f("blur_columns")?,
            sobel: f("sobel")?,
            histogram: f("histogram")?,
            otsu_threshold: f("otsu_threshold")?,
            edge_mask: f("edge_mask")?,
        })
    }

    /// The context the kernels were loaded into.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn check_stream(&self, stage: &str, stream: &CudaStream) -> Result<(), Error> {
        if is_per_thread(stream) {
            return Err(invalid(format!(
                "{stage}: the kernels were asked to run on {PER_THREAD_WHY}"
            )));
        }
        if stream.context() != &self.ctx {
            return Err(invalid(format!(
                "{stage}: the stream belongs to {}, the kernels were loaded into device {}'s",
                which_context(stream.context(), &self.ctx),
                self.ctx.ordinal()
            )));
        }
        Ok(())
    }

    fn check_buffer<T>(
        &self,
        stage: &str,
        name: &str,
        buffer: &impl DeviceSlice<T>,
        expected: usize,
        size: Option<ImageSize>,
    ) -> Result<(), Error> {
        check_len(stage, name, buffer.len(), expected, size)?;
        self.check_context(stage, name, buffer)
    }

    /// [`check_room`] and the buffer's context.
    fn check_room<T>(
        &self,
        stage: &str,
        name: &str,
        buffer: &impl DeviceSlice<T>,
        needed: usize,
        size: ImageSize,
    ) -> Result<(), Error> {
        check_room(stage, name, buffer.len(), needed, size)?;
        self.check_context(stage, name, buffer)
    }

    fn check_context<T>(
        &self,
        stage: &str,
        name: &str,
        buffer: &impl DeviceSlice<T>,
    ) -> Result<(), Error> {
        check_buffer_stream(stage, name, buffer.stream(), &self.ctx, "the kernels run")
    }

    fn check_size(stage: &str, size: ImageSize) -> Result<(), Error> {
        size.check(stage)?;
        if size.height > MAX_ROWS {
            return Err(invalid(format!(
                "{stage}: image of {size} pixels is taller than the {MAX_ROWS} rows one launch \
                 covers"
            )));
        }
        Ok(())
    }

    /// RGB to luma ([`super::host::rgb_to_gray`]).
    pub fn rgb_to_gray(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        rgb: &impl TrustedDevicePtr<u8>,
        gray: &mut (impl DevicePtrMut<f32> + TrustedDevicePtr<f32>),
    ) -> Result<(), Error> {
        const STAGE: &str = "grayscale";
        self.check_stream(STAGE, stream)?;
        Self::check_size(STAGE, size)?;
        self.check_buffer(STAGE, "rgb", rgb, size.pixels() * 3, Some(size))?;
        self.check_buffer(STAGE, "gray", gray, size.pixels(), Some(size))?;
        let joined = CrossStreams::join(stream, &[rgb.stream(), gray.stream()])?;
        joined.around(|| {
            let (src, _read) = rgb.device_ptr(stream);
            let (dst, _write) = gray.device_ptr_mut(stream);
            // SAFETY: both buffers were checked to hold a `size` image and to live in the
            // kernels' context; `joined` orders the launch after their streams' work so far
            // and their streams' later work after it.
            unsafe { self.rgb_to_gray_raw(stream, size, src, dst) }
        })
    }

    /// The blur's pass along rows ([`super::host::blur_horizontal`]).
    pub fn blur_rows(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: &impl TrustedDevicePtr<f32>,
        dst: &mut (impl DevicePtrMut<f32> + TrustedDevicePtr<f32>),
    ) -> Result<(), Error> {
        let pass = (&self.blur_rows, "blur (rows)", "cuLaunchKernel(blur_rows)");
        self.image_pass(pass, stream, size, src, dst)
    }

    /// The blur's pass along columns ([`super::host::blur_vertical`]).
    pub fn blur_columns(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: &impl TrustedDevicePtr<f32>,
        dst: &mut (impl DevicePtrMut<f32> + TrustedDevicePtr<f32>),
    ) -> Result<(), Error> {
        let pass = (
            &self.blur_columns,
            "blur (columns)",
            "cuLaunchKernel(blur_columns)",
        );
        self.image_pass(pass, stream, size, src, dst)
    }

    /// Sobel gradient magnitude ([`super::host::sobel_magnitude`]).
    pub fn sobel(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: &impl TrustedDevicePtr<f32>,
        magnitude: &mut (impl DevicePtrMut<f32> + TrustedDevicePtr<f32>),
    ) -> Result<(), Error> {
        let pass = (&self.sobel, "sobel", "cuLaunchKernel(sobel)");
        self.image_pass(pass, stream, size, src, magnitude)
    }

    /// One image-to-image kernel (`(kernel, stage name, driver call)`): both buffers checked to
    /// hold a `size` image of `f32` in the kernels' context, then the launch.
    fn image_pass(
        &self,
        (kernel, stage, call): (&CudaFunction, &str, &'static str),
        stream: &CudaStream,
        size: ImageSize,
        src: &impl TrustedDevicePtr<f32>,
        dst: &mut (impl DevicePtrMut<f32> + TrustedDevicePtr<f32>),
    ) -> Result<(), Error> {
        self.check_stream(stage, stream)?;
        Self::check_size(stage, size)?;
        self.check_buffer(stage, "src", src, size.pixels(), Some(size))?;
        self.check_buffer(stage, "dst", dst, size.pixels(), Some(size))?;
        let joined = CrossStreams::join(stream, &[src.stream(), dst.stream()])?;
        joined.around(|| {
            let (s, _read) = src.device_ptr(stream);
            let (d, _write) = dst.device_ptr_mut(stream);
            // SAFETY: as in `rgb_to_gray`: both buffers were checked to hold a `size` image and
            // to live in the kernels' context, and `joined` orders the launch with their
            // streams. `kernel` takes `(const float*, float*, u32 width, u32 height)`.
            unsafe { self.launch_2d(kernel, call, stream, size, s, d) }
        })
    }

    /// Zeroes `hist` and counts the magnitudes' bins into it ([`super::host::histogram`]).
    pub fn histogram(
        &self,
        stream: &CudaStream,
        magnitude: &impl TrustedDevicePtr<f32>,
        hist: &mut (impl DevicePtrMut<u32> + TrustedDevicePtr<u32>),
    ) -> Result<(), Error> {
        const STAGE: &str = "histogram";
        self.check_stream(STAGE, stream)?;
        self.check_context(STAGE, "magnitude", magnitude)?;
        self.check_buffer(STAGE, "hist", hist, HIST_BINS, None)?;
        let pixels = check_pixels(STAGE, magnitude.len())?;
        let joined = CrossStreams::join(stream, &[magnitude.stream(), hist.stream()])?;
        joined.around(|| {
            let (m, _read) = magnitude.device_ptr(stream);
            let (h, _write) = hist.device_ptr_mut(stream);
            // SAFETY: `hist` holds 256 counters and `magnitude` `pixels` floats, in this
            // context; `joined` orders the launch with their streams.
            unsafe { self.histogram_raw(stream, pixels, m, h) }
        })
    }

    /// Otsu's threshold from the histogram, written to `threshold[0]` on the device
    /// ([`super::host::otsu_threshold`]).
    pub fn otsu_threshold(
        &self,
        stream: &CudaStream,
        hist: &impl TrustedDevicePtr<u32>,
        threshold: &mut (impl DevicePtrMut<u32> + TrustedDevicePtr<u32>),
    ) -> Result<(), Error> {
        const STAGE: &str = "otsu";
        self.check_stream(STAGE, stream)?;
        self.check_buffer(STAGE, "hist", hist, HIST_BINS, None)?;
        self.check_buffer(STAGE, "threshold", threshold, 1, None)?;
        let joined = CrossStreams::join(stream, &[hist.stream(), threshold.stream()])?;
        joined.around(|| {
            let (h, _read) = hist.device_ptr(stream);
            let (t, _write) = threshold.device_ptr_mut(stream);
            // SAFETY: 256 counters in, one counter out, in this context; `joined` orders the
            // launch with their streams.
            unsafe { self.otsu_threshold_raw(stream, h, t) }
        })
    }

    /// The binary edge mask from the magnitude and the device-resident threshold
    /// ([`super::host::edge_mask`]).
    pub fn edge_mask(
        &self,
        stream: &CudaStream,
        magnitude: &impl TrustedDevicePtr<f32>,
        threshold: &impl TrustedDevicePtr<u32>,
        mask: &mut (impl DevicePtrMut<u8> + TrustedDevicePtr<u8>),
    ) -> Result<(), Error> {
        const STAGE: &str = "mask";
        self.check_stream(STAGE, stream)?;
        self.check_buffer(STAGE, "threshold", threshold, 1, None)?;
        self.check_context(STAGE, "magnitude", magnitude)?;
        self.check_buffer(STAGE, "mask", mask, magnitude.len(), None)?;
        let pixels = check_pixels(STAGE, magnitude.len())?;
        if pixels == 0 {
            // No pixel, no mask (as on the host); a launch of no blocks is a driver error.
            return Ok(());
        }
        let streams = [magnitude.stream(), threshold.stream(), mask.stream()];
        let joined = CrossStreams::join(stream, &streams)?;
        joined.around(|| {
            let (m, _r1) = magnitude.device_ptr(stream);
            let (t, _r2) = threshold.device_ptr(stream);
            let (k, _write) = mask.device_ptr_mut(stream);
            // SAFETY: `mask` and `magnitude` hold `pixels` elements, `threshold` one, in this
            // context; `joined` orders the launch with their streams.
            unsafe { self.edge_mask_raw(stream, pixels, m, t, k) }
        })
    }

    /// [`run_frame`](Self::run_frame) on raw device addresses: the launch sequence itself,
    /// with no checks. Used directly by code that manages device memory by hand.
    ///
    /// # Safety
    ///
    /// Every address must point to a live device buffer of the size [`RawFrame`] documents for
    /// `size`, in the kernels' context, usable on `stream`, and not be accessed concurrently by
    /// anything else until the queued work completes.
    pub unsafe fn run_frame_raw(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        p: &RawFrame,
        events: Option<&StageEvents>,
    ) -> Result<(), Error> {
        let px = size.pixels() as u32;
        let mark = |i: usize| events.map_or(Ok(()), |e| e.record(i, stream));
        mark(0)?;
        // SAFETY: the caller's contract covers every buffer of every call below.
        unsafe {
            self.rgb_to_gray_raw(stream, size, p.rgb, p.gray)?;
            mark(1)?;
            self.blur_rows_raw(stream, size, p.gray, p.scratch)?;
            mark(2)?;
            self.blur_columns_raw(stream, size, p.scratch, p.blurred)?;
            mark(3)?;
            self.sobel_raw(stream, size, p.blurred, p.magnitude)?;
            mark(4)?;
            self.histogram_raw(stream, px, p.magnitude, p.hist)?;
            mark(5)?;
            self.otsu_threshold_raw(stream, p.hist, p.threshold)?;
            mark(6)?;
            self.edge_mask_raw(stream, px, p.magnitude, p.threshold, p.mask)?;
        }
        mark(7)
    }

    /// # Safety
    ///
    /// `rgb` must hold `3 · pixels` bytes and `gray` `pixels` floats of a checked `size`, in
    /// the kernels' context, usable on `stream`.
    pub unsafe fn rgb_to_gray_raw(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        rgb: sys::CUdeviceptr,
        gray: sys::CUdeviceptr,
    ) -> Result<(), Error> {
        let px = size.pixels() as u32;
        let mut b = stream.launch_builder(&self.rgb_to_gray);
        b.arg(&rgb).arg(&gray).arg(&px);
        // SAFETY: the signature matches `rgb_to_gray(const u8*, float*, u32)`; the caller
        // guarantees the buffers.
        unsafe { b.launch(grid_1d(size.pixels())) }
            .map(drop)
            .map_err(|e| driver_error("cuLaunchKernel(rgb_to_gray)", e))
    }

    /// # Safety
    ///
    /// `src` and `dst` must each hold `pixels` floats of a checked `size`, in the kernels'
    /// context, usable on `stream`.
    pub unsafe fn blur_rows_raw(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: sys::CUdeviceptr,
        dst: sys::CUdeviceptr,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe {
            self.launch_2d(
                &self.blur_rows,
                "cuLaunchKernel(blur_rows)",
                stream,
                size,
                src,
                dst,
            )
        }
    }

    /// # Safety
    ///
    /// As [`blur_rows_raw`](Self::blur_rows_raw).
    pub unsafe fn blur_columns_raw(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: sys::CUdeviceptr,
        dst: sys::CUdeviceptr,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe {
            self.launch_2d(
                &self.blur_columns,
                "cuLaunchKernel(blur_columns)",
                stream,
                size,
                src,
                dst,
            )
        }
    }

    /// # Safety
    ///
    /// As [`blur_rows_raw`](Self::blur_rows_raw).
    pub unsafe fn sobel_raw(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: sys::CUdeviceptr,
        magnitude: sys::CUdeviceptr,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe {
            self.launch_2d(
                &self.sobel,
                "cuLaunchKernel(sobel)",
                stream,
                size,
                src,
                magnitude,
            )
        }
    }

    /// # Safety
    ///
    /// As [`blur_rows_raw`](Self::blur_rows_raw); `f` takes `(const float*, float*, u32, u32)`.
    unsafe fn launch_2d(
        &self,
        f: &CudaFunction,
        call: &'static str,
        stream: &CudaStream,
        size: ImageSize,
        src: sys::CUdeviceptr,
        dst: sys::CUdeviceptr,
    ) -> Result<(), Error> {
        let (w, h) = (size.width as u32, size.height as u32);
        let mut b = stream.launch_builder(f);
        b.arg(&src).arg(&dst).arg(&w).arg(&h);
        // SAFETY: the signature matches; the caller guarantees the buffers.
        unsafe { b.launch(grid_2d(size)) }
            .map(drop)
            .map_err(|e| driver_error(call, e))
    }

    /// Zeroes the histogram (`cuMemsetD8Async`) and counts into it.
    ///
    /// # Safety
    ///
    /// `magnitude` must hold `pixels` floats and `hist` 256 counters, in the kernels' context,
    /// usable on `stream`.
    pub unsafe fn histogram_raw(
        &self,
        stream: &CudaStream,
        pixels: u32,
        magnitude: sys::CUdeviceptr,
        hist: sys::CUdeviceptr,
    ) -> Result<(), Error> {
        // SAFETY: `hist` holds 256 counters (the caller's contract).
        unsafe { result::memset_d8_async(hist, 0, HIST_BINS * 4, stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemsetD8Async(hist)", e))?;
        let blocks = pixels.div_ceil(BLOCK_1D).clamp(1, HIST_MAX_BLOCKS);
        let mut b = stream.launch_builder(&self.histogram);
        b.arg(&magnitude).arg(&hist).arg(&pixels);
        // SAFETY: the signature matches `histogram(const float*, u32*, u32)`; the kernel
        // needs exactly 256 threads per block.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (HIST_BINS as u32, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map(drop)
        .map_err(|e| driver_error("cuLaunchKernel(histogram)", e))
    }

    /// # Safety
    ///
    /// `hist` must hold 256 counters and `threshold` one, in the kernels' context, usable on
    /// `stream`.
    pub unsafe fn otsu_threshold_raw(
        &self,
        stream: &CudaStream,
        hist: sys::CUdeviceptr,
        threshold: sys::CUdeviceptr,
    ) -> Result<(), Error> {
        let mut b = stream.launch_builder(&self.otsu_threshold);
        b.arg(&hist).arg(&threshold);
        // SAFETY: the signature matches `otsu_threshold(const u32*, u32*)`; one block of
        // exactly 256 threads, as the kernel requires.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (HIST_BINS as u32, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map(drop)
        .map_err(|e| driver_error("cuLaunchKernel(otsu_threshold)", e))
    }

    /// # Safety
    ///
    /// `magnitude` must hold `pixels` floats, `threshold` one counter and `mask` `pixels`
    /// bytes, in the kernels' context, usable on `stream`.
    pub unsafe fn edge_mask_raw(
        &self,
        stream: &CudaStream,
        pixels: u32,
        magnitude: sys::CUdeviceptr,
        threshold: sys::CUdeviceptr,
        mask: sys::CUdeviceptr,
    ) -> Result<(), Error> {
        let mut b = stream.launch_builder(&self.edge_mask);
        b.arg(&magnitude).arg(&threshold).arg(&mask).arg(&pixels);
        // SAFETY: the signature matches `edge_mask(const float*, const u32*, u8*, u32)`.
        unsafe { b.launch(grid_1d(pixels as usize)) }
            .map(drop)
            .map_err(|e| driver_error("cuLaunchKernel(edge_mask)", e))
    }
}

fn check_pixels(stage: &str, len: usize) -> Result<u32, Error> {
    u32::try_from(len).map_err(|_| {
        invalid(format!(
            "{stage}: {len} pixels do not fit the kernels' 32-bit indices"
        ))
    })
}

mod frame;
pub use frame::{
    FRAME_GRAPH_NODES, FrameSlices, download_mask_stage, upload_input, upload_input_staged,
};

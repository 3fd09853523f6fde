//! The pipeline's PTX kernels and their launch wrappers (feature `cuda`).
//!
//! [`PipelineKernels::load`] loads the embedded PTX into a context once; each stage is then one
//! method taking a stream and device buffers: anything that implements cudarc's
//! [`DevicePtr`] / [`DevicePtrMut`] (cudarc's own `CudaSlice` and views, or the views of a
//! devarena arena on the CUDA backend). [`PipelineKernels::run_frame`] runs every stage on a
//! [`FrameBuffers`], which an arena's views convert into:
//!
//! ```no_run
//! use devarena::Arena;
//! use devarena::backend::cuda::{CudaBackend, cuda_stream};
//! use devarena_kernels::pipeline::cuda::PipelineKernels;
//! use devarena_kernels::pipeline::{FRAME_SIZE, Frame, FrameBuffers, PIXELS};
//!
//! let rgb = vec![128u8; PIXELS * 3];
//! let stream = cuda_stream(0)?;
//! let kernels = PipelineKernels::load(stream.context())?;
//! let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone()))?;
//! let mut views = arena.views_mut();
//! views.rgb.upload(&rgb)?;
//! kernels.run_frame(&stream, FRAME_SIZE, FrameBuffers::from(&mut views), None)?;
//! # Ok::<(), devarena::Error>(())
//! ```
//!
//! [`PipelineKernels::run_frame_staged`] runs the same kernels on an aliased
//! [`FrameStaged`] arena, each stage on its own stage views.
//!
//! The kernels compute the same bits as [`super::host`] (see `kernels/cuda/pipeline.cu`).
//! Every wrapper checks buffer lengths and contexts first and returns
//! [`Error::InvalidArgument`]; driver failures come back as [`Error::Driver`].

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceSlice, LaunchConfig, PushKernelArg, result, sys,
};
use cudarc::nvrtc::Ptx;
use devarena::backend::DirectViews;
use devarena::backend::cuda::{CudaMut, DeviceViewMut};
use devarena::{Arena, Error};

use super::{
    FRAME_SIZE, FrameBuffers, FrameOutputs, FrameStaged, FrameStagedStages, HIST_BINS, ImageSize,
    Stage, check_len, invalid,
};

/// The pipeline's PTX (compute_75, JIT-compiled by the driver for the GPU at hand), generated
/// from `kernels/cuda/pipeline.cu` by `kernels/build-ptx.sh`.
pub const PTX: &str = include_str!("../../ptx/pipeline.ptx");

/// Threads per block of the 1-D kernels.
const BLOCK_1D: u32 = 256;
/// Block shape of the 2-D kernels.
const BLOCK_2D: (u32, u32) = (32, 8);
/// Most blocks the grid-stride histogram launches.
const HIST_MAX_BLOCKS: u32 = 1024;

/// A [`DriverError`](cudarc::driver::DriverError) as a devarena [`Error`], with the CUDA error
/// name and text (devarena's own conversion).
pub use devarena::backend::cuda::driver_error;

/// Downloads every stage output of a frame's device buffers (cudarc slices, arena views) into
/// `outputs`, and waits for the copies.
pub fn download_outputs<B8, BF, BU>(
    stream: &Arc<CudaStream>,
    b: &FrameBuffers<'_, B8, BF, BU>,
    outputs: &mut FrameOutputs,
) -> Result<(), Error>
where
    B8: DevicePtr<u8>,
    BF: DevicePtr<f32>,
    BU: DevicePtr<u32>,
{
    const STAGE: &str = "outputs";
    let o = outputs;
    check_len(STAGE, "gray", b.gray.len(), o.gray.len(), None)?;
    check_len(STAGE, "scratch", b.scratch.len(), o.scratch.len(), None)?;
    check_len(STAGE, "blurred", b.blurred.len(), o.blurred.len(), None)?;
    check_len(
        STAGE,
        "magnitude",
        b.magnitude.len(),
        o.magnitude.len(),
        None,
    )?;
    check_len(STAGE, "hist", b.hist.len(), o.hist.len(), None)?;
    check_len(STAGE, "threshold", b.threshold.len(), 1, None)?;
    check_len(STAGE, "mask", b.mask.len(), o.mask.len(), None)?;
    let dtoh = |e| driver_error("cuMemcpyDtoHAsync", e);
    let mut threshold = [0u32];
    stream.memcpy_dtoh(&*b.gray, &mut o.gray).map_err(dtoh)?;
    stream
        .memcpy_dtoh(&*b.scratch, &mut o.scratch)
        .map_err(dtoh)?;
    stream
        .memcpy_dtoh(&*b.blurred, &mut o.blurred)
        .map_err(dtoh)?;
    stream
        .memcpy_dtoh(&*b.magnitude, &mut o.magnitude)
        .map_err(dtoh)?;
    stream.memcpy_dtoh(&*b.hist, &mut o.hist).map_err(dtoh)?;
    stream
        .memcpy_dtoh(&*b.threshold, &mut threshold)
        .map_err(dtoh)?;
    stream.memcpy_dtoh(&*b.mask, &mut o.mask).map_err(dtoh)?;
    stream
        .synchronize()
        .map_err(|e| driver_error("cuStreamSynchronize", e))?;
    o.threshold = threshold[0];
    Ok(())
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
        if stream.context() != &self.ctx {
            return Err(invalid(format!(
                "{stage}: the stream belongs to device {}'s context, the kernels were loaded into \
                 device {}'s",
                stream.context().ordinal(),
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

    fn check_context<T>(
        &self,
        stage: &str,
        name: &str,
        buffer: &impl DeviceSlice<T>,
    ) -> Result<(), Error> {
        if buffer.stream().context() != &self.ctx {
            return Err(invalid(format!(
                "{stage}: `{name}` lives in device {}'s context, the kernels run in device {}'s",
                buffer.stream().context().ordinal(),
                self.ctx.ordinal()
            )));
        }
        Ok(())
    }

    fn check_size(stage: &str, size: ImageSize) -> Result<(), Error> {
        size.check(stage)?;
        let max_height = 65_535 * BLOCK_2D.1 as usize;
        if size.height > max_height {
            return Err(invalid(format!(
                "{stage}: image of {size} pixels is taller than the {max_height} rows one launch \
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
        rgb: &impl DevicePtr<u8>,
        gray: &mut impl DevicePtrMut<f32>,
    ) -> Result<(), Error> {
        const STAGE: &str = "grayscale";
        self.check_stream(STAGE, stream)?;
        Self::check_size(STAGE, size)?;
        self.check_buffer(STAGE, "rgb", rgb, size.pixels() * 3, Some(size))?;
        self.check_buffer(STAGE, "gray", gray, size.pixels(), Some(size))?;
        let (src, _read) = rgb.device_ptr(stream);
        let (dst, _write) = gray.device_ptr_mut(stream);
        // SAFETY: both buffers were checked to hold a `size` image and to live in the kernels'
        // context; the guards keep them ordered on `stream` until the launch is queued.
        unsafe { self.rgb_to_gray_raw(stream, size, src, dst) }
    }

    /// The blur's pass along rows ([`super::host::blur_horizontal`]).
    pub fn blur_rows(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: &impl DevicePtr<f32>,
        dst: &mut impl DevicePtrMut<f32>,
    ) -> Result<(), Error> {
        const STAGE: &str = "blur (rows)";
        self.check_image_pair(STAGE, stream, size, src, dst)?;
        let (s, _read) = src.device_ptr(stream);
        let (d, _write) = dst.device_ptr_mut(stream);
        // SAFETY: as in `rgb_to_gray`.
        unsafe { self.blur_rows_raw(stream, size, s, d) }
    }

    /// The blur's pass along columns ([`super::host::blur_vertical`]).
    pub fn blur_columns(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: &impl DevicePtr<f32>,
        dst: &mut impl DevicePtrMut<f32>,
    ) -> Result<(), Error> {
        const STAGE: &str = "blur (columns)";
        self.check_image_pair(STAGE, stream, size, src, dst)?;
        let (s, _read) = src.device_ptr(stream);
        let (d, _write) = dst.device_ptr_mut(stream);
        // SAFETY: as in `rgb_to_gray`.
        unsafe { self.blur_columns_raw(stream, size, s, d) }
    }

    /// Sobel gradient magnitude ([`super::host::sobel_magnitude`]).
    pub fn sobel(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        src: &impl DevicePtr<f32>,
        magnitude: &mut impl DevicePtrMut<f32>,
    ) -> Result<(), Error> {
        const STAGE: &str = "sobel";
        self.check_image_pair(STAGE, stream, size, src, magnitude)?;
        let (s, _read) = src.device_ptr(stream);
        let (d, _write) = magnitude.device_ptr_mut(stream);
        // SAFETY: as in `rgb_to_gray`.
        unsafe { self.sobel_raw(stream, size, s, d) }
    }

    fn check_image_pair(
        &self,
        stage: &str,
        stream: &CudaStream,
        size: ImageSize,
        src: &impl DeviceSlice<f32>,
        dst: &impl DeviceSlice<f32>,
    ) -> Result<(), Error> {
        self.check_stream(stage, stream)?;
        Self::check_size(stage, size)?;
        self.check_buffer(stage, "src", src, size.pixels(), Some(size))?;
        self.check_buffer(stage, "dst", dst, size.pixels(), Some(size))
    }

    /// Zeroes `hist` and counts the magnitudes' bins into it ([`super::host::histogram`]).
    pub fn histogram(
        &self,
        stream: &CudaStream,
        magnitude: &impl DevicePtr<f32>,
        hist: &mut impl DevicePtrMut<u32>,
    ) -> Result<(), Error> {
        const STAGE: &str = "histogram";
        self.check_stream(STAGE, stream)?;
        self.check_context(STAGE, "magnitude", magnitude)?;
        self.check_buffer(STAGE, "hist", hist, HIST_BINS, None)?;
        let pixels = check_pixels(STAGE, magnitude.len())?;
        let (m, _read) = magnitude.device_ptr(stream);
        let (h, _write) = hist.device_ptr_mut(stream);
        // SAFETY: `hist` holds 256 counters and `magnitude` `pixels` floats, in this context.
        unsafe { self.histogram_raw(stream, pixels, m, h) }
    }

    /// Otsu's threshold from the histogram, written to `threshold[0]` on the device
    /// ([`super::host::otsu_threshold`]).
    pub fn otsu_threshold(
        &self,
        stream: &CudaStream,
        hist: &impl DevicePtr<u32>,
        threshold: &mut impl DevicePtrMut<u32>,
    ) -> Result<(), Error> {
        const STAGE: &str = "otsu";
        self.check_stream(STAGE, stream)?;
        self.check_buffer(STAGE, "hist", hist, HIST_BINS, None)?;
        self.check_buffer(STAGE, "threshold", threshold, 1, None)?;
        let (h, _read) = hist.device_ptr(stream);
        let (t, _write) = threshold.device_ptr_mut(stream);
        // SAFETY: 256 counters in, one counter out, in this context.
        unsafe { self.otsu_threshold_raw(stream, h, t) }
    }

    /// The binary edge mask from the magnitude and the device-resident threshold
    /// ([`super::host::edge_mask`]).
    pub fn edge_mask(
        &self,
        stream: &CudaStream,
        magnitude: &impl DevicePtr<f32>,
        threshold: &impl DevicePtr<u32>,
        mask: &mut impl DevicePtrMut<u8>,
    ) -> Result<(), Error> {
        const STAGE: &str = "mask";
        self.check_stream(STAGE, stream)?;
        self.check_buffer(STAGE, "threshold", threshold, 1, None)?;
        self.check_context(STAGE, "magnitude", magnitude)?;
        self.check_buffer(STAGE, "mask", mask, magnitude.len(), None)?;
        let pixels = check_pixels(STAGE, magnitude.len())?;
        let (m, _r1) = magnitude.device_ptr(stream);
        let (t, _r2) = threshold.device_ptr(stream);
        let (k, _write) = mask.device_ptr_mut(stream);
        // SAFETY: `mask` and `magnitude` hold `pixels` elements, `threshold` one, in this
        // context.
        unsafe { self.edge_mask_raw(stream, pixels, m, t, k) }
    }

    /// Runs every stage on one frame, queued on `stream` (nothing waits for it). With `events`,
    /// records each stage's start and end for [`StageEvents::elapsed_ms`].
    ///
    /// The threshold stays on the device (`buffers.threshold`), where the mask stage reads it.
    pub fn run_frame<B8, BF, BU>(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        b: FrameBuffers<'_, B8, BF, BU>,
        events: Option<&StageEvents>,
    ) -> Result<(), Error>
    where
        B8: DevicePtr<u8> + DevicePtrMut<u8>,
        BF: DevicePtr<f32> + DevicePtrMut<f32>,
        BU: DevicePtr<u32> + DevicePtrMut<u32>,
    {
        const STAGE: &str = "frame";
        self.check_stream(STAGE, stream)?;
        Self::check_size(STAGE, size)?;
        let px = size.pixels();
        let s = Some(size);
        self.check_buffer(STAGE, "rgb", &*b.rgb, px * 3, s)?;
        for (name, buf) in [
            ("gray", &*b.gray),
            ("scratch", &*b.scratch),
            ("blurred", &*b.blurred),
            ("magnitude", &*b.magnitude),
        ] {
            self.check_buffer(STAGE, name, buf, px, s)?;
        }
        self.check_buffer(STAGE, "hist", &*b.hist, HIST_BINS, None)?;
        self.check_buffer(STAGE, "threshold", &*b.threshold, 1, None)?;
        self.check_buffer(STAGE, "mask", &*b.mask, px, s)?;
        let (rgb, _g0) = b.rgb.device_ptr(stream);
        let (gray, _g1) = b.gray.device_ptr_mut(stream);
        let (scratch, _g2) = b.scratch.device_ptr_mut(stream);
        let (blurred, _g3) = b.blurred.device_ptr_mut(stream);
        let (magnitude, _g4) = b.magnitude.device_ptr_mut(stream);
        let (hist, _g5) = b.hist.device_ptr_mut(stream);
        let (threshold, _g6) = b.threshold.device_ptr_mut(stream);
        let (mask, _g7) = b.mask.device_ptr_mut(stream);
        let raw = RawFrame {
            rgb,
            gray,
            scratch,
            blurred,
            magnitude,
            hist,
            threshold,
            mask,
        };
        // SAFETY: every buffer was checked above to have its frame size and to live in the
        // kernels' context; the guards keep them ordered on `stream` until all launches are
        // queued, and the `&mut` borrows keep the host side from touching them meanwhile.
        unsafe { self.run_frame_raw(stream, size, &raw, events) }
    }

    /// Runs one 1920×1080 frame on an aliased [`FrameStaged`] arena, queued on the arena's
    /// stream.
    ///
    /// Every stage gets its buffers only from the views of its own stage (`arena.gray_mut()`,
    /// `arena.blur_rows_mut()`, ...), which hold exactly the buffers live in it, so no kernel
    /// is handed a buffer outside its live range. Reusing bytes is sound on one stream: the
    /// kernels of a later stage run after those of earlier stages, in stream order. The kernels
    /// and their bits are those of [`run_frame`](Self::run_frame).
    ///
    /// `decode` writes the frame's input into `rgb` in stage `decode` (an upload, or a copy
    /// from a resident device buffer), on the stream it is given: the input's bytes are reused
    /// by later stages, so every frame starts by decoding. With `events`, each stage's start
    /// and end are recorded for [`StageEvents::elapsed_ms`]. With `outputs`, each stage
    /// output is downloaded in the last stage it is live in; the downloads wait for the
    /// stream, so a frame that copies its outputs out should not be timed.
    pub fn run_frame_staged<B: DirectViews<Mut = CudaMut>>(
        &self,
        arena: &mut Arena<FrameStaged, B>,
        decode: impl FnOnce(&Arc<CudaStream>, &mut DeviceViewMut<'_, u8>) -> Result<(), Error>,
        events: Option<&StageEvents>,
        mut outputs: Option<&mut FrameOutputs>,
    ) -> Result<(), Error> {
        let size = FRAME_SIZE;
        if let Some(o) = &outputs {
            if o.size != size {
                return Err(invalid(format!(
                    "outputs: made for a {} image, the frame is {size}",
                    o.size
                )));
            }
        }
        let mut s = arena.decode_mut();
        let stream = s.rgb.stream().clone();
        self.check_stream("frame", &stream)?;
        decode(&stream, &mut s.rgb)?;
        let mark = |i: usize| events.map_or(Ok(()), |e| e.record(i, &stream));

        mark(0)?;
        let mut s = arena.gray_mut();
        self.rgb_to_gray(&stream, size, &s.rgb, &mut s.gray)?;
        mark(1)?;

        let mut s = arena.blur_rows_mut();
        self.blur_rows(&stream, size, &s.gray, &mut s.scratch)?;
        mark(2)?;
        if let Some(o) = outputs.as_deref_mut() {
            s.gray.download(&mut o.gray)?;
        }

        let mut s = arena.blur_columns_mut();
        self.blur_columns(&stream, size, &s.scratch, &mut s.blurred)?;
        mark(3)?;
        if let Some(o) = outputs.as_deref_mut() {
            s.scratch.download(&mut o.scratch)?;
        }

        let mut s = arena.sobel_mut();
        self.sobel(&stream, size, &s.blurred, &mut s.magnitude)?;
        mark(4)?;
        if let Some(o) = outputs.as_deref_mut() {
            s.blurred.download(&mut o.blurred)?;
        }

        let mut s = arena.threshold_mut();
        self.histogram(&stream, &s.magnitude, &mut s.hist)?;
        mark(5)?;
        self.otsu_threshold(&stream, &s.hist, &mut s.threshold)?;
        mark(6)?;
        if let Some(o) = outputs.as_deref_mut() {
            s.hist.download(&mut o.hist)?;
        }

        let mut s = arena.mask_mut();
        self.edge_mask(&stream, &s.magnitude, &s.threshold, &mut s.mask)?;
        mark(7)?;
        if let Some(o) = outputs {
            s.magnitude.download(&mut o.magnitude)?;
            let mut threshold = [0u32];
            s.threshold.download(&mut threshold)?;
            o.threshold = threshold[0];
            s.mask.download(&mut o.mask)?;
        }
        Ok(())
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

/// One cudarc allocation per frame buffer: the way device buffers are usually made, and the
/// baseline a [`Frame`](super::Frame) arena replaces with a single allocation.
#[derive(Debug)]
pub struct FrameSlices {
    /// `3 · pixels` bytes.
    pub rgb: CudaSlice<u8>,
    /// `pixels` floats.
    pub gray: CudaSlice<f32>,
    /// `pixels` floats.
    pub scratch: CudaSlice<f32>,
    /// `pixels` floats.
    pub blurred: CudaSlice<f32>,
    /// `pixels` floats.
    pub magnitude: CudaSlice<f32>,
    /// 256 counters.
    pub hist: CudaSlice<u32>,
    /// One counter.
    pub threshold: CudaSlice<u32>,
    /// `pixels` bytes.
    pub mask: CudaSlice<u8>,
}

impl FrameSlices {
    /// Eight zeroed allocations on `stream`, sized for `size`.
    pub fn alloc(stream: &Arc<CudaStream>, size: ImageSize) -> Result<Self, Error> {
        size.check("frame buffers")?;
        let px = size.pixels();
        fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
            stream: &Arc<CudaStream>,
            len: usize,
        ) -> Result<CudaSlice<T>, Error> {
            stream.alloc_zeros::<T>(len).map_err(|e| {
                if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                    Error::OutOfMemory {
                        backend: "cuda",
                        requested: len * size_of::<T>(),
                        free: stream.context().mem_get_info().ok().map(|(free, _)| free),
                        detail: Some("CUDA_ERROR_OUT_OF_MEMORY"),
                    }
                } else {
                    driver_error("cuMemAlloc", e)
                }
            })
        }
        Ok(FrameSlices {
            rgb: zeros(stream, px * 3)?,
            gray: zeros(stream, px)?,
            scratch: zeros(stream, px)?,
            blurred: zeros(stream, px)?,
            magnitude: zeros(stream, px)?,
            hist: zeros(stream, HIST_BINS)?,
            threshold: zeros(stream, 1)?,
            mask: zeros(stream, px)?,
        })
    }

    /// Every buffer, borrowed for [`PipelineKernels::run_frame`].
    pub fn buffers(&mut self) -> FrameBuffers<'_, CudaSlice<u8>, CudaSlice<f32>, CudaSlice<u32>> {
        FrameBuffers {
            rgb: &mut self.rgb,
            gray: &mut self.gray,
            scratch: &mut self.scratch,
            blurred: &mut self.blurred,
            magnitude: &mut self.magnitude,
            hist: &mut self.hist,
            threshold: &mut self.threshold,
            mask: &mut self.mask,
        }
    }
}

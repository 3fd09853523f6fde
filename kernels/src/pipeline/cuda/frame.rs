//! Whole frames: every stage of a frame on an arena's views (eagerly or captured into a
//! graph), on an aliased arena's stage views, on cudarc buffers; the input's upload and the
//! outputs' download between replays.

use super::*;

impl PipelineKernels {
    /// Runs every stage on one frame of `size`, queued on `stream` (nothing waits for it).
    /// With `events`, records each stage's start and end for [`StageEvents::elapsed_ms`].
    ///
    /// Every image buffer must hold at least the frame (`3 · pixels` bytes of `rgb`, `pixels`
    /// elements of the others): the kernels take the real size and touch the first `pixels`
    /// elements of each, so buffers planned for a larger frame ([`Frame`]'s) serve any smaller
    /// one. The threshold stays on the device (`buffers.threshold`), where the mask stage reads
    /// it.
    pub fn run_frame<B8, BF, BU>(
        &self,
        stream: &CudaStream,
        size: ImageSize,
        b: FrameBuffers<'_, B8, BF, BU>,
        events: Option<&StageEvents>,
    ) -> Result<(), Error>
    where
        B8: TrustedDevicePtr<u8> + DevicePtrMut<u8>,
        BF: TrustedDevicePtr<f32> + DevicePtrMut<f32>,
        BU: TrustedDevicePtr<u32> + DevicePtrMut<u32>,
    {
        const STAGE: &str = "frame";
        self.check_stream(STAGE, stream)?;
        Self::check_size(STAGE, size)?;
        let px = size.pixels();
        self.check_room(STAGE, "rgb", &*b.rgb, px * 3, size)?;
        for (name, buf) in [
            ("gray", &*b.gray),
            ("scratch", &*b.scratch),
            ("blurred", &*b.blurred),
            ("magnitude", &*b.magnitude),
        ] {
            self.check_room(STAGE, name, buf, px, size)?;
        }
        self.check_buffer(STAGE, "hist", &*b.hist, HIST_BINS, None)?;
        self.check_buffer(STAGE, "threshold", &*b.threshold, 1, None)?;
        self.check_room(STAGE, "mask", &*b.mask, px, size)?;
        let streams = frame_streams(&b).map(|(_, theirs)| theirs);
        let joined = CrossStreams::join(stream, &streams)?;
        joined.around(|| {
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
            // SAFETY: every buffer was checked above to hold at least its part of a `size`
            // frame (the kernels touch no more) and to live in the kernels' context; `joined`
            // orders the launches after their streams' work and their streams' later work
            // after the launches, and the `&mut` borrows keep the host side from touching
            // them meanwhile.
            unsafe { self.run_frame_raw(stream, size, &raw, events) }
        })
    }

    /// Captures one frame of `size` on a [`Frame`] arena into a graph of the arena: the
    /// launches of [`run_frame`](Self::run_frame), recorded once. Replay it with
    /// `graph.launch()` after uploading each frame's input ([`upload_input`]); read the outputs
    /// through `graph.views_mut()` ([`download_outputs`]) between replays. A graph is made for
    /// one size: capture another for another size.
    ///
    /// Safe where [`Arena::capture`] is not: the recorded work is this crate's kernels on the
    /// arena's views alone, and the graph borrows the kernels as well as the arena, so the
    /// module its kernel nodes run stays loaded for every replay (a replay still running when
    /// graph and kernels are dropped is waited for by the module's unload, `cuModuleUnload`,
    /// as the test `dropping_the_kernels_waits_for_their_launches_in_flight` checks on the
    /// GPU). The capture runs on a stream
    /// of its own ([`Arena::capture_on_own_stream`]), which no other thread holds: work other
    /// threads queue on the arena's stream meanwhile runs as usual and stays out of the graph.
    /// (As a second guard, a graph whose operations are not the frame's
    /// [`FRAME_GRAPH_NODES`] in number is discarded unlaunched, with an error.)
    pub fn capture_frame<'a, B: DirectViews<Mut = CudaMut> + StreamOrdered>(
        &'a self,
        arena: &'a mut Arena<Frame, B>,
        size: ImageSize,
    ) -> Result<ArenaGraph<'a, Frame, B>, Error> {
        // SAFETY: `record_frame` queues this crate's kernels on the capture's views of the
        // arena and nothing else (no events, no outputs); the kernels' module is `self`'s,
        // borrowed for the graph's life (`'a`), and its unload, when `self` goes, waits for
        // the replays still in flight. The capture's stream is its own: no other
        // thread's work reaches the graph (and `only_the_frame` checks the number of its
        // operations), so the graph reaches the arena's allocation alone, which it borrows.
        let graph =
            unsafe { arena.capture_on_own_stream(|capture| self.record_frame(capture, size)) }?;
        only_the_frame(graph, "capture_frame")
    }

    /// Records the launches of one frame of `size` into a capture of a [`Frame`] arena
    /// ([`Arena::capture`]), after whatever the capture recorded before (a copy of the input
    /// from a resident buffer, say): [`capture_frame`](Self::capture_frame) is this alone.
    pub fn record_frame<B: DirectViews<Mut = CudaMut> + StreamOrdered>(
        &self,
        capture: &mut Capture<'_, Frame, B>,
        size: ImageSize,
    ) -> Result<(), Error> {
        let stream = capture.stream().clone();
        let mut views = capture.views_mut();
        self.run_frame(&stream, size, FrameBuffers::from(&mut views), None)
    }

    /// Runs one frame of `size` on an aliased [`FrameStaged`] arena, queued on the arena's
    /// stream.
    ///
    /// Every stage gets its buffers only from the views of its own stage (`arena.gray_mut()`,
    /// `arena.blur_rows_mut()`, ...), which hold exactly the buffers live in it, each cut to
    /// the frame, so no kernel is handed a buffer outside its live range. Reusing bytes is
    /// sound on one stream: the kernels of a later stage run after those of earlier stages, in
    /// stream order. The kernels and their bits are those of [`run_frame`](Self::run_frame).
    ///
    /// `decode` writes the frame's input into `rgb` (cut to `3 · pixels` bytes) in stage
    /// `decode` (an upload, or a copy from a resident device buffer), on the stream it is given:
    /// the input's bytes are reused by later stages, so every frame starts by decoding. With
    /// `events`, each stage's start and end are recorded for [`StageEvents::elapsed_ms`]. With
    /// `outputs` (made for `size`), each stage output is downloaded in the last stage it is live
    /// in; the downloads wait for the stream, so a frame that copies its outputs out should not
    /// be timed.
    pub fn run_frame_staged<B: DirectViews<Mut = CudaMut>>(
        &self,
        arena: &mut Arena<FrameStaged, B>,
        size: ImageSize,
        decode: impl FnOnce(&Arc<CudaStream>, &mut DeviceViewMut<'_, u8>) -> Result<(), Error>,
        events: Option<&StageEvents>,
        outputs: Option<&mut FrameOutputs>,
    ) -> Result<(), Error> {
        Self::check_size("frame", size)?;
        if let Some(o) = &outputs {
            if o.size != size {
                return Err(invalid(format!(
                    "outputs: made for a {} image, the frame is {size}",
                    o.size
                )));
            }
        }
        let mut s = arena.stage_mut::<DECODE>();
        let stream = s.rgb.stream().clone();
        self.check_stream("frame", &stream)?;
        decode(&stream, &mut image(&mut s.rgb, "rgb", 3, size)?)?;
        self.stages(arena, &stream, size, events, outputs)
    }

    /// Captures one frame of `size` on an aliased [`FrameStaged`] arena into a graph of the
    /// arena: the stages of [`run_frame_staged`](Self::run_frame_staged) from `gray` to `mask`,
    /// recorded through each stage's own views in stage order on the arena's stream, so the
    /// graph is one chain in stage order and a buffer's bytes are reused only after its last
    /// reader ran. Stage `decode` stays outside: upload each frame's input between replays
    /// ([`upload_input_staged`]); after a replay, the outputs live in stage `mask` are there to
    /// read ([`download_mask_stage`]).
    ///
    /// Safe for the reasons [`capture_frame`](Self::capture_frame) is.
    pub fn capture_frame_staged<'a, B: DirectViews<Mut = CudaMut> + StreamOrdered>(
        &'a self,
        arena: &'a mut Arena<FrameStaged, B>,
        size: ImageSize,
    ) -> Result<ArenaGraph<'a, FrameStaged, B>, Error> {
        // SAFETY: as in `capture_frame`: `record_frame_staged` queues this crate's kernels on
        // the capture's stage views of the arena alone (no events, no outputs), on a stream
        // of the capture's own, and `only_the_frame` checks the number of its operations.
        let graph = unsafe {
            arena.capture_on_own_stream(|capture| self.record_frame_staged(capture, size))
        }?;
        only_the_frame(graph, "capture_frame_staged")
    }

    /// Records the stages `gray` … `mask` of one frame of `size` into a capture of a
    /// [`FrameStaged`] arena, after whatever the capture recorded before — stage `decode`'s
    /// copy of the input from a resident device buffer, say, which then replays with the rest:
    /// [`capture_frame_staged`](Self::capture_frame_staged) is this alone.
    pub fn record_frame_staged<B: DirectViews<Mut = CudaMut> + StreamOrdered>(
        &self,
        capture: &mut Capture<'_, FrameStaged, B>,
        size: ImageSize,
    ) -> Result<(), Error> {
        Self::check_size("frame", size)?;
        let stream = capture.stream().clone();
        self.check_stream("frame", &stream)?;
        self.stages(capture, &stream, size, None, None)
    }

    /// The stages `gray` … `mask` of a frame of `size` on the stage views of `frames` (an arena
    /// or a capture of one), every buffer cut to the frame.
    fn stages(
        &self,
        frames: &mut impl StagedViews,
        stream: &Arc<CudaStream>,
        size: ImageSize,
        events: Option<&StageEvents>,
        mut outputs: Option<&mut FrameOutputs>,
    ) -> Result<(), Error> {
        let mark = |i: usize| events.map_or(Ok(()), |e| e.record(i, stream));

        mark(0)?;
        let mut s = frames.stage::<GRAY>();
        let rgb = image(&mut s.rgb, "rgb", 3, size)?;
        self.rgb_to_gray(
            stream,
            size,
            &rgb,
            &mut image(&mut s.gray, "gray", 1, size)?,
        )?;
        mark(1)?;

        let mut s = frames.stage::<BLUR_ROWS>();
        let gray = image(&mut s.gray, "gray", 1, size)?;
        self.blur_rows(
            stream,
            size,
            &gray,
            &mut image(&mut s.scratch, "scratch", 1, size)?,
        )?;
        mark(2)?;
        if let Some(o) = outputs.as_deref_mut() {
            gray.download(&mut o.gray)?;
        }

        let mut s = frames.stage::<BLUR_COLUMNS>();
        let scratch = image(&mut s.scratch, "scratch", 1, size)?;
        let mut blurred = image(&mut s.blurred, "blurred", 1, size)?;
        self.blur_columns(stream, size, &scratch, &mut blurred)?;
        mark(3)?;
        if let Some(o) = outputs.as_deref_mut() {
            scratch.download(&mut o.scratch)?;
        }

        let mut s = frames.stage::<SOBEL>();
        let blurred = image(&mut s.blurred, "blurred", 1, size)?;
        let mut magnitude = image(&mut s.magnitude, "magnitude", 1, size)?;
        self.sobel(stream, size, &blurred, &mut magnitude)?;
        mark(4)?;
        if let Some(o) = outputs.as_deref_mut() {
            blurred.download(&mut o.blurred)?;
        }

        let mut s = frames.stage::<THRESHOLD>();
        let magnitude = image(&mut s.magnitude, "magnitude", 1, size)?;
        self.histogram(stream, &magnitude, &mut s.hist)?;
        mark(5)?;
        self.otsu_threshold(stream, &s.hist, &mut s.threshold)?;
        mark(6)?;
        if let Some(o) = outputs.as_deref_mut() {
            s.hist.download(&mut o.hist)?;
        }

        let mut s = frames.stage::<MASK>();
        let magnitude = image(&mut s.magnitude, "magnitude", 1, size)?;
        let mut mask = image(&mut s.mask, "mask", 1, size)?;
        self.edge_mask(stream, &magnitude, &s.threshold, &mut mask)?;
        mark(7)?;
        if let Some(o) = outputs {
            download_mask_outputs(&magnitude, &s.threshold, &mask, o)?;
        }
        Ok(())
    }
}

/// [`FrameStaged`]'s stages, by index (the order of `#[layout(stages(..))]`).
const DECODE: usize = 0;
const GRAY: usize = 1;
const BLUR_ROWS: usize = 2;
const BLUR_COLUMNS: usize = 3;
const SOBEL: usize = 4;
const THRESHOLD: usize = 5;
const MASK: usize = 6;

/// The stage views of a [`FrameStaged`] arena, from the arena itself (an eager frame) or from
/// a capture of it (a frame recorded into a graph): one frame's code serves both.
trait StagedViews {
    /// The device views of the fields live in stage `S`.
    fn stage<const S: usize>(&mut self) -> <FrameStaged as LayoutStage<S>>::StageViews<'_, CudaMut>
    where
        FrameStaged: LayoutStage<S>;
}

impl<B: DirectViews<Mut = CudaMut>> StagedViews for Arena<FrameStaged, B> {
    fn stage<const S: usize>(&mut self) -> <FrameStaged as LayoutStage<S>>::StageViews<'_, CudaMut>
    where
        FrameStaged: LayoutStage<S>,
    {
        self.stage_mut::<S>()
    }
}

impl<B: DirectViews<Mut = CudaMut> + StreamOrdered> StagedViews for Capture<'_, FrameStaged, B> {
    fn stage<const S: usize>(&mut self) -> <FrameStaged as LayoutStage<S>>::StageViews<'_, CudaMut>
    where
        FrameStaged: LayoutStage<S>,
    {
        self.stage_mut::<S>()
    }
}

/// The first `per_pixel · pixels` elements of an image buffer's view: the view cut to a frame of
/// `size`.
fn image<'v, T>(
    view: &'v mut DeviceViewMut<'_, T>,
    name: &str,
    per_pixel: usize,
    size: ImageSize,
) -> Result<DeviceViewMut<'v, T>, Error> {
    // (Saturating: a size past `usize` is refused by the check, not an overflow.)
    let needed = per_pixel.saturating_mul(size.pixels());
    check_room("frame", name, view.len(), needed, size)?;
    view.slice_mut(..needed)
}

/// Downloads what a frame leaves in stage `mask` of a [`FrameStaged`] arena (magnitude,
/// threshold, mask, each cut to `outputs.size`) into `outputs`.
fn download_mask_outputs(
    magnitude: &DeviceViewMut<'_, f32>,
    threshold: &DeviceViewMut<'_, u32>,
    mask: &DeviceViewMut<'_, u8>,
    outputs: &mut FrameOutputs,
) -> Result<(), Error> {
    let size = outputs.size;
    check_room("outputs", "magnitude", magnitude.len(), size.pixels(), size)?;
    check_room("outputs", "mask", mask.len(), size.pixels(), size)?;
    magnitude
        .slice(..size.pixels())?
        .download(&mut outputs.magnitude)?;
    let mut t = [0u32];
    threshold.download(&mut t)?;
    outputs.threshold = t[0];
    mask.slice(..size.pixels())?.download(&mut outputs.mask)
}

/// Uploads a frame's input (`3 · pixels` bytes of RGB for a frame of `size`) into the `rgb`
/// buffer of a [`Frame`] graph, between replays, and waits for the copy.
pub fn upload_input<B: DirectViews<Mut = CudaMut> + StreamOrdered>(
    graph: &mut ArenaGraph<'_, Frame, B>,
    size: ImageSize,
    rgb: &[u8],
) -> Result<(), Error> {
    size.check("upload")?;
    check_len("upload", "input", rgb.len(), 3 * size.pixels(), Some(size))?;
    image(&mut graph.views_mut().rgb, "rgb", 3, size)?.upload(rgb)
}

/// Uploads a frame's input into stage `decode` of a [`FrameStaged`] graph, between replays
/// (its bytes are reused by later stages, so every frame needs it again), and waits for the
/// copy.
pub fn upload_input_staged<B: DirectViews<Mut = CudaMut> + StreamOrdered>(
    graph: &mut ArenaGraph<'_, FrameStaged, B>,
    size: ImageSize,
    rgb: &[u8],
) -> Result<(), Error> {
    size.check("upload")?;
    check_len("upload", "input", rgb.len(), 3 * size.pixels(), Some(size))?;
    image(&mut graph.stage_mut::<DECODE>().rgb, "rgb", 3, size)?.upload(rgb)
}

/// Downloads the outputs a replay of a [`FrameStaged`] graph leaves in stage `mask` (the last
/// one): magnitude, threshold and mask, cut to `outputs.size`. The other buffers' bytes have
/// been reused by then (run [`PipelineKernels::run_frame_staged`] with `outputs` for all of
/// them).
pub fn download_mask_stage<B: DirectViews<Mut = CudaMut> + StreamOrdered>(
    graph: &mut ArenaGraph<'_, FrameStaged, B>,
    outputs: &mut FrameOutputs,
) -> Result<(), Error> {
    let s = graph.stage_mut::<MASK>();
    download_mask_outputs(&s.magnitude, &s.threshold, &s.mask, outputs)
}

/// One cudarc allocation per frame buffer: the way device buffers are usually made, and the
/// baseline a [`Frame`] arena replaces with a single allocation.
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

/// The operations a captured frame holds: the seven kernels of [`PipelineKernels::run_frame`]
/// and the histogram's reset, as [`PipelineKernels::capture_frame`] and
/// [`PipelineKernels::capture_frame_staged`] record them.
pub const FRAME_GRAPH_NODES: usize = 8;

/// `graph`, where its operations are the frame's in number; an error otherwise (the graph is
/// dropped unlaunched). (The capture's stream is the call's own, so no other thread's work can
/// be in it: a guard, not a path expected to run.)
fn only_the_frame<'a, L: devarena::DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered>(
    graph: ArenaGraph<'a, L, B>,
    call: &str,
) -> Result<ArenaGraph<'a, L, B>, Error> {
    let nodes = graph.nodes();
    if nodes == FRAME_GRAPH_NODES {
        return Ok(graph);
    }
    Err(invalid(format!(
        "{call}: the capture recorded {nodes} operations where a frame has \
         {FRAME_GRAPH_NODES}; the graph was discarded without a replay"
    )))
}

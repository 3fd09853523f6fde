//! Steady state: one pipeline frame on buffers made every way, against the floor of raw
//! buffers allocated once by hand; and the same frame replayed from a CUDA graph (of the arena,
//! and of the raw buffers), at 1920×1080 and at 256×256.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaGraph, CudaStream, result, sys};
use devarena::backend::cuda::{CudaBackend, DeviceViewMut};
use devarena::{Arena, Capture, DeviceLayout, Error, FieldPlacement};
use devarena_kernels::pipeline::cuda::{
    FrameSlices, PipelineKernels, RawFrame, driver_error, upload_input,
};
use devarena_kernels::pipeline::image::{DEFAULT_SEED, synthetic_frame};
use devarena_kernels::pipeline::{
    FRAME_SIZE, Frame, FrameBuffers, FramePaged, FrameStaged, HIST_BINS, ImageSize, PIXELS,
};

use crate::driver::{RawBuffers, field_sizes, median, sync};
use crate::report::{Target, esc, us};

/// One frame of a method; returns its submit time: from the first call to the last one that
/// queues work, before the wait for the device that ends every frame.
type Runner<'k> = Box<dyn FnMut() -> Result<Duration, Error> + 'k>;

const RESIDENT: &str = "1920×1080, from a resident input";
const SMALL: &str = "256×256, from a resident input";
const COPIED: &str = "1920×1080, input copied in every frame (6 MB device to device)";

/// The small frame of the graph comparison: where launch overhead dominates.
const SMALL_SIZE: ImageSize = ImageSize::new(256, 256);

/// Method names the targets refer to.
const FLOOR: &str = "raw cudarc, buffers allocated once (floor)";
const ARENA: &str = "arena (Frame on CudaBackend)";
const ARENA_GRAPH: &str = "arena, one graph replay (ArenaGraph)";
const RAW_GRAPH: &str = "  raw cudarc buffers, one graph replay";

pub struct SteadyRow {
    group: &'static str,
    method: &'static str,
    /// The floor of its group: the other rows are compared with it.
    floor: bool,
    /// Median frame time.
    frame: Duration,
    /// Median submit time (queuing the frame's work, before the wait).
    submit: Duration,
}

/// Where the buffer of the field `name` lies in `fields`.
fn field<'f>(fields: &'f [FieldPlacement], name: &str) -> Option<(usize, &'f FieldPlacement)> {
    fields.iter().enumerate().find(|(_, f)| f.name == name)
}

/// A frame's buffers as raw addresses, `addr` giving the address of the buffer of each of
/// `Frame`'s field names.
fn raw_frame(addr: impl Fn(&str) -> Option<sys::CUdeviceptr>) -> Result<RawFrame, Error> {
    let at = |name: &str| {
        addr(name).ok_or_else(|| Error::InvalidArgument {
            what: format!("the frame has no `{name}` buffer"),
        })
    };
    Ok(RawFrame {
        rgb: at("rgb")?,
        gray: at("gray")?,
        scratch: at("scratch")?,
        blurred: at("blurred")?,
        magnitude: at("magnitude")?,
        hist: at("hist")?,
        threshold: at("threshold")?,
        mask: at("mask")?,
    })
}

/// The device addresses of the frame buffers of an arena of `L` (a layout with `Frame`'s
/// field names).
fn arena_frame<L: DeviceLayout>(arena: &Arena<L, CudaBackend>) -> Result<RawFrame, Error> {
    raw_frame(|name| field(L::FIELDS, name).map(|(_, f)| arena.addr() + f.offset as u64))
}

/// Queues a copy of the 1080p input from `src` to `dst` on `stream` (6 MB, device to
/// device).
///
/// # Safety
///
/// `src` and `dst` must each address `3 · PIXELS` bytes of live device memory in the
/// stream's context, `dst` used by nothing else until the copy completes.
unsafe fn copy_input(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
) -> Result<(), Error> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_dtod_async(dst, src, PIXELS * 3, stream.cu_stream()) }
        .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
}

/// Queues one frame with an allocation around every kernel: each stage allocates its output
/// and frees the buffers no later stage reads. `cuMemFree` waits for the device before it
/// frees (the implicit synchronization that makes this pattern slow), so nothing is freed
/// under a running kernel; the async variant orders its frees on the stream instead.
///
/// # Safety
///
/// `rgb` must hold the 1080p input in the kernels' context; `alloc` must return device
/// buffers of the requested size usable on `stream`, `free` must free them.
unsafe fn frame_alloc_each(
    kernels: &PipelineKernels,
    stream: &CudaStream,
    rgb: sys::CUdeviceptr,
    alloc: &dyn Fn(usize) -> Result<sys::CUdeviceptr, Error>,
    free: &dyn Fn(sys::CUdeviceptr) -> Result<(), Error>,
) -> Result<(), Error> {
    let (size, px) = (FRAME_SIZE, PIXELS);
    // SAFETY: every buffer is allocated at its stage's size just before its kernel and
    // freed after the last kernel that reads it was queued (see above).
    unsafe {
        let gray = alloc(px * 4)?;
        kernels.rgb_to_gray_raw(stream, size, rgb, gray)?;
        let scratch = alloc(px * 4)?;
        kernels.blur_rows_raw(stream, size, gray, scratch)?;
        free(gray)?;
        let blurred = alloc(px * 4)?;
        kernels.blur_columns_raw(stream, size, scratch, blurred)?;
        free(scratch)?;
        let magnitude = alloc(px * 4)?;
        kernels.sobel_raw(stream, size, blurred, magnitude)?;
        free(blurred)?;
        let hist = alloc(HIST_BINS * 4)?;
        kernels.histogram_raw(stream, px as u32, magnitude, hist)?;
        let threshold = alloc(4)?;
        kernels.otsu_threshold_raw(stream, hist, threshold)?;
        free(hist)?;
        let mask = alloc(px)?;
        kernels.edge_mask_raw(stream, px as u32, magnitude, threshold, mask)?;
        free(magnitude)?;
        free(threshold)?;
        // The result has been consumed (a real program would download it first).
        free(mask)?;
    }
    // The caller waits for the stream (the frame's end, after its submit time).
    Ok(())
}

/// A graph of `record`'s launches on `stream`, captured through cudarc (the raw floor's graph):
/// the capture is ended also when `record` fails.
fn raw_graph(
    stream: &Arc<CudaStream>,
    record: impl FnOnce() -> Result<(), Error>,
) -> Result<CudaGraph, Error> {
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| driver_error("cuStreamBeginCapture", e))?;
    let recorded = record();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    recorded?;
    graph
        .map_err(|e| driver_error("cuStreamEndCapture", e))?
        .ok_or_else(|| Error::InvalidArgument {
            what: "the capture recorded no graph".into(),
        })
}

/// The synthetic input of `size`.
fn input_of(size: ImageSize) -> Result<Vec<u8>, Error> {
    let mut input = vec![0u8; size.pixels() * 3];
    synthetic_frame(size, DEFAULT_SEED, &mut input)?;
    Ok(input)
}

/// Runs `queue`, returns how long it took (the frame's submit time), then waits for `stream`.
fn submit_and_wait(
    stream: &CudaStream,
    queue: impl FnOnce() -> Result<(), Error>,
) -> Result<Duration, Error> {
    let start = Instant::now();
    queue()?;
    let submit = start.elapsed();
    sync(stream)?;
    Ok(submit)
}

pub fn measure(
    kernels: &PipelineKernels,
    stream: &Arc<CudaStream>,
    backend: &CudaBackend,
    frames: usize,
) -> Result<Vec<SteadyRow>, Error> {
    let input = input_of(FRAME_SIZE)?;
    let small_input = input_of(SMALL_SIZE)?;
    let upload = |dst: sys::CUdeviceptr, input: &[u8]| {
        // SAFETY: `dst` holds at least `input.len()` bytes; the copy completes before `sync`
        // returns.
        unsafe { result::memcpy_htod_async(dst, input, stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        sync(stream)
    };

    // The floor: `Frame`'s eight buffers allocated once (room for the largest frame, as the
    // arena has), raw pointers, no checks.
    let floor_buffers = RawBuffers::alloc(&field_sizes(Frame::FIELDS))?;
    let raw = raw_frame(|name| field(Frame::FIELDS, name).map(|(i, _)| floor_buffers.0[i]))?;
    upload(raw.rgb, &input)?;
    // The resident input of the allocate-around-each-kernel methods and the source of the
    // per-frame input copies, and the small frame's input for the floor: allocated once.
    let input_buffers = RawBuffers::alloc(&[PIXELS * 3, SMALL_SIZE.pixels() * 3])?;
    let rgb = input_buffers.0[0];
    upload(rgb, &input)?;
    let raw_small = RawFrame {
        rgb: input_buffers.0[1],
        ..raw
    };
    upload(raw_small.rgb, &small_input)?;
    let mut slices = FrameSlices::alloc(stream, FRAME_SIZE)?;
    stream
        .memcpy_htod(&input, &mut slices.rgb)
        .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
    let arena_with = |size: ImageSize, input: &[u8]| -> Result<Arena<Frame, CudaBackend>, Error> {
        let mut arena = Arena::<Frame, _>::new_in(backend.clone())?;
        arena
            .views_mut()
            .rgb
            .slice_mut(..size.pixels() * 3)?
            .upload(input)?;
        Ok(arena)
    };
    let mut arena = arena_with(FRAME_SIZE, &input)?;
    let mut small_arena = arena_with(SMALL_SIZE, &small_input)?;
    let mut staged = Arena::<FrameStaged, _>::new_in(backend.clone())?;
    // Diagnostics of the arena's distance to the floor: the arena's own addresses without
    // the checks of `run_frame`, and the same buffers each aligned to a 2 MiB page as the
    // floor's separate allocations are.
    let arena_raw = arena_frame(&arena)?;
    let mut paged = Arena::<FramePaged, _>::new_in(backend.clone())?;
    paged
        .views_mut()
        .rgb
        .slice_mut(..input.len())?
        .upload(&input)?;
    let paged_raw = arena_frame(&paged)?;

    // The graphs: each arena graph borrows an arena of its own for as long as it lives, with
    // its input resident (uploaded once, as the eager rows' is).
    let mut graph_arena = Arena::<Frame, _>::new_in(backend.clone())?;
    let mut graph = kernels.capture_frame(&mut graph_arena, FRAME_SIZE)?;
    upload_input(&mut graph, FRAME_SIZE, &input)?;
    let mut small_graph_arena = Arena::<Frame, _>::new_in(backend.clone())?;
    let mut small_graph = kernels.capture_frame(&mut small_graph_arena, SMALL_SIZE)?;
    upload_input(&mut small_graph, SMALL_SIZE, &small_input)?;
    let mut staged_graph_arena = Arena::<FrameStaged, _>::new_in(backend.clone())?;
    let record = |capture: &mut Capture<'_, FrameStaged, CudaBackend>| {
        let stream = capture.stream().clone();
        let decode = capture.stage_mut::<0>();
        // SAFETY: the view holds the frame's input bytes (stage `decode`), exclusively
        // borrowed while the copy is queued; `rgb` holds the input and outlives the graph
        // (both live until the end of this function).
        unsafe { copy_input(&stream, decode.rgb.device_addr(), rgb) }?;
        // The stages, through the very code of an eager frame, recorded after the copy.
        kernels.record_frame_staged(capture, FRAME_SIZE)
    };
    // SAFETY: besides the arena, the graph reaches `rgb` (the resident input, read by the
    // captured copy) and `kernels`' module, both live until the end of this function, after
    // the graph's last replay has finished (the runs synchronize) and it is dropped.
    let mut staged_graph = unsafe { staged_graph_arena.capture(record) }?;
    let raw_graph_1080 = raw_graph(stream, || {
        // SAFETY: `raw` addresses buffers of the floor, live until the end of this function
        // (longer than the graph), with room for the frame.
        unsafe { kernels.run_frame_raw(stream, FRAME_SIZE, &raw, None) }
    })?;
    let raw_graph_small = raw_graph(stream, || {
        // SAFETY: as above, for the small frame.
        unsafe { kernels.run_frame_raw(stream, SMALL_SIZE, &raw_small, None) }
    })?;
    let launch_raw = |g: &CudaGraph| g.launch().map_err(|e| driver_error("cuGraphLaunch", e));

    let s = stream.cu_stream();
    let alloc_sync = |bytes| {
        // SAFETY: a plain allocation, freed by `free_sync` below within the frame.
        unsafe { result::malloc_sync(bytes) }.map_err(|e| driver_error("cuMemAlloc", e))
    };
    let free_sync = |p| {
        // SAFETY: allocated by `alloc_sync` within this frame, freed once.
        unsafe { result::free_sync(p) }.map_err(|e| driver_error("cuMemFree", e))
    };
    let alloc_async = |bytes| {
        // SAFETY: a stream-ordered allocation, freed on the same stream within the frame.
        unsafe { result::malloc_async(s, bytes) }.map_err(|e| driver_error("cuMemAllocAsync", e))
    };
    let free_async = |p| {
        // SAFETY: allocated by `alloc_async` on this stream within this frame, freed once.
        unsafe { result::free_async(p, s) }.map_err(|e| driver_error("cuMemFreeAsync", e))
    };
    let wait = |queue: &mut dyn FnMut() -> Result<(), Error>| submit_and_wait(stream, queue);

    let mut methods: Vec<(&'static str, &'static str, bool, Runner<'_>)> = vec![
        (
            RESIDENT,
            FLOOR,
            true,
            Box::new(|| {
                // SAFETY: `raw` addresses eight live buffers holding the frame.
                wait(&mut || unsafe { kernels.run_frame_raw(stream, FRAME_SIZE, &raw, None) })
            }),
        ),
        (
            RESIDENT,
            ARENA,
            false,
            Box::new(|| {
                wait(&mut || {
                    let mut views = arena.views_mut();
                    kernels.run_frame(stream, FRAME_SIZE, FrameBuffers::from(&mut views), None)
                })
            }),
        ),
        (
            RESIDENT,
            "  arena addresses, no per-frame checks",
            false,
            Box::new(|| {
                // SAFETY: the arena (alive until the end of this function) holds eight
                // buffers with room for the frame at these addresses.
                wait(&mut || unsafe { kernels.run_frame_raw(stream, FRAME_SIZE, &arena_raw, None) })
            }),
        ),
        (
            RESIDENT,
            "  arena, every field 2 MiB-aligned",
            false,
            Box::new(|| {
                let _keep = &paged;
                // SAFETY: `paged` (alive until the end of this function) holds eight buffers
                // with room for the frame at these addresses.
                wait(&mut || unsafe { kernels.run_frame_raw(stream, FRAME_SIZE, &paged_raw, None) })
            }),
        ),
        (
            RESIDENT,
            "cudarc CudaSlice per buffer, allocated once",
            false,
            Box::new(|| {
                wait(&mut || kernels.run_frame(stream, FRAME_SIZE, slices.buffers(), None))
            }),
        ),
        (
            RESIDENT,
            "cuMemAlloc/cuMemFree around each kernel",
            false,
            Box::new(move || {
                // SAFETY: `rgb` holds the input; the closures allocate and free.
                wait(&mut || unsafe {
                    frame_alloc_each(kernels, stream, rgb, &alloc_sync, &free_sync)
                })
            }),
        ),
        (
            RESIDENT,
            "cuMemAllocAsync/cuMemFreeAsync around each kernel",
            false,
            Box::new(move || {
                // SAFETY: as above, stream-ordered.
                wait(&mut || unsafe {
                    frame_alloc_each(kernels, stream, rgb, &alloc_async, &free_async)
                })
            }),
        ),
        (
            RESIDENT,
            RAW_GRAPH,
            false,
            Box::new(|| wait(&mut || launch_raw(&raw_graph_1080))),
        ),
        (
            RESIDENT,
            ARENA_GRAPH,
            false,
            Box::new(move || wait(&mut || graph.launch())),
        ),
        (
            SMALL,
            FLOOR,
            true,
            Box::new(|| {
                // SAFETY: `raw_small` addresses eight live buffers holding the small frame.
                wait(&mut || unsafe { kernels.run_frame_raw(stream, SMALL_SIZE, &raw_small, None) })
            }),
        ),
        (
            SMALL,
            ARENA,
            false,
            Box::new(|| {
                wait(&mut || {
                    let mut views = small_arena.views_mut();
                    kernels.run_frame(stream, SMALL_SIZE, FrameBuffers::from(&mut views), None)
                })
            }),
        ),
        (
            SMALL,
            RAW_GRAPH,
            false,
            Box::new(|| wait(&mut || launch_raw(&raw_graph_small))),
        ),
        (
            SMALL,
            ARENA_GRAPH,
            false,
            Box::new(move || wait(&mut || small_graph.launch())),
        ),
        (
            COPIED,
            "raw cudarc floor + the input copy",
            true,
            Box::new(|| {
                // SAFETY: `raw.rgb` and `rgb` hold the input's bytes; nothing else uses
                // `raw` while the frame runs.
                wait(&mut || unsafe {
                    copy_input(stream, raw.rgb, rgb)?;
                    kernels.run_frame_raw(stream, FRAME_SIZE, &raw, None)
                })
            }),
        ),
        (
            COPIED,
            "arena, aliased (FrameStaged, stage views)",
            false,
            Box::new(move || {
                wait(&mut || {
                    let decode = |s: &Arc<CudaStream>, view: &mut DeviceViewMut<'_, u8>| {
                        // SAFETY: the view holds the frame's input bytes, exclusively
                        // borrowed; `rgb` holds the input.
                        unsafe { copy_input(s, view.device_addr(), rgb) }
                    };
                    kernels.run_frame_staged(&mut staged, FRAME_SIZE, decode, None, None)
                })
            }),
        ),
        (
            COPIED,
            "arena, aliased, one graph replay (copy captured)",
            false,
            Box::new(move || wait(&mut || staged_graph.launch())),
        ),
    ];

    // Warm up every method, then alternate between them in passes of 10 frames.
    for (.., run) in methods.iter_mut() {
        for _ in 0..5 {
            run()?;
        }
    }
    let mut samples: Vec<(Vec<Duration>, Vec<Duration>)> = methods
        .iter()
        .map(|_| (Vec::with_capacity(frames), Vec::with_capacity(frames)))
        .collect();
    let mut done = 0;
    while done < frames {
        let pass = (frames - done).min(10);
        for ((.., run), (times, submits)) in methods.iter_mut().zip(samples.iter_mut()) {
            for _ in 0..pass {
                let start = Instant::now();
                let submit = run()?;
                times.push(start.elapsed());
                submits.push(submit);
            }
        }
        done += pass;
    }
    Ok(methods
        .iter()
        .zip(samples.iter_mut())
        .map(|((group, method, floor, _), (times, submits))| SteadyRow {
            group,
            method,
            floor: *floor,
            frame: median(times),
            submit: median(submits),
        })
        .collect())
}

/// The floor of `row`'s group.
fn floor_of<'r>(rows: &'r [SteadyRow], row: &SteadyRow) -> Option<&'r SteadyRow> {
    rows.iter().find(|r| r.floor && r.group == row.group)
}

/// `row`'s frame time over its floor's, in percent.
fn over_floor(rows: &[SteadyRow], row: &SteadyRow) -> Option<f64> {
    ratio(rows, row).map(|r| (r - 1.0) * 100.0)
}

/// `row`'s frame time over its floor's.
fn ratio(rows: &[SteadyRow], row: &SteadyRow) -> Option<f64> {
    floor_of(rows, row).map(|f| us(row.frame) / us(f.frame))
}

/// The row of `method` in `group`.
fn row<'r>(rows: &'r [SteadyRow], group: &str, method: &str) -> Option<&'r SteadyRow> {
    rows.iter().find(|r| r.group == group && r.method == method)
}

/// The eager arenas within 1% of their floors; the graph-replayed arena at 0.85 × the eager
/// floor at 1920×1080 and 0.55 × at 256×256; a replayed frame submitted in 3 µs.
pub fn targets(rows: &[SteadyRow]) -> Vec<Target> {
    let mut targets: Vec<Target> = rows
        .iter()
        .filter(|r| {
            r.group != SMALL && r.method.starts_with("arena") && !r.method.contains("graph")
        })
        .filter_map(|r| {
            let floor = floor_of(rows, r)?;
            let over = over_floor(rows, r)?;
            Some(Target {
                what: format!(
                    "{}: {}: frame time over `{}`",
                    r.group, r.method, floor.method
                ),
                value: format!(
                    "{over:+.2}% ({:.1} / {:.1} µs)",
                    us(r.frame),
                    us(floor.frame)
                ),
                target: "≤ +1%",
                met: over <= 1.0,
            })
        })
        .collect();
    for (group, bound, target) in [(RESIDENT, 0.85, "≤ 0.85 ×"), (SMALL, 0.55, "≤ 0.55 ×")] {
        let Some(r) = row(rows, group, ARENA_GRAPH) else {
            continue;
        };
        if let (Some(floor), Some(x)) = (floor_of(rows, r), ratio(rows, r)) {
            targets.push(Target {
                what: format!("{group}: graph-replayed arena over the eager floor"),
                value: format!("{x:.3} × ({:.1} / {:.1} µs)", us(r.frame), us(floor.frame)),
                target,
                met: x <= bound,
            });
        }
        targets.push(Target {
            what: format!("{group}: CPU time to submit a replayed frame (graph.launch())"),
            value: format!("{:.2} µs", us(r.submit)),
            target: "≤ 3 µs",
            met: us(r.submit) <= 3.0,
        });
    }
    targets
}

pub fn print(rows: &[SteadyRow]) {
    println!(
        "steady state: one frame (7 kernels + histogram reset, then synchronize), launched \
         eagerly or replayed from a CUDA graph"
    );
    for group in rows.chunk_by(|a, b| a.group == b.group) {
        println!(
            "{:<52} {:>10} {:>10} {:>10} {:>9} {:>10}",
            group[0].group, "frame µs", "frames/s", "vs floor", "× floor", "submit µs"
        );
        for r in group {
            let vs = over_floor(rows, r).map_or("-".into(), |o| format!("{o:>+9.1}%"));
            let x = ratio(rows, r).map_or("-".into(), |x| format!("{x:.3}"));
            println!(
                "  {:<50} {:>10.1} {:>10.0} {:>10} {:>9} {:>10.2}",
                r.method,
                us(r.frame),
                1.0 / r.frame.as_secs_f64(),
                vs,
                x,
                us(r.submit)
            );
        }
    }
    println!(
        "(submit µs: CPU time to queue the frame's work, before the wait that ends it: the \
         launches, or one graph.launch())"
    );
}

pub fn json(rows: &[SteadyRow], r: &SteadyRow) -> String {
    let vs = over_floor(rows, r).map_or("null".into(), |o| format!("{o:.3}"));
    let x = ratio(rows, r).map_or("null".into(), |x| format!("{x:.4}"));
    format!(
        "{{\"group\":\"{}\",\"method\":\"{}\",\"floor\":{},\"frame_us\":{:.3},\"frames_per_s\":{:.3},\"vs_floor_percent\":{},\"ratio_to_floor\":{},\"submit_us\":{:.3}}}",
        esc(r.group),
        esc(r.method),
        r.floor,
        us(r.frame),
        1.0 / r.frame.as_secs_f64(),
        vs,
        x,
        us(r.submit)
    )
}

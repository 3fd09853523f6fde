//! Steady state: one pipeline frame on buffers made every way, against the floor of raw
//! buffers allocated once by hand.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, result, sys};
use devarena::backend::cuda::{CudaBackend, DeviceViewMut};
use devarena::{Arena, DeviceLayout, Error, FieldPlacement};
use devarena_kernels::pipeline::cuda::{FrameSlices, PipelineKernels, RawFrame, driver_error};
use devarena_kernels::pipeline::image::{DEFAULT_SEED, synthetic_frame};
use devarena_kernels::pipeline::{
    FRAME_SIZE, Frame, FrameBuffers, FramePaged, FrameStaged, HIST_BINS, PIXELS,
};

use crate::driver::{RawBuffers, field_sizes, median, sync};
use crate::report::{Target, esc, us};

type Runner<'k> = Box<dyn FnMut() -> Result<(), Error> + 'k>;

const RESIDENT: &str = "from a resident input";
const COPIED: &str = "input copied in every frame (6 MB device to device)";

pub struct SteadyRow {
    group: &'static str,
    method: &'static str,
    /// The floor of its group: the other rows are compared with it.
    floor: bool,
    /// Median frame time.
    frame: Duration,
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

/// One frame with an allocation around every kernel: each stage allocates its output and
/// frees the buffers no later stage reads. `cuMemFree` waits for the device before it
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
    sync(stream)
}

pub fn measure(
    kernels: &PipelineKernels,
    stream: &Arc<CudaStream>,
    backend: &CudaBackend,
    frames: usize,
) -> Result<Vec<SteadyRow>, Error> {
    let mut input = vec![0u8; PIXELS * 3];
    synthetic_frame(FRAME_SIZE, DEFAULT_SEED, &mut input)?;
    let upload = |dst: sys::CUdeviceptr| {
        // SAFETY: `dst` holds `PIXELS * 3` bytes; the copy completes before `sync` returns.
        unsafe { result::memcpy_htod_async(dst, &input, stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        sync(stream)
    };

    // The floor: `Frame`'s eight buffers allocated once, raw pointers, no checks.
    let floor_buffers = RawBuffers::alloc(&field_sizes(Frame::FIELDS))?;
    let raw = raw_frame(|name| field(Frame::FIELDS, name).map(|(i, _)| floor_buffers.0[i]))?;
    upload(raw.rgb)?;
    // The resident input of the allocate-around-each-kernel methods and the source of the
    // per-frame input copies: allocated once.
    let input_buffer = RawBuffers::alloc(&[PIXELS * 3])?;
    let rgb = input_buffer.0[0];
    upload(rgb)?;
    let mut slices = FrameSlices::alloc(stream, FRAME_SIZE)?;
    stream
        .memcpy_htod(&input, &mut slices.rgb)
        .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
    let mut arena = Arena::<Frame, _>::new_in(backend.clone())?;
    arena.views_mut().rgb.upload(&input)?;
    let mut staged = Arena::<FrameStaged, _>::new_in(backend.clone())?;
    // Diagnostics of the arena's distance to the floor: the arena's own addresses without
    // the checks of `run_frame`, and the same buffers each aligned to a 2 MiB page as the
    // floor's separate allocations are.
    let arena_raw = arena_frame(&arena)?;
    let mut paged = Arena::<FramePaged, _>::new_in(backend.clone())?;
    paged.views_mut().rgb.upload(&input)?;
    let paged_raw = arena_frame(&paged)?;

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

    let mut methods: Vec<(&'static str, &'static str, bool, Runner<'_>)> = vec![
        (
            RESIDENT,
            "raw cudarc, buffers allocated once (floor)",
            true,
            Box::new(|| {
                // SAFETY: `raw` addresses eight live buffers of the frame's sizes.
                unsafe { kernels.run_frame_raw(stream, FRAME_SIZE, &raw, None) }?;
                sync(stream)
            }),
        ),
        (
            RESIDENT,
            "arena (Frame on CudaBackend)",
            false,
            Box::new(move || {
                let mut views = arena.views_mut();
                kernels.run_frame(stream, FRAME_SIZE, FrameBuffers::from(&mut views), None)?;
                sync(stream)
            }),
        ),
        (
            RESIDENT,
            "  arena addresses, no per-frame checks",
            false,
            Box::new(|| {
                // SAFETY: the arena (alive until the end of this function) holds eight
                // buffers of the frame's sizes at these addresses.
                unsafe { kernels.run_frame_raw(stream, FRAME_SIZE, &arena_raw, None) }?;
                sync(stream)
            }),
        ),
        (
            RESIDENT,
            "  arena, every field 2 MiB-aligned",
            false,
            Box::new(move || {
                let _keep = &paged;
                // SAFETY: `paged` (moved into this closure) holds eight buffers of the
                // frame's sizes at these addresses.
                unsafe { kernels.run_frame_raw(stream, FRAME_SIZE, &paged_raw, None) }?;
                sync(stream)
            }),
        ),
        (
            RESIDENT,
            "cudarc CudaSlice per buffer, allocated once",
            false,
            Box::new(|| {
                kernels.run_frame(stream, FRAME_SIZE, slices.buffers(), None)?;
                sync(stream)
            }),
        ),
        (
            RESIDENT,
            "cuMemAlloc/cuMemFree around each kernel",
            false,
            Box::new(move || {
                // SAFETY: `rgb` holds the input; the closures allocate and free.
                unsafe { frame_alloc_each(kernels, stream, rgb, &alloc_sync, &free_sync) }
            }),
        ),
        (
            RESIDENT,
            "cuMemAllocAsync/cuMemFreeAsync around each kernel",
            false,
            Box::new(move || {
                // SAFETY: as above, stream-ordered.
                unsafe { frame_alloc_each(kernels, stream, rgb, &alloc_async, &free_async) }
            }),
        ),
        (
            COPIED,
            "raw cudarc floor + the input copy",
            true,
            Box::new(|| {
                // SAFETY: `raw.rgb` and `rgb` hold the input's bytes; nothing else uses
                // `raw` while the frame runs.
                unsafe {
                    copy_input(stream, raw.rgb, rgb)?;
                    kernels.run_frame_raw(stream, FRAME_SIZE, &raw, None)?;
                }
                sync(stream)
            }),
        ),
        (
            COPIED,
            "arena, aliased (FrameStaged, stage views)",
            false,
            Box::new(move || {
                let decode = |s: &Arc<CudaStream>, view: &mut DeviceViewMut<'_, u8>| {
                    // SAFETY: the view holds the frame's input bytes, exclusively borrowed;
                    // `rgb` holds the input.
                    unsafe { copy_input(s, view.device_addr(), rgb) }
                };
                kernels.run_frame_staged(&mut staged, decode, None, None)?;
                sync(stream)
            }),
        ),
    ];

    // Warm up every method, then alternate between them in passes of 10 frames.
    for (.., run) in methods.iter_mut() {
        for _ in 0..5 {
            run()?;
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(frames); methods.len()];
    let mut done = 0;
    while done < frames {
        let pass = (frames - done).min(10);
        for ((.., run), times) in methods.iter_mut().zip(samples.iter_mut()) {
            for _ in 0..pass {
                let start = Instant::now();
                run()?;
                times.push(start.elapsed());
            }
        }
        done += pass;
    }
    Ok(methods
        .iter()
        .zip(samples.iter_mut())
        .map(|((group, method, floor, _), times)| SteadyRow {
            group,
            method,
            floor: *floor,
            frame: median(times),
        })
        .collect())
}

/// The floor of `row`'s group.
fn floor_of<'r>(rows: &'r [SteadyRow], row: &SteadyRow) -> Option<&'r SteadyRow> {
    rows.iter().find(|r| r.floor && r.group == row.group)
}

/// `row`'s frame time over its floor's, in percent.
fn over_floor(rows: &[SteadyRow], row: &SteadyRow) -> Option<f64> {
    floor_of(rows, row).map(|f| (us(row.frame) / us(f.frame) - 1.0) * 100.0)
}

/// Every arena's frame time within 1% of its floor.
pub fn targets(rows: &[SteadyRow]) -> Vec<Target> {
    rows.iter()
        .filter(|r| r.method.starts_with("arena"))
        .filter_map(|r| {
            let floor = floor_of(rows, r)?;
            let over = over_floor(rows, r)?;
            Some(Target {
                what: format!("{}: frame time over `{}`", r.method, floor.method),
                value: format!(
                    "{over:+.2}% ({:.1} / {:.1} µs)",
                    us(r.frame),
                    us(floor.frame)
                ),
                target: "≤ +1%",
                met: over <= 1.0,
            })
        })
        .collect()
}

pub fn print(rows: &[SteadyRow]) {
    println!("steady state: one 1080p frame (7 kernels + histogram reset, then synchronize)");
    for group in rows.chunk_by(|a, b| a.group == b.group) {
        println!(
            "{:<52} {:>10} {:>10} {:>10}",
            group[0].group, "frame µs", "frames/s", "vs floor"
        );
        for r in group {
            let vs = over_floor(rows, r).map_or("-".into(), |o| format!("{o:>+9.1}%"));
            println!(
                "  {:<50} {:>10.1} {:>10.0} {:>10}",
                r.method,
                us(r.frame),
                1.0 / r.frame.as_secs_f64(),
                vs
            );
        }
    }
}

pub fn json(rows: &[SteadyRow], r: &SteadyRow) -> String {
    let vs = over_floor(rows, r).map_or("null".into(), |o| format!("{o:.3}"));
    format!(
        "{{\"group\":\"{}\",\"method\":\"{}\",\"floor\":{},\"frame_us\":{:.3},\"frames_per_s\":{:.3},\"vs_floor_percent\":{}}}",
        esc(r.group),
        esc(r.method),
        r.floor,
        us(r.frame),
        1.0 / r.frame.as_secs_f64(),
        vs
    )
}

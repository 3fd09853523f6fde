//! A 1080p edge-detection pipeline whose every buffer lives in one `#[derive(DeviceLayout)]`
//! arena, allocating nothing after setup.
//!
//! ```text
//! cargo run --release --example image_pipeline [-- INPUT.png] [--frames N] [--out DIR] [--host]
//! cargo run --release --example image_pipeline --features cuda      # on a machine with a GPU
//! ```
//!
//! RGB → grayscale → Gaussian blur (two passes through a scratch buffer) → Sobel magnitude →
//! 256-bin histogram → Otsu threshold → binary edge mask, every frame. With no input it
//! generates a deterministic 1920×1080 test frame (gradients, shapes, noise). The `Frame`
//! layout is planned at compile time for 1920×1080: an input of another size is resampled
//! (bilinear) to 1920×1080, and the program says so.
//!
//! Without a GPU (or with `--host`) the stages run on the host backend; built with
//! `--features cuda` and given a device, they run as PTX kernels. It prints per-stage times
//! (medians over the frames), frames/s, the layout table, `allocations after setup: 0` from
//! the backend's own counter, and writes gray, blurred, magnitude and mask PNGs, the layout
//! table and the SVG memory map to `--out` (default `out/`).

use std::error::Error as StdError;
use std::fs::{self, File};
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use devarena::{Arena, HostBackend, LayoutReport};
use devarena_kernels::pipeline::image::{DEFAULT_SEED, synthetic_frame};
use devarena_kernels::pipeline::{
    FRAME_SIZE, Frame, FrameBuffers, HEIGHT, HIST_SCALE, PIXELS, Stage, WIDTH, host, magnitude_bin,
};

type Result<T> = std::result::Result<T, Box<dyn StdError>>;

const USAGE: &str = "usage: image_pipeline [INPUT.png] [--frames N] [--out DIR] [--host]";

#[derive(Debug)]
struct Args {
    input: Option<PathBuf>,
    frames: usize,
    out: PathBuf,
    host: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        input: None,
        frames: 20,
        out: PathBuf::from("out"),
        host: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--frames" => {
                let v = it.next().ok_or("--frames needs a number")?;
                args.frames = v
                    .parse()
                    .map_err(|_| format!("--frames: `{v}` is not a number"))?;
                if args.frames == 0 {
                    return Err("--frames must be at least 1".into());
                }
            }
            "--out" => args.out = it.next().ok_or("--out needs a directory")?.into(),
            "--host" => args.host = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s if s.starts_with('-') => return Err(format!("unknown option `{s}`\n{USAGE}").into()),
            s => {
                if args.input.is_some() {
                    return Err(format!("more than one input given (`{s}`)\n{USAGE}").into());
                }
                args.input = Some(s.into());
            }
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    match parse_args().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a run produced, whichever backend ran it.
struct Run {
    backend: String,
    stage_times: Vec<Vec<Duration>>,
    frame_times: Vec<Duration>,
    threshold: u32,
    allocations_after_setup: Option<u64>,
    setup_note: String,
    written: Vec<PathBuf>,
}

fn run(args: Args) -> Result<()> {
    let (input, source) = match &args.input {
        Some(path) => load_png(path)?,
        None => {
            let mut rgb = vec![0u8; PIXELS * 3];
            synthetic_frame(FRAME_SIZE, DEFAULT_SEED, &mut rgb)?;
            (
                rgb,
                format!("synthetic {WIDTH}×{HEIGHT} test frame (seed {DEFAULT_SEED:#x})"),
            )
        }
    };
    fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create `{}`: {e}", args.out.display()))?;
    let mut written = Vec::new();
    if args.input.is_none() {
        written.push(write_png(
            &args.out,
            "input.png",
            &input,
            png::ColorType::Rgb,
        )?);
    }

    #[cfg(feature = "cuda")]
    let result = if args.host {
        None
    } else {
        match device::run(&input, args.frames, &args.out) {
            Ok(r) => Some(r),
            Err(e) => match e.downcast_ref::<devarena::Error>() {
                Some(devarena::Error::NoDevice { reason }) => {
                    println!("no CUDA device ({reason}): running on the host backend");
                    None
                }
                _ => return Err(e),
            },
        }
    };
    #[cfg(not(feature = "cuda"))]
    let result: Option<Run> = None;
    let mut run = match result {
        Some(r) => r,
        None => run_host(&input, args.frames, &args.out)?,
    };
    written.append(&mut run.written);

    let report = LayoutReport::of::<Frame>();
    let table = args.out.join("layout.txt");
    fs::write(&table, format!("{report}\n"))?;
    let svg = args.out.join("layout.svg");
    report.write_svg(&svg)?;
    written.extend([table, svg]);

    println!("devarena image pipeline");
    println!("  input:    {source}");
    println!("  backend:  {}", run.backend);
    println!("  frames:   {}", args.frames);
    println!();
    println!("{report}");
    println!();
    println!("{:<16} {:>12}", "stage", "median ms");
    for stage in Stage::ALL {
        println!(
            "{:<16} {:>12.3}",
            stage.name(),
            ms(median(&run.stage_times[stage.index()]))
        );
    }
    let frame = median(&run.frame_times);
    println!("{:<16} {:>12.3}", "frame", ms(frame));
    println!(
        "frames/s: {:.1} (median frame time over {} frames)",
        1.0 / frame.as_secs_f64(),
        args.frames
    );
    println!(
        "Otsu threshold: bin {} (edges: gradient magnitude >= {:.4})",
        run.threshold,
        (run.threshold + 1) as f32 / HIST_SCALE
    );
    println!("{}", run.setup_note);
    match run.allocations_after_setup {
        Some(n) => println!("allocations after setup: {n}"),
        None => println!("allocations after setup: not counted (no arena backend counter)"),
    }
    println!("wrote:");
    for path in &written {
        println!("  {}", path.display());
    }
    Ok(())
}

fn run_host(input: &[u8], frames: usize, out: &Path) -> Result<Run> {
    let backend = HostBackend::new();
    let mut arena = Arena::<Frame>::new_in(backend.clone())?;
    let setup = backend.stats();
    let mut stage_times = vec![Vec::with_capacity(frames); Stage::ALL.len()];
    let mut frame_times = Vec::with_capacity(frames);
    let mut views = arena.views_mut();
    views.rgb.copy_from_slice(input);
    let mut threshold = 0;
    // The frame loop: nothing below allocates on the backend (checked after the loop).
    for _ in 0..frames {
        let start = Instant::now();
        threshold = host::run_frame_timed(FRAME_SIZE, FrameBuffers::from(&mut views), |s, d| {
            stage_times[s.index()].push(d)
        })?;
        frame_times.push(start.elapsed());
    }
    let written = write_outputs(out, views.gray, views.blurred, views.magnitude, views.mask)?;
    let after = backend.stats();
    Ok(Run {
        backend: "host (HostBackend, one thread)".into(),
        stage_times,
        frame_times,
        threshold,
        allocations_after_setup: Some(after.allocations - setup.allocations),
        setup_note: format!(
            "setup: {} backend allocation of {} bytes (the whole Frame layout)",
            setup.allocations,
            arena.size()
        ),
        written,
    })
}

#[cfg(feature = "cuda")]
mod device {
    //! The GPU path: the same stages as PTX kernels.

    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
    use devarena::Error;
    use devarena_kernels::pipeline::cuda::{
        FrameSlices, PipelineKernels, StageEvents, driver_error, open_stream,
    };
    use devarena_kernels::pipeline::{FRAME_SIZE, FrameBuffers, PIXELS, Stage};

    use super::{Run, write_outputs};

    pub fn run(input: &[u8], frames: usize, out: &Path) -> super::Result<Run> {
        // ARENA GLUE: `devarena::backend::cuda::cuda_stream(0)`.
        let stream = open_stream(0)?;
        let ctx = stream.context().clone();
        let name = ctx.name().map_err(|e| driver_error("cuDeviceGetName", e))?;
        let kernels = PipelineKernels::load(&ctx)?;
        let events = StageEvents::new(&ctx)?;

        // ARENA GLUE: with `devarena::backend::cuda`, replace from here to "end of glue" by
        //     let mut arena = Arena::<Frame, CudaBackend>::new_in(CudaBackend::new(stream.clone()))?;
        //     let setup = arena.backend().stats();
        //     let mut views = arena.views_mut();
        //     let d = drive(&kernels, &stream, &events, FrameBuffers::from(&mut views), input, frames)?;
        //     let allocations_after_setup = Some(arena.backend().stats().allocations - setup.allocations);
        //     let setup_note = format!(
        //         "setup: {} device allocation of {} bytes (the whole Frame layout)",
        //         setup.allocations, arena.size());
        //     let storage = "CudaBackend arena";
        let mut slices = FrameSlices::alloc(&stream, FRAME_SIZE)?;
        let d = drive(&kernels, &stream, &events, slices.buffers(), input, frames)?;
        let allocations_after_setup = None;
        let setup_note = String::from(
            "setup: 8 device allocations, one per buffer (cudarc CudaSlice; the Frame arena \
             makes one instead once the CUDA backend is in)",
        );
        let storage = "one CudaSlice per buffer";
        // end of glue

        let written = write_outputs(out, &d.gray, &d.blurred, &d.magnitude, &d.mask)?;
        Ok(Run {
            backend: format!("cuda: {name}, PTX kernels, {storage}"),
            stage_times: d.stage_times,
            frame_times: d.frame_times,
            threshold: d.threshold,
            allocations_after_setup,
            setup_note: format!(
                "{setup_note}\ndevice free memory before / after the frame loop (cuMemGetInfo): \
                 {} / {} bytes ({})",
                d.free_before,
                d.free_after,
                if d.free_before == d.free_after {
                    "unchanged"
                } else {
                    "CHANGED"
                }
            ),
            written,
        })
    }

    /// What the device frames produced.
    pub struct DeviceRun {
        pub stage_times: Vec<Vec<Duration>>,
        pub frame_times: Vec<Duration>,
        pub threshold: u32,
        pub gray: Vec<f32>,
        pub blurred: Vec<f32>,
        pub magnitude: Vec<f32>,
        pub mask: Vec<u8>,
        pub free_before: usize,
        pub free_after: usize,
    }

    /// Uploads the input, runs one warm-up frame and then the timed frames (each stage timed by
    /// events, each frame on the wall clock up to the stream's completion), downloads the
    /// results.
    pub fn drive<B8, BF, BU>(
        kernels: &PipelineKernels,
        stream: &Arc<CudaStream>,
        events: &StageEvents,
        mut b: FrameBuffers<'_, B8, BF, BU>,
        input: &[u8],
        frames: usize,
    ) -> Result<DeviceRun, Error>
    where
        B8: DevicePtr<u8> + DevicePtrMut<u8>,
        BF: DevicePtr<f32> + DevicePtrMut<f32>,
        BU: DevicePtr<u32> + DevicePtrMut<u32>,
    {
        let sync = || {
            stream
                .synchronize()
                .map_err(|e| driver_error("cuStreamSynchronize", e))
        };
        let free_memory = || {
            stream
                .context()
                .mem_get_info()
                .map(|(free, _)| free)
                .map_err(|e| driver_error("cuMemGetInfo", e))
        };
        stream
            .memcpy_htod(input, b.rgb)
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        let mut stage_times = vec![Vec::with_capacity(frames); Stage::ALL.len()];
        let mut frame_times = Vec::with_capacity(frames);
        kernels.run_frame(stream, FRAME_SIZE, b.reborrow(), None)?;
        sync()?;
        let free_before = free_memory()?;
        // The frame loop: launches, event records and a synchronize; no allocation.
        for _ in 0..frames {
            let start = Instant::now();
            kernels.run_frame(stream, FRAME_SIZE, b.reborrow(), Some(events))?;
            sync()?;
            frame_times.push(start.elapsed());
            for (t, ms) in stage_times.iter_mut().zip(events.elapsed_ms()?) {
                t.push(Duration::from_secs_f64(ms as f64 / 1e3));
            }
        }
        let free_after = free_memory()?;
        let mut threshold = [0u32];
        let mut gray = vec![0f32; PIXELS];
        let mut blurred = vec![0f32; PIXELS];
        let mut magnitude = vec![0f32; PIXELS];
        let mut mask = vec![0u8; PIXELS];
        let dtoh = |e| driver_error("cuMemcpyDtoHAsync", e);
        stream
            .memcpy_dtoh(&*b.threshold, &mut threshold)
            .map_err(dtoh)?;
        stream.memcpy_dtoh(&*b.gray, &mut gray).map_err(dtoh)?;
        stream
            .memcpy_dtoh(&*b.blurred, &mut blurred)
            .map_err(dtoh)?;
        stream
            .memcpy_dtoh(&*b.magnitude, &mut magnitude)
            .map_err(dtoh)?;
        stream.memcpy_dtoh(&*b.mask, &mut mask).map_err(dtoh)?;
        sync()?;
        Ok(DeviceRun {
            stage_times,
            frame_times,
            threshold: threshold[0],
            gray,
            blurred,
            magnitude,
            mask,
            free_before,
            free_after,
        })
    }
}

fn median(xs: &[Duration]) -> Duration {
    let mut v = xs.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Writes the gray, blurred, magnitude and mask images.
fn write_outputs(
    out: &Path,
    gray: &[f32],
    blurred: &[f32],
    magnitude: &[f32],
    mask: &[u8],
) -> Result<Vec<PathBuf>> {
    let unit = |v: &[f32]| -> Vec<u8> {
        v.iter()
            .map(|&x| (x.clamp(0.0, 1.0) * 255.0).round() as u8)
            .collect()
    };
    // The magnitude as its histogram bin: 64 levels per unit of gradient, saturating at 255.
    let bins: Vec<u8> = magnitude.iter().map(|&m| magnitude_bin(m) as u8).collect();
    let gray_png = png::ColorType::Grayscale;
    Ok(vec![
        write_png(out, "gray.png", &unit(gray), gray_png)?,
        write_png(out, "blurred.png", &unit(blurred), gray_png)?,
        write_png(out, "magnitude.png", &bins, gray_png)?,
        write_png(out, "mask.png", mask, gray_png)?,
    ])
}

fn write_png(dir: &Path, name: &str, data: &[u8], color: png::ColorType) -> Result<PathBuf> {
    let path = dir.join(name);
    let file =
        File::create(&path).map_err(|e| format!("cannot create `{}`: {e}", path.display()))?;
    let mut enc = png::Encoder::new(BufWriter::new(file), WIDTH as u32, HEIGHT as u32);
    enc.set_color(color);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(data)?;
    writer.finish()?;
    Ok(path)
}

/// Reads a PNG as 8-bit RGB at 1920×1080: palette, gray and 16-bit images are converted, alpha
/// is dropped, other sizes are resampled.
fn load_png(path: &Path) -> Result<(Vec<u8>, String)> {
    let file = File::open(path).map_err(|e| format!("cannot open `{}`: {e}", path.display()))?;
    let mut decoder = png::Decoder::new(BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder
        .read_info()
        .map_err(|e| format!("`{}` is not a readable PNG: {e}", path.display()))?;
    let len = reader
        .output_buffer_size()
        .ok_or_else(|| format!("`{}`: image too large to decode", path.display()))?;
    let mut buf = vec![0u8; len];
    let info = reader.next_frame(&mut buf)?;
    let (w, h) = (info.width as usize, info.height as usize);
    let samples = info.color_type.samples();
    let mut rgb = Vec::with_capacity(w * h * 3);
    for row in buf.chunks(info.line_size).take(h) {
        for px in row[..w * samples].chunks_exact(samples) {
            match info.color_type {
                png::ColorType::Grayscale | png::ColorType::GrayscaleAlpha => {
                    rgb.extend_from_slice(&[px[0]; 3])
                }
                _ => rgb.extend_from_slice(&px[..3]),
            }
        }
    }
    let mut source = format!(
        "{} ({w}×{h}, {:?})",
        path.display(),
        reader.info().color_type
    );
    if (w, h) != (WIDTH, HEIGHT) {
        rgb = resample(&rgb, w, h, WIDTH, HEIGHT);
        source.push_str(&format!(
            ", resampled (bilinear) to {WIDTH}×{HEIGHT}: the Frame layout is planned for that size \
             at compile time"
        ));
    }
    Ok((rgb, source))
}

/// Bilinear resampling of 8-bit RGB, pixel centres aligned.
fn resample(src: &[u8], sw: usize, sh: usize, dw: usize, dh: usize) -> Vec<u8> {
    let mut out = vec![0u8; dw * dh * 3];
    let coord = |d: usize, dn: usize, sn: usize| {
        let s = ((d as f32 + 0.5) * sn as f32 / dn as f32 - 0.5).clamp(0.0, (sn - 1) as f32);
        let i = s.floor() as usize;
        (i, (i + 1).min(sn - 1), s - i as f32)
    };
    for y in 0..dh {
        let (y0, y1, fy) = coord(y, dh, sh);
        for x in 0..dw {
            let (x0, x1, fx) = coord(x, dw, sw);
            for c in 0..3 {
                let p = |xx: usize, yy: usize| src[(yy * sw + xx) * 3 + c] as f32;
                let top = p(x0, y0) * (1.0 - fx) + p(x1, y0) * fx;
                let bot = p(x0, y1) * (1.0 - fx) + p(x1, y1) * fx;
                out[(y * dw + x) * 3 + c] = (top * (1.0 - fy) + bot * fy).round() as u8;
            }
        }
    }
    out
}

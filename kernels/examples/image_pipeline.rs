//! A 1080p edge-detection pipeline whose every buffer lives in one `#[derive(DeviceLayout)]`
//! arena, allocating nothing after setup.
//!
//! ```text
//! cargo run --release --example image_pipeline [-- INPUT.png] [--frames N] [--out DIR] [--host]
//!                                                 [--unaliased | --compare]
//! ```
//!
//! Every frame: decode (the input lands in the `rgb` buffer) → grayscale → Gaussian blur (two
//! passes through a scratch buffer) → Sobel magnitude → 256-bin histogram → Otsu threshold →
//! binary edge mask. With no input it generates a deterministic 1920×1080 test frame
//! (gradients, shapes, noise). The layouts are planned at compile time for 1920×1080: an input
//! of another size is resampled (bilinear) to 1920×1080, and the program says so.
//!
//! By default the buffers live in `FrameStaged`, a layout with stages whose buffers share
//! bytes when their live ranges never meet; every stage reaches its buffers only through its
//! own stage views, so the borrow checker proves no buffer is touched outside its live range.
//! `--unaliased` runs the plain `Frame` layout (every buffer its own bytes) instead;
//! `--compare` runs both and checks that every output is bit-identical.
//!
//! With a GPU the stages run as PTX kernels (the crate's default feature `cuda` loads the
//! driver at run time); without one, or with `--host`, they run on the host backend (built
//! with `--no-default-features`, the CUDA path is left out). It prints per-stage times
//! (medians over the frames), frames/s, the layout table, the bytes aliasing saves,
//! `allocations after setup: 0` from the backend's own counter and, on the GPU, the device's
//! free memory (`cuMemGetInfo`) before and after the frame loop; it writes gray, blurred,
//! magnitude and mask PNGs, the layout table and the SVG memory map (a stage × address
//! picture for the aliased layout) to `--out` (default `out/`).

use std::error::Error as StdError;
use std::fs::{self, File};
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use devarena::{Arena, DeviceLayout, HostBackend, LayoutReport};
use devarena_kernels::pipeline::image::{DEFAULT_SEED, output_images, synthetic_frame};
use devarena_kernels::pipeline::{
    FRAME_SIZE, Frame, FrameBuffers, FrameOutputs, FrameStaged, HEIGHT, HIST_SCALE, PIXELS, Stage,
    WIDTH, host,
};

type Result<T> = std::result::Result<T, Box<dyn StdError>>;

const USAGE: &str = "usage: image_pipeline [INPUT.png] [--frames N] [--out DIR] [--host] \
                     [--unaliased | --compare]";

/// Which layouts to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Aliased,
    Unaliased,
    Compare,
}

#[derive(Debug)]
struct Args {
    input: Option<PathBuf>,
    frames: usize,
    out: PathBuf,
    host: bool,
    mode: Mode,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        input: None,
        frames: 20,
        out: PathBuf::from("out"),
        host: false,
        mode: Mode::Aliased,
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
            "--unaliased" | "--compare" => {
                let mode = if a == "--compare" {
                    Mode::Compare
                } else {
                    Mode::Unaliased
                };
                if args.mode != Mode::Aliased && args.mode != mode {
                    return Err(
                        format!("--unaliased and --compare exclude each other\n{USAGE}").into(),
                    );
                }
                args.mode = mode;
            }
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

/// The layout a run used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `FrameStaged`: buffers share bytes across stages.
    Aliased,
    /// `Frame`: every buffer has bytes of its own.
    Unaliased,
}

impl Layout {
    fn label(self) -> &'static str {
        match self {
            Layout::Aliased => "FrameStaged (aliased)",
            Layout::Unaliased => "Frame (unaliased)",
        }
    }

    fn report(self) -> LayoutReport {
        match self {
            Layout::Aliased => LayoutReport::of::<FrameStaged>(),
            Layout::Unaliased => LayoutReport::of::<Frame>(),
        }
    }

    /// `layout.txt` / `layout.svg` for the first run, `layout-unaliased.*` for the second.
    fn file_stem(self, first: bool) -> &'static str {
        match (first, self) {
            (true, _) => "layout",
            (false, Layout::Unaliased) => "layout-unaliased",
            (false, Layout::Aliased) => "layout-aliased",
        }
    }
}

/// What a run produced, whichever backend and layout ran it.
struct Run {
    layout: Layout,
    backend: String,
    /// Writing the input into the arena (host copy or upload), per frame.
    decode_times: Vec<Duration>,
    /// Per stage of [`Stage::ALL`], per frame.
    stage_times: Vec<Vec<Duration>>,
    /// Decode and every stage, per frame, up to the results being complete.
    frame_times: Vec<Duration>,
    outputs: FrameOutputs,
    arena_bytes: usize,
    setup_allocations: u64,
    allocations_after_setup: u64,
    /// Device free memory before and after the frame loop (`cuMemGetInfo`), on the GPU.
    free_memory: Option<(usize, usize)>,
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
    let layouts: &[Layout] = match args.mode {
        Mode::Aliased => &[Layout::Aliased],
        Mode::Unaliased => &[Layout::Unaliased],
        Mode::Compare => &[Layout::Aliased, Layout::Unaliased],
    };

    #[cfg(feature = "cuda")]
    let gpu = if args.host {
        None
    } else {
        match device::Gpu::open() {
            Ok(g) => Some(g),
            Err(devarena::Error::NoDevice { reason }) => {
                println!("no CUDA device ({reason}): running on the host backend");
                None
            }
            Err(e) => return Err(e.into()),
        }
    };
    let mut runs = Vec::new();
    for &layout in layouts {
        #[cfg(feature = "cuda")]
        if let Some(gpu) = &gpu {
            runs.push(gpu.run(layout, &input, args.frames)?);
            continue;
        }
        runs.push(run_host(layout, &input, args.frames)?);
    }

    for (image, data) in output_images(&runs[0].outputs) {
        written.push(write_png(
            &args.out,
            image,
            &data,
            png::ColorType::Grayscale,
        )?);
    }
    for (i, r) in runs.iter().enumerate() {
        let report = r.layout.report();
        let stem = r.layout.file_stem(i == 0);
        let table = args.out.join(format!("{stem}.txt"));
        fs::write(&table, format!("{report}\n"))?;
        let svg = args.out.join(format!("{stem}.svg"));
        report.write_svg(&svg)?;
        written.extend([table, svg]);
    }

    println!("devarena image pipeline");
    println!("  input:    {source}");
    println!("  backend:  {}", runs[0].backend);
    println!(
        "  frames:   {} per layout (each: decode + {} stages)",
        args.frames,
        Stage::ALL.len()
    );
    for r in &runs {
        println!();
        println!("{}", r.layout.report());
        if r.layout == Layout::Aliased {
            print_savings();
        }
    }
    println!();
    print_times(&runs);
    let t = runs[0].outputs.threshold;
    println!(
        "Otsu threshold: bin {t} (edges: gradient magnitude >= {:.4})",
        (t + 1) as f32 / HIST_SCALE
    );
    for r in &runs {
        println!(
            "{}: setup: {} backend allocation of {} bytes (the whole layout)",
            r.layout.label(),
            r.setup_allocations,
            r.arena_bytes
        );
        if let Some((before, after)) = r.free_memory {
            println!(
                "{}: device free memory before / after the frame loop (cuMemGetInfo): {before} / \
                 {after} bytes ({})",
                r.layout.label(),
                if before == after {
                    "unchanged"
                } else {
                    "CHANGED"
                }
            );
        }
        println!("allocations after setup: {}", r.allocations_after_setup);
    }
    if let [aliased, unaliased] = &runs[..] {
        match aliased.outputs.first_difference(&unaliased.outputs) {
            None => {
                let images_equal = output_images(&aliased.outputs)
                    .iter()
                    .zip(output_images(&unaliased.outputs).iter())
                    .all(|(a, b)| a.1 == b.1);
                println!(
                    "aliased vs unaliased: every stage output bit-identical (gray, scratch, \
                     blurred, magnitude, hist, threshold, mask){}",
                    if images_equal {
                        "; the PNG images too"
                    } else {
                        ""
                    }
                );
            }
            Some(d) => {
                return Err(format!("the aliased run differs from the unaliased one: {d}").into());
            }
        }
    }
    println!("wrote:");
    for path in &written {
        println!("  {}", path.display());
    }
    Ok(())
}

/// What aliasing saves, from the planner's constants.
fn print_savings() {
    let (size, unaliased, bound) = (
        FrameStaged::SIZE,
        FrameStaged::UNALIASED_SIZE,
        FrameStaged::PEAK_LIVE_BOUND,
    );
    let saved = unaliased - size;
    println!(
        "bytes saved by aliasing: UNALIASED_SIZE − SIZE = {unaliased} − {size} = {saved} bytes \
         ({:.1}% of {unaliased}); PEAK_LIVE_BOUND {bound} (SIZE / bound = {:.3})",
        saved as f64 * 100.0 / unaliased as f64,
        size as f64 / bound as f64
    );
}

fn print_times(runs: &[Run]) {
    print!("{:<22}", "median ms");
    for r in runs {
        print!(" {:>22}", r.layout.label());
    }
    println!();
    print!("{:<22}", "decode (input)");
    for r in runs {
        print!(" {:>22.3}", ms(median(&r.decode_times)));
    }
    println!();
    for stage in Stage::ALL {
        print!("{:<22}", stage.name());
        for r in runs {
            print!(" {:>22.3}", ms(median(&r.stage_times[stage.index()])));
        }
        println!();
    }
    print!("{:<22}", "frame");
    for r in runs {
        print!(" {:>22.3}", ms(median(&r.frame_times)));
    }
    println!();
    print!("{:<22}", "frames/s");
    for r in runs {
        print!(" {:>22.1}", 1.0 / median(&r.frame_times).as_secs_f64());
    }
    println!();
    println!(
        "(medians over {} frames; a frame is decode plus every stage, up to the results being \
         complete)",
        runs[0].frame_times.len()
    );
}

fn run_host(layout: Layout, input: &[u8], frames: usize) -> Result<Run> {
    let backend = HostBackend::new();
    let mut stage_times = vec![Vec::with_capacity(frames); Stage::ALL.len()];
    let mut frame_times = Vec::with_capacity(frames);
    let mut decode_times = Vec::with_capacity(frames);
    let mut outputs = FrameOutputs::new(FRAME_SIZE);
    let (setup, arena_bytes) = match layout {
        Layout::Unaliased => {
            let mut arena = Arena::<Frame>::new_in(backend.clone())?;
            let setup = backend.stats();
            let mut views = arena.views_mut();
            // The frame loop: nothing below allocates on the backend (checked after the loop).
            for _ in 0..frames {
                let start = Instant::now();
                views.rgb.copy_from_slice(input);
                decode_times.push(start.elapsed());
                host::run_frame_timed(FRAME_SIZE, FrameBuffers::from(&mut views), |s, d| {
                    stage_times[s.index()].push(d)
                })?;
                frame_times.push(start.elapsed());
            }
            outputs.copy_from(&FrameBuffers::from(&mut views))?;
            (setup, arena.size())
        }
        Layout::Aliased => {
            let mut arena = Arena::<FrameStaged>::new_in(backend.clone())?;
            let setup = backend.stats();
            for _ in 0..frames {
                let start = Instant::now();
                let mut decode_time = Duration::ZERO;
                let decode = |rgb: &mut [u8]| {
                    rgb.copy_from_slice(input);
                    decode_time = start.elapsed();
                    Ok(())
                };
                host::run_frame_staged(&mut arena, decode, None, |s, d| {
                    stage_times[s.index()].push(d)
                })?;
                frame_times.push(start.elapsed());
                decode_times.push(decode_time);
            }
            // One more frame, untimed, that copies each output out in the last stage it is
            // live in (its bytes are reused afterwards).
            let decode = |rgb: &mut [u8]| {
                rgb.copy_from_slice(input);
                Ok(())
            };
            host::run_frame_staged(&mut arena, decode, Some(&mut outputs), |_, _| {})?;
            (setup, arena.size())
        }
    };
    let after = backend.stats();
    Ok(Run {
        layout,
        backend: "host (HostBackend, one thread)".into(),
        decode_times,
        stage_times,
        frame_times,
        outputs,
        arena_bytes,
        setup_allocations: setup.allocations,
        allocations_after_setup: after.allocations - setup.allocations,
        free_memory: None,
    })
}

#[cfg(feature = "cuda")]
mod device {
    //! The GPU path: the same stages as PTX kernels, on a `CudaBackend` arena.

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use devarena::backend::cuda::{
        CudaBackend, CudaStream, DeviceViewMut, cuda_stream, describe_device, mem_info,
    };
    use devarena::{Arena, Error};
    use devarena_kernels::pipeline::cuda::{
        PipelineKernels, StageEvents, download_outputs, driver_error,
    };
    use devarena_kernels::pipeline::{
        FRAME_SIZE, Frame, FrameBuffers, FrameOutputs, FrameStaged, Stage,
    };

    use super::{Layout, Run};

    /// A device with the kernels loaded.
    pub struct Gpu {
        stream: Arc<CudaStream>,
        kernels: PipelineKernels,
        events: StageEvents,
        device: String,
    }

    impl Gpu {
        /// GPU 0, or `Err(Error::NoDevice { .. })`.
        pub fn open() -> Result<Gpu, Error> {
            let stream = cuda_stream(0)?;
            let kernels = PipelineKernels::load(stream.context())?;
            let events = StageEvents::new(stream.context())?;
            let device = describe_device(&stream)?;
            Ok(Gpu {
                stream,
                kernels,
                events,
                device,
            })
        }

        fn sync(&self) -> Result<(), Error> {
            self.stream
                .synchronize()
                .map_err(|e| driver_error("cuStreamSynchronize", e))
        }

        fn free_memory(&self) -> Result<usize, Error> {
            mem_info(&self.stream).map(|(free, _)| free)
        }

        /// Runs one warm-up frame and `frames` timed frames of `layout` on a fresh arena (each
        /// stage timed by events, each frame on the wall clock up to the stream's completion),
        /// then reads every output back.
        pub fn run(&self, layout: Layout, input: &[u8], frames: usize) -> super::Result<Run> {
            let backend = CudaBackend::new(self.stream.clone());
            let mut stage_times = vec![Vec::with_capacity(frames); Stage::ALL.len()];
            let mut frame_times = Vec::with_capacity(frames);
            let mut decode_times = Vec::with_capacity(frames);
            let mut outputs = FrameOutputs::new(FRAME_SIZE);
            let record_stages = |times: &mut Vec<Vec<Duration>>| -> Result<(), Error> {
                for (t, ms) in times.iter_mut().zip(self.events.elapsed_ms()?) {
                    t.push(Duration::from_secs_f64(ms as f64 / 1e3));
                }
                Ok(())
            };
            let (setup, free_before, free_after, arena_bytes) = match layout {
                Layout::Unaliased => {
                    let mut arena = Arena::<Frame, _>::new_in(backend.clone())?;
                    let setup = backend.stats();
                    let mut views = arena.views_mut();
                    views.rgb.upload(input)?;
                    self.kernels.run_frame(
                        &self.stream,
                        FRAME_SIZE,
                        FrameBuffers::from(&mut views),
                        None,
                    )?;
                    self.sync()?;
                    let free_before = self.free_memory()?;
                    // The frame loop: an upload, launches, event records and a synchronize;
                    // no allocation.
                    for _ in 0..frames {
                        let start = Instant::now();
                        views.rgb.upload(input)?;
                        decode_times.push(start.elapsed());
                        self.kernels.run_frame(
                            &self.stream,
                            FRAME_SIZE,
                            FrameBuffers::from(&mut views),
                            Some(&self.events),
                        )?;
                        self.sync()?;
                        frame_times.push(start.elapsed());
                        record_stages(&mut stage_times)?;
                    }
                    let free_after = self.free_memory()?;
                    download_outputs(&self.stream, &FrameBuffers::from(&mut views), &mut outputs)?;
                    (setup, free_before, free_after, arena.size())
                }
                Layout::Aliased => {
                    let mut arena = Arena::<FrameStaged, _>::new_in(backend.clone())?;
                    let setup = backend.stats();
                    let upload =
                        |_: &Arc<CudaStream>, rgb: &mut DeviceViewMut<'_, u8>| rgb.upload(input);
                    self.kernels
                        .run_frame_staged(&mut arena, upload, None, None)?;
                    self.sync()?;
                    let free_before = self.free_memory()?;
                    for _ in 0..frames {
                        let start = Instant::now();
                        let mut decode_time = Duration::ZERO;
                        let decode = |_: &Arc<CudaStream>, rgb: &mut DeviceViewMut<'_, u8>| {
                            rgb.upload(input)?;
                            decode_time = start.elapsed();
                            Ok(())
                        };
                        self.kernels.run_frame_staged(
                            &mut arena,
                            decode,
                            Some(&self.events),
                            None,
                        )?;
                        self.sync()?;
                        frame_times.push(start.elapsed());
                        decode_times.push(decode_time);
                        record_stages(&mut stage_times)?;
                    }
                    let free_after = self.free_memory()?;
                    // One more frame, untimed, that downloads each output in the last stage it
                    // is live in (its bytes are reused afterwards).
                    self.kernels
                        .run_frame_staged(&mut arena, upload, None, Some(&mut outputs))?;
                    (setup, free_before, free_after, arena.size())
                }
            };
            let after = backend.stats();
            Ok(Run {
                layout,
                backend: format!(
                    "cuda: {}, PTX kernels, CudaBackend arena (one cuMemAlloc)",
                    self.device
                ),
                decode_times,
                stage_times,
                frame_times,
                outputs,
                arena_bytes,
                setup_allocations: setup.allocations,
                allocations_after_setup: after.allocations - setup.allocations,
                free_memory: Some((free_before, free_after)),
            })
        }
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
            ", resampled (bilinear) to {WIDTH}×{HEIGHT}: the layouts are planned for that size \
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

//! An edge-detection pipeline whose every buffer lives in one `#[derive(DeviceLayout)]` arena,
//! allocating nothing after setup, run on each image at its own size.
//!
//! ```text
//! cargo run --release --example image_pipeline [-- INPUT.png | --size WxH] [--frames N]
//!     [--out DIR] [--host] [--unaliased | --compare] [--graph | --eager]
//! ```
//!
//! Every frame: decode (the input lands in the `rgb` buffer) → grayscale → Gaussian blur (two
//! passes through a scratch buffer) → Sobel magnitude → 256-bin histogram → Otsu threshold →
//! binary edge mask. With no input it generates a deterministic test frame (gradients, shapes,
//! noise) of `--size` (default 1920×1080).
//!
//! **Sizes.** The layouts are planned at compile time for the largest frame, 3840×2160 pixels
//! (`MAX_PIXELS`); an image of up to that many pixels (a 1×1 one, an odd 1023×767 one, a
//! 2160×3840 portrait) runs at its own size: the views are cut to its width × height, the
//! kernels take its real size, and the outputs are written at its size. Only an image larger
//! than the maximum is downscaled (bilinear) to the largest size of the same aspect ratio that
//! fits, and the program says so. An unreadable or truncated PNG is an error naming the file.
//!
//! By default the buffers live in `FrameStaged`, a layout with stages whose buffers share
//! bytes when their live ranges never meet; every stage reaches its buffers only through its
//! own stage views, so the borrow checker proves no buffer is touched outside its live range.
//! `--unaliased` runs the plain `Frame` layout (every buffer its own bytes) instead;
//! `--compare` runs both and checks that every output is bit-identical.
//!
//! With a GPU the stages run as PTX kernels (the crate's default feature `cuda` loads the
//! driver at run time); without one, or with `--host`, they run on the host backend (built
//! with `--no-default-features`, the CUDA path is left out). On the GPU a frame is either
//! submitted **eagerly** (an upload, then the 7 kernels and a memset launched one by one) or
//! **replayed from a CUDA graph** captured once from the same launches (an upload, then one
//! `graph.launch()`). By default the program times 20 frames of each and keeps the faster
//! (and says which); `--graph` and `--eager` choose. In graph mode it also runs one eager frame
//! and checks that the graph's outputs are bit-identical to it.
//!
//! It prints per-stage times (medians over the frames; eager only — a replayed graph is timed
//! whole), frames/s, the layout table, the bytes aliasing saves, `allocations after setup: 0`
//! from the backend's own counter and, on the GPU, the device's free memory (`cuMemGetInfo`)
//! before and after the frame loop; it writes gray, blurred, magnitude and mask PNGs at the
//! image's size, the layout table and the SVG memory map (a stage × address picture for the
//! aliased layout) to `--out` (default `out/`).

use std::error::Error as StdError;
use std::fs::{self, File};
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use devarena::{Arena, DeviceLayout, HostBackend, LayoutReport};
use devarena_kernels::pipeline::image::{DEFAULT_SEED, output_images, resample, synthetic_frame};
use devarena_kernels::pipeline::{
    FRAME_SIZE, Frame, FrameBuffers, FrameOutputs, FrameStaged, HIST_SCALE, ImageSize, MAX_PIXELS,
    MAX_ROWS, MAX_SIZE, Stage, host,
};

type Result<T> = std::result::Result<T, Box<dyn StdError>>;

const USAGE: &str = "usage: image_pipeline [INPUT.png | --size WxH] [--frames N] [--out DIR] \
                     [--host] [--unaliased | --compare] [--graph | --eager]";

/// Which layouts to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Aliased,
    Unaliased,
    Compare,
}

/// How the GPU submits frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exec {
    /// Time a few frames both ways and keep the faster.
    Auto,
    /// Capture the frame once into a CUDA graph, replay it every frame.
    Graph,
    /// Launch every kernel every frame.
    Eager,
}

#[derive(Debug)]
struct Args {
    input: Option<PathBuf>,
    size: Option<ImageSize>,
    frames: usize,
    out: PathBuf,
    host: bool,
    mode: Mode,
    exec: Exec,
}

/// `WxH` (or `W×H`) as an image size.
fn parse_size(v: &str) -> Result<ImageSize> {
    let bad = || format!("--size: `{v}` is not WIDTHxHEIGHT (e.g. 1920x1080)");
    let (w, h) = v.split_once(['x', 'X', '×']).ok_or_else(bad)?;
    let (w, h): (usize, usize) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    let size = ImageSize::new(w, h);
    size.check("--size")?;
    Ok(size)
}

/// The most frames a run times: every frame keeps a time per stage, allocated before the loop.
const MAX_FRAMES: usize = 100_000;

/// The arguments after the program's name.
fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Args> {
    let mut args = Args {
        input: None,
        size: None,
        frames: 20,
        out: PathBuf::from("out"),
        host: false,
        mode: Mode::Aliased,
        exec: Exec::Auto,
    };
    let mut it = argv.into_iter();
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
                if args.frames > MAX_FRAMES {
                    return Err(format!(
                        "--frames: {} is more than the {MAX_FRAMES} frames a run times",
                        args.frames
                    )
                    .into());
                }
            }
            "--size" => args.size = Some(parse_size(&it.next().ok_or("--size needs WxH")?)?),
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
            "--graph" | "--eager" => {
                let exec = if a == "--graph" {
                    Exec::Graph
                } else {
                    Exec::Eager
                };
                if args.exec != Exec::Auto && args.exec != exec {
                    return Err(format!("--graph and --eager exclude each other\n{USAGE}").into());
                }
                args.exec = exec;
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
    if args.input.is_some() && args.size.is_some() {
        return Err(format!(
            "--size sets the synthetic frame's size; an input image has its own\n{USAGE}"
        )
        .into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1)).and_then(run) {
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
    /// How frames were submitted (the GPU's eager launches or graph replays, or the host).
    execution: String,
    /// Writing the input into the arena (host copy or upload), per frame.
    decode_times: Vec<Duration>,
    /// Per stage of [`Stage::ALL`], per frame (empty for replayed graphs, timed whole).
    stage_times: Vec<Vec<Duration>>,
    /// Decode and every stage, per frame, up to the results being complete.
    frame_times: Vec<Duration>,
    outputs: FrameOutputs,
    arena_bytes: usize,
    setup_allocations: u64,
    allocations_after_setup: u64,
    /// Device free memory before and after the frame loop (`cuMemGetInfo`), on the GPU.
    free_memory: Option<(usize, usize)>,
    /// In graph mode: what the check against one eager frame found.
    graph_check: Option<String>,
}

/// The input image at the size the pipeline runs it at, and where it came from.
struct Input {
    rgb: Vec<u8>,
    size: ImageSize,
    source: String,
}

/// An image of `size` brought to a size the layouts hold: unchanged when it fits, else
/// downscaled keeping its aspect ratio, which `source` then says.
fn fit_input(rgb: Vec<u8>, size: ImageSize, mut source: String) -> Result<Input> {
    let fitted = size.fit();
    if fitted == size {
        return Ok(Input { rgb, size, source });
    }
    source.push_str(&format!(
        ", downscaled (bilinear, aspect ratio kept) to {fitted}: {}",
        too_large(size)
    ));
    Ok(Input {
        rgb: resample(&rgb, size, fitted)?,
        size: fitted,
        source,
    })
}

/// Why an image of `size` does not run as it is ([`ImageSize::fits`]).
fn too_large(size: ImageSize) -> String {
    if size.pixels() > MAX_PIXELS {
        format!(
            "its {} pixels are more than the {MAX_PIXELS} ({MAX_SIZE}) the layouts are planned \
             for",
            size.pixels()
        )
    } else {
        format!(
            "its {} rows are more than the {MAX_ROWS} one launch of the 2-D kernels covers",
            size.height
        )
    }
}

/// The input image: the PNG given, or the synthetic frame of `--size`, made directly at the
/// size that fits (its shapes are placed in proportion to the size, so it is the same picture):
/// a `--size` past the layouts costs no more memory than one that fits.
fn load_input(args: &Args) -> Result<Input> {
    if let Some(path) = &args.input {
        return load_png(path);
    }
    let asked = args.size.unwrap_or(FRAME_SIZE);
    let size = asked.fit();
    let mut rgb = vec![0u8; size.pixels() * 3];
    synthetic_frame(size, DEFAULT_SEED, &mut rgb)?;
    let mut source = format!("synthetic {size} test frame (seed {DEFAULT_SEED:#x})");
    if size != asked {
        source.push_str(&format!(
            ": --size {asked} downscaled (aspect ratio kept): {}",
            too_large(asked)
        ));
    }
    Ok(Input { rgb, size, source })
}

fn run(args: Args) -> Result<()> {
    let input = load_input(&args)?;
    if input.source.contains("downscaled") {
        println!("note: {}", input.source);
    }
    fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create `{}`: {e}", args.out.display()))?;
    let mut written = Vec::new();
    if args.input.is_none() {
        written.push(write_png(
            &args.out,
            "input.png",
            input.size,
            &input.rgb,
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
            runs.push(gpu.run(layout, &input.rgb, input.size, args.frames, args.exec)?);
            continue;
        }
        runs.push(run_host(layout, &input.rgb, input.size, args.frames)?);
    }

    for (image, data) in output_images(&runs[0].outputs) {
        written.push(write_png(
            &args.out,
            image,
            input.size,
            &data,
            png::ColorType::Grayscale,
        )?);
    }
    for (i, r) in runs.iter().enumerate() {
        let report = r.layout.report();
        let stem = r.layout.file_stem(i == 0);
        let table = args.out.join(format!("{stem}.txt"));
        let cannot_write = |path: &Path, e| format!("cannot write `{}`: {e}", path.display());
        fs::write(&table, format!("{report}\n")).map_err(|e| cannot_write(&table, e))?;
        let svg = args.out.join(format!("{stem}.svg"));
        report.write_svg(&svg).map_err(|e| cannot_write(&svg, e))?;
        written.extend([table, svg]);
    }

    println!("devarena image pipeline");
    println!("  input:     {}", input.source);
    println!(
        "  frame:     {} ({} pixels; the layouts hold up to {MAX_PIXELS}, {MAX_SIZE})",
        input.size,
        input.size.pixels()
    );
    println!("  backend:   {}", runs[0].backend);
    println!("  execution: {}", runs[0].execution);
    println!(
        "  frames:    {} per layout (each: decode + {} stages)",
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
        if let Some(check) = &r.graph_check {
            println!("{}: {check}", r.layout.label());
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
    let cell = |times: &[Duration]| match median(times) {
        Some(d) => format!(" {:>22.3}", ms(d)),
        None => format!(" {:>22}", "-"),
    };
    print!("{:<22}", "median ms");
    for r in runs {
        print!(" {:>22}", r.layout.label());
    }
    println!();
    print!("{:<22}", "decode (input)");
    for r in runs {
        print!("{}", cell(&r.decode_times));
    }
    println!();
    for stage in Stage::ALL {
        print!("{:<22}", stage.name());
        for r in runs {
            print!("{}", cell(&r.stage_times[stage.index()]));
        }
        println!();
    }
    print!("{:<22}", "frame");
    for r in runs {
        print!("{}", cell(&r.frame_times));
    }
    println!();
    print!("{:<22}", "frames/s");
    for r in runs {
        let fps = median(&r.frame_times).map_or(0.0, |d| 1.0 / d.as_secs_f64());
        print!(" {fps:>22.1}");
    }
    println!();
    println!(
        "(medians over {} frames; a frame is decode plus every stage, up to the results being \
         complete{})",
        runs[0].frame_times.len(),
        if runs.iter().any(|r| r.stage_times.iter().all(Vec::is_empty)) {
            "; a replayed graph runs its stages in one launch: '-' where they are not timed \
             one by one"
        } else {
            ""
        }
    );
}

fn run_host(layout: Layout, input: &[u8], size: ImageSize, frames: usize) -> Result<Run> {
    let backend = HostBackend::new();
    let mut stage_times = vec![Vec::with_capacity(frames); Stage::ALL.len()];
    let mut frame_times = Vec::with_capacity(frames);
    let mut decode_times = Vec::with_capacity(frames);
    let mut outputs = FrameOutputs::new(size);
    let n = size.pixels();
    let (setup, arena_bytes) = match layout {
        Layout::Unaliased => {
            let mut arena = Arena::<Frame>::new_in(backend.clone())?;
            let setup = backend.stats();
            let mut views = arena.views_mut();
            // The frame loop: nothing below allocates on the backend (checked after the loop).
            for _ in 0..frames {
                let start = Instant::now();
                views.rgb[..3 * n].copy_from_slice(input);
                decode_times.push(start.elapsed());
                host::run_frame_timed(size, FrameBuffers::from(&mut views), |s, d| {
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
                host::run_frame_staged(&mut arena, size, decode, None, |s, d| {
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
            host::run_frame_staged(&mut arena, size, decode, Some(&mut outputs), |_, _| {})?;
            (setup, arena.size())
        }
    };
    let after = backend.stats();
    Ok(Run {
        layout,
        backend: "host (HostBackend, one thread)".into(),
        execution: "host, stage by stage".into(),
        decode_times,
        stage_times,
        frame_times,
        outputs,
        arena_bytes,
        setup_allocations: setup.allocations,
        allocations_after_setup: after.allocations - setup.allocations,
        free_memory: None,
        graph_check: None,
    })
}

#[cfg(feature = "cuda")]
mod device {
    //! The GPU path: the same stages as PTX kernels, on a `CudaBackend` arena, launched eagerly
    //! or replayed from a CUDA graph of the arena.

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use devarena::backend::cuda::{
        CudaBackend, CudaStream, DeviceViewMut, cuda_stream, describe_device, mem_info,
    };
    use devarena::{Arena, ArenaGraph, DeviceLayout, Error};
    use devarena_kernels::pipeline::cuda::{
        PipelineKernels, StageEvents, download_mask_stage, download_outputs, driver_error,
        upload_input, upload_input_staged,
    };
    use devarena_kernels::pipeline::{
        Frame, FrameBuffers, FrameOutputs, FrameStaged, ImageSize, Stage,
    };

    use super::{Exec, Layout, Run, median};

    /// Frames timed each way when choosing between eager launches and graph replays.
    const CHOOSE_FRAMES: usize = 20;

    /// A device with the kernels loaded.
    pub struct Gpu {
        stream: Arc<CudaStream>,
        kernels: PipelineKernels,
        events: StageEvents,
        device: String,
    }

    /// One frame's input and its size.
    struct FrameInput<'i> {
        input: &'i [u8],
        size: ImageSize,
    }

    /// What the example does with one layout on the GPU: eager frames, a graph of the frame,
    /// replays, and the outputs of each.
    trait GpuLayout: DeviceLayout + Sized {
        const LAYOUT: Layout;
        /// Which outputs a replay leaves to compare with an eager frame.
        const GRAPH_OUTPUTS: &'static str;

        /// One eager frame (upload, launches; with `outputs`, every output downloaded); returns
        /// the upload's time. Does not wait unless it downloads.
        fn eager(
            gpu: &Gpu,
            arena: &mut Arena<Self, CudaBackend>,
            frame: &FrameInput<'_>,
            events: Option<&StageEvents>,
            outputs: Option<&mut FrameOutputs>,
        ) -> Result<Duration, Error>;

        /// The frame captured into a graph of the arena.
        fn capture<'a>(
            gpu: &'a Gpu,
            arena: &'a mut Arena<Self, CudaBackend>,
            size: ImageSize,
        ) -> Result<ArenaGraph<'a, Self, CudaBackend>, Error>;

        /// Uploads a frame's input into the graph's arena, between replays.
        fn upload(
            graph: &mut ArenaGraph<'_, Self, CudaBackend>,
            frame: &FrameInput<'_>,
        ) -> Result<(), Error>;

        /// The outputs a replay leaves ([`GRAPH_OUTPUTS`](Self::GRAPH_OUTPUTS)) into `outputs`.
        fn graph_outputs(
            graph: &mut ArenaGraph<'_, Self, CudaBackend>,
            outputs: &mut FrameOutputs,
        ) -> Result<(), Error>;

        /// The first difference between a replay's outputs and an eager frame's, among
        /// [`GRAPH_OUTPUTS`](Self::GRAPH_OUTPUTS).
        fn difference(graph: &FrameOutputs, eager: &FrameOutputs) -> Option<String>;
    }

    impl GpuLayout for Frame {
        const LAYOUT: Layout = Layout::Unaliased;
        const GRAPH_OUTPUTS: &'static str =
            "every stage output (gray, scratch, blurred, magnitude, hist, threshold, mask)";

        fn eager(
            gpu: &Gpu,
            arena: &mut Arena<Self, CudaBackend>,
            frame: &FrameInput<'_>,
            events: Option<&StageEvents>,
            outputs: Option<&mut FrameOutputs>,
        ) -> Result<Duration, Error> {
            let start = Instant::now();
            let mut views = arena.views_mut();
            views
                .rgb
                .slice_mut(..frame.input.len())?
                .upload(frame.input)?;
            let decode = start.elapsed();
            let buffers = FrameBuffers::from(&mut views);
            gpu.kernels
                .run_frame(&gpu.stream, frame.size, buffers, events)?;
            if let Some(o) = outputs {
                download_outputs(&gpu.stream, &FrameBuffers::from(&mut views), o)?;
            }
            Ok(decode)
        }

        fn capture<'a>(
            gpu: &'a Gpu,
            arena: &'a mut Arena<Self, CudaBackend>,
            size: ImageSize,
        ) -> Result<ArenaGraph<'a, Self, CudaBackend>, Error> {
            gpu.kernels.capture_frame(arena, size)
        }

        fn upload(
            graph: &mut ArenaGraph<'_, Self, CudaBackend>,
            frame: &FrameInput<'_>,
        ) -> Result<(), Error> {
            upload_input(graph, frame.size, frame.input)
        }

        fn graph_outputs(
            graph: &mut ArenaGraph<'_, Self, CudaBackend>,
            outputs: &mut FrameOutputs,
        ) -> Result<(), Error> {
            let stream = graph.stream().clone();
            download_outputs(
                &stream,
                &FrameBuffers::from(&mut graph.views_mut()),
                outputs,
            )
        }

        fn difference(graph: &FrameOutputs, eager: &FrameOutputs) -> Option<String> {
            graph.first_difference(eager)
        }
    }

    impl GpuLayout for FrameStaged {
        const LAYOUT: Layout = Layout::Aliased;
        const GRAPH_OUTPUTS: &'static str =
            "the outputs live in the last stage (magnitude, threshold, mask)";

        fn eager(
            gpu: &Gpu,
            arena: &mut Arena<Self, CudaBackend>,
            frame: &FrameInput<'_>,
            events: Option<&StageEvents>,
            outputs: Option<&mut FrameOutputs>,
        ) -> Result<Duration, Error> {
            let start = Instant::now();
            let mut decode_time = Duration::ZERO;
            let decode = |_: &Arc<CudaStream>, rgb: &mut DeviceViewMut<'_, u8>| {
                rgb.upload(frame.input)?;
                decode_time = start.elapsed();
                Ok(())
            };
            gpu.kernels
                .run_frame_staged(arena, frame.size, decode, events, outputs)?;
            Ok(decode_time)
        }

        fn capture<'a>(
            gpu: &'a Gpu,
            arena: &'a mut Arena<Self, CudaBackend>,
            size: ImageSize,
        ) -> Result<ArenaGraph<'a, Self, CudaBackend>, Error> {
            gpu.kernels.capture_frame_staged(arena, size)
        }

        fn upload(
            graph: &mut ArenaGraph<'_, Self, CudaBackend>,
            frame: &FrameInput<'_>,
        ) -> Result<(), Error> {
            upload_input_staged(graph, frame.size, frame.input)
        }

        fn graph_outputs(
            graph: &mut ArenaGraph<'_, Self, CudaBackend>,
            outputs: &mut FrameOutputs,
        ) -> Result<(), Error> {
            download_mask_stage(graph, outputs)
        }

        fn difference(graph: &FrameOutputs, eager: &FrameOutputs) -> Option<String> {
            let mut a = eager.clone();
            a.magnitude.clone_from(&graph.magnitude);
            a.threshold = graph.threshold;
            a.mask.clone_from(&graph.mask);
            a.first_difference(eager)
        }
    }

    /// A replay: upload, launch, wait; returns the upload's time.
    fn replay<L: GpuLayout>(
        graph: &mut ArenaGraph<'_, L, CudaBackend>,
        frame: &FrameInput<'_>,
    ) -> Result<Duration, Error> {
        let start = Instant::now();
        L::upload(graph, frame)?;
        let decode = start.elapsed();
        graph.launch()?;
        graph.synchronize()?;
        Ok(decode)
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

        /// Runs `layout` on a fresh arena: one warm-up frame, the choice between eager
        /// launches and graph replays, `frames` timed frames (eager ones with every stage timed
        /// by events), then the outputs (in graph mode checked against one eager frame).
        pub fn run(
            &self,
            layout: Layout,
            input: &[u8],
            size: ImageSize,
            frames: usize,
            exec: Exec,
        ) -> super::Result<Run> {
            let frame = FrameInput { input, size };
            match layout {
                Layout::Unaliased => self.run_layout::<Frame>(&frame, frames, exec),
                Layout::Aliased => self.run_layout::<FrameStaged>(&frame, frames, exec),
            }
        }

        /// Median time of `n` frames run by `f`, each waited for.
        fn time_frames(
            &self,
            n: usize,
            mut f: impl FnMut() -> Result<Duration, Error>,
        ) -> Result<Duration, Error> {
            let mut times = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                f()?;
                self.sync()?;
                times.push(start.elapsed());
            }
            Ok(median(&times).unwrap_or_default())
        }

        fn run_layout<L: GpuLayout>(
            &self,
            frame: &FrameInput<'_>,
            frames: usize,
            exec: Exec,
        ) -> super::Result<Run> {
            let backend = CudaBackend::new(self.stream.clone());
            let mut arena = Arena::<L, _>::new_in(backend.clone())?;
            let setup = backend.stats();
            let mut stage_times: Vec<Vec<Duration>> = Stage::ALL
                .iter()
                .map(|_| Vec::with_capacity(frames))
                .collect();
            let mut frame_times = Vec::with_capacity(frames);
            let mut decode_times = Vec::with_capacity(frames);
            let mut outputs = FrameOutputs::new(frame.size);

            L::eager(self, &mut arena, frame, None, None)?;
            self.sync()?;
            let (use_graph, execution) = match exec {
                Exec::Eager => (
                    false,
                    "eager: every kernel launched every frame".to_string(),
                ),
                Exec::Graph => (true, "graph: one CUDA graph replay per frame".to_string()),
                Exec::Auto => {
                    let eager = self.time_frames(CHOOSE_FRAMES, || {
                        L::eager(self, &mut arena, frame, None, None)
                    })?;
                    let mut graph = L::capture(self, &mut arena, frame.size)?;
                    replay(&mut graph, frame)?;
                    let replayed = self.time_frames(CHOOSE_FRAMES, || replay(&mut graph, frame))?;
                    let faster = replayed < eager;
                    (
                        faster,
                        format!(
                            "{} (chosen: a frame took {:.1} µs replayed from a graph, {:.1} µs \
                             launched eagerly, medians of {CHOOSE_FRAMES} each; --graph or \
                             --eager to choose)",
                            if faster {
                                "graph: one CUDA graph replay per frame"
                            } else {
                                "eager: every kernel launched every frame"
                            },
                            replayed.as_secs_f64() * 1e6,
                            eager.as_secs_f64() * 1e6
                        ),
                    )
                }
            };

            let (free_before, free_after, graph_check) = if use_graph {
                let mut graph = L::capture(self, &mut arena, frame.size)?;
                replay(&mut graph, frame)?;
                let free_before = self.free_memory()?;
                // The frame loop: an upload and one graph launch per frame; no allocation.
                for _ in 0..frames {
                    let start = Instant::now();
                    decode_times.push(replay(&mut graph, frame)?);
                    frame_times.push(start.elapsed());
                }
                let free_after = self.free_memory()?;
                let mut replayed = FrameOutputs::new(frame.size);
                L::graph_outputs(&mut graph, &mut replayed)?;
                drop(graph);
                // One eager frame, untimed, for the outputs and to check the replays against.
                L::eager(self, &mut arena, frame, None, Some(&mut outputs))?;
                let check = match L::difference(&replayed, &outputs) {
                    None => format!(
                        "graph replay vs eager launches: {} bit-identical",
                        L::GRAPH_OUTPUTS
                    ),
                    Some(d) => {
                        return Err(format!("the graph's output differs from eager: {d}").into());
                    }
                };
                (free_before, free_after, Some(check))
            } else {
                let free_before = self.free_memory()?;
                // The frame loop: an upload, launches, event records and a synchronize; no
                // allocation.
                for _ in 0..frames {
                    let start = Instant::now();
                    decode_times.push(L::eager(self, &mut arena, frame, Some(&self.events), None)?);
                    self.sync()?;
                    frame_times.push(start.elapsed());
                    for (t, ms) in stage_times.iter_mut().zip(self.events.elapsed_ms()?) {
                        t.push(Duration::from_secs_f64(ms as f64 / 1e3));
                    }
                }
                let free_after = self.free_memory()?;
                // One more frame, untimed, that downloads every output (on the aliased layout,
                // each in the last stage it is live in: its bytes are reused afterwards).
                L::eager(self, &mut arena, frame, None, Some(&mut outputs))?;
                (free_before, free_after, None)
            };
            let after = backend.stats();
            Ok(Run {
                layout: L::LAYOUT,
                backend: format!(
                    "cuda: {}, PTX kernels, CudaBackend arena (one cuMemAlloc)",
                    self.device
                ),
                execution,
                decode_times,
                stage_times: if use_graph {
                    vec![Vec::new(); Stage::ALL.len()]
                } else {
                    stage_times
                },
                frame_times,
                outputs,
                arena_bytes: arena.size(),
                setup_allocations: setup.allocations,
                allocations_after_setup: after.allocations - setup.allocations,
                free_memory: Some((free_before, free_after)),
                graph_check,
            })
        }
    }
}

/// The median, `None` for no values.
fn median(xs: &[Duration]) -> Option<Duration> {
    let mut v = xs.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn write_png(
    dir: &Path,
    name: &str,
    size: ImageSize,
    data: &[u8],
    color: png::ColorType,
) -> Result<PathBuf> {
    let path = dir.join(name);
    let file =
        File::create(&path).map_err(|e| format!("cannot create `{}`: {e}", path.display()))?;
    let mut enc = png::Encoder::new(BufWriter::new(file), size.width as u32, size.height as u32);
    enc.set_color(color);
    enc.set_depth(png::BitDepth::Eight);
    let fail = |e: png::EncodingError| format!("writing `{}`: {e}", path.display());
    let mut writer = enc.write_header().map_err(fail)?;
    writer.write_image_data(data).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(path)
}

/// The most deflate (a PNG's compression) expands its input.
const DEFLATE_MAX_RATIO: u64 = 1032;

/// Reads a PNG as 8-bit RGB at its own size, or downscaled to fit the layouts ([`fit_input`]):
/// palette, gray and 16-bit images are converted, alpha is dropped. Every error names the file.
fn load_png(path: &Path) -> Result<Input> {
    let file = File::open(path).map_err(|e| format!("cannot open `{}`: {e}", path.display()))?;
    let mut decoder = png::Decoder::new(BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder
        .read_info()
        .map_err(|e| format!("`{}` is not a readable PNG: {e}", path.display()))?;
    // The header may claim any size: checked before a pixel buffer of that size is allocated.
    let info = reader.info();
    let claimed = ImageSize::new(info.width as usize, info.height as usize);
    claimed.check(&format!("`{}`", path.display()))?;
    // Deflate expands at most 1032:1 (zlib's technical notes), so a file much smaller than the
    // image's pixel data cannot hold it: a few bytes claiming gigapixels fail here.
    let pixel_bytes = (claimed.pixels() as u64 * info.bits_per_pixel() as u64).div_ceil(8);
    let file_bytes = fs::metadata(path).map_or(u64::MAX, |m| m.len());
    if file_bytes.saturating_mul(DEFLATE_MAX_RATIO) < pixel_bytes {
        return Err(format!(
            "`{}`: {file_bytes} bytes cannot hold the {claimed} image its header claims \
             ({pixel_bytes} bytes of pixels, compressed at most {DEFLATE_MAX_RATIO}:1)",
            path.display()
        )
        .into());
    }
    let len = reader
        .output_buffer_size()
        .ok_or_else(|| format!("`{}`: image too large to decode", path.display()))?;
    let mut buf = vec![0u8; len];
    let info = reader
        .next_frame(&mut buf)
        .map_err(|e| format!("`{}`: cannot decode the image data: {e}", path.display()))?;
    let size = ImageSize::new(info.width as usize, info.height as usize);
    let samples = info.color_type.samples();
    let mut rgb = Vec::with_capacity(size.pixels() * 3);
    for row in buf.chunks(info.line_size).take(size.height) {
        for px in row[..size.width * samples].chunks_exact(samples) {
            match info.color_type {
                png::ColorType::Grayscale | png::ColorType::GrayscaleAlpha => {
                    rgb.extend_from_slice(&[px[0]; 3])
                }
                _ => rgb.extend_from_slice(&px[..3]),
            }
        }
    }
    let source = format!(
        "{} ({size}, {:?})",
        path.display(),
        reader.info().color_type
    );
    fit_input(rgb, size, source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
    use std::cell::Cell;

    /// The system allocator, recording the largest single allocation each thread asks for: a
    /// test checks that a size claimed by its input does not become an allocation of that size.
    #[derive(Debug)]
    struct LargestAllocation;

    thread_local! {
        static LARGEST: Cell<usize> = const { Cell::new(0) };
    }

    fn note(size: usize) {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    }

    // SAFETY: every call is forwarded to `System` unchanged; `note` neither allocates nor
    // unwinds.
    unsafe impl GlobalAlloc for LargestAllocation {
        unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
            note(layout.size());
            // SAFETY: the caller keeps `GlobalAlloc::alloc`'s contract, which is `System`'s.
            unsafe { System.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
            note(layout.size());
            // SAFETY: as in `alloc`.
            unsafe { System.alloc_zeroed(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
            // SAFETY: `ptr` came from `System` with `layout` (every allocation above does).
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
            note(new_size);
            // SAFETY: `ptr` came from `System` with `layout`; the caller keeps `realloc`'s
            // contract for `new_size`.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: LargestAllocation = LargestAllocation;

    /// `f`'s result and the largest allocation this thread asked for while it ran.
    fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
        LARGEST.with(|l| l.set(0));
        let r = f();
        (r, LARGEST.with(Cell::get))
    }

    /// CRC-32 of a PNG chunk's type and data (ISO 3309, as PNG uses it).
    fn crc32(bytes: &[u8]) -> u32 {
        !bytes.iter().fold(!0u32, |mut c, &b| {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xedb8_8320
                } else {
                    c >> 1
                };
            }
            c
        })
    }

    /// `png` with its header's width and height replaced (and the header's CRC redone).
    fn claim_size(png: &[u8], width: u32, height: u32) -> Vec<u8> {
        // Signature (8), IHDR length (4), "IHDR" (4), width, height, 5 bytes, CRC.
        let mut out = png.to_vec();
        out[16..20].copy_from_slice(&width.to_be_bytes());
        out[20..24].copy_from_slice(&height.to_be_bytes());
        let crc = crc32(&out[12..29]);
        out[29..33].copy_from_slice(&crc.to_be_bytes());
        out
    }

    fn args(line: &str) -> Result<Args> {
        parse_args(line.split_whitespace().map(String::from))
    }

    /// A fresh directory for one test's files.
    fn scratch_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "devarena-image-pipeline-{}-{test}",
            std::process::id()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Writes an 8-bit PNG of `size` and `color` (`data` holds its samples).
    fn png_file(
        dir: &Path,
        name: &str,
        size: ImageSize,
        data: &[u8],
        color: png::ColorType,
    ) -> PathBuf {
        write_png(dir, name, size, data, color).unwrap()
    }

    /// The size a PNG file says it has.
    fn png_size(path: &Path) -> ImageSize {
        let reader = png::Decoder::new(BufReader::new(File::open(path).unwrap()))
            .read_info()
            .unwrap();
        let info = reader.info();
        ImageSize::new(info.width as usize, info.height as usize)
    }

    #[test]
    fn sizes_parse_and_bad_ones_are_named() {
        assert_eq!(parse_size("1920x1080").unwrap(), ImageSize::new(1920, 1080));
        assert_eq!(parse_size("7×5").unwrap(), ImageSize::new(7, 5));
        let e = parse_size("640by480").unwrap_err();
        assert!(e.to_string().contains("`640by480`"), "{e}");
        let e = parse_size("0x5").unwrap_err();
        assert!(e.to_string().contains("0×5"), "{e}");
    }

    #[test]
    fn wrong_arguments_are_errors_naming_them() {
        for (line, says) in [
            ("--frames", "--frames needs a number"),
            ("--frames 0", "at least 1"),
            ("--frames -1", "`-1` is not a number"),
            ("--frames 99999999999999999999", "is not a number"),
            (
                "--frames 18446744073709551615",
                "18446744073709551615 is more than the 100000 frames",
            ),
            ("--frames 100001", "100001 is more than the 100000 frames"),
            ("--size", "--size needs WxH"),
            ("--size 10x", "`10x` is not WIDTHxHEIGHT"),
            ("--size abc", "`abc` is not WIDTHxHEIGHT"),
            ("--size 0x0", "0×0 pixels is empty"),
            ("--size 99999999999x1", "99999999999×1 pixels is too large"),
            ("--out", "--out needs a directory"),
            ("--bogus", "unknown option `--bogus`"),
            ("a.png b.png", "more than one input given (`b.png`)"),
            ("a.png --size 4x4", "an input image has its own"),
            ("--graph --eager", "exclude each other"),
        ] {
            let e = args(line).expect_err(line).to_string();
            assert!(e.contains(says), "`{line}`: {e}");
        }
        let a = args("--frames 100000 --size 3x7 --compare --eager").unwrap();
        assert_eq!((a.frames, a.size), (MAX_FRAMES, Some(ImageSize::new(3, 7))));
    }

    #[test]
    fn a_size_past_the_layouts_makes_the_synthetic_frame_at_the_size_that_fits() {
        let a = args("--size 7680x4320").unwrap();
        let (input, largest) = largest_allocation(|| load_input(&a).unwrap());
        assert_eq!(input.size, MAX_SIZE);
        assert_eq!(input.rgb.len(), MAX_PIXELS * 3);
        assert!(
            largest <= MAX_PIXELS * 3,
            "{largest} bytes allocated at once"
        );
        assert!(
            input.source.contains("7680×4320 downscaled")
                && input
                    .source
                    .contains("33177600 pixels are more than the 8294400"),
            "{}",
            input.source
        );
        // Too many rows, not too many pixels: the note says which.
        let a = args("--size 1x600000").unwrap();
        let input = load_input(&a).unwrap();
        assert_eq!(input.size, ImageSize::new(1, MAX_ROWS));
        assert!(
            input
                .source
                .contains("600000 rows are more than the 524280"),
            "{}",
            input.source
        );
    }

    #[test]
    fn a_header_claiming_a_huge_image_is_refused_before_allocating_it() {
        let dir = scratch_dir("bomb");
        let size = ImageSize::new(16, 16);
        let small = png_file(
            &dir,
            "small.png",
            size,
            &[7; 16 * 16 * 3],
            png::ColorType::Rgb,
        );
        let bytes = fs::read(&small).unwrap();
        let bomb = dir.join("bomb.png");
        for (w, h, says) in [
            // 2.7 GB of pixels claimed by a file of a few dozen bytes.
            (
                30_000,
                30_000,
                "cannot hold the 30000×30000 image its header claims",
            ),
            // More than the pipeline's u32 byte counts: refused by its size alone.
            (100_000, 100_000, "100000×100000 pixels is too large"),
            (u32::MAX >> 1, u32::MAX >> 1, "is not a readable PNG"),
        ] {
            fs::write(&bomb, claim_size(&bytes, w, h)).unwrap();
            let (e, largest) = largest_allocation(|| load_png(&bomb).err());
            let e = e.expect("a bomb must not load").to_string();
            assert!(e.contains(says) && e.contains("bomb.png"), "{w}×{h}: {e}");
            assert!(
                largest < 1 << 20,
                "{w}×{h}: {largest} bytes allocated at once"
            );
        }
        // Claiming a slightly larger size than the data holds: decoded, and refused as short.
        fs::write(&bomb, claim_size(&bytes, 16, 17)).unwrap();
        let e = load_png(&bomb).err().expect("short data must not load");
        assert!(e.to_string().contains("bomb.png"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_output_that_cannot_be_written_is_an_error_naming_it() {
        for name in ["mask.png", "layout.txt", "layout.svg"] {
            let dir = scratch_dir(&format!("unwritable-{name}"));
            // A directory where the file goes.
            let blocked = dir.join(name);
            fs::create_dir_all(&blocked).unwrap();
            let mut a = args("--size 5x3 --frames 1 --host").unwrap();
            a.out = dir.clone();
            let e = run(a).expect_err(name).to_string();
            assert!(e.contains(&blocked.display().to_string()), "{name}: {e}");
            fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn a_truncated_png_is_an_error_naming_the_file() {
        let dir = scratch_dir("truncated");
        let size = ImageSize::new(64, 48);
        let rgb: Vec<u8> = (0..size.pixels() * 3)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let path = png_file(&dir, "whole.png", size, &rgb, png::ColorType::Rgb);
        let bytes = fs::read(&path).unwrap();
        let cut = dir.join("cut.png");
        fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
        let e = load_png(&cut).err().expect("a truncated PNG must not load");
        assert!(e.to_string().contains(&cut.display().to_string()), "{e}");
        // Cut inside the header too.
        fs::write(&cut, &bytes[..20]).unwrap();
        let e = load_png(&cut)
            .err()
            .expect("a truncated header must not load");
        assert!(e.to_string().contains(&cut.display().to_string()), "{e}");
        // The whole file loads, at its own size.
        let input = load_png(&path).unwrap();
        assert_eq!((input.size, &input.rgb), (size, &rgb));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn small_and_odd_images_run_and_are_written_at_their_own_size() {
        let dir = scratch_dir("odd");
        for size in [
            ImageSize::new(1, 1),
            ImageSize::new(7, 5),
            ImageSize::new(3, 11),
        ] {
            let gray: Vec<u8> = (0..size.pixels()).map(|i| (i * 37 % 256) as u8).collect();
            let path = png_file(&dir, "in.png", size, &gray, png::ColorType::Grayscale);
            let input = load_png(&path).unwrap();
            assert_eq!(input.size, size);
            assert!(!input.source.contains("downscaled"), "{}", input.source);
            let mut outputs = Vec::new();
            for layout in [Layout::Unaliased, Layout::Aliased] {
                let run = run_host(layout, &input.rgb, input.size, 2).unwrap();
                assert_eq!(run.outputs.size, size);
                assert_eq!(run.allocations_after_setup, 0);
                outputs.push(run.outputs);
            }
            assert_eq!(outputs[0].first_difference(&outputs[1]), None, "{size}");
            for (name, data) in output_images(&outputs[0]) {
                let written =
                    write_png(&dir, name, size, &data, png::ColorType::Grayscale).unwrap();
                assert_eq!(png_size(&written), size, "{name}");
            }
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_image_larger_than_the_maximum_is_downscaled_keeping_its_aspect_ratio() {
        let dir = scratch_dir("large");
        let size = ImageSize::new(5000, 3000);
        // Dark left half, bright right half: compresses well, and its edge must stay central.
        let gray: Vec<u8> = (0..size.pixels())
            .map(|i| if i % 5000 < 2500 { 30 } else { 220 })
            .collect();
        let path = png_file(&dir, "large.png", size, &gray, png::ColorType::Grayscale);
        let input = load_png(&path).unwrap();
        assert_eq!(input.size, ImageSize::new(3718, 2230));
        assert_eq!(input.rgb.len(), input.size.pixels() * 3);
        assert!(
            input.source.contains("downscaled") && input.source.contains("aspect ratio kept"),
            "{}",
            input.source
        );
        let row = &input.rgb[..input.size.width * 3];
        let half = input.size.width / 2;
        assert_eq!(row[(half - 3) * 3], 30);
        assert_eq!(row[(half + 3) * 3], 220);
        // An image that fits is not touched, however it is shaped.
        let tall = ImageSize::new(3, 4000);
        let path = png_file(
            &dir,
            "tall.png",
            tall,
            &vec![9; tall.pixels()],
            png::ColorType::Grayscale,
        );
        assert_eq!(load_png(&path).unwrap().size, tall);
        fs::remove_dir_all(&dir).unwrap();
    }
}

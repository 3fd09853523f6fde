//! What one arena saves over the ways device buffers are usually made, on the image pipeline.
//!
//! ```text
//! cargo bench -p devarena-kernels --features cuda --bench pipeline [-- --json] [--rounds N] [--frames N]
//! ```
//!
//! Three measurements, a module each:
//!
//! * **setup** (`setup.rs`): making every buffer of a layout, as N × `cuMemAlloc`,
//!   N × `cuMemAllocAsync` (plus the stream synchronize that makes them usable), one
//!   `cuMemAlloc` of the layout's `SIZE`, and one arena: for the pipeline's `Frame` (8
//!   buffers), for a 1000-buffer layout built at run time, of mixed sizes (16 B … 192 KiB) and
//!   alignments (1 … 4096), and for the derived 1000-field layout of the GPU tests
//!   (`tests/src/many_fields.rs`: small buffers, alignments 1 … 4096). Teardown (freeing them
//!   all) is timed too. The arena's construction is timed exactly as the single `cuMemAlloc`
//!   is (a clock read before and after the one call); the variants take turns within every
//!   round, in an order that rotates from round to round, so drift hits them alike. Medians of
//!   `--rounds` (≥ 20, default 51) rounds after 3 warm-up rounds.
//! * **steady state** (`steady.rs`): one pipeline frame (7 kernels and the histogram reset,
//!   from a resident input, ending with a stream synchronize), on buffers allocated once
//!   by hand (raw cudarc: the floor), on the arena, on one cudarc `CudaSlice` per buffer, and
//!   with `cuMemAlloc`/`cuMemFree` or `cuMemAllocAsync`/`cuMemFreeAsync` around every kernel
//!   (each stage allocates its output and frees what no later stage reads) — and **replayed
//!   from a CUDA graph**: the arena's (`PipelineKernels::capture_frame`, one
//!   `ArenaGraph::launch` per frame) and, as its floor, one captured from the raw buffers
//!   through cudarc. All at 1920×1080 and, where launch overhead dominates, at 256×256 (the
//!   buffers have room for 3840×2160 and are used at the frame's size). Then the aliased
//!   `FrameStaged` arena, whose input buffer shares bytes with later stages and so is written
//!   every frame (a 6 MB device-to-device copy from a resident input), eagerly and from a graph
//!   that captures the copy too, against the floor doing the same copy. Every row reports the
//!   median frame time, its ratio to the eager floor of its group, and the median **submit
//!   time**: the CPU time to queue the frame (the launches, or one `graph.launch()`), before the
//!   wait. `--frames` (default 500) frames per method, run in passes of 10 that alternate
//!   between the methods.
//! * **footprint** (`footprint.rs`): device memory consumed (`cuMemGetInfo` free before −
//!   after) by the pipeline's buffers and by 10,000 buffers of 100 B: one allocation per
//!   buffer against one arena (and one plain `cuMemAlloc` of the same `SIZE`); and the aliased
//!   `FrameStaged` arena (`SIZE`) against the unaliased `Frame` arena (`UNALIASED_SIZE`).
//!
//! The last table checks the targets: arena setup ≤ 1.1 × one `cuMemAlloc` of the same size;
//! the eager arena's frame time within 1% of the floor; the graph-replayed arena at ≤ 0.85 ×
//! the eager floor at 1920×1080 and ≤ 0.55 × at 256×256, each replay submitted in ≤ 3 µs;
//! arena footprint within one 2 MiB page of `SIZE`.
//! `report.rs` prints the tables (or `--json`); `driver.rs` holds the driver calls the
//! measurements share.
//!
//! Without a CUDA device it prints `skipped: no CUDA device` and exits 0. Run by a test
//! runner (`--test-threads=N`, `--nocapture`, as `cargo test --benches` passes), it makes a
//! quick run of 20 rounds and 20 frames per method: every method runs on the device, the
//! medians are rough.

use std::process::ExitCode;

#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
mod footprint;
#[cfg(feature = "cuda")]
mod report;
#[cfg(feature = "cuda")]
mod setup;
#[cfg(feature = "cuda")]
mod steady;

#[derive(Debug, Clone)]
struct Args {
    json: bool,
    rounds: usize,
    frames: usize,
    /// Run by a test runner: fewer rounds and frames.
    quick: bool,
}

const USAGE: &str = "usage: pipeline [--json] [--rounds N (>= 20)] [--frames N (>= 20)]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        json: false,
        rounds: 51,
        frames: 500,
        quick: false,
    };
    let mut quick = false;
    let (mut rounds, mut frames) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            let v = it.next().ok_or(format!("{name} needs a number"))?;
            let n: usize = v
                .parse()
                .map_err(|_| format!("{name}: `{v}` is not a number"))?;
            if n < 20 {
                return Err(format!(
                    "{name} must be at least 20 (medians of >= 20), got {n}"
                ));
            }
            Ok(n)
        };
        match a.as_str() {
            "--json" => args.json = true,
            "--rounds" => rounds = Some(number("--rounds")?),
            "--frames" => frames = Some(number("--frames")?),
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" => {}
            // A test runner: a quick run, unless the counts were given.
            "--test-threads" => {
                it.next();
                quick = true;
            }
            s if s.starts_with("--test-threads=") || s == "--nocapture" || s == "--quiet" => {
                quick = true;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    let (full_rounds, full_frames) = (args.rounds, args.frames);
    args.quick = quick;
    args.rounds = rounds.unwrap_or(if quick { 20 } else { full_rounds });
    args.frames = frames.unwrap_or(if quick { 20 } else { full_frames });
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    #[cfg(feature = "cuda")]
    {
        match run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(devarena::Error::NoDevice { reason }) => {
                println!("skipped: no CUDA device ({reason})");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = args;
        println!("skipped: no CUDA device (built without the `cuda` feature)");
        ExitCode::SUCCESS
    }
}

/// Every measurement, then the tables.
#[cfg(feature = "cuda")]
fn run(args: &Args) -> Result<(), devarena::Error> {
    use devarena::backend::cuda::{CudaBackend, cuda_stream};
    use devarena_kernels::pipeline::cuda::{PipelineKernels, driver_error};

    let stream = cuda_stream(0)?;
    let ctx = stream.context().clone();
    ctx.bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    let device = driver::describe(&ctx)?;
    let kernels = PipelineKernels::load(&ctx)?;
    let backend = CudaBackend::new(stream.clone());

    let setup = setup::measure(&stream, &backend, args.rounds)?;
    // Footprint before the steady state, on an idle device: a context synchronize lets the
    // stream-ordered pool give back what the async rounds freed (release threshold 0).
    ctx.synchronize()
        .map_err(|e| driver_error("cuCtxSynchronize", e))?;
    let footprint = footprint::measure(&ctx, &stream, &backend)?;
    let steady = steady::measure(&kernels, &stream, &backend, args.frames)?;

    let tables = report::Tables {
        device,
        setup,
        steady,
        footprint,
    };
    if args.json {
        println!("{}", tables.json(args));
    } else {
        tables.print(args);
    }
    Ok(())
}

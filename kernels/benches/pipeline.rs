//! What one arena saves over the ways device buffers are usually made, on the image pipeline.
//!
//! ```text
//! cargo bench -p devarena-kernels --features cuda --bench pipeline [-- --json] [--rounds N] [--frames N]
//! ```
//!
//! Three measurements:
//!
//! * **setup**: making every buffer of a layout, as N × `cuMemAlloc`, N × `cuMemAllocAsync`
//!   (plus the stream synchronize that makes them usable), one `cuMemAlloc` of the layout's
//!   `SIZE`, and one arena: for the pipeline's `Frame` (8 buffers) and for a 1000-buffer layout
//!   of mixed sizes (16 B … 128 KiB) and alignments (1 … 4096). Teardown (freeing them all) is
//!   timed too. The arena's construction is timed exactly as the single `cuMemAlloc` is (a
//!   clock read before and after the one call); the variants take turns within every round,
//!   in an order that rotates from round to round, so drift hits them alike. Medians of
//!   `--rounds` (≥ 20, default 51) rounds after 3 warm-up rounds.
//! * **steady state**: one pipeline frame (7 kernels and the histogram reset, from a resident
//!   1080p input, ending with a stream synchronize), on buffers allocated once by hand (raw
//!   cudarc: the floor), on the arena, on one cudarc `CudaSlice` per buffer, and with
//!   `cuMemAlloc`/`cuMemFree` or `cuMemAllocAsync`/`cuMemFreeAsync` around every kernel (each
//!   stage allocates its output and frees what no later stage reads). Then the aliased
//!   `FrameStaged` arena, whose input buffer shares bytes with later stages and so is written
//!   every frame (a 6 MB device-to-device copy from a resident input), against the floor
//!   doing the same copy. `--frames` (default 500) frames per method, run in passes of 10
//!   that alternate between the methods; the medians give frames/s and the overhead over the
//!   floor.
//! * **footprint**: device memory consumed (`cuMemGetInfo` free before − after) by the
//!   pipeline's buffers and by 10,000 buffers of 100 B: one allocation per buffer against one
//!   arena (and one plain `cuMemAlloc` of the same `SIZE`); and the aliased `FrameStaged`
//!   arena (`SIZE`) against the unaliased `Frame` arena (`UNALIASED_SIZE`).
//!
//! The last table checks the targets: arena setup ≤ 1.1 × one `cuMemAlloc` of the same size,
//! arena frame time within 1% of the floor, arena footprint within one 2 MiB page of `SIZE`.
//!
//! Without a CUDA device it prints `skipped: no CUDA device` and exits 0. Run by a test
//! runner (`--test-threads=N`, `--nocapture`, as `cargo test --benches` and the GPU runner
//! pass), it makes a quick run of 20 rounds and 20 frames per method: every method runs on the
//! device, the medians are rough.

use std::process::ExitCode;

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
        match gpu::run(&args) {
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

#[cfg(feature = "cuda")]
mod gpu {
    use std::fmt::Write as _;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use cudarc::driver::{CudaContext, CudaStream, result, sys};
    use devarena::backend::cuda::{CudaBackend, DeviceViewMut, cuda_stream, mem_info};
    use devarena::{Arena, Backend, DeviceLayout, Error, LayoutBuilder, RuntimeLayout};
    use devarena_kernels::pipeline::cuda::{FrameSlices, PipelineKernels, RawFrame, driver_error};
    use devarena_kernels::pipeline::image::{DEFAULT_SEED, SplitMix64, synthetic_frame};
    use devarena_kernels::pipeline::{
        FRAME_SIZE, Frame, FrameBuffers, FrameStaged, HIST_BINS, PIXELS,
    };

    use super::Args;

    /// `Frame`'s buffers with every field on its own 2 MiB page, as separate `cuMemAlloc`s of
    /// them land: a diagnostic of where buffers sit relative to each other.
    #[derive(DeviceLayout)]
    #[layout(align = 2097152)]
    struct FramePaged {
        rgb: [u8; PIXELS * 3],
        gray: [f32; PIXELS],
        scratch: [f32; PIXELS],
        blurred: [f32; PIXELS],
        magnitude: [f32; PIXELS],
        hist: [u32; HIST_BINS],
        threshold: [u32; 1],
        mask: [u8; PIXELS],
    }

    type Runner<'k> = Box<dyn FnMut() -> Result<(), Error> + 'k>;
    /// One setup measurement: (setup, teardown).
    type Measure<'a> = Box<dyn FnMut() -> Result<(Duration, Duration), Error> + 'a>;

    /// Warm-up rounds before the measured ones.
    const WARMUP_ROUNDS: usize = 3;
    /// The granularity `cuMemGetInfo` counts in on the target GPU.
    const PAGE: usize = 2 << 20;

    /// One row of the setup table.
    struct SetupRow {
        layout: &'static str,
        method: &'static str,
        buffers: usize,
        bytes: usize,
        /// Median setup and teardown.
        times: (Duration, Duration),
    }

    struct SteadyRow {
        group: &'static str,
        method: &'static str,
        /// The floor of its group: the other rows are compared with it.
        floor: bool,
        /// Median frame time.
        frame: Duration,
    }

    struct FootprintRow {
        what: &'static str,
        method: &'static str,
        requested: usize,
        consumed: usize,
        /// The arena row the group's ratios are taken against.
        baseline: bool,
        /// For an arena row: the plan's `SIZE`, which the footprint must stay within a page of.
        plan_size: Option<usize>,
    }

    /// One target of the issue, checked on this run.
    struct Target {
        what: String,
        value: String,
        target: &'static str,
        met: bool,
    }

    pub fn run(args: &Args) -> Result<(), Error> {
        let stream = cuda_stream(0)?;
        let ctx = stream.context().clone();
        ctx.bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let device = describe(&ctx)?;
        let kernels = PipelineKernels::load(&ctx)?;
        let backend = CudaBackend::new(stream.clone());

        let frame_sizes: Vec<usize> = Frame::FIELDS.iter().map(|f| f.size).collect();
        let many = many_buffers_layout()?;
        let many_sizes: Vec<usize> = many.fields().iter().map(|f| f.size).collect();

        let mut setup = setup_group(
            "Frame (1080p pipeline)",
            args.rounds,
            &frame_sizes,
            Frame::SIZE,
            vec![
                Box::new(|| setup_sync(&frame_sizes)),
                Box::new(|| setup_async(&stream, &frame_sizes)),
                Box::new(|| setup_one(Frame::SIZE)),
                Box::new(|| arena_setup::<Frame>(&backend)),
            ],
        )?;
        setup.extend(setup_group(
            "1000 buffers",
            args.rounds,
            &many_sizes,
            many.size(),
            vec![
                Box::new(|| setup_sync(&many_sizes)),
                Box::new(|| setup_async(&stream, &many_sizes)),
                Box::new(|| setup_one(many.size())),
                Box::new(|| runtime_arena_setup(&backend, many.size(), many.align())),
            ],
        )?);

        // Footprint before the steady state, on an idle device: a context synchronize lets the
        // stream-ordered pool give back what the async rounds freed (release threshold 0).
        ctx.synchronize()
            .map_err(|e| driver_error("cuCtxSynchronize", e))?;
        let footprint = footprints(&ctx, &stream, &backend, &frame_sizes)?;

        let steady = steady_state(&kernels, &stream, &backend, args.frames)?;
        let targets = targets(&setup, &steady, &footprint);

        if args.json {
            println!(
                "{}",
                json(&device, args, &setup, &steady, &footprint, &targets)
            );
        } else {
            print_tables(&device, args, &setup, &steady, &footprint, &targets);
        }
        Ok(())
    }

    fn describe(ctx: &Arc<CudaContext>) -> Result<String, Error> {
        let name = ctx.name().map_err(|e| driver_error("cuDeviceGetName", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error("cuDeviceGetAttribute", e))?;
        let total = ctx
            .total_mem()
            .map_err(|e| driver_error("cuDeviceTotalMem", e))?;
        let mut version = 0i32;
        // SAFETY: writes one `int` through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| driver_error("cuDriverGetVersion", e))?;
        Ok(format!(
            "{name} (sm_{major}{minor}, {:.1} GiB), CUDA driver API {}.{}",
            total as f64 / (1u64 << 30) as f64,
            version / 1000,
            version % 1000 / 10
        ))
    }

    /// A layout of 1000 buffers: sizes 16 B … 128 KiB (log-uniform), alignments 1 … 4096.
    fn many_buffers_layout() -> Result<RuntimeLayout, Error> {
        let mut rng = SplitMix64::new(DEFAULT_SEED);
        let mut b = LayoutBuilder::new("ThousandBuffers");
        for i in 0..1000 {
            let magnitude = 4 + rng.next_u64() % 14; // 2^4 … 2^17
            let len = (1usize << magnitude) + (rng.next_u64() % (1 << magnitude)) as usize / 2;
            b = b.array_aligned::<u8>(format!("b{i}"), len, 1 << (i % 13));
        }
        b.build()
    }

    /// The four setup methods of one layout, measured by [`interleaved`] rounds. `variants`:
    /// N × `cuMemAlloc`, N × `cuMemAllocAsync`, 1 × `cuMemAlloc` of `size`, the arena.
    fn setup_group<'a>(
        layout: &'static str,
        rounds: usize,
        sizes: &[usize],
        size: usize,
        mut variants: Vec<Measure<'a>>,
    ) -> Result<Vec<SetupRow>, Error> {
        let times = interleaved(rounds, &mut variants)?;
        let requested = sizes.iter().sum();
        let rows = [
            ("N × cuMemAlloc", sizes.len(), requested),
            ("N × cuMemAllocAsync", sizes.len(), requested),
            ("1 × cuMemAlloc (SIZE)", 1, size),
            ("arena (one allocation)", 1, size),
        ];
        Ok(rows
            .into_iter()
            .zip(times)
            .map(|((method, buffers, bytes), times)| SetupRow {
                layout,
                method,
                buffers,
                bytes,
                times,
            })
            .collect())
    }

    /// Runs every variant once per round, starting each round one variant further on, so slow
    /// drift (clocks, the driver's caches) spreads evenly; medians of `rounds` rounds after
    /// [`WARMUP_ROUNDS`].
    fn interleaved(
        rounds: usize,
        variants: &mut [Measure<'_>],
    ) -> Result<Vec<(Duration, Duration)>, Error> {
        let n = variants.len();
        let mut samples = vec![(Vec::with_capacity(rounds), Vec::with_capacity(rounds)); n];
        for round in 0..WARMUP_ROUNDS + rounds {
            for k in 0..n {
                let v = (round + k) % n;
                let (setup, teardown) = variants[v]()?;
                if round >= WARMUP_ROUNDS {
                    samples[v].0.push(setup);
                    samples[v].1.push(teardown);
                }
            }
        }
        Ok(samples
            .into_iter()
            .map(|(mut s, mut t)| (median(&mut s), median(&mut t)))
            .collect())
    }

    fn median(v: &mut [Duration]) -> Duration {
        v.sort_unstable();
        v[v.len() / 2]
    }

    /// One `cuMemAlloc` of `size`, then its `cuMemFree`: each call timed on its own.
    fn setup_one(size: usize) -> Result<(Duration, Duration), Error> {
        let start = Instant::now();
        // SAFETY: a plain allocation in the current context; freed below.
        let p = unsafe { result::malloc_sync(size) };
        let setup = start.elapsed();
        let p = p.map_err(|e| driver_error("cuMemAlloc", e))?;
        let start = Instant::now();
        // SAFETY: allocated above, freed once, never used.
        let freed = unsafe { result::free_sync(p) };
        let teardown = start.elapsed();
        freed.map_err(|e| driver_error("cuMemFree", e))?;
        Ok((setup, teardown))
    }

    /// One arena of `L` on `backend`, then its free: timed as [`setup_one`] times its calls.
    fn arena_setup<L: DeviceLayout>(backend: &CudaBackend) -> Result<(Duration, Duration), Error> {
        let backend = backend.clone();
        let start = Instant::now();
        let arena = Arena::<L, _>::new_in(backend);
        let setup = start.elapsed();
        let arena = arena?;
        let start = Instant::now();
        let freed = arena.free();
        let teardown = start.elapsed();
        freed?;
        Ok((setup, teardown))
    }

    /// One backend allocation of `bytes` at `align` (the arena of a run-time layout), then its
    /// free: timed as [`setup_one`] times its calls.
    fn runtime_arena_setup(
        backend: &CudaBackend,
        bytes: usize,
        align: usize,
    ) -> Result<(Duration, Duration), Error> {
        let start = Instant::now();
        let a = backend.allocate(bytes, align);
        let setup = start.elapsed();
        let a = a?;
        let start = Instant::now();
        // SAFETY: allocated just above by this backend, freed once; no view was made.
        let freed = unsafe { backend.deallocate(&a) };
        let teardown = start.elapsed();
        freed?;
        Ok((setup, teardown))
    }

    /// N × `cuMemAlloc`, then N × `cuMemFree`.
    fn setup_sync(sizes: &[usize]) -> Result<(Duration, Duration), Error> {
        let mut ptrs = Vec::with_capacity(sizes.len());
        let start = Instant::now();
        for &s in sizes {
            // SAFETY: a plain allocation in the current context; freed below.
            let p = unsafe { result::malloc_sync(s) };
            match p {
                Ok(p) => ptrs.push(p),
                Err(e) => {
                    free_all_sync(&ptrs);
                    return Err(driver_error("cuMemAlloc", e));
                }
            }
        }
        let setup = start.elapsed();
        let start = Instant::now();
        for p in ptrs {
            // SAFETY: allocated above, freed once, never used.
            unsafe { result::free_sync(p) }.map_err(|e| driver_error("cuMemFree", e))?;
        }
        Ok((setup, start.elapsed()))
    }

    fn free_all_sync(ptrs: &[sys::CUdeviceptr]) {
        for &p in ptrs {
            // SAFETY: each pointer came from `malloc_sync` and is freed once, here.
            let _ = unsafe { result::free_sync(p) };
        }
    }

    /// N × `cuMemAllocAsync` and a synchronize, then N × `cuMemFreeAsync` and a synchronize.
    fn setup_async(
        stream: &Arc<CudaStream>,
        sizes: &[usize],
    ) -> Result<(Duration, Duration), Error> {
        let s = stream.cu_stream();
        let mut ptrs = Vec::with_capacity(sizes.len());
        let start = Instant::now();
        for &size in sizes {
            // SAFETY: a stream-ordered allocation on `stream`, freed below on the same stream.
            match unsafe { result::malloc_async(s, size) } {
                Ok(p) => ptrs.push(p),
                Err(e) => {
                    for &p in &ptrs {
                        // SAFETY: allocated above on this stream, freed once.
                        let _ = unsafe { result::free_async(p, s) };
                    }
                    return Err(driver_error("cuMemAllocAsync", e));
                }
            }
        }
        sync(stream)?;
        let setup = start.elapsed();
        let start = Instant::now();
        for p in ptrs {
            // SAFETY: allocated above on this stream, freed once, never used.
            unsafe { result::free_async(p, s) }.map_err(|e| driver_error("cuMemFreeAsync", e))?;
        }
        sync(stream)?;
        Ok((setup, start.elapsed()))
    }

    fn free_bytes(stream: &CudaStream) -> Result<usize, Error> {
        mem_info(stream).map(|(free, _)| free)
    }

    /// Free device bytes before − after making one `cuMemAlloc` per size.
    fn footprint_sync(stream: &CudaStream, sizes: &[usize]) -> Result<usize, Error> {
        let before = free_bytes(stream)?;
        let mut ptrs = Vec::with_capacity(sizes.len());
        for &s in sizes {
            // SAFETY: a plain allocation; freed below.
            match unsafe { result::malloc_sync(s) } {
                Ok(p) => ptrs.push(p),
                Err(e) => {
                    free_all_sync(&ptrs);
                    return Err(driver_error("cuMemAlloc", e));
                }
            }
        }
        let after = free_bytes(stream);
        free_all_sync(&ptrs);
        Ok(before.saturating_sub(after?))
    }

    /// Free device bytes before − after making an arena of `L`.
    fn footprint_arena<L: DeviceLayout>(
        stream: &CudaStream,
        backend: &CudaBackend,
    ) -> Result<usize, Error> {
        let before = free_bytes(stream)?;
        let arena = Arena::<L, _>::new_in(backend.clone())?;
        let after = free_bytes(stream);
        arena.free()?;
        Ok(before.saturating_sub(after?))
    }

    /// Free device bytes before − after one backend allocation of `bytes` at `align`.
    fn footprint_runtime_arena(
        stream: &CudaStream,
        backend: &CudaBackend,
        bytes: usize,
        align: usize,
    ) -> Result<usize, Error> {
        let before = free_bytes(stream)?;
        let a = backend.allocate(bytes, align)?;
        let after = free_bytes(stream);
        // SAFETY: allocated just above, freed once; no view was made.
        unsafe { backend.deallocate(&a) }?;
        Ok(before.saturating_sub(after?))
    }

    fn footprints(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        backend: &CudaBackend,
        frame_sizes: &[usize],
    ) -> Result<Vec<FootprintRow>, Error> {
        ctx.bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let row = |what, method, requested, consumed, baseline, plan_size| FootprintRow {
            what,
            method,
            requested,
            consumed,
            baseline,
            plan_size,
        };
        let tiny_sizes = vec![100usize; 10_000];
        let tiny = (0..10_000)
            .fold(LayoutBuilder::new("TenThousand"), |b, i| {
                b.array::<u8>(format!("b{i}"), 100)
            })
            .build()?;
        let frame = "Frame (1080p pipeline)";
        let staged = "FrameStaged (aliased)";
        let small = "10,000 × 100 B";
        Ok(vec![
            row(
                frame,
                "one cuMemAlloc per buffer",
                frame_sizes.iter().sum(),
                footprint_sync(stream, frame_sizes)?,
                false,
                None,
            ),
            row(
                frame,
                "1 × cuMemAlloc (SIZE)",
                Frame::SIZE,
                footprint_sync(stream, &[Frame::SIZE])?,
                false,
                None,
            ),
            row(
                frame,
                "arena (one allocation)",
                Frame::SIZE,
                footprint_arena::<Frame>(stream, backend)?,
                true,
                Some(Frame::SIZE),
            ),
            row(
                staged,
                "arena, aliased (SIZE)",
                FrameStaged::SIZE,
                footprint_arena::<FrameStaged>(stream, backend)?,
                true,
                Some(FrameStaged::SIZE),
            ),
            row(
                staged,
                "arena, unaliased Frame (UNALIASED_SIZE)",
                FrameStaged::UNALIASED_SIZE,
                footprint_arena::<Frame>(stream, backend)?,
                false,
                None,
            ),
            row(
                small,
                "one cuMemAlloc per buffer",
                tiny_sizes.iter().sum(),
                footprint_sync(stream, &tiny_sizes)?,
                false,
                None,
            ),
            row(
                small,
                "1 × cuMemAlloc (SIZE)",
                tiny.size(),
                footprint_sync(stream, &[tiny.size()])?,
                false,
                None,
            ),
            row(
                small,
                "arena (one allocation)",
                tiny.size(),
                footprint_runtime_arena(stream, backend, tiny.size(), tiny.align())?,
                true,
                Some(tiny.size()),
            ),
        ])
    }

    /// Device buffers made with `cuMemAlloc`, freed on drop.
    struct RawBuffers(Vec<sys::CUdeviceptr>);

    impl RawBuffers {
        fn alloc(sizes: &[usize]) -> Result<Self, Error> {
            let mut b = RawBuffers(Vec::with_capacity(sizes.len()));
            for &s in sizes {
                // SAFETY: a plain allocation, freed once when `b` drops.
                let p =
                    unsafe { result::malloc_sync(s) }.map_err(|e| driver_error("cuMemAlloc", e))?;
                b.0.push(p);
            }
            Ok(b)
        }
    }

    impl Drop for RawBuffers {
        fn drop(&mut self) {
            free_all_sync(&self.0);
        }
    }

    fn sync(stream: &CudaStream) -> Result<(), Error> {
        stream
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))
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

    const RESIDENT: &str = "from a resident input";
    const COPIED: &str = "input copied in every frame (6 MB device to device)";

    fn steady_state(
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

        // The floor: eight buffers allocated once, raw pointers, no checks.
        let names = [
            "rgb",
            "gray",
            "scratch",
            "blurred",
            "magnitude",
            "hist",
            "threshold",
            "mask",
        ];
        let sizes: Vec<usize> = names
            .iter()
            .map(|&n| {
                Frame::FIELDS
                    .iter()
                    .find(|f| f.name == n)
                    .map_or(0, |f| f.size)
            })
            .collect();
        let floor_buffers = RawBuffers::alloc(&sizes)?;
        let [
            rgb_p,
            gray,
            scratch,
            blurred,
            magnitude,
            hist,
            threshold,
            mask,
        ] = <[sys::CUdeviceptr; 8]>::try_from(floor_buffers.0.as_slice()).map_err(|_| {
            Error::InvalidArgument {
                what: "the floor needs eight buffers".into(),
            }
        })?;
        let raw = RawFrame {
            rgb: rgb_p,
            gray,
            scratch,
            blurred,
            magnitude,
            hist,
            threshold,
            mask,
        };
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
        // The device addresses of an arena's eight frame buffers (any layout with those fields).
        macro_rules! raw_frame {
            ($arena:expr) => {{
                let v = $arena.views();
                RawFrame {
                    rgb: v.rgb.device_addr(),
                    gray: v.gray.device_addr(),
                    scratch: v.scratch.device_addr(),
                    blurred: v.blurred.device_addr(),
                    magnitude: v.magnitude.device_addr(),
                    hist: v.hist.device_addr(),
                    threshold: v.threshold.device_addr(),
                    mask: v.mask.device_addr(),
                }
            }};
        }
        let arena_raw = raw_frame!(arena);
        let mut paged = Arena::<FramePaged, _>::new_in(backend.clone())?;
        paged.views_mut().rgb.upload(&input)?;
        let paged_raw = raw_frame!(paged);

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
            unsafe { result::malloc_async(s, bytes) }
                .map_err(|e| driver_error("cuMemAllocAsync", e))
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

    fn us(d: Duration) -> f64 {
        d.as_secs_f64() * 1e6
    }

    /// The floor of `row`'s group.
    fn floor_of<'r>(steady: &'r [SteadyRow], row: &SteadyRow) -> Option<&'r SteadyRow> {
        steady.iter().find(|r| r.floor && r.group == row.group)
    }

    /// The arena row of `row`'s group.
    fn baseline_of<'r>(
        footprint: &'r [FootprintRow],
        row: &FootprintRow,
    ) -> Option<&'r FootprintRow> {
        footprint.iter().find(|r| r.baseline && r.what == row.what)
    }

    fn targets(
        setup: &[SetupRow],
        steady: &[SteadyRow],
        footprint: &[FootprintRow],
    ) -> Vec<Target> {
        let mut out = Vec::new();
        for group in setup.chunk_by(|a, b| a.layout == b.layout) {
            let one = group.iter().find(|r| r.method.starts_with("1 ×"));
            let arena = group.iter().find(|r| r.method.starts_with("arena"));
            if let (Some(one), Some(arena)) = (one, arena) {
                let ratio = us(arena.times.0) / us(one.times.0);
                out.push(Target {
                    what: format!("{}: arena setup / 1 × cuMemAlloc (SIZE)", arena.layout),
                    value: format!(
                        "{ratio:.3} ({:.1} / {:.1} µs)",
                        us(arena.times.0),
                        us(one.times.0)
                    ),
                    target: "≤ 1.10",
                    met: ratio <= 1.10,
                });
            }
        }
        for r in steady.iter().filter(|r| r.method.starts_with("arena")) {
            if let Some(floor) = floor_of(steady, r) {
                let over = (us(r.frame) / us(floor.frame) - 1.0) * 100.0;
                out.push(Target {
                    what: format!("{}: frame time over `{}`", r.method, floor.method),
                    value: format!(
                        "{over:+.2}% ({:.1} / {:.1} µs)",
                        us(r.frame),
                        us(floor.frame)
                    ),
                    target: "≤ +1%",
                    met: over <= 1.0,
                });
            }
        }
        for r in footprint {
            if let Some(size) = r.plan_size {
                let off = r.consumed as i64 - size as i64;
                out.push(Target {
                    what: format!("{}: {} footprint − SIZE", r.what, r.method),
                    value: format!("{off:+} bytes ({} − {size})", r.consumed),
                    target: "within one 2 MiB page",
                    met: off.unsigned_abs() as usize <= PAGE,
                });
            }
        }
        out
    }

    fn print_tables(
        device: &str,
        args: &Args,
        setup: &[SetupRow],
        steady: &[SteadyRow],
        footprint: &[FootprintRow],
        targets: &[Target],
    ) {
        println!("devarena pipeline benchmark");
        println!("device: {device}");
        println!(
            "medians of {} interleaved rounds (setup) and {} frames per method (steady state){}",
            args.rounds,
            args.frames,
            if args.quick {
                " — a quick run under a test runner; run the bench itself for the figures"
            } else {
                ""
            }
        );
        println!();
        println!("setup: making every buffer of a layout (teardown: freeing them)");
        println!(
            "{:<24} {:<24} {:>8} {:>12} {:>12} {:>13} {:>14}",
            "layout", "method", "buffers", "bytes", "setup µs", "teardown µs", "× 1 cuMemAlloc"
        );
        for group in setup.chunk_by(|a, b| a.layout == b.layout) {
            let base = group
                .iter()
                .find(|r| r.method.starts_with("1 ×"))
                .map(|r| r.times.0);
            for (i, r) in group.iter().enumerate() {
                let layout = if i == 0 { r.layout } else { "" };
                let (s, t) = r.times;
                println!(
                    "{:<24} {:<24} {:>8} {:>12} {:>12.1} {:>13.1} {:>14}",
                    layout,
                    r.method,
                    r.buffers,
                    r.bytes,
                    us(s),
                    us(t),
                    base.map_or("-".into(), |b| format!("{:.2}", us(s) / us(b)))
                );
            }
        }
        println!();
        println!("steady state: one 1080p frame (7 kernels + histogram reset, then synchronize)");
        for group in steady.chunk_by(|a, b| a.group == b.group) {
            println!(
                "{:<52} {:>10} {:>10} {:>10}",
                group[0].group, "frame µs", "frames/s", "vs floor"
            );
            for r in group {
                let vs = floor_of(steady, r).map_or("-".into(), |f| {
                    format!("{:>+9.1}%", (us(r.frame) / us(f.frame) - 1.0) * 100.0)
                });
                println!(
                    "  {:<50} {:>10.1} {:>10.0} {:>10}",
                    r.method,
                    us(r.frame),
                    1.0 / r.frame.as_secs_f64(),
                    vs
                );
            }
        }
        println!();
        println!("footprint: device memory consumed (cuMemGetInfo free before − after)");
        println!(
            "{:<24} {:<40} {:>14} {:>14} {:>10}",
            "buffers", "method", "requested B", "consumed B", "vs arena"
        );
        for group in footprint.chunk_by(|a, b| a.what == b.what) {
            for (i, r) in group.iter().enumerate() {
                let what = if i == 0 { r.what } else { "" };
                println!(
                    "{:<24} {:<40} {:>14} {:>14} {:>10}",
                    what,
                    r.method,
                    r.requested,
                    r.consumed,
                    match baseline_of(footprint, r) {
                        Some(a) if a.consumed > 0 =>
                            format!("{:.2}", r.consumed as f64 / a.consumed as f64),
                        _ => "-".into(),
                    }
                );
            }
        }
        println!("(cuMemGetInfo counts in pages of 2 MiB)");
        println!();
        println!("targets");
        for t in targets {
            println!(
                "  {:<4} {:<72} {:<36} target {}",
                if t.met { "met" } else { "MISS" },
                t.what,
                t.value,
                t.target
            );
        }
    }

    fn json(
        device: &str,
        args: &Args,
        setup: &[SetupRow],
        steady: &[SteadyRow],
        footprint: &[FootprintRow],
        targets: &[Target],
    ) -> String {
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let mut s = String::new();
        let _ = write!(
            s,
            "{{\"device\":\"{}\",\"rounds\":{},\"frames\":{},\"quick\":{},\"setup\":[",
            esc(device),
            args.rounds,
            args.frames,
            args.quick
        );
        for (i, r) in setup.iter().enumerate() {
            let _ = write!(
                s,
                "{}{{\"layout\":\"{}\",\"method\":\"{}\",\"buffers\":{},\"bytes\":{},\"setup_us\":{:.3},\"teardown_us\":{:.3}}}",
                if i > 0 { "," } else { "" },
                esc(r.layout),
                esc(r.method),
                r.buffers,
                r.bytes,
                us(r.times.0),
                us(r.times.1)
            );
        }
        s.push_str("],\"steady\":[");
        for (i, r) in steady.iter().enumerate() {
            let vs = floor_of(steady, r).map_or("null".into(), |f| {
                format!("{:.3}", (us(r.frame) / us(f.frame) - 1.0) * 100.0)
            });
            let _ = write!(
                s,
                "{}{{\"group\":\"{}\",\"method\":\"{}\",\"floor\":{},\"frame_us\":{:.3},\"frames_per_s\":{:.3},\"vs_floor_percent\":{}}}",
                if i > 0 { "," } else { "" },
                esc(r.group),
                esc(r.method),
                r.floor,
                us(r.frame),
                1.0 / r.frame.as_secs_f64(),
                vs
            );
        }
        s.push_str("],\"footprint\":[");
        for (i, r) in footprint.iter().enumerate() {
            let _ = write!(
                s,
                "{}{{\"buffers\":\"{}\",\"method\":\"{}\",\"requested_bytes\":{},\"consumed_bytes\":{},\"baseline\":{}}}",
                if i > 0 { "," } else { "" },
                esc(r.what),
                esc(r.method),
                r.requested,
                r.consumed,
                r.baseline
            );
        }
        s.push_str("],\"targets\":[");
        for (i, t) in targets.iter().enumerate() {
            let _ = write!(
                s,
                "{}{{\"what\":\"{}\",\"value\":\"{}\",\"target\":\"{}\",\"met\":{}}}",
                if i > 0 { "," } else { "" },
                esc(&t.what),
                esc(&t.value),
                esc(t.target),
                t.met
            );
        }
        s.push_str("]}");
        s
    }
}

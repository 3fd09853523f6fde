//! What one arena saves over the ways device buffers are usually made, on the image pipeline.
//!
//! ```text
//! cargo bench -p devarena-kernels --features cuda --bench pipeline [-- --json] [--rounds N] [--frames N]
//! ```
//!
//! Three measurements, medians of `--rounds` (≥ 20, default 25) rounds:
//!
//! * **setup**: making every buffer of a layout, as N × `cuMemAlloc`, N × `cuMemAllocAsync`
//!   (plus the stream synchronize that makes them usable), one `cuMemAlloc` of the layout's
//!   `SIZE`, and one arena: for the pipeline's `Frame` (8 buffers) and for a 1000-buffer layout
//!   of mixed sizes (16 B … 128 KiB) and alignments (1 … 4096). Teardown (freeing them all) is
//!   timed too.
//! * **steady state**: one pipeline frame (7 kernels and the histogram reset, from a resident
//!   1080p input, ending with a stream synchronize), on buffers allocated once by hand (raw
//!   cudarc: the floor), on the arena, on one cudarc `CudaSlice` per buffer, and with
//!   `cuMemAlloc`/`cuMemFree` or `cuMemAllocAsync`/`cuMemFreeAsync` around every kernel (each
//!   stage allocates its output and frees what no later stage reads). `--frames` (default 100)
//!   frames per method, run in passes of 10 that alternate between the methods; the medians
//!   give frames/s and the overhead over the floor.
//! * **footprint**: device memory consumed (`cuMemGetInfo` free before − after) by the
//!   pipeline's buffers and by 10,000 buffers of 100 B: one allocation per buffer against one
//!   arena (and one plain `cuMemAlloc` of the same `SIZE`).
//!
//! Without a CUDA device it prints `skipped: no CUDA device` and exits 0.

use std::process::ExitCode;

#[derive(Debug, Clone)]
struct Args {
    json: bool,
    rounds: usize,
    frames: usize,
}

const USAGE: &str = "usage: pipeline [--json] [--rounds N (>= 20)] [--frames N (>= 20)]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        json: false,
        rounds: 25,
        frames: 100,
    };
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
            "--rounds" => args.rounds = number("--rounds")?,
            "--frames" => args.frames = number("--frames")?,
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" => {}
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
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
    use devarena::{DeviceLayout, Error, LayoutBuilder, RuntimeLayout};
    use devarena_kernels::pipeline::cuda::{
        FrameSlices, PipelineKernels, RawFrame, driver_error, open_stream,
    };
    use devarena_kernels::pipeline::image::{DEFAULT_SEED, SplitMix64, synthetic_frame};
    use devarena_kernels::pipeline::{FRAME_SIZE, Frame, HIST_BINS, PIXELS};

    use super::Args;

    type Runner<'k> = Box<dyn FnMut() -> Result<(), Error> + 'k>;

    /// One row of the setup table.
    struct SetupRow {
        layout: &'static str,
        method: &'static str,
        buffers: usize,
        bytes: usize,
        /// Median setup and teardown; `None` when the method is not available in this build.
        times: Option<(Duration, Duration)>,
    }

    struct SteadyRow {
        method: &'static str,
        /// Median frame time; `None` when not available in this build.
        frame: Option<Duration>,
    }

    struct FootprintRow {
        what: &'static str,
        method: &'static str,
        requested: usize,
        consumed: Option<usize>,
    }

    pub fn run(args: &Args) -> Result<(), Error> {
        // ARENA GLUE: `devarena::backend::cuda::cuda_stream(0)`.
        let stream = open_stream(0)?;
        let ctx = stream.context().clone();
        ctx.bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let device = describe(&ctx)?;
        let kernels = PipelineKernels::load(&ctx)?;

        let frame_sizes: Vec<usize> = Frame::FIELDS.iter().map(|f| f.size).collect();
        let many = many_buffers_layout()?;
        let many_sizes: Vec<usize> = many.fields().iter().map(|f| f.size).collect();

        let mut setup = Vec::new();
        for (layout, sizes, size, align, is_frame) in [
            (
                "Frame (1080p pipeline)",
                &frame_sizes,
                Frame::SIZE,
                Frame::ALIGN,
                true,
            ),
            (
                "1000 buffers",
                &many_sizes,
                many.size(),
                many.align(),
                false,
            ),
        ] {
            let requested = sizes.iter().sum();
            setup.push(SetupRow {
                layout,
                method: "N × cuMemAlloc",
                buffers: sizes.len(),
                bytes: requested,
                times: Some(rounds(args.rounds, || setup_sync(sizes))?),
            });
            setup.push(SetupRow {
                layout,
                method: "N × cuMemAllocAsync",
                buffers: sizes.len(),
                bytes: requested,
                times: Some(rounds(args.rounds, || setup_async(&stream, sizes))?),
            });
            setup.push(SetupRow {
                layout,
                method: "1 × cuMemAlloc (SIZE)",
                buffers: 1,
                bytes: size,
                times: Some(rounds(args.rounds, || setup_sync(&[size]))?),
            });
            let arena = optional_rounds(args.rounds, || {
                if is_frame {
                    arena_frame_setup(&stream)
                } else {
                    arena_alloc_setup(&stream, size, align)
                }
            })?;
            setup.push(SetupRow {
                layout,
                method: "arena (one allocation)",
                buffers: 1,
                bytes: size,
                times: arena,
            });
        }

        // Footprint before the steady state, on an idle device: a context synchronize lets the
        // stream-ordered pool give back what the async rounds freed (release threshold 0).
        ctx.synchronize()
            .map_err(|e| driver_error("cuCtxSynchronize", e))?;
        let mut footprint = Vec::new();
        let tiny_sizes = vec![100usize; 10_000];
        let tiny = LayoutBuilder::new("TenThousand");
        let tiny = (0..10_000)
            .fold(tiny, |b, i| b.array::<u8>(format!("b{i}"), 100))
            .build()?;
        for (what, sizes, size, align) in [
            (
                "Frame (1080p pipeline)",
                &frame_sizes,
                Frame::SIZE,
                Frame::ALIGN,
            ),
            ("10,000 × 100 B", &tiny_sizes, tiny.size(), tiny.align()),
        ] {
            footprint.push(FootprintRow {
                what,
                method: "one cuMemAlloc per buffer",
                requested: sizes.iter().sum(),
                consumed: Some(footprint_sync(&ctx, sizes)?),
            });
            footprint.push(FootprintRow {
                what,
                method: "1 × cuMemAlloc (SIZE)",
                requested: size,
                consumed: Some(footprint_sync(&ctx, &[size])?),
            });
            footprint.push(FootprintRow {
                what,
                method: "arena (one allocation)",
                requested: size,
                consumed: arena_footprint(&stream, size, align).transpose()?,
            });
        }

        let steady = steady_state(&kernels, &stream, args.frames)?;

        if args.json {
            println!("{}", json(&device, args, &setup, &steady, &footprint));
        } else {
            print_tables(&device, args, &setup, &steady, &footprint);
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

    /// Medians of `n` rounds of a measurement returning (setup, teardown), after 2 warm-ups.
    fn rounds(
        n: usize,
        mut f: impl FnMut() -> Result<(Duration, Duration), Error>,
    ) -> Result<(Duration, Duration), Error> {
        for _ in 0..2 {
            f()?;
        }
        let mut setup = Vec::with_capacity(n);
        let mut teardown = Vec::with_capacity(n);
        for _ in 0..n {
            let (s, t) = f()?;
            setup.push(s);
            teardown.push(t);
        }
        Ok((median(&mut setup), median(&mut teardown)))
    }

    /// [`rounds`] of a measurement this build may not have (`None`: not available).
    fn optional_rounds(
        n: usize,
        mut f: impl FnMut() -> Option<Result<(Duration, Duration), Error>>,
    ) -> Result<Option<(Duration, Duration)>, Error> {
        match f() {
            None => Ok(None),
            Some(first) => {
                first?;
                let gone = || Error::InvalidArgument {
                    what: "a measurement became unavailable between rounds".into(),
                };
                rounds(n, || f().unwrap_or_else(|| Err(gone()))).map(Some)
            }
        }
    }

    fn median(v: &mut [Duration]) -> Duration {
        v.sort_unstable();
        v[v.len() / 2]
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
        let sync = || {
            stream
                .synchronize()
                .map_err(|e| driver_error("cuStreamSynchronize", e))
        };
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
        sync()?;
        let setup = start.elapsed();
        let start = Instant::now();
        for p in ptrs {
            // SAFETY: allocated above on this stream, freed once, never used.
            unsafe { result::free_async(p, s) }.map_err(|e| driver_error("cuMemFreeAsync", e))?;
        }
        sync()?;
        Ok((setup, start.elapsed()))
    }

    /// Free device bytes before − after making one `cuMemAlloc` per size.
    fn footprint_sync(ctx: &Arc<CudaContext>, sizes: &[usize]) -> Result<usize, Error> {
        let free = || {
            ctx.mem_get_info()
                .map(|(f, _)| f)
                .map_err(|e| driver_error("cuMemGetInfo", e))
        };
        let before = free()?;
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
        let after = free();
        free_all_sync(&ptrs);
        Ok(before.saturating_sub(after?))
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

    fn steady_state(
        kernels: &PipelineKernels,
        stream: &Arc<CudaStream>,
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
        // Input of the allocate-around-each-kernel methods: resident, allocated once.
        let input_buffer = RawBuffers::alloc(&[PIXELS * 3])?;
        let rgb = input_buffer.0[0];
        upload(rgb)?;
        let mut slices = FrameSlices::alloc(stream, FRAME_SIZE)?;
        stream
            .memcpy_htod(&input, &mut slices.rgb)
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;

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

        let mut methods: Vec<(&'static str, Option<Runner<'_>>)> = vec![
            (
                "raw cudarc, buffers allocated once (floor)",
                Some(Box::new(|| {
                    // SAFETY: `raw` addresses eight live buffers of the frame's sizes.
                    unsafe { kernels.run_frame_raw(stream, FRAME_SIZE, &raw, None) }?;
                    sync(stream)
                })),
            ),
            (
                "arena (Frame on CudaBackend)",
                arena_frame_runner(kernels, stream, &input).transpose()?,
            ),
            (
                "cudarc CudaSlice per buffer, allocated once",
                Some(Box::new(|| {
                    kernels.run_frame(stream, FRAME_SIZE, slices.buffers(), None)?;
                    sync(stream)
                })),
            ),
            (
                "cuMemAlloc/cuMemFree around each kernel",
                Some(Box::new(move || {
                    // SAFETY: `rgb` holds the input; the closures allocate and free.
                    unsafe { frame_alloc_each(kernels, stream, rgb, &alloc_sync, &free_sync) }
                })),
            ),
            (
                "cuMemAllocAsync/cuMemFreeAsync around each kernel",
                Some(Box::new(move || {
                    // SAFETY: as above, stream-ordered.
                    unsafe { frame_alloc_each(kernels, stream, rgb, &alloc_async, &free_async) }
                })),
            ),
        ];

        // Warm up every method, then alternate between them in passes of 10 frames.
        for (_, run) in methods.iter_mut() {
            if let Some(run) = run {
                for _ in 0..5 {
                    run()?;
                }
            }
        }
        let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(frames); methods.len()];
        let mut done = 0;
        while done < frames {
            let pass = (frames - done).min(10);
            for ((_, run), times) in methods.iter_mut().zip(samples.iter_mut()) {
                if let Some(run) = run {
                    for _ in 0..pass {
                        let start = Instant::now();
                        run()?;
                        times.push(start.elapsed());
                    }
                }
            }
            done += pass;
        }
        let rows = methods
            .iter()
            .zip(samples.iter_mut())
            .map(|((method, run), times)| SteadyRow {
                method,
                frame: run.as_ref().map(|_| median(times)),
            })
            .collect();
        Ok(rows)
    }

    fn us(d: Duration) -> f64 {
        d.as_secs_f64() * 1e6
    }

    fn print_tables(
        device: &str,
        args: &Args,
        setup: &[SetupRow],
        steady: &[SteadyRow],
        footprint: &[FootprintRow],
    ) {
        println!("devarena pipeline benchmark");
        println!("device: {device}");
        println!(
            "medians of {} rounds (setup) and {} frames (steady state)",
            args.rounds, args.frames
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
                .and_then(|r| r.times)
                .map(|t| t.0);
            for (i, r) in group.iter().enumerate() {
                let layout = if i == 0 { r.layout } else { "" };
                match r.times {
                    Some((s, t)) => println!(
                        "{:<24} {:<24} {:>8} {:>12} {:>12.1} {:>13.1} {:>14}",
                        layout,
                        r.method,
                        r.buffers,
                        r.bytes,
                        us(s),
                        us(t),
                        base.map_or("-".into(), |b| format!("{:.2}", us(s) / us(b)))
                    ),
                    None => println!(
                        "{:<24} {:<24} {:>8} {:>12} {:>12} {:>13} {:>14}",
                        layout, r.method, r.buffers, r.bytes, "n/a", "n/a", "n/a"
                    ),
                }
            }
        }
        println!();
        println!("steady state: one 1080p frame (7 kernels + histogram reset, then synchronize)");
        println!(
            "{:<52} {:>10} {:>10} {:>10}",
            "method", "frame µs", "frames/s", "vs floor"
        );
        let floor = steady[0].frame;
        for r in steady {
            match (r.frame, floor) {
                (Some(f), Some(base)) => println!(
                    "{:<52} {:>10.1} {:>10.0} {:>+9.1}%",
                    r.method,
                    us(f),
                    1.0 / f.as_secs_f64(),
                    (us(f) / us(base) - 1.0) * 100.0
                ),
                _ => println!("{:<52} {:>10} {:>10} {:>10}", r.method, "n/a", "n/a", "n/a"),
            }
        }
        println!();
        println!("footprint: device memory consumed (cuMemGetInfo free before − after)");
        println!(
            "{:<24} {:<28} {:>14} {:>14} {:>10}",
            "buffers", "method", "requested B", "consumed B", "vs arena"
        );
        for group in footprint.chunk_by(|a, b| a.what == b.what) {
            let arena = group
                .iter()
                .find(|r| r.method.starts_with("arena"))
                .and_then(|r| r.consumed);
            for (i, r) in group.iter().enumerate() {
                let what = if i == 0 { r.what } else { "" };
                println!(
                    "{:<24} {:<28} {:>14} {:>14} {:>10}",
                    what,
                    r.method,
                    r.requested,
                    r.consumed.map_or("n/a".into(), |c| c.to_string()),
                    match (r.consumed, arena) {
                        (Some(c), Some(a)) if a > 0 => format!("{:.2}", c as f64 / a as f64),
                        _ => "-".into(),
                    }
                );
            }
        }
        println!(
            "\n(`n/a`: the arena rows need devarena's CUDA backend in this build; \
             cuMemGetInfo counts in pages of 2 MiB)"
        );
    }

    fn json(
        device: &str,
        args: &Args,
        setup: &[SetupRow],
        steady: &[SteadyRow],
        footprint: &[FootprintRow],
    ) -> String {
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let opt = |v: Option<f64>| v.map_or("null".to_string(), |x| format!("{x:.3}"));
        let mut s = String::new();
        let _ = write!(
            s,
            "{{\"device\":\"{}\",\"rounds\":{},\"frames\":{},\"setup\":[",
            esc(device),
            args.rounds,
            args.frames
        );
        for (i, r) in setup.iter().enumerate() {
            let _ = write!(
                s,
                "{}{{\"layout\":\"{}\",\"method\":\"{}\",\"buffers\":{},\"bytes\":{},\"setup_us\":{},\"teardown_us\":{}}}",
                if i > 0 { "," } else { "" },
                esc(r.layout),
                esc(r.method),
                r.buffers,
                r.bytes,
                opt(r.times.map(|t| us(t.0))),
                opt(r.times.map(|t| us(t.1)))
            );
        }
        s.push_str("],\"steady\":[");
        for (i, r) in steady.iter().enumerate() {
            let _ = write!(
                s,
                "{}{{\"method\":\"{}\",\"frame_us\":{},\"frames_per_s\":{}}}",
                if i > 0 { "," } else { "" },
                esc(r.method),
                opt(r.frame.map(us)),
                opt(r.frame.map(|f| 1.0 / f.as_secs_f64()))
            );
        }
        s.push_str("],\"footprint\":[");
        for (i, r) in footprint.iter().enumerate() {
            let _ = write!(
                s,
                "{}{{\"buffers\":\"{}\",\"method\":\"{}\",\"requested_bytes\":{},\"consumed_bytes\":{}}}",
                if i > 0 { "," } else { "" },
                esc(r.what),
                esc(r.method),
                r.requested,
                r.consumed.map_or("null".into(), |c| c.to_string())
            );
        }
        s.push_str("]}");
        s
    }

    // ---- ARENA GLUE ------------------------------------------------------------------------
    // The only arena-specific code of this benchmark. Until `devarena::backend::cuda` is in,
    // these return `None` and the arena rows print `n/a`. With it, their bodies become:
    //
    //  fn arena_frame_setup(stream) -> Option<Result<(Duration, Duration), Error>> {
    //      let start = Instant::now();
    //      let arena = match Arena::<Frame, CudaBackend>::new_in(CudaBackend::new(stream.clone())) {
    //          Ok(a) => a,
    //          Err(e) => return Some(Err(e)),
    //      };
    //      let setup = start.elapsed();
    //      let start = Instant::now();
    //      Some(arena.free().map(|()| (setup, start.elapsed())))
    //  }
    //
    //  fn arena_alloc_setup(stream, bytes, align) -> Option<Result<(Duration, Duration), Error>> {
    //      let backend = CudaBackend::new(stream.clone());
    //      let start = Instant::now();
    //      let a = match backend.allocate(bytes, align) { Ok(a) => a, Err(e) => return Some(Err(e)) };
    //      let setup = start.elapsed();
    //      let start = Instant::now();
    //      // SAFETY: allocated just above by this backend, freed once, no view was made.
    //      Some(unsafe { backend.deallocate(&a) }.map(|()| (setup, start.elapsed())))
    //  }
    //
    //  fn arena_footprint(stream, bytes, align) -> Option<Result<usize, Error>> {
    //      let backend = CudaBackend::new(stream.clone());
    //      let free = || devarena::backend::cuda::mem_info(stream).map(|(f, _)| f);
    //      Some((|| {
    //          let before = free()?;
    //          let a = backend.allocate(bytes, align)?;
    //          let after = free();
    //          // SAFETY: allocated just above, freed once.
    //          unsafe { backend.deallocate(&a) }?;
    //          Ok(before.saturating_sub(after?))
    //      })())
    //  }
    //
    //  fn arena_frame_runner<'k>(kernels, stream, input) -> Option<Result<Runner<'k>, Error>> {
    //      let mut arena = match Arena::<Frame, CudaBackend>::new_in(CudaBackend::new(stream.clone())) {
    //          Ok(a) => a,
    //          Err(e) => return Some(Err(e)),
    //      };
    //      if let Err(e) = stream.memcpy_htod(input, &mut arena.views_mut().rgb).and_then(|()| stream.synchronize()) {
    //          return Some(Err(driver_error("cuMemcpyHtoDAsync", e)));
    //      }
    //      let stream = stream.clone();
    //      Some(Ok(Box::new(move || {
    //          let mut views = arena.views_mut();
    //          kernels.run_frame(&stream, FRAME_SIZE, FrameBuffers::from(&mut views), None)?;
    //          sync(&stream)
    //      })))
    //  }
    //
    // (imports: devarena::{Arena, Backend}, devarena::backend::cuda::CudaBackend,
    // devarena_kernels::pipeline::FrameBuffers.)

    /// ARENA GLUE: setup and teardown of one `Arena<Frame, CudaBackend>`.
    fn arena_frame_setup(_stream: &Arc<CudaStream>) -> Option<Result<(Duration, Duration), Error>> {
        None
    }

    /// ARENA GLUE: one `CudaBackend` allocation of `bytes` at `align` (a run-time layout's
    /// arena), and its free.
    fn arena_alloc_setup(
        _stream: &Arc<CudaStream>,
        _bytes: usize,
        _align: usize,
    ) -> Option<Result<(Duration, Duration), Error>> {
        None
    }

    /// ARENA GLUE: device bytes one `CudaBackend` allocation of `bytes` consumes.
    fn arena_footprint(
        _stream: &Arc<CudaStream>,
        _bytes: usize,
        _align: usize,
    ) -> Option<Result<usize, Error>> {
        None
    }

    /// ARENA GLUE: a runner of one frame on a `Frame` arena holding the uploaded input.
    fn arena_frame_runner<'k>(
        _kernels: &'k PipelineKernels,
        _stream: &Arc<CudaStream>,
        _input: &[u8],
    ) -> Option<Result<Runner<'k>, Error>> {
        None
    }
}

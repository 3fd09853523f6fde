//! The pipeline's PTX kernels against the host reference (`devarena_kernels::pipeline::host`).
//!
//! Every device stage is compared with the host stage run on the device's own input for that
//! stage, so a difference cannot hide behind (or be blamed on) an earlier one:
//!
//! * float stages (grayscale, both blur passes, Sobel): `|device − host| ≤ FLOAT_TOLERANCE`.
//!   The kernels perform the same IEEE-754 round-to-nearest operations in the same order (no
//!   FMA contraction, IEEE division and square root), so the expected difference is 0; each
//!   test prints how many values were bit-identical;
//! * integer stages (histogram, Otsu threshold, mask given the same magnitude): exactly equal.
//!
//! Then the whole frame end to end: the same threshold, and masks that differ at most where the
//! host magnitude sits within the tolerance of a bin boundary. On a `Frame` arena
//! (`arena_frame_matches_host`) and on the aliased `FrameStaged` arena, whose output must equal
//! the unaliased GPU run's bit for bit and which must pass the verifier stage by stage.
//!
//! Sizes other than 1080p run in the same arenas (planned for 3840×2160) at their own size:
//! 1×1, odd sizes, a 5000×3000 image downscaled to fit; bit-identical to a run on buffers of
//! exactly their size. And CUDA graphs of the frame: a replay's outputs are bit-identical to an
//! eager frame's, over 1,000 replays whose input changes every time, on both layouts.
//!
//! Without a CUDA driver or device every test prints `skipped: no CUDA device` and passes; with
//! `DEVARENA_REQUIRE_GPU=1` it fails instead.

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_pipeline_matches_host() {
    assert!(
        std::env::var("DEVARENA_REQUIRE_GPU").as_deref() != Ok("1"),
        "DEVARENA_REQUIRE_GPU=1, but this test was built without the `cuda` feature"
    );
    println!("skipped: no CUDA device (built without the `cuda` feature)");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;

    use devarena::backend::cuda::{CudaBackend, CudaStream, DeviceViewMut, TrustedDevicePtr};
    use devarena::{Arena, DeviceLayout, Error};
    use devarena_kernels::cudarc::driver::DevicePtrMut;
    use devarena_kernels::pipeline::cuda::{
        FrameSlices, PipelineKernels, download_mask_stage, download_outputs, upload_input,
        upload_input_staged,
    };
    use devarena_kernels::pipeline::image::{DEFAULT_SEED, SplitMix64, resample, synthetic_frame};
    use devarena_kernels::pipeline::{
        FRAME_SIZE, FRAME_STAGED_STAGES, Frame, FrameBuffers, FrameOutputs, FrameStaged, HIST_BINS,
        HIST_SCALE, ImageSize, host, magnitude_bin,
    };
    use devarena_kernels::verify_stages;

    /// Largest accepted `|device − host|` of a float stage given the same input. The expected
    /// difference is 0; 2e-6 is about 16 ulp at 1.0 (grayscale and blur lie in `[0, 1]`) and
    /// 4 ulp at 4.0 (Sobel magnitudes reach 4√2), room for one operation rounded differently
    /// by some driver's JIT, far below anything visible or any bin width (1/64).
    const FLOAT_TOLERANCE: f32 = 2e-6;

    /// An arena of another thread's on the same stream, for work that must stay out of a
    /// capture of the frame.
    #[derive(DeviceLayout)]
    struct Scratch {
        buf: [u8; 4096],
    }

    /// The device, or `None` after printing `skipped: no CUDA device`; fails instead when
    /// `DEVARENA_REQUIRE_GPU=1`.
    fn stream() -> Option<Arc<CudaStream>> {
        devarena_tests::gpu_stream()
    }

    /// Uploads `input`, runs one frame on `b`, reads every buffer back. Generic over the
    /// buffer types: cudarc slices and an arena's views.
    fn run_on_device<B8, BF, BU>(
        kernels: &PipelineKernels,
        stream: &Arc<CudaStream>,
        size: ImageSize,
        mut b: FrameBuffers<'_, B8, BF, BU>,
        input: &[u8],
    ) -> FrameOutputs
    where
        B8: TrustedDevicePtr<u8> + DevicePtrMut<u8>,
        BF: TrustedDevicePtr<f32> + DevicePtrMut<f32>,
        BU: TrustedDevicePtr<u32> + DevicePtrMut<u32>,
    {
        stream.memcpy_htod(input, b.rgb).unwrap();
        kernels.run_frame(stream, size, b.reborrow(), None).unwrap();
        let mut d = FrameOutputs::new(size);
        download_outputs(stream, &b, &mut d).unwrap();
        d
    }

    /// The synthetic 1080p input.
    fn input() -> Vec<u8> {
        let mut input = vec![0u8; FRAME_SIZE.pixels() * 3];
        synthetic_frame(FRAME_SIZE, DEFAULT_SEED, &mut input).unwrap();
        input
    }

    /// Asserts `|device − host| ≤ FLOAT_TOLERANCE` everywhere; prints how many values were
    /// bit-identical.
    fn compare_floats(what: &str, device: &[f32], host: &[f32]) {
        assert_eq!(device.len(), host.len(), "{what}: lengths");
        let mut identical = 0usize;
        let mut worst = (0.0f32, 0usize);
        for (i, (d, h)) in device.iter().zip(host).enumerate() {
            if d.to_bits() == h.to_bits() {
                identical += 1;
                continue;
            }
            let diff = (d - h).abs();
            assert!(
                diff <= FLOAT_TOLERANCE,
                "{what}: element {i} is {d:e} on the device, {h:e} on the host (|Δ| {diff:e} > \
                 {FLOAT_TOLERANCE:e})"
            );
            if diff > worst.0 {
                worst = (diff, i);
            }
        }
        println!(
            "{what}: {identical} of {} bit-identical, max |Δ| {:e}",
            host.len(),
            worst.0
        );
    }

    /// Checks every stage of `d` against the host stage run on the device's input for it, and
    /// the frame end to end against the host pipeline.
    fn check_against_host(size: ImageSize, input: &[u8], d: &FrameOutputs) {
        let n = size.pixels();
        let mut buf = vec![0.0f32; n];
        host::rgb_to_gray(size, input, &mut buf).unwrap();
        compare_floats(&format!("{size} grayscale"), &d.gray, &buf);
        host::blur_horizontal(size, &d.gray, &mut buf).unwrap();
        compare_floats(&format!("{size} blur (rows)"), &d.scratch, &buf);
        host::blur_vertical(size, &d.scratch, &mut buf).unwrap();
        compare_floats(&format!("{size} blur (columns)"), &d.blurred, &buf);
        host::sobel_magnitude(size, &d.blurred, &mut buf).unwrap();
        compare_floats(&format!("{size} sobel"), &d.magnitude, &buf);

        // Integer stages, given the device's magnitude: exact.
        let mut hist = vec![0u32; HIST_BINS];
        host::histogram(&d.magnitude, &mut hist).unwrap();
        assert_eq!(d.hist, hist, "{size}: histogram");
        assert_eq!(
            d.threshold,
            host::otsu_threshold(&d.hist).unwrap(),
            "{size}: Otsu threshold"
        );
        let mut mask = vec![0u8; n];
        host::edge_mask(&d.magnitude, d.threshold, &mut mask).unwrap();
        assert!(
            d.mask == mask,
            "{size}: mask differs from the host's for the same magnitude"
        );

        // End to end.
        let (mut rgb, mut gray, mut scratch, mut blurred, mut magnitude) = (
            input.to_vec(),
            vec![0.0f32; n],
            vec![0.0f32; n],
            vec![0.0f32; n],
            vec![0.0f32; n],
        );
        let (mut hist, mut threshold) = (vec![0u32; HIST_BINS], vec![0u32; 1]);
        let threshold = host::run_frame(
            size,
            FrameBuffers {
                rgb: &mut rgb,
                gray: &mut gray,
                scratch: &mut scratch,
                blurred: &mut blurred,
                magnitude: &mut magnitude,
                hist: &mut hist,
                threshold: &mut threshold,
                mask: &mut mask,
            },
        )
        .unwrap();
        assert_eq!(d.threshold, threshold, "{size}: end-to-end threshold");
        let near_boundary = |m: f32| {
            let scaled = m * HIST_SCALE;
            (scaled - scaled.round()).abs() <= FLOAT_TOLERANCE * HIST_SCALE
        };
        let differing: Vec<usize> = (0..n).filter(|&i| d.mask[i] != mask[i]).collect();
        for &i in &differing {
            assert!(
                near_boundary(magnitude[i]),
                "{size}: mask differs at pixel {i} (host magnitude {:e}, bin {}) that is not \
                 within the tolerance of a bin boundary",
                magnitude[i],
                magnitude_bin(magnitude[i])
            );
        }
        println!(
            "{size} end to end: threshold {threshold}, {} of {n} mask pixels differ",
            differing.len()
        );
    }

    #[test]
    fn synthetic_frame_matches_host() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let input = input();
        let mut slices = FrameSlices::alloc(&stream, FRAME_SIZE).unwrap();
        let d = run_on_device(&kernels, &stream, FRAME_SIZE, slices.buffers(), &input);
        check_against_host(FRAME_SIZE, &input, &d);
        // A real edge map, not an empty or full one.
        let edges = d.mask.iter().filter(|&&m| m == 255).count();
        assert!(
            edges > 1000 && edges < FRAME_SIZE.pixels() / 20,
            "{edges} edges"
        );
    }

    #[test]
    fn arena_frame_matches_host() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let input = input();
        let backend = CudaBackend::new(stream.clone());
        let mut arena = Arena::<Frame, _>::new_in(backend.clone()).unwrap();
        let setup = backend.stats();
        assert_eq!((setup.allocations, setup.live_bytes), (1, Frame::SIZE));
        let mut views = arena.views_mut();
        let d = run_on_device(
            &kernels,
            &stream,
            FRAME_SIZE,
            FrameBuffers::from(&mut views),
            &input,
        );
        check_against_host(FRAME_SIZE, &input, &d);
        // The same frame on one cudarc allocation per buffer: the same bits.
        let mut slices = FrameSlices::alloc(&stream, FRAME_SIZE).unwrap();
        let s = run_on_device(&kernels, &stream, FRAME_SIZE, slices.buffers(), &input);
        assert_eq!(d.first_difference(&s), None);
        assert_eq!(backend.stats().allocations, setup.allocations);
    }

    /// Runs `frames` frames of `input` (of `size`) on an aliased arena; returns the outputs of
    /// the last.
    fn run_staged(
        kernels: &PipelineKernels,
        arena: &mut Arena<FrameStaged, CudaBackend>,
        size: ImageSize,
        input: &[u8],
        frames: usize,
    ) -> FrameOutputs {
        let mut out = FrameOutputs::new(size);
        for i in 0..frames {
            let upload = |_: &Arc<CudaStream>, rgb: &mut DeviceViewMut<'_, u8>| rgb.upload(input);
            let outputs = (i + 1 == frames).then_some(&mut out);
            kernels
                .run_frame_staged(arena, size, upload, None, outputs)
                .unwrap();
        }
        out
    }

    #[test]
    fn aliased_arena_matches_unaliased_and_host() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let input = input();

        let mut plain = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let mut views = plain.views_mut();
        let unaliased = run_on_device(
            &kernels,
            &stream,
            FRAME_SIZE,
            FrameBuffers::from(&mut views),
            &input,
        );

        let backend = CudaBackend::new(stream.clone());
        let mut arena = Arena::<FrameStaged, _>::new_in(backend.clone()).unwrap();
        assert_eq!(arena.size(), FrameStaged::SIZE);
        const { assert!(FrameStaged::SIZE < FrameStaged::UNALIASED_SIZE) };
        let aliased = run_staged(&kernels, &mut arena, FRAME_SIZE, &input, 1);
        if let Some(d) = aliased.first_difference(&unaliased) {
            panic!("the aliased GPU run differs from the unaliased GPU run: {d}");
        }
        check_against_host(FRAME_SIZE, &input, &aliased);

        // And against the aliased host run: the same bits as well.
        let mut host_arena = Arena::<FrameStaged>::new().unwrap();
        let mut host_out = FrameOutputs::new(FRAME_SIZE);
        let decode = |rgb: &mut [u8]| {
            rgb.copy_from_slice(&input);
            Ok(())
        };
        host::run_frame_staged(
            &mut host_arena,
            FRAME_SIZE,
            decode,
            Some(&mut host_out),
            |_, _| {},
        )
        .unwrap();
        println!(
            "aliased GPU vs aliased host: {}",
            aliased
                .first_difference(&host_out)
                .unwrap_or_else(|| "bit-identical".into())
        );

        // Frames after the first reuse bytes the previous frame wrote: still the same bits,
        // and no allocation.
        let again = run_staged(&kernels, &mut arena, FRAME_SIZE, &input, 3);
        assert_eq!(again.first_difference(&unaliased), None);
        let stats = backend.stats();
        assert_eq!((stats.allocations, stats.frees), (1, 0));
    }

    #[test]
    fn aliased_arena_passes_the_verifier_per_stage() {
        let Some(stream) = stream() else { return };
        let mut arena = Arena::<FrameStaged, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let report = verify_stages(&mut arena).unwrap();
        println!("{report}");
        assert!(report.passed(), "{report}");
        assert_eq!(report.stages.len(), FRAME_STAGED_STAGES.len());
        for (s, fields) in report.stages.iter().enumerate() {
            let live: Vec<&str> = FrameStaged::FIELDS
                .iter()
                .zip(FrameStaged::LIVE)
                .filter(|(_, l)| l.contains(s))
                .map(|(f, _)| f.name)
                .collect();
            let checked: Vec<&str> = fields.iter().map(|r| r.region.name.as_str()).collect();
            assert_eq!(checked, live, "stage {s} ({})", FRAME_STAGED_STAGES[s]);
            for r in fields {
                assert_eq!(r.alignment.residue, 0, "{}", r.region.name);
                assert_eq!(
                    r.mismatches, 0,
                    "{} overlaps a field live with it",
                    r.region.name
                );
            }
        }
        // Fields of stages that never meet do share bytes, and the device sees it.
        assert!(!report.shared.is_empty(), "no field shares bytes");
        for p in &report.shared {
            assert!(
                p.confirmed(),
                "{} and {}: sharing not seen",
                p.first,
                p.second
            );
        }

        // A layout without stages is checked whole, by `verify`.
        let mut plain = Arena::<Frame, _>::new_in(CudaBackend::new(stream)).unwrap();
        let e = verify_stages(&mut plain).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("no stages"),
            "{e}"
        );
    }

    #[test]
    fn odd_sizes_match_host() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        // Sizes that leave partial blocks in both directions, and images narrower or shorter
        // than the filters, where every pixel clamps.
        for (w, h) in [
            (1, 1),
            (2, 3),
            (4, 1),
            (37, 23),
            (5, 300),
            (300, 5),
            (33, 9),
        ] {
            let size = ImageSize::new(w, h);
            let mut input = vec![0u8; size.pixels() * 3];
            synthetic_frame(size, DEFAULT_SEED ^ (w * 1000 + h) as u64, &mut input).unwrap();
            let mut slices = FrameSlices::alloc(&stream, size).unwrap();
            let d = run_on_device(&kernels, &stream, size, slices.buffers(), &input);
            check_against_host(size, &input, &d);
        }
    }

    /// The synthetic input of `size` with `seed`.
    fn input_of(size: ImageSize, seed: u64) -> Vec<u8> {
        let mut input = vec![0u8; size.pixels() * 3];
        synthetic_frame(size, seed, &mut input).unwrap();
        input
    }

    /// One eager frame of `input` on a `Frame` arena (room for the largest frame), every
    /// output read back.
    fn eager_frame(
        kernels: &PipelineKernels,
        arena: &mut Arena<Frame, CudaBackend>,
        size: ImageSize,
        input: &[u8],
    ) -> FrameOutputs {
        let stream = arena.backend().stream().clone();
        let mut views = arena.views_mut();
        run_on_device(
            kernels,
            &stream,
            size,
            FrameBuffers::from(&mut views),
            input,
        )
    }

    /// The outputs a `FrameStaged` frame leaves in its last stage, from full outputs (floats
    /// by their bits).
    fn mask_stage(o: &FrameOutputs) -> (Vec<u32>, u32, Vec<u8>) {
        let bits = o.magnitude.iter().map(|m| m.to_bits()).collect();
        (bits, o.threshold, o.mask.clone())
    }

    #[test]
    fn arenas_run_other_sizes_at_their_own_size() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let backend = CudaBackend::new(stream.clone());
        let mut frame = Arena::<Frame, _>::new_in(backend.clone()).unwrap();
        let mut staged = Arena::<FrameStaged, _>::new_in(backend.clone()).unwrap();
        for (w, h) in [
            (1, 1),
            (2, 3),
            (37, 23),
            (256, 256),
            (1023, 767),
            (2160, 3840),
        ] {
            let size = ImageSize::new(w, h);
            let input = input_of(size, DEFAULT_SEED ^ (w * 7919 + h) as u64);
            // Buffers of exactly the image's size: the reference.
            let mut slices = FrameSlices::alloc(&stream, size).unwrap();
            let exact = run_on_device(&kernels, &stream, size, slices.buffers(), &input);
            let d = eager_frame(&kernels, &mut frame, size, &input);
            assert_eq!(d.first_difference(&exact), None, "{size}: Frame arena");
            let a = run_staged(&kernels, &mut staged, size, &input, 1);
            assert_eq!(
                a.first_difference(&exact),
                None,
                "{size}: FrameStaged arena"
            );
            check_against_host(size, &input, &d);
        }
        // Nothing was allocated for any of them.
        assert_eq!(backend.stats().allocations, 2);
    }

    #[test]
    fn a_5000x3000_image_is_downscaled_and_runs_eagerly_and_from_a_graph() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let big = ImageSize::new(5000, 3000);
        let size = big.fit();
        assert_eq!(size, ImageSize::new(3718, 2230));
        let input = resample(&input_of(big, DEFAULT_SEED), big, size).unwrap();
        let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let eager = eager_frame(&kernels, &mut arena, size, &input);
        check_against_host(size, &input, &eager);
        let mut graph = kernels.capture_frame(&mut arena, size).unwrap();
        upload_input(&mut graph, size, &input).unwrap();
        graph.launch().unwrap();
        let mut replayed = FrameOutputs::new(size);
        let stream = graph.stream().clone();
        download_outputs(
            &stream,
            &FrameBuffers::from(&mut graph.views_mut()),
            &mut replayed,
        )
        .unwrap();
        assert_eq!(replayed.first_difference(&eager), None);
    }

    /// A capture records whatever any thread queues on the stream while it runs: a graph with
    /// another thread's work in it could replay that work on memory the graph does not own.
    /// That work shows in the graph's node count, which is how `capture_frame` refuses such a
    /// graph (it hands one out only with the frame's `FRAME_GRAPH_NODES` operations). Here
    /// another thread queues a memset of an arena of its own on the stream during a capture of
    /// the frame (joined before the capture ends: a push racing the capture's end can crash
    /// the driver), and the graph holds one node more.
    #[test]
    fn another_threads_work_during_a_capture_lands_in_the_graph_and_in_its_node_count() {
        use devarena_kernels::pipeline::cuda::FRAME_GRAPH_NODES;

        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let mut other = Arena::<Scratch, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        other.views_mut().buf.fill_bytes(0).unwrap();
        let size = ImageSize::new(67, 45);
        let graph = kernels.capture_frame(&mut arena, size).unwrap();
        assert_eq!(graph.nodes(), FRAME_GRAPH_NODES);
        drop(graph);
        // SAFETY: the graph is dropped unlaunched below; nothing it recorded ever runs.
        let graph = unsafe {
            arena.capture(|capture| {
                kernels.record_frame(capture, size)?;
                std::thread::scope(|s| {
                    s.spawn(|| other.views_mut().buf.fill_bytes(0xCD))
                        .join()
                        .unwrap()
                })
            })
        }
        .unwrap();
        assert_eq!(graph.nodes(), FRAME_GRAPH_NODES + 1);
        drop(graph);
        // The other thread's memset was recorded, not run: its arena still holds zeros.
        let mut bytes = [1u8; 4096];
        other.views_mut().buf.download(&mut bytes).unwrap();
        assert!(bytes.iter().all(|&b| b == 0));
    }

    /// `capture_frame` captures on a stream of its own: another thread that keeps queuing
    /// work on the arena's stream meanwhile (a memset of an arena of its own, over and over)
    /// neither lands in the graph nor is held back, and every capture holds the frame alone.
    #[test]
    fn capture_frame_keeps_another_threads_work_on_the_stream_out_of_its_graph() {
        use std::sync::atomic::{AtomicBool, Ordering};

        use devarena_kernels::pipeline::cuda::FRAME_GRAPH_NODES;

        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let size = ImageSize::new(67, 45);
        let stop = Arc::new(AtomicBool::new(false));
        let mut other = Arena::<Scratch, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let intruder = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut last = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    last = last.wrapping_add(1).max(1);
                    other.views_mut().buf.fill_bytes(last).unwrap();
                }
                (other, last)
            })
        };
        for _ in 0..200 {
            let graph = kernels.capture_frame(&mut arena, size).unwrap();
            assert_eq!(graph.nodes(), FRAME_GRAPH_NODES);
        }
        stop.store(true, Ordering::Relaxed);
        let (other, last) = intruder.join().unwrap();
        // Every memset of the other thread ran: the buffer holds the last one's value.
        assert!(
            other
                .views()
                .buf
                .to_vec()
                .unwrap()
                .iter()
                .all(|&b| b == last)
        );
    }

    /// An arena on a stream borrowed from another library, in a `CudaContext` that cudarc made
    /// no stream in: `capture_frame` makes its capture's stream without cudarc (which would
    /// synchronize the whole device for that context's first stream), and its replays match
    /// the eager frame.
    #[test]
    fn capture_frame_on_a_borrowed_stream_of_a_context_without_streams() {
        let Some(stream) = stream() else { return };
        let fresh = devarena::backend::cuda::CudaContext::new(stream.context().ordinal()).unwrap();
        // SAFETY: `stream`, a live stream of the same (primary) context, outlives the wrapper
        // and everything made with it in this test.
        let borrowed = unsafe { fresh.wrap_borrowed_stream(stream.cu_stream()) };
        assert!(!fresh.is_in_multi_stream_mode());
        let kernels = PipelineKernels::load(&fresh).unwrap();
        let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(borrowed.clone())).unwrap();
        let size = ImageSize::new(67, 45);
        let input = input_of(size, DEFAULT_SEED + 3);
        let eager = eager_frame(&kernels, &mut arena, size, &input);
        let mut graph = kernels.capture_frame(&mut arena, size).unwrap();
        assert_eq!(graph.nodes(), 8);
        // Still no stream counted in that context: nothing synchronized the device.
        assert!(!fresh.is_in_multi_stream_mode());
        upload_input(&mut graph, size, &input).unwrap();
        graph.launch().unwrap();
        let mut out = FrameOutputs::new(size);
        download_outputs(
            &borrowed,
            &FrameBuffers::from(&mut graph.views_mut()),
            &mut out,
        )
        .unwrap();
        assert_eq!(out.first_difference(&eager), None);
    }

    #[test]
    fn frame_graph_replays_match_eager_frames_over_a_thousand_changing_inputs() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let backend = CudaBackend::new(stream.clone());
        let mut arena = Arena::<Frame, _>::new_in(backend.clone()).unwrap();
        let size = ImageSize::new(67, 45);
        let inputs: Vec<Vec<u8>> = (0..16).map(|i| input_of(size, DEFAULT_SEED + i)).collect();
        let eager: Vec<FrameOutputs> = inputs
            .iter()
            .map(|input| eager_frame(&kernels, &mut arena, size, input))
            .collect();
        assert!(
            eager
                .windows(2)
                .all(|w| w[0].first_difference(&w[1]).is_some()),
            "the inputs give different outputs"
        );

        let mut graph = kernels.capture_frame(&mut arena, size).unwrap();
        // A memset and seven kernels.
        assert_eq!(graph.nodes(), 8);
        assert_eq!(devarena_kernels::pipeline::cuda::FRAME_GRAPH_NODES, 8);
        let stream = graph.stream().clone();
        let mut out = FrameOutputs::new(size);
        for replay in 0..1000usize {
            // A different input every replay: 7 is coprime to 16.
            let i = (replay * 7 + 3) % inputs.len();
            upload_input(&mut graph, size, &inputs[i]).unwrap();
            graph.launch().unwrap();
            download_outputs(
                &stream,
                &FrameBuffers::from(&mut graph.views_mut()),
                &mut out,
            )
            .unwrap();
            if let Some(d) = out.first_difference(&eager[i]) {
                panic!("replay {replay} (input {i}) differs from the eager frame: {d}");
            }
        }
        // Many launches queued back to back, then the last one's outputs.
        upload_input(&mut graph, size, &inputs[5]).unwrap();
        for _ in 0..100 {
            graph.launch().unwrap();
        }
        download_outputs(
            &stream,
            &FrameBuffers::from(&mut graph.views_mut()),
            &mut out,
        )
        .unwrap();
        assert_eq!(out.first_difference(&eager[5]), None);
        drop(graph);
        // The arena is free again, and still holds what the last replay wrote.
        let again = eager_frame(&kernels, &mut arena, size, &inputs[5]);
        assert_eq!(again.first_difference(&eager[5]), None);
        assert_eq!(backend.stats().allocations, 1);
    }

    #[test]
    fn staged_graph_replays_match_eager_staged_frames() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let backend = CudaBackend::new(stream.clone());
        let mut arena = Arena::<FrameStaged, _>::new_in(backend.clone()).unwrap();
        for size in [ImageSize::new(31, 17), FRAME_SIZE] {
            let inputs: Vec<Vec<u8>> = (0..4).map(|i| input_of(size, DEFAULT_SEED + i)).collect();
            let eager: Vec<FrameOutputs> = inputs
                .iter()
                .map(|input| run_staged(&kernels, &mut arena, size, input, 1))
                .collect();
            let mut graph = kernels.capture_frame_staged(&mut arena, size).unwrap();
            // Stages gray … mask: a memset and seven kernels, recorded in stage order.
            assert_eq!(graph.nodes(), 8);
            let replays = if size == FRAME_SIZE { 20 } else { 1000 };
            let mut out = FrameOutputs::new(size);
            for replay in 0..replays {
                let i = (replay * 3 + 1) % inputs.len();
                upload_input_staged(&mut graph, size, &inputs[i]).unwrap();
                graph.launch().unwrap();
                download_mask_stage(&mut graph, &mut out).unwrap();
                assert!(
                    mask_stage(&out) == mask_stage(&eager[i]),
                    "{size}: replay {replay} (input {i}) differs from the eager frame"
                );
            }
            drop(graph);
            if size == FRAME_SIZE {
                check_against_host(size, &inputs[0], &eager[0]);
            }
        }
        assert_eq!(backend.stats().allocations, 1);
    }

    #[test]
    fn histogram_and_mask_on_special_values() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let below = |x: f32| f32::from_bits(x.to_bits() - 1);
        let mut values = vec![
            0.0,
            -0.0,
            -1.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE / 2.0,
            255.0 / 64.0,
            below(255.0 / 64.0),
            1e30,
        ];
        for b in 0..=256u32 {
            let edge = b as f32 / HIST_SCALE;
            values.extend([edge, below(edge.max(f32::MIN_POSITIVE)), edge + 1e-3]);
        }
        let mut rng = SplitMix64::new(3);
        values.extend((0..5000).map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 5.0));
        let magnitude = stream.clone_htod(&values).unwrap();
        let mut hist = stream.alloc_zeros::<u32>(HIST_BINS).unwrap();
        let mut threshold = stream.alloc_zeros::<u32>(1).unwrap();
        let mut mask = stream.alloc_zeros::<u8>(values.len()).unwrap();
        kernels.histogram(&stream, &magnitude, &mut hist).unwrap();
        kernels
            .otsu_threshold(&stream, &hist, &mut threshold)
            .unwrap();
        kernels
            .edge_mask(&stream, &magnitude, &threshold, &mut mask)
            .unwrap();
        let device_hist = stream.clone_dtoh(&hist).unwrap();
        let device_threshold = stream.clone_dtoh(&threshold).unwrap()[0];
        let device_mask = stream.clone_dtoh(&mask).unwrap();

        let mut host_hist = vec![0u32; HIST_BINS];
        host::histogram(&values, &mut host_hist).unwrap();
        assert_eq!(device_hist, host_hist);
        let t = host::otsu_threshold(&host_hist).unwrap();
        assert_eq!(device_threshold, t);
        let mut host_mask = vec![0u8; values.len()];
        host::edge_mask(&values, t, &mut host_mask).unwrap();
        assert_eq!(device_mask, host_mask);
    }

    /// No magnitude at all: the histogram is zeros and the mask is nothing, as on the host
    /// (`edge_mask` launched a grid of no blocks: `CUDA_ERROR_INVALID_VALUE`).
    #[test]
    fn histogram_and_mask_of_no_pixels_match_host() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let magnitude = stream.clone_htod(&[1.0f32; 4]).unwrap();
        let mut mask = stream.alloc_zeros::<u8>(4).unwrap();
        let mut hist = stream.clone_htod(&[7u32; HIST_BINS]).unwrap();
        let mut threshold = stream.alloc_zeros::<u32>(1).unwrap();
        let none = magnitude.slice(0..0);
        kernels.histogram(&stream, &none, &mut hist).unwrap();
        kernels
            .otsu_threshold(&stream, &hist, &mut threshold)
            .unwrap();
        kernels
            .edge_mask(&stream, &none, &threshold, &mut mask.slice_mut(0..0))
            .unwrap();
        let mut host_hist = vec![7u32; HIST_BINS];
        host::histogram(&[], &mut host_hist).unwrap();
        assert_eq!(stream.clone_dtoh(&hist).unwrap(), host_hist);
        assert_eq!(
            stream.clone_dtoh(&threshold).unwrap()[0],
            host::otsu_threshold(&host_hist).unwrap()
        );
        host::edge_mask(&[], 0, &mut []).unwrap();
        assert_eq!(stream.clone_dtoh(&mask).unwrap(), vec![0u8; 4]);
    }

    #[test]
    fn otsu_kernel_matches_host_on_crafted_histograms() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let mut cases: Vec<Vec<u32>> = Vec::new();
        cases.push(vec![0; 256]);
        let mut one = vec![0; 256];
        one[17] = 99;
        cases.push(one);
        let mut two = vec![0; 256];
        two[3] = 10;
        two[250] = 10;
        cases.push(two);
        cases.push(vec![1; 256]);
        let mut edges = vec![0; 256];
        edges[0] = u32::MAX / 2;
        edges[255] = u32::MAX / 2;
        cases.push(edges);
        let mut rng = SplitMix64::new(11);
        for shift in [40, 48, 56, 60] {
            cases.push((0..256).map(|_| (rng.next_u64() >> shift) as u32).collect());
        }
        // A frame-like histogram: most pixels near 0, a long tail.
        cases.push(
            (0..256u32)
                .map(|b| (2_000_000 >> b.min(20)) + (b % 7) * 300)
                .collect(),
        );
        let mut threshold = stream.alloc_zeros::<u32>(1).unwrap();
        for (i, case) in cases.iter().enumerate() {
            let hist = stream.clone_htod(case).unwrap();
            kernels
                .otsu_threshold(&stream, &hist, &mut threshold)
                .unwrap();
            let device = stream.clone_dtoh(&threshold).unwrap()[0];
            assert_eq!(
                device,
                host::otsu_threshold(case).unwrap(),
                "case {i}: {case:?}"
            );
        }
    }

    #[test]
    fn wrong_buffers_are_errors_before_any_launch() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let small = ImageSize::new(64, 64);
        let mut slices = FrameSlices::alloc(&stream, small).unwrap();
        let e = kernels
            .run_frame(&stream, FRAME_SIZE, slices.buffers(), None)
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { .. })
                && e.to_string()
                    .contains("`rgb` holds 12288 elements, a 1920×1080 image needs"),
            "{e}"
        );
        let mut hist = stream.alloc_zeros::<u32>(255).unwrap();
        let e = kernels
            .histogram(&stream, &slices.magnitude, &mut hist)
            .unwrap_err();
        assert!(e.to_string().contains("`hist` holds 255 elements"), "{e}");
        let e = kernels
            .rgb_to_gray(
                &stream,
                ImageSize::new(0, 64),
                &slices.rgb,
                &mut slices.gray,
            )
            .unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }

    /// A buffer of another context of the same device, whose addresses mean nothing in the
    /// kernels' context, is refused by name: by a stage, by a frame, and by the download.
    #[test]
    fn buffers_of_another_context_of_the_same_device_are_refused_by_name() {
        let Some(stream) = stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let size = ImageSize::new(8, 8);
        let other =
            devarena::backend::cuda::CudaContext::new_non_primary(stream.context().ordinal(), 0)
                .unwrap();
        let theirs = other.default_stream();
        let foreign = theirs.alloc_zeros::<f32>(size.pixels()).unwrap();
        let foreign_mask = theirs.alloc_zeros::<u8>(size.pixels()).unwrap();
        theirs.synchronize().unwrap();
        let want = format!("another context of device {}", stream.context().ordinal());
        let mut dst = stream.alloc_zeros::<f32>(size.pixels()).unwrap();
        let err = kernels
            .blur_rows(&stream, size, &foreign, &mut dst)
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!("`src` lives in {want}")),
            "{err}"
        );
        let err = kernels
            .blur_rows(&theirs, size, &dst, &mut dst.clone())
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("stream belongs to {want}")),
            "{err}"
        );
        let mut slices = FrameSlices::alloc(&stream, size).unwrap();
        slices.mask = foreign_mask;
        let err = kernels
            .run_frame(&stream, size, slices.buffers(), None)
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!("`mask` lives in {want}")),
            "{err}"
        );
        let mut out = FrameOutputs::new(size);
        let err = download_outputs(&stream, &slices.buffers(), &mut out).unwrap_err();
        assert!(
            err.to_string().contains(&format!("`mask` lives in {want}")),
            "{err}"
        );
        stream.synchronize().unwrap();
    }
}

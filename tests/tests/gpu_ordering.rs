//! Ordering on the GPU that the pipeline's wrappers and graphs rest on, checked by holding a
//! stream at a host function ([`Gate`](gpu::Gate)) and looking at what waits behind it: the
//! stage wrappers order a launch with each buffer's own stream both ways, also across two
//! `CudaContext` objects of one context (between which cudarc tracks nothing); dropping the
//! kernels waits for their launches in flight, eager or replayed from a graph.
//!
//! A test process of its own, its tests one at a time: a stream held at a host function holds
//! up every driver call of the process that waits for the whole context (a module's unload, a
//! synchronous free), and another test's such call would hold up these tests in turn until the
//! gate's time limit. Without a CUDA driver or device every test prints `skipped: no CUDA
//! device` and passes; with `DEVARENA_REQUIRE_GPU=1` it fails instead.

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_ordering_needs_the_cuda_feature() {
    assert!(
        std::env::var("DEVARENA_REQUIRE_GPU").as_deref() != Ok("1"),
        "DEVARENA_REQUIRE_GPU=1, but this test was built without the `cuda` feature"
    );
    println!("skipped: no CUDA device (built without the `cuda` feature)");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;

    use devarena::Arena;
    use devarena::backend::cuda::{CudaBackend, CudaStream};
    use devarena_kernels::pipeline::cuda::{
        FrameSlices, PipelineKernels, download_outputs, upload_input,
    };
    use devarena_kernels::pipeline::image::{DEFAULT_SEED, synthetic_frame};
    use devarena_kernels::pipeline::{Frame, FrameBuffers, FrameOutputs, ImageSize, host};

    fn stream() -> Option<Arc<CudaStream>> {
        devarena_tests::gpu_stream()
    }

    /// One test at a time (see the module docs).
    fn alone() -> std::sync::MutexGuard<'static, ()> {
        static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        ALONE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds a stream at a host function until opened (or dropped), or for [`GATE_LIMIT`] at
    /// most, so that a test that goes wrong fails instead of hanging: work queued on the
    /// stream after the hold cannot run before.
    struct Gate(Arc<GateState>);

    #[derive(Default)]
    struct GateState {
        /// (opened, released by the time limit instead)
        state: std::sync::Mutex<(bool, bool)>,
        cv: std::sync::Condvar,
    }

    /// The longest a [`Gate`] holds its stream.
    const GATE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

    unsafe extern "C" fn wait_at_gate(arg: *mut std::ffi::c_void) {
        // SAFETY: `arg` is the `Arc` that `Gate::hold` leaked for this call, reclaimed once.
        let gate = unsafe { Arc::from_raw(arg as *const GateState) };
        let deadline = std::time::Instant::now() + GATE_LIMIT;
        let mut state = gate.state.lock().unwrap_or_else(|e| e.into_inner());
        while !state.0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                state.1 = true;
                return;
            }
            state = gate
                .cv
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    impl Gate {
        fn hold(stream: &CudaStream) -> Gate {
            let state = Arc::new(GateState::default());
            let arg = Arc::into_raw(state.clone()) as *mut std::ffi::c_void;
            stream.context().bind_to_thread().unwrap();
            // SAFETY: a live stream; the host function makes no CUDA call and owns the one
            // reference leaked for it.
            unsafe {
                devarena_kernels::cudarc::driver::result::stream::launch_host_function(
                    stream.cu_stream(),
                    wait_at_gate,
                    arg,
                )
            }
            .expect("cuLaunchHostFunc");
            Gate(state)
        }

        /// Whether the time limit released the stream (the test was held up behind its own
        /// gate).
        fn timed_out(&self) -> bool {
            self.0.state.lock().unwrap_or_else(|e| e.into_inner()).1
        }

        /// Lets the stream run on; panics where the time limit released it first (the test
        /// was held up behind its own gate).
        fn open(&self) {
            let mut state = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            state.0 = true;
            self.0.cv.notify_all();
            assert!(!state.1, "the gate's time limit released the stream");
        }
    }

    impl Drop for Gate {
        fn drop(&mut self) {
            let mut state = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            state.0 = true;
            self.0.cv.notify_all();
        }
    }

    /// Whether work queued on `stream` now is still waiting after a while (50 ms: ample for
    /// a small kernel that nothing holds).
    fn still_waits(stream: &CudaStream) -> bool {
        let marker = stream.record_event(None).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        !marker.try_is_complete().unwrap()
    }

    /// Two `CudaContext` objects of one context track no events between them (cudarc orders
    /// a buffer with a stream only within one object, and only in multi-stream mode): the
    /// stage wrappers order a launch with each buffer's own stream themselves, both ways. A
    /// buffer of a fresh object, on its legacy default stream, used by a blur launched on a
    /// non-blocking stream of another object: the blur waits for the copy queued into the
    /// buffer before it, and the buffer's stream (where its free goes) waits for the blur.
    #[test]
    fn stage_wrappers_order_buffers_of_another_context_object_both_ways() {
        let _alone = alone();
        let Some(stream) = stream() else { return };
        let other = devarena::backend::cuda::CudaContext::new(stream.context().ordinal()).unwrap();
        let legacy = other.default_stream();
        assert!(!other.is_in_multi_stream_mode());
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let size = ImageSize::new(96, 64);
        let px = size.pixels();
        let first: Vec<f32> = (0..px).map(|i| (i % 7) as f32 / 7.0).collect();
        let second: Vec<f32> = (0..px).map(|i| (i % 5) as f32 / 5.0).collect();
        let mut src = legacy.clone_htod(&first).unwrap();
        let staged = legacy.clone_htod(&second).unwrap();
        let mut dst = stream.alloc_zeros::<f32>(px).unwrap();
        legacy.synchronize().unwrap();
        stream.synchronize().unwrap();
        let mut want = vec![0f32; px];
        host::blur_horizontal(size, &second, &mut want).unwrap();

        // Before: the new input is copied into `src` behind a hold on its stream.
        let gate = Gate::hold(&legacy);
        legacy.memcpy_dtod(&staged, &mut src).unwrap();
        kernels.blur_rows(&stream, size, &src, &mut dst).unwrap();
        assert!(
            still_waits(&stream),
            "the blur ran before the copy into its input"
        );
        gate.open();
        stream.synchronize().unwrap();
        legacy.synchronize().unwrap();
        assert_eq!(stream.clone_dtoh(&dst).unwrap(), want);

        // After: the blur is held on its stream; `src`'s stream waits for it.
        let gate = Gate::hold(&stream);
        kernels.blur_rows(&stream, size, &src, &mut dst).unwrap();
        assert!(
            still_waits(&legacy),
            "the input's stream ran on past the blur that reads it"
        );
        gate.open();
        legacy.synchronize().unwrap();
        stream.synchronize().unwrap();
        assert_eq!(stream.clone_dtoh(&dst).unwrap(), want);
    }

    /// Drops `kernels` on another thread while `gate` holds their stream, with a launch of
    /// theirs queued behind it: the drop (`cuModuleUnload`) returns only after the gate opens,
    /// once the launch has run.
    fn assert_unload_waits(kernels: PipelineKernels, gate: Gate) {
        assert!(
            !gate.timed_out(),
            "held up behind the gate before the unload"
        );
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let dropper = s.spawn(|| {
                drop(kernels);
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(
                !done.load(std::sync::atomic::Ordering::SeqCst),
                "the module was unloaded under a launch of its kernels"
            );
            gate.open();
            dropper.join().unwrap();
        });
    }

    /// What `capture_frame`'s graph (which borrows the kernels only while it lives) and an
    /// eager launch rest on: dropping the kernels, which unloads their module, waits for the
    /// launches of theirs still queued, eager or replayed; their output is whole.
    #[test]
    fn dropping_the_kernels_waits_for_their_launches_in_flight() {
        let _alone = alone();
        let Some(stream) = stream() else { return };
        let size = ImageSize::new(96, 64);
        let px = size.pixels();
        let input: Vec<f32> = (0..px).map(|i| (i % 7) as f32 / 7.0).collect();
        let mut want = vec![0f32; px];
        host::blur_horizontal(size, &input, &mut want).unwrap();

        // Eager.
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let src = stream.clone_htod(&input).unwrap();
        let mut dst = stream.alloc_zeros::<f32>(px).unwrap();
        stream.synchronize().unwrap();
        let gate = Gate::hold(&stream);
        kernels.blur_rows(&stream, size, &src, &mut dst).unwrap();
        assert_unload_waits(kernels, gate);
        stream.synchronize().unwrap();
        assert_eq!(stream.clone_dtoh(&dst).unwrap(), want);

        // A graph's replay, the graph dropped before the kernels.
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let mut frame = vec![0u8; size.pixels() * 3];
        synthetic_frame(size, DEFAULT_SEED + 5, &mut frame).unwrap();
        let mut slices = FrameSlices::alloc(&stream, size).unwrap();
        slices.rgb = stream.clone_htod(&frame).unwrap();
        kernels
            .run_frame(&stream, size, slices.buffers(), None)
            .unwrap();
        let mut eager = FrameOutputs::new(size);
        download_outputs(&stream, &slices.buffers(), &mut eager).unwrap();
        let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let mut graph = kernels.capture_frame(&mut arena, size).unwrap();
        upload_input(&mut graph, size, &frame).unwrap();
        let gate = Gate::hold(&stream);
        graph.launch().unwrap();
        drop(graph);
        assert_unload_waits(kernels, gate);
        stream.synchronize().unwrap();
        let mut out = FrameOutputs::new(size);
        download_outputs(
            &stream,
            &FrameBuffers::from(&mut arena.views_mut()),
            &mut out,
        )
        .unwrap();
        assert_eq!(out.first_difference(&eager), None);
    }
}

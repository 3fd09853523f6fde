//! CUDA graphs of arenas (`Arena::capture`, `ArenaGraph`): replays that follow a changing input
//! a thousand times, layouts with stages captured stage by stage, another stream joined to a
//! capture, a managed arena's host views between replays, and the calls a capture cannot
//! record — each an error with the CUDA error name, after which the stream is out of capture
//! mode and usable. The borrow rules are checked at compile time in
//! `ui/compile_fail/graph_*.rs`.

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    devarena_tests::skip_or_fail("built without the `cuda` feature");
}

// The stream gate of the pool's GPU tests (a host function that holds a stream).
#[cfg(feature = "cuda")]
#[path = "../../allocator/tests/gpu_common/mod.rs"]
mod gpu_common;

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;

    use devarena::backend::DirectViews;
    use devarena::backend::cuda::{
        CudaBackend, CudaFunction, CudaMut, CudaStream, DeviceViewMut, LaunchConfig,
        ManagedBackend, Ptx, PushKernelArg, StreamOrdered, default_stream, is_capturing,
    };
    use devarena::{Arena, ArenaGraph, DeviceLayout, Error};
    use devarena_tests::gpu_stream;

    /// `y[i] = a * x[i] + b` (u32, wrapping): the kernel of the pool's GPU tests.
    const PTX: &str = include_str!("../../allocator/tests/kernels/scale_add.ptx");

    const N: usize = 4096;

    #[derive(DeviceLayout)]
    struct Pair {
        input: [u32; N],
        scratch: [u32; N],
        output: [u32; N],
    }

    /// Three stages; `output` (stage 2) reuses the bytes of `input` (stages 0 and 1).
    #[derive(DeviceLayout)]
    #[layout(stages = 3)]
    struct Steps {
        #[layout(live = 0..=1)]
        input: [u32; N],
        #[layout(live = 1..=2)]
        mid: [u32; N],
        #[layout(live = 2..=2)]
        output: [u32; N],
    }

    fn scale_add(stream: &Arc<CudaStream>) -> CudaFunction {
        let module = stream.context().load_module(Ptx::from_src(PTX)).unwrap();
        module.load_function("scale_add_u32").unwrap()
    }

    /// Queues `y = a * x + b` on `stream`.
    fn launch(
        f: &CudaFunction,
        stream: &Arc<CudaStream>,
        x: &DeviceViewMut<'_, u32>,
        y: &mut DeviceViewMut<'_, u32>,
        (a, b): (u32, u32),
    ) -> Result<(), Error> {
        let n = x.len() as u32;
        let mut args = stream.launch_builder(f);
        args.arg(x).arg(y).arg(&a).arg(&b).arg(&n);
        // SAFETY: `scale_add_u32(const u32*, u32*, u32, u32, u32)` reads `n` elements of `x` and
        // writes `n` of `y`; both views hold `n` (`N`) elements and are ordered on `stream`.
        unsafe { args.launch(LaunchConfig::for_num_elems(n)) }
            .map(drop)
            .map_err(|e| devarena::backend::cuda::driver_error("cuLaunchKernel", e))
    }

    /// Captures `output = 5 · (3 · input + 1) + 7` (two launches of `f`, through `scratch`) on
    /// `arena`'s stream. The graph borrows `f` as well as the arena, so the module its kernel
    /// nodes run outlives it.
    fn capture_two_launches<'a, B>(
        arena: &'a mut Arena<Pair, B>,
        f: &'a CudaFunction,
    ) -> ArenaGraph<'a, Pair, B>
    where
        B: DirectViews<Mut = CudaMut> + StreamOrdered,
    {
        // SAFETY: the work reaches the arena's views alone, and `f`'s module, borrowed for the
        // graph's life.
        unsafe {
            arena.capture(|c| {
                let s = c.stream().clone();
                let mut v = c.views_mut();
                launch(f, &s, &v.input, &mut v.scratch, (3, 1))?;
                launch(f, &s, &v.scratch, &mut v.output, (5, 7))
            })
        }
        .unwrap()
    }

    /// The input of replay `r`: different every time.
    fn input(r: u32) -> Vec<u32> {
        (0..N as u32)
            .map(|i| {
                i.wrapping_mul(2_654_435_761)
                    .wrapping_add(r.wrapping_mul(40_503))
            })
            .collect()
    }

    fn expected(input: &[u32]) -> Vec<u32> {
        input
            .iter()
            .map(|&x| {
                x.wrapping_mul(3)
                    .wrapping_add(1)
                    .wrapping_mul(5)
                    .wrapping_add(7)
            })
            .collect()
    }

    /// The name of a driver error, or a panic naming what came instead.
    fn driver_error_name(e: &Error) -> &str {
        match e {
            Error::Driver { name, .. } => name,
            other => panic!("expected a driver error, got {other:?}"),
        }
    }

    /// After a failed capture: the stream is out of capture mode and the arena works.
    fn assert_usable(arena: &mut Arena<Pair, CudaBackend>) {
        let stream = arena.backend().stream().clone();
        assert!(
            !is_capturing(&stream).unwrap(),
            "the stream is still capturing"
        );
        let data = input(99);
        arena.views_mut().input.upload(&data).unwrap();
        assert_eq!(arena.views().input.to_vec().unwrap(), data);
    }

    #[test]
    fn replays_follow_a_changing_input_a_thousand_times() {
        let Some(stream) = gpu_stream() else { return };
        let f = scale_add(&stream);
        let backend = CudaBackend::new(stream.clone());
        let mut arena = Arena::<Pair, _>::new_in(backend.clone()).unwrap();
        let mut graph = capture_two_launches(&mut arena, &f);
        assert_eq!(graph.nodes(), 2);
        let mut out = vec![0u32; N];
        for r in 0..1000 {
            let data = input(r);
            graph.views_mut().input.upload(&data).unwrap();
            graph.launch().unwrap();
            graph.arena().views().output.download(&mut out).unwrap();
            assert!(out == expected(&data), "replay {r}");
        }
        // Replays queued back to back run in order, each after the one before.
        graph.views_mut().input.upload(&input(7)).unwrap();
        for _ in 0..50 {
            graph.launch().unwrap();
        }
        graph.synchronize().unwrap();
        assert_eq!(
            graph.arena().views().output.to_vec().unwrap(),
            expected(&input(7))
        );
        drop(graph);
        // The arena is the caller's again; nothing was allocated for the graph's replays.
        arena.views_mut().output.fill_bytes(0).unwrap();
        assert_eq!(arena.views().output.to_vec().unwrap(), vec![0; N]);
        assert_eq!(backend.stats().allocations, 1);
    }

    #[test]
    fn stages_are_captured_in_stage_order() {
        let Some(stream) = gpu_stream() else { return };
        let f = scale_add(&stream);
        // `output` sits on `input`'s bytes: stage 2 may write them only after stage 1 read them.
        let (input_at, output_at) = (Steps::OFFSETS.input, Steps::OFFSETS.output);
        assert!(output_at < input_at + N * 4 && input_at < output_at + N * 4);
        let mut arena = Arena::<Steps, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let mut graph = unsafe {
            arena.capture(|c| {
                let s = c.stream().clone();
                let mut one = c.stage_mut::<1>();
                launch(&f, &s, &one.input, &mut one.mid, (3, 1))?;
                let mut two = c.stage_mut::<2>();
                launch(&f, &s, &two.mid, &mut two.output, (5, 7))
            })
        }
        .unwrap();
        assert_eq!(graph.nodes(), 2);
        let mut out = vec![0u32; N];
        for r in 0..300 {
            let data = input(r);
            // Stage 0 writes the input between replays; stage 2 holds the result after one.
            graph.stage_mut::<0>().input.upload(&data).unwrap();
            graph.launch().unwrap();
            graph.stage_mut::<2>().output.download(&mut out).unwrap();
            assert!(out == expected(&data), "replay {r}");
        }
    }

    #[test]
    fn another_stream_joins_the_capture_in_order() {
        let Some(stream) = gpu_stream() else { return };
        let other = stream.context().new_stream().unwrap();
        let f = scale_add(&stream);
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let mut graph = unsafe {
            arena.capture(|c| {
                let s = c.stream().clone();
                let mut v = c.views_mut();
                launch(&f, &s, &v.input, &mut v.scratch, (3, 1))?;
                // Forked onto `other`: after the work above, joined back when the closure returns.
                c.views_mut_on(&other, |mut on| {
                    assert_eq!(on.output.stream().cu_stream(), other.cu_stream());
                    launch(&f, &other, &on.scratch, &mut on.output, (5, 7))
                })?;
                // Back on the arena's stream, after `other`'s work: copy the result over.
                let mut v = c.views_mut();
                launch(&f, &s, &v.output, &mut v.input, (1, 0))
            })
        }
        .unwrap();
        assert!(!is_capturing(&other).unwrap());
        for r in 0..200 {
            let data = input(r);
            graph.views_mut().input.upload(&data).unwrap();
            graph.launch().unwrap();
            let v = graph.arena().views();
            let want = expected(&data);
            assert!(v.output.to_vec().unwrap() == want, "replay {r}: output");
            assert!(v.input.to_vec().unwrap() == want, "replay {r}: the join");
        }
    }

    #[test]
    fn another_stream_joins_a_staged_capture_in_stage_order() {
        let Some(stream) = gpu_stream() else { return };
        let other = stream.context().new_stream().unwrap();
        let f = scale_add(&stream);
        let mut arena = Arena::<Steps, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let mut graph = unsafe {
            arena.capture(|c| {
                let s = c.stream().clone();
                // Stage 1 on `other`, stage 2 (on `input`'s bytes) on the arena's stream: the
                // join orders stage 2's writes after stage 1's reads.
                c.stage_mut_on::<1, _>(&other, |mut one| {
                    assert_eq!(one.mid.stream().cu_stream(), other.cu_stream());
                    launch(&f, &other, &one.input, &mut one.mid, (3, 1))
                })?;
                let mut two = c.stage_mut::<2>();
                launch(&f, &s, &two.mid, &mut two.output, (5, 7))
            })
        }
        .unwrap();
        assert!(!is_capturing(&other).unwrap());
        let mut out = vec![0u32; N];
        for r in 0..200 {
            let data = input(r);
            graph.stage_mut::<0>().input.upload(&data).unwrap();
            graph.launch().unwrap();
            graph.stage_mut::<2>().output.download(&mut out).unwrap();
            assert!(out == expected(&data), "replay {r}");
        }
    }

    /// Between replays, work on another stream (the next input, written on a copy stream) runs
    /// before the next replay: the other stream is held by a gate, opened 200 ms later from
    /// another thread, and the replay must still see the new input.
    #[test]
    fn work_on_another_stream_between_replays_runs_before_the_next_replay() {
        let Some((_device, stream)) = super::gpu_common::gpu() else {
            return;
        };
        let other = stream.context().new_stream().unwrap();
        let f = scale_add(&stream);
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let mut graph = capture_two_launches(&mut arena, &f);
        graph.views_mut().input.upload(&input(1)).unwrap();
        graph.launch().unwrap();
        let gate = super::gpu_common::StreamGate::block(&other);
        let open_later = gate.open_after(std::time::Duration::from_millis(200));
        // The next input, queued on `other` behind the gate.
        graph
            .views_mut_on(&other, |mut v| v.input.fill_bytes(0x01))
            .unwrap();
        graph.launch().unwrap();
        let out = graph.arena().views().output.to_vec().unwrap();
        open_later.join().unwrap();
        assert!(
            out == expected(&vec![0x0101_0101; N]),
            "the replay ran before the input written on the other stream"
        );
    }

    #[test]
    fn a_managed_arena_is_read_by_the_host_between_replays() {
        let Some(stream) = gpu_stream() else { return };
        let f = scale_add(&stream);
        let mut arena = Arena::<Pair, _>::new_in(ManagedBackend::new(stream.clone())).unwrap();
        let mut graph = capture_two_launches(&mut arena, &f);
        for r in 0..20 {
            let data = input(r);
            graph.host_views_mut().unwrap().input.copy_from_slice(&data);
            graph.launch().unwrap();
            // Waits for the replay before the host reads.
            let v = graph.host_views_mut().unwrap();
            assert!(v.output == &expected(&data)[..], "replay {r}");
        }
    }

    #[test]
    fn deliberate_api_error_a_synchronous_copy_during_capture_is_an_error_and_the_stream_stays_usable()
     {
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let data = input(1);
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let e = unsafe { arena.capture(|c| c.views_mut().input.upload(&data)) }.unwrap_err();
        let name = driver_error_name(&e);
        assert!(name.starts_with("CUDA_ERROR_STREAM_CAPTURE"), "{e}");
        println!("upload during capture: {e}");
        assert_usable(&mut arena);
        let mut out = vec![0u32; N];
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let e = unsafe { arena.capture(|c| c.views_mut().output.download(&mut out)) }.unwrap_err();
        assert!(
            driver_error_name(&e).starts_with("CUDA_ERROR_STREAM_CAPTURE"),
            "{e}"
        );
        assert_usable(&mut arena);

        // A capture after the failed ones works.
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let mut graph = unsafe { arena.capture(|c| c.views_mut().output.fill_bytes(3)) }.unwrap();
        graph.launch().unwrap();
        assert_eq!(
            graph.arena().views().output.to_vec().unwrap(),
            vec![0x0303_0303; N]
        );
    }

    #[test]
    fn deliberate_api_error_an_allocation_during_capture_is_an_error() {
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let inner = CudaBackend::new(stream.clone());
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let e = unsafe {
            arena.capture(|c| {
                c.views_mut().output.fill_bytes(1)?;
                // `cuMemAlloc` on the capturing thread.
                Arena::<Pair, _>::new_in(inner.clone()).map(drop)
            })
        }
        .unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Driver {
                    call: "cuMemAlloc",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            driver_error_name(&e).starts_with("CUDA_ERROR_STREAM_CAPTURE"),
            "{e}"
        );
        println!("cuMemAlloc during capture: {e}");
        assert_eq!(inner.stats().failures, 1);
        assert_usable(&mut arena);
        // Outside a capture the same allocation succeeds.
        Arena::<Pair, _>::new_in(inner.clone()).unwrap();
    }

    #[test]
    fn deliberate_api_error_a_swallowed_error_still_fails_the_capture() {
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let data = input(2);
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let e = unsafe {
            arena.capture(|c| {
                let _ = c.views_mut().input.upload(&data); // the error is dropped
                Ok(())
            })
        }
        .unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Driver {
                    call: "cuStreamEndCapture",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            driver_error_name(&e).starts_with("CUDA_ERROR_STREAM_CAPTURE"),
            "{e}"
        );
        println!("swallowed error: {e}");
        assert_usable(&mut arena);
    }

    #[test]
    fn a_panic_during_capture_ends_the_capture() {
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
            let _ = unsafe {
                arena.capture(|c| {
                    c.views_mut().output.fill_bytes(1)?;
                    panic!("a bug in the recording code");
                })
            };
        }));
        assert!(result.is_err());
        assert_usable(&mut arena);
    }

    #[test]
    fn deliberate_api_error_an_arena_on_the_legacy_default_stream_cannot_capture() {
        let Some(stream) = gpu_stream() else { return };
        let legacy = default_stream(stream.context().ordinal()).unwrap();
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(legacy.clone())).unwrap();
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let e = unsafe { arena.capture(|c| c.views_mut().output.fill_bytes(1)) }.unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Driver {
                    call: "cuStreamBeginCapture",
                    ..
                }
            ),
            "{e}"
        );
        println!("capture on the legacy stream: {e}");
        assert!(!is_capturing(&legacy).unwrap());
        arena.views_mut().output.fill_bytes(2).unwrap();
        assert_eq!(arena.views().output.to_vec().unwrap(), vec![0x0202_0202; N]);
    }

    /// `capture_on_own_stream` captures on a non-blocking stream of its own, so an arena on
    /// the legacy default stream, which `capture` refuses, captures that way, and its replays
    /// run on the legacy stream.
    #[test]
    fn an_arena_on_the_legacy_default_stream_captures_on_a_stream_of_its_own() {
        let Some(stream) = gpu_stream() else { return };
        let legacy = default_stream(stream.context().ordinal()).unwrap();
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(legacy.clone())).unwrap();
        arena.views_mut().output.fill_bytes(1).unwrap();
        // SAFETY: the work reaches the arena's views alone.
        let mut graph = unsafe {
            arena.capture_on_own_stream(|c| {
                assert_ne!(c.stream().cu_stream(), legacy.cu_stream());
                c.views_mut().output.fill_bytes(6)
            })
        }
        .unwrap();
        assert_eq!(graph.nodes(), 1);
        // Nothing ran at capture.
        assert_eq!(
            graph.views_mut().output.to_vec().unwrap(),
            vec![0x0101_0101; N]
        );
        graph.launch().unwrap();
        assert_eq!(
            graph.views_mut().output.to_vec().unwrap(),
            vec![0x0606_0606; N]
        );
    }

    /// `capture_on_own_stream` queues nothing on the arena's stream before its capture ends
    /// and makes its stream without cudarc: it works while someone else captures the arena's
    /// stream (whose capture gets nothing of it), and on a stream borrowed from another library
    /// in a `CudaContext` cudarc made no stream in (which cudarc's `new_stream` would have
    /// synchronized the whole device for, and which stays without a counted stream).
    #[test]
    fn a_capture_on_its_own_stream_leaves_the_arenas_stream_and_context_alone() {
        use devarena_kernels::cudarc::driver::sys::{
            CUgraphInstantiate_flags, CUstreamCaptureMode,
        };
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        arena.views_mut().output.fill_bytes(9).unwrap();
        // Another thread captures the arena's stream meanwhile (a thread-local capture, begun
        // and ended on that thread).
        let (begun, done) = (
            Arc::new(std::sync::Barrier::new(2)),
            Arc::new(std::sync::Barrier::new(2)),
        );
        let other = {
            let (stream, begun, done) = (stream.clone(), begun.clone(), done.clone());
            std::thread::spawn(move || {
                stream
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .unwrap();
                begun.wait();
                done.wait();
                // Ended intact, and replayed: it must leave the arena as it was.
                let other = stream.end_capture(CUgraphInstantiate_flags(0))?;
                if let Some(other) = other {
                    other.launch()?;
                }
                stream.synchronize()
            })
        };
        begun.wait();
        assert!(is_capturing(&stream).unwrap());
        // SAFETY: the work reaches the arena's views alone.
        let graph = unsafe { arena.capture_on_own_stream(|c| c.views_mut().output.fill_bytes(1)) };
        done.wait();
        other.join().unwrap().unwrap();
        let mut graph = graph.unwrap();
        assert_eq!(graph.nodes(), 1);
        assert_eq!(
            graph.views_mut().output.to_vec().unwrap(),
            vec![0x0909_0909; N]
        );
        graph.launch().unwrap();
        assert_eq!(
            graph.views_mut().output.to_vec().unwrap(),
            vec![0x0101_0101; N]
        );
        drop(graph);

        // A borrowed stream in a `CudaContext` of its own that has made no stream.
        let fresh = devarena::backend::cuda::CudaContext::new(stream.context().ordinal()).unwrap();
        assert!(!fresh.is_in_multi_stream_mode());
        // SAFETY: `stream`, a live stream of the same (primary) context, outlives the wrapper
        // and everything made with it in this test.
        let borrowed = unsafe { fresh.wrap_borrowed_stream(stream.cu_stream()) };
        let mut on_borrowed = Arena::<Pair, _>::new_in(CudaBackend::new(borrowed)).unwrap();
        // SAFETY: the work reaches the arena's views alone.
        let mut graph =
            unsafe { on_borrowed.capture_on_own_stream(|c| c.views_mut().output.fill_bytes(3)) }
                .unwrap();
        assert!(!fresh.is_in_multi_stream_mode());
        graph.launch().unwrap();
        assert_eq!(
            graph.views_mut().output.to_vec().unwrap(),
            vec![0x0303_0303; N]
        );
    }

    /// The capture's stream of `capture_on_own_stream` stays usable where a handle to it
    /// outlives the call (it is then never destroyed), and a panic in `record` ends the
    /// capture: the arena and its stream work on.
    #[test]
    fn a_capture_streams_kept_handle_stays_usable_and_a_panic_ends_the_capture() {
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let mut kept = None;
        // SAFETY: the work reaches the arena's views alone.
        let mut graph = unsafe {
            arena.capture_on_own_stream(|c| {
                kept = Some(c.stream().clone());
                c.views_mut().output.fill_bytes(1)
            })
        }
        .unwrap();
        graph.launch().unwrap();
        drop(graph);
        let kept = kept.unwrap();
        assert!(!is_capturing(&kept).unwrap());
        kept.synchronize().unwrap();
        arena
            .views_mut_on(&kept, |mut v| v.output.fill_bytes(5))
            .unwrap();
        assert_eq!(arena.views().output.to_vec().unwrap(), vec![0x0505_0505; N]);

        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: as above.
            let _ = unsafe {
                arena.capture_on_own_stream(|c| {
                    c.views_mut().output.fill_bytes(7)?;
                    panic!("a bug in the recording code");
                })
            };
        }));
        assert!(unwound.is_err());
        assert!(!is_capturing(&stream).unwrap());
        arena.views_mut().output.fill_bytes(2).unwrap();
        assert_eq!(arena.views().output.to_vec().unwrap(), vec![0x0202_0202; N]);
        // SAFETY: as above.
        let mut graph =
            unsafe { arena.capture_on_own_stream(|c| c.views_mut().output.fill_bytes(3)) }.unwrap();
        graph.launch().unwrap();
        assert_eq!(
            graph.views_mut().output.to_vec().unwrap(),
            vec![0x0303_0303; N]
        );
    }

    /// In a capture on a stream of its own, `views_mut_on` for the arena's stream records on
    /// the capturing stream: the arena's stream, which other code may use, never joins the
    /// capture, and work queued on it meanwhile runs instead of being recorded.
    #[test]
    fn a_capture_on_its_own_stream_never_pulls_the_arenas_stream_in() {
        #[derive(DeviceLayout)]
        struct Scratch {
            buf: [u8; 4096],
        }
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let mut other = Arena::<Scratch, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        // SAFETY: the recorded work reaches the arena's views alone (the other arena's memset
        // runs on the arena's stream, which is not capturing).
        let mut graph = unsafe {
            arena.capture_on_own_stream(|c| {
                c.views_mut_on(&stream, |mut v| {
                    assert!(!is_capturing(&stream).unwrap());
                    v.output.fill_bytes(7)
                })?;
                assert!(!is_capturing(&stream).unwrap());
                other.views_mut().buf.fill_bytes(9)
            })
        }
        .unwrap();
        assert_eq!(graph.nodes(), 1);
        assert!(other.views().buf.to_vec().unwrap().iter().all(|&b| b == 9));
        graph.launch().unwrap();
        assert_eq!(
            graph.views_mut().output.to_vec().unwrap(),
            vec![0x0707_0707; N]
        );
    }

    #[test]
    fn deliberate_api_error_a_replay_is_never_recorded_into_another_capture() {
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let mut graph = unsafe { arena.capture(|c| c.views_mut().output.fill_bytes(4)) }.unwrap();
        // Someone else's capture of the arena's stream, through cudarc.
        let mode = devarena_kernels::cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        stream.begin_capture(mode).unwrap();
        let e = graph.launch().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        let flags = devarena_kernels::cudarc::driver::sys::CUgraphInstantiate_flags(0);
        drop(stream.end_capture(flags).unwrap());
        assert!(!is_capturing(&stream).unwrap());
        graph.launch().unwrap();
        assert_eq!(
            graph.arena().views().output.to_vec().unwrap(),
            vec![0x0404_0404; N]
        );
    }

    #[test]
    fn an_empty_capture_replays_nothing() {
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Pair, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        arena.views_mut().output.fill_bytes(9).unwrap();
        // SAFETY: the work reaches the arena's views alone (and kernels that outlive the graph).
        let mut graph = unsafe { arena.capture(|_| Ok(())) }.unwrap();
        assert_eq!(graph.nodes(), 0);
        graph.launch().unwrap();
        graph.synchronize().unwrap();
        assert_eq!(
            graph.arena().views().output.to_vec().unwrap(),
            vec![0x0909_0909; N]
        );
    }
}

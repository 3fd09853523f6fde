//! An arena's views on another stream than the arena's: ordered both ways.

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
    use std::panic::AssertUnwindSafe;
    use std::time::Duration;

    use devarena::backend::cuda::PinnedBackend;
    use devarena::backend::cuda::{CudaBackend, ManagedBackend};
    use devarena::{Arena, DeviceLayout, Error};
    use devarena_tests::gpu_stream;

    #[derive(DeviceLayout)]
    struct Params {
        scale: [f32; 4],
        #[layout(align = 1024)]
        lut: [u8; 300],
    }

    /// CUDA's per-thread default stream names another stream on each thread, and an arena may
    /// be used and dropped on any thread: every CUDA backend refuses it, with an error that
    /// names it, and allocates nothing. (Here, not beside the footprint tests of `gpu_arena`:
    /// the first use of the per-thread stream moves the device's free memory.)
    #[test]
    fn arenas_refuse_the_per_thread_default_stream() {
        let Some(stream) = gpu_stream() else { return };
        let per_thread = stream.context().per_thread_stream();
        let device = CudaBackend::new(per_thread.clone());
        let ordered = CudaBackend::stream_ordered(per_thread.clone());
        let managed = ManagedBackend::new(per_thread.clone());
        let pinned = PinnedBackend::new(per_thread);
        let errors = [
            (
                "cuda",
                Arena::<Params, _>::new_in(device.clone()).err(),
                device.stats(),
            ),
            (
                "cuda-async",
                Arena::<Params, _>::new_in(ordered.clone()).err(),
                ordered.stats(),
            ),
            (
                "cuda-managed",
                Arena::<Params, _>::new_in(managed.clone()).err(),
                managed.stats(),
            ),
            (
                "cuda-pinned",
                Arena::<Params, _>::new_in(pinned.clone()).err(),
                pinned.stats(),
            ),
        ];
        for (name, error, stats) in errors {
            let error =
                error.unwrap_or_else(|| panic!("{name}: an arena on the per-thread stream"));
            let text = error.to_string();
            assert!(
                text.contains(name) && text.contains("per-thread default stream"),
                "{text}"
            );
            assert_eq!(stats.allocations, 0, "{name}");
        }
        // Its own stream serves as before; views for the per-thread stream are refused too
        // (they may be sent to another thread).
        let mut arena = Arena::<Params, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let per_thread = stream.context().per_thread_stream();
        let error = arena.views_mut_on(&per_thread, |_| Ok(())).unwrap_err();
        assert!(
            error.to_string().contains("per-thread default stream"),
            "{error}"
        );
    }

    /// The pipeline's kernels refuse the per-thread default stream too: to run on, and as a
    /// buffer's stream (a cudarc buffer allocated on it by one thread would be freed on
    /// another thread's), by name, before anything is queued.
    #[test]
    fn pipeline_kernels_refuse_the_per_thread_default_stream() {
        use devarena_kernels::pipeline::ImageSize;
        use devarena_kernels::pipeline::cuda::{FrameSlices, PipelineKernels, download_outputs};
        let Some(stream) = gpu_stream() else { return };
        let kernels = PipelineKernels::load(stream.context()).unwrap();
        let per_thread = stream.context().per_thread_stream();
        let size = ImageSize::new(8, 8);
        let src = stream.alloc_zeros::<f32>(size.pixels()).unwrap();
        let mut dst = stream.alloc_zeros::<f32>(size.pixels()).unwrap();
        let theirs = per_thread.alloc_zeros::<f32>(size.pixels()).unwrap();
        let err = kernels
            .blur_rows(&per_thread, size, &src, &mut dst)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("run on CUDA's per-thread default stream"),
            "{err}"
        );
        let err = kernels
            .blur_rows(&stream, size, &theirs, &mut dst)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("`src` is ordered on CUDA's per-thread default stream"),
            "{err}"
        );
        let mut slices = FrameSlices::alloc(&stream, size).unwrap();
        let mut out = devarena_kernels::pipeline::FrameOutputs::new(size);
        let err = download_outputs(&per_thread, &slices.buffers(), &mut out).unwrap_err();
        assert!(
            err.to_string().contains("per-thread default stream"),
            "{err}"
        );
        slices.blurred = theirs;
        let err = download_outputs(&stream, &slices.buffers(), &mut out).unwrap_err();
        assert!(
            err.to_string()
                .contains("`blurred` is ordered on CUDA's per-thread default stream"),
            "{err}"
        );
        stream.synchronize().unwrap();
        per_thread.synchronize().unwrap();
    }

    #[derive(DeviceLayout)]
    struct Big {
        data: [u32; 1 << 24],
        #[layout(align = 4096)]
        flag: [u32; 1],
    }

    #[test]
    fn views_for_another_stream_are_ordered_both_ways() {
        let Some(stream) = gpu_stream() else { return };
        let other = stream.context().new_stream().unwrap();
        let mut arena = Arena::<Big, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        for round in 1..=4u8 {
            // 64 MiB queued on the arena's stream, then 64 MiB on the other stream: the second
            // must run after the first, and the download on the arena's stream after both.
            arena.views_mut().data.fill_bytes(round).unwrap();
            arena
                .views_mut_on(&other, |mut on| {
                    assert_eq!(on.data.stream().cu_stream(), other.cu_stream());
                    on.data.fill_bytes(round.wrapping_mul(16))?;
                    on.flag.fill_bytes(round)
                })
                .unwrap();
            let data = arena.views().data.to_vec().unwrap();
            let want = u32::from_ne_bytes([round.wrapping_mul(16); 4]);
            assert!(
                data.iter().all(|&x| x == want),
                "round {round}: bytes queued on the other stream were not all seen in order"
            );
            assert_eq!(
                arena.views().flag.to_vec().unwrap(),
                [u32::from_ne_bytes([round; 4])]
            );
        }
    }

    /// Making a stream waits for nothing: one made on another thread while a graph is being
    /// captured neither fails nor invalidates that capture (cudarc synchronizes the whole
    /// context when it makes the first stream of a `CudaContext`, which a capture refuses),
    /// and its `CudaContext` counts it (so a stream made there later needs no synchronize
    /// either).
    #[test]
    fn a_stream_made_during_another_threads_capture_leaves_it_alone() {
        use devarena_kernels::cudarc::driver::sys::{
            CUgraphInstantiate_flags, CUstreamCaptureMode,
        };
        let Some(stream) = gpu_stream() else { return };
        assert!(stream.context().is_in_multi_stream_mode());
        let mut arena = Arena::<Params, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        arena.views_mut().lut.fill_bytes(3).unwrap();
        let ordinal = stream.context().ordinal();
        let made = std::thread::spawn(move || {
            devarena::backend::cuda::cuda_stream(ordinal).map(|s| s.cu_stream() as usize)
        })
        .join()
        .unwrap();
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        let made = made.unwrap();
        assert_ne!(made, stream.cu_stream() as usize);
        let graph = graph.unwrap().expect("the capture recorded the memset");
        graph.launch().unwrap();
        assert_eq!(arena.views().lut.to_vec().unwrap(), vec![3u8; 300]);
    }

    /// A stream of another context of the same device (`cuCtxCreate`, not the primary
    /// context the arena lives in) is refused before the closure runs: the arena's addresses
    /// mean nothing in that context, and its stream could not be ordered with the arena's.
    #[test]
    fn views_for_a_stream_of_another_context_of_the_device_are_refused() {
        let Some(stream) = gpu_stream() else { return };
        let ordinal = stream.context().ordinal();
        let ctx = devarena::backend::cuda::CudaContext::new_non_primary(ordinal, 0).unwrap();
        assert!(!ctx.is_primary());
        assert_ne!(ctx.cu_ctx(), stream.context().cu_ctx());
        let foreign = ctx.new_stream().unwrap();
        let mut arena = Arena::<Big, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let mut ran = false;
        let error = arena
            .views_mut_on(&foreign, |_| {
                ran = true;
                Ok(())
            })
            .unwrap_err();
        assert!(
            !ran,
            "the closure ran with views for a stream of another context"
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!("another context of device {ordinal}"))
                && message.contains("Big"),
            "{message}"
        );
        // The arena is untouched and still works on its own stream and on a stream of its
        // own context.
        let own = stream.context().new_stream().unwrap();
        arena
            .views_mut_on(&own, |mut on| on.flag.fill_bytes(7))
            .unwrap();
        assert_eq!(
            arena.views().flag.to_vec().unwrap(),
            [u32::from_ne_bytes([7; 4])]
        );
    }

    /// Views for another stream live only inside the closure of `views_mut_on`, and the
    /// arena's stream waits for that stream when the closure returns: no guard exists that
    /// safe code could leak (`mem::forget`) to skip the wait. Without it a managed arena's
    /// host views, which wait only for the arena's own stream, would let the host read bytes a
    /// memset queued on the other stream has not written yet (and a stream-ordered arena
    /// would be freed with `cuMemFreeAsync` unordered after that memset). The other stream is
    /// held by a gate, opened 200 ms later from another thread, so the outcome does not depend
    /// on timing: the host must see every byte of the memset.
    #[test]
    fn host_views_wait_for_the_work_queued_in_views_mut_on() {
        let Some((_device, other, mut arena, gate)) = gated_arena() else {
            return;
        };
        // Queued behind the gate: the call returns with the memset still pending.
        arena
            .views_mut_on(&other, |mut on| on.data.fill_bytes(0x5a))
            .unwrap();
        let stale = stale_words_after_opening_later(&arena, gate);
        assert_eq!(
            stale, 0,
            "the host views were handed out before the memset queued on the other stream ran \
             ({stale} words not written yet)"
        );
    }

    /// The same when the closure panics after queueing its work: the wait is queued during
    /// the unwinding, before the panic reaches the caller.
    #[test]
    fn host_views_wait_for_the_work_queued_in_views_mut_on_when_it_panics() {
        let Some((_device, other, mut arena, gate)) = gated_arena() else {
            return;
        };
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| {
            arena.views_mut_on(&other, |mut on| -> Result<(), Error> {
                on.data.fill_bytes(0x5a)?; // queued behind the gate
                panic!("a closure that panics after queueing its work");
            })
        }));
        assert!(panicked.is_err(), "the closure's panic reaches the caller");
        let stale = stale_words_after_opening_later(&arena, gate);
        assert_eq!(
            stale, 0,
            "after a panic in the closure, the host views were handed out before the memset \
             queued on the other stream ran ({stale} words not written yet)"
        );
    }

    /// The device's lock, another stream of it, a zeroed managed arena, and a gate holding
    /// that stream.
    type Gated = (
        std::sync::MutexGuard<'static, ()>,
        std::sync::Arc<devarena::backend::cuda::CudaStream>,
        Arena<Big, ManagedBackend>,
        (super::gpu_common::StreamGate, std::thread::JoinHandle<()>),
    );

    fn gated_arena() -> Option<Gated> {
        let (device, stream) = super::gpu_common::gpu()?;
        let other = stream.context().new_stream().unwrap();
        let mut arena = Arena::<Big, _>::new_in(ManagedBackend::new(stream.clone())).unwrap();
        arena.host_views_mut().unwrap().data.fill(0);
        let gate = super::gpu_common::StreamGate::block(&other);
        // Opened 200 ms from now by a thread of its own (see `open_after`).
        let open_later = gate.open_after(Duration::from_millis(200));
        Some((device, other, arena, (gate, open_later)))
    }

    /// Takes the host views (which must wait for the gate, opened 200 ms after it closed) and
    /// counts the words of `data` not yet 0x5a5a5a5a.
    fn stale_words_after_opening_later(
        arena: &Arena<Big, ManagedBackend>,
        (_gate, open_later): (super::gpu_common::StreamGate, std::thread::JoinHandle<()>),
    ) -> usize {
        let host = arena.host_views().unwrap();
        let stale = host.data.iter().filter(|&&x| x != 0x5a5a_5a5a).count();
        open_later.join().unwrap();
        stale
    }
}

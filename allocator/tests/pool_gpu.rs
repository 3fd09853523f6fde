//! The pool on a CUDA device: device addresses inside the reserved region, kernels and copies
//! through `PoolSlice` views, stream ordering with real CUDA events, quotas, and the region
//! going back to the driver on drop. The tests that speak of one `cuMemAlloc` region ask for a
//! classic region; the others run on the default, growable one (`pool_vmm_gpu.rs` tests what is
//! its own).
//!
//! Without a CUDA driver or device each test prints `skipped: no CUDA device` and passes; with
//! `DEVARENA_REQUIRE_GPU=1` set they fail instead.

mod gpu_common;

#[cfg(not(feature = "cuda"))]
#[test]
fn device_pool_tests_need_the_cuda_feature() {
    gpu_common::skip_or_fail("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use devarena::backend::cuda::{
        LaunchConfig, PointerMemory, Ptx, PushKernelArg, mem_info, pointer_info,
    };
    use devarena::pool::cuda::stream_id;
    use devarena::pool::{PoolStats, RegionKind, Tracking};
    use devarena::{Error, Pool};

    use super::gpu_common::{StreamGate, gpu};

    const SCALE_ADD_PTX: &str = include_str!("kernels/scale_add.ptx");

    /// Work queued on `stream` now cannot finish before the stream held at `gate`: an event
    /// recorded there completes only once the gate opens (which this opens); `ran_ahead`
    /// says what it means when it does.
    fn assert_waits_at_gate(
        stream: &devarena::backend::cuda::CudaStream,
        gate: &StreamGate,
        ran_ahead: &str,
    ) {
        let marker = stream.record_event(None).unwrap();
        assert!(!marker.try_is_complete().unwrap(), "{ran_ahead}");
        gate.open();
        stream.synchronize().unwrap();
        assert!(marker.try_is_complete().unwrap());
    }

    /// Device views let safe code queue work on a slice's stream: only pools with their own
    /// CUDA stream runtime (which orders every reuse after that work) give them. A device pool
    /// without a stream runtime (every free reused at once, on any stream) and one with a
    /// runtime of another kind refuse them; a `Pool::cuda` pool gives them.
    #[test]
    fn device_views_need_the_pools_own_cuda_stream_runtime() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        use devarena::backend::cuda::{CudaBackend, CudaVirtualMemory};
        use devarena::pool::{ManualStreams, StreamId};
        let bare = Pool::builder(1 << 20)
            .build_in(CudaBackend::new(stream.clone()))
            .unwrap();
        let growable = Pool::builder(4 << 20)
            .build_mapped(CudaVirtualMemory::new(stream.clone()).unwrap())
            .unwrap();
        let manual = Pool::builder(1 << 20)
            .streams(std::sync::Arc::new(ManualStreams::new()), StreamId::DEFAULT)
            .build_in(CudaBackend::new(stream.clone()))
            .unwrap();
        let legacy = stream.context().default_stream();
        for (pool, why) in [
            (&bare, "has no stream runtime"),
            (&growable, "has no stream runtime"),
            (&manual, "other than `CudaStreams`"),
        ] {
            let mut s = pool.alloc_slice::<u32>(16).unwrap();
            for view_stream in [&stream, &legacy] {
                let err = s.device_view(view_stream).unwrap_err();
                assert!(err.to_string().contains(why), "{err}");
                let err = s.device_view_mut(view_stream).unwrap_err();
                assert!(err.to_string().contains("device views need"), "{err}");
            }
            drop(s);
            assert_eq!(pool.stats().live, 0);
        }
        let pool = Pool::cuda(stream.clone(), 1 << 20).unwrap();
        let mut s = pool.alloc_slice::<u32>(16).unwrap();
        s.device_view_mut(&stream)
            .unwrap()
            .upload(&[3; 16])
            .unwrap();
        assert_eq!(s.device_view(&stream).unwrap().to_vec().unwrap(), [3; 16]);
    }

    /// The default streams' handles name a stream of every context: a pool on the primary
    /// context's legacy default stream gives no view on another context's default stream of
    /// the same device, whose kernels cannot reach the pool's memory, and registers no stream
    /// of that context.
    #[test]
    fn device_views_refuse_a_stream_of_another_context_of_the_same_device() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        use devarena::backend::cuda::CudaContext;
        let ours = stream.context().clone();
        let legacy = ours.default_stream();
        let pool = Pool::cuda(legacy.clone(), 1 << 20).unwrap();
        let mut s = pool.alloc_slice::<u32>(16).unwrap();
        let other = CudaContext::new_non_primary(ours.ordinal(), 0).unwrap();
        let other_legacy = other.default_stream();
        assert_eq!(
            stream_id(&other_legacy),
            stream_id(&legacy),
            "one handle, two contexts"
        );
        let err = s.device_view(&other_legacy).unwrap_err();
        let want = format!("another context of device {}", ours.ordinal());
        assert!(err.to_string().contains(&want), "{err}");
        let err = s.device_view_mut(&other_legacy).unwrap_err();
        assert!(err.to_string().contains(&want), "{err}");
        let err = pool
            .register_stream(&other.new_stream().unwrap())
            .unwrap_err();
        assert!(err.to_string().contains(&want), "{err}");
        // The pool's own context still gives them.
        ours.bind_to_thread().unwrap();
        s.device_view_mut(&legacy)
            .unwrap()
            .upload(&[5; 16])
            .unwrap();
        assert_eq!(s.device_view(&legacy).unwrap().to_vec().unwrap(), [5; 16]);
        drop(s);
        assert_eq!(pool.stats().live, 0);
    }

    /// A pool whose stream runtime is of one context and whose memory is of another (here
    /// two contexts of one device) is refused at its build, before any memory is taken: the
    /// runtime would order the blocks' reuse and the region's teardown on streams that are
    /// not the memory's.
    #[test]
    fn a_pool_whose_runtime_and_memory_are_of_two_contexts_is_refused() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        use devarena::backend::cuda::{CudaBackend, CudaContext, CudaVirtualMemory};
        use devarena::pool::cuda::CudaStreams;
        let other = CudaContext::new_non_primary(stream.context().ordinal(), 0).unwrap();
        let theirs = other.new_stream().unwrap();
        let runtime = CudaStreams::new(other.clone());
        let home = runtime.register(&theirs).unwrap();
        let runtime: std::sync::Arc<dyn devarena::pool::StreamSync> = std::sync::Arc::new(runtime);
        let want = format!(
            "memory belongs to another context of device {}",
            stream.context().ordinal()
        );
        stream.context().bind_to_thread().unwrap();
        let backend = CudaBackend::new(stream.clone());
        let err = Pool::builder(1 << 20)
            .streams(runtime.clone(), home)
            .build_in(backend.clone())
            .unwrap_err();
        assert!(err.to_string().contains(&want), "{err}");
        assert_eq!(backend.stats().allocations, 0);
        let vm = CudaVirtualMemory::new(stream.clone()).unwrap();
        let err = Pool::builder(4 << 20)
            .streams(runtime, home)
            .build_mapped(vm)
            .unwrap_err();
        assert!(err.to_string().contains(&want), "{err}");
        // On one context, the same pieces build.
        let runtime = CudaStreams::new(stream.context().clone());
        let home = runtime.register(&stream).unwrap();
        let pool = Pool::builder(1 << 20)
            .streams(std::sync::Arc::new(runtime), home)
            .build_in(CudaBackend::new(stream.clone()))
            .unwrap();
        let a = pool.allocate(4096, 0).unwrap();
        pool.deallocate(a).unwrap();
    }

    fn exhausted(error: &Error) -> (&'static str, usize) {
        match error {
            Error::PoolExhausted { limit, pending, .. } => (limit, *pending),
            other => panic!("expected PoolExhausted, got {other:?}"),
        }
    }

    #[test]
    fn a_classic_device_pool_hands_out_addresses_inside_its_one_allocation() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        let capacity = 64 << 20;
        let pool = Pool::builder(capacity)
            .region(RegionKind::Classic)
            .build_cuda(stream.clone())
            .unwrap();
        assert_eq!(pool.backend_name(), "cuda");
        assert_eq!(pool.region_kind(), RegionKind::Classic);
        assert!(!pool.is_host());
        assert_eq!(pool.capacity(), capacity);
        assert_eq!(pool.home_stream(), stream_id(&stream));

        // The region is one cuMemAlloc allocation on device 0 that covers the whole capacity.
        let region = pointer_info(&stream, pool.base()).unwrap();
        println!("region: base {:#x}, {region:?}", pool.base());
        assert_eq!(region.memory_type, PointerMemory::Device);
        assert_eq!(region.device_ordinal, Some(0));
        assert!(region.range_start <= pool.base());
        assert!(pool.base() + capacity as u64 <= region.range_start + region.range_size as u64);

        let requests = [
            (1usize, 0usize),
            (1000, 512),
            (4096, 4096),
            (3 << 20, 256),
            (0, 0),
            (12345, 1024),
            (8 << 20, 2048),
        ];
        let mut addrs = Vec::new();
        for &(size, align) in &requests {
            let addr = pool.allocate(size, align).unwrap();
            assert!(pool.contains(addr), "{addr:#x} outside the region");
            assert!(addr + size as u64 <= pool.base() + capacity as u64);
            assert_eq!(
                addr % align.max(256) as u64,
                0,
                "{addr:#x} not aligned to {align}"
            );
            let info = pointer_info(&stream, addr).unwrap();
            assert_eq!(info.memory_type, PointerMemory::Device);
            assert_eq!(info.device_ordinal, Some(0));
            // Inside the very allocation the pool reserved, not a new one.
            assert_eq!(info.range_start, region.range_start);
            addrs.push(addr);
        }
        let mut sorted = addrs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            addrs.len(),
            "two allocations share an address"
        );
        assert_eq!(pool.stats().live, requests.len() as u64);
        for addr in addrs {
            pool.deallocate(addr).unwrap();
        }
        let stats = pool.stats();
        assert_eq!((stats.live, stats.in_use), (0, 0));
        assert_eq!(stats.largest_free, capacity);
    }

    #[test]
    fn a_kernel_and_copies_round_trip_through_pool_slice_views() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        let pool = Pool::builder(32 << 20)
            .name("kernels")
            .tracking(Tracking::Tags)
            .build_cuda(stream.clone())
            .unwrap();
        let n = (1 << 20) + 3;
        let input: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let mut x = pool.alloc_slice::<u32>(n).unwrap();
        let mut y = pool.alloc_slice::<u32>(n).unwrap();
        assert_eq!(x.addr() % 256, 0);
        x.device_view_mut(&stream).unwrap().upload(&input).unwrap();
        y.device_view_mut(&stream)
            .unwrap()
            .fill_bytes(0xAB)
            .unwrap();

        let module = stream
            .context()
            .load_module(Ptx::from_src(SCALE_ADD_PTX))
            .unwrap();
        let scale_add = module.load_function("scale_add_u32").unwrap();
        let (a, b, count) = (3u32, 7u32, n as u32);
        {
            let xv = x.device_view(&stream).unwrap();
            let mut yv = y.device_view_mut(&stream).unwrap();
            let mut launch = stream.launch_builder(&scale_add);
            launch.arg(&xv).arg(&mut yv).arg(&a).arg(&b).arg(&count);
            // SAFETY: the kernel reads `count` u32 from `xv` and writes `count` u32 to `yv`,
            // both views of exactly `n` elements; the argument types match its signature.
            unsafe { launch.launch(LaunchConfig::for_num_elems(count)) }.unwrap();
        }
        let out = y.device_view(&stream).unwrap().to_vec().unwrap();
        for (i, (&o, &v)) in out.iter().zip(&input).enumerate() {
            assert_eq!(o, v.wrapping_mul(a).wrapping_add(b), "element {i}");
        }
        // The input came through unchanged, and a sub-view reads the right elements.
        assert_eq!(x.device_view(&stream).unwrap().to_vec().unwrap(), input);
        let tail = x.device_view(&stream).unwrap();
        let tail = tail.slice(n - 3..).unwrap().to_vec().unwrap();
        assert_eq!(tail, input[n - 3..]);

        // A view is ordered on its slice's stream: another stream is refused with the numbers.
        let other = stream.context().new_stream().unwrap();
        let err = x.device_view(&other).unwrap_err();
        assert!(
            err.to_string().contains("was allocated for stream"),
            "{err}"
        );
        // A stream that is not registered never reaches the driver: an error, nothing changes.
        let live = pool.stats().live;
        let err = pool
            .own_client()
            .alloc_slice_on::<u32>(16, stream_id(&other))
            .unwrap_err();
        assert!(err.to_string().contains("is not registered"), "{err}");
        assert_eq!(pool.stats().live, live);
        // A slice allocated for the registered other stream gives views there.
        let other_id = pool.register_stream(&other).unwrap();
        assert_eq!(other_id, stream_id(&other));
        let mut z = pool
            .own_client()
            .alloc_slice_on::<u32>(16, other_id)
            .unwrap();
        z.device_view_mut(&other).unwrap().upload(&[5; 16]).unwrap();
        assert_eq!(z.device_view(&other).unwrap().to_vec().unwrap(), [5; 16]);
        drop(z);
        other.synchronize().unwrap();

        // A stream of another context of the same device (not the primary context the pool
        // lives in) is refused: the pool's addresses mean nothing there.
        let ordinal = stream.context().ordinal();
        let ctx = devarena::backend::cuda::CudaContext::new_non_primary(ordinal, 0).unwrap();
        let foreign = ctx.new_stream().unwrap();
        let live = pool.stats().live;
        let err = pool.register_stream(&foreign).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("another context of device {ordinal}")),
            "{err}"
        );
        let err = pool
            .own_client()
            .alloc_slice_on::<u32>(16, stream_id(&foreign))
            .unwrap_err();
        assert!(err.to_string().contains("is not registered"), "{err}");
        assert_eq!(pool.stats().live, live);

        // A host pool's slice has no device view.
        let host = Pool::host(1 << 20).unwrap();
        let h = host.alloc_slice::<u32>(4).unwrap();
        let err = h.device_view(&stream).unwrap_err();
        assert!(err.to_string().contains("`host` memory"), "{err}");

        drop((x, y));
        pool.reclaim().unwrap();
        assert_eq!(pool.stats().live, 0);
    }

    /// A classic device pool dropped while a block is parked behind the event of another
    /// stream, whose queued work (held at a gate) may still use it: the drop waits for that
    /// stream before the region goes back to the driver, whatever `cuMemFree` waits for.
    #[test]
    fn a_pool_dropped_with_a_block_parked_on_a_busy_stream_waits_for_that_stream() {
        let Some((_device, home)) = gpu() else { return };
        let other = home.context().new_stream().unwrap();
        // (No thread heaps: a heap of `other` would take the free on `other` at once.)
        let pool = Pool::builder(4 << 20)
            .region(RegionKind::Classic)
            .thread_heaps(0)
            .build_cuda(home.clone())
            .unwrap();
        let id = pool.register_stream(&other).unwrap();
        let gate = StreamGate::block(&other);
        let mut s = pool.own_client().alloc_slice_on::<u32>(1024, id).unwrap();
        s.device_view_mut(&other).unwrap().fill_bytes(7).unwrap();
        drop(s);
        assert_eq!(pool.stats().pending, 4096);
        let marker = other.record_event(None).unwrap();
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let opener = {
            let (gate, opened) = (gate.opener(), opened.clone());
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(200));
                opened.store(true, std::sync::atomic::Ordering::SeqCst);
                gate.open();
            })
        };
        drop(pool);
        assert!(
            opened.load(std::sync::atomic::Ordering::SeqCst),
            "the pool's region went back while the stream's gate was still shut"
        );
        assert!(marker.try_is_complete().unwrap());
        opener.join().unwrap();
    }

    #[test]
    fn a_block_freed_on_another_stream_is_reused_only_after_its_event() {
        let Some((_device, home)) = gpu() else { return };
        let other = home.context().new_stream().unwrap();
        let capacity = 4 << 20;
        let pool = Pool::cuda(home.clone(), capacity).unwrap();
        pool.register_stream(&other).unwrap();

        // `other` still has work queued (a host function held at a gate) when the block, of
        // the pool's index, is freed there: the event recorded at the free cannot complete.
        let gate = StreamGate::block(&other);
        let addr = pool.allocate(capacity, 0).unwrap();
        pool.deallocate_on(addr, stream_id(&other)).unwrap();
        let stats: PoolStats = pool.stats();
        assert_eq!((stats.live, stats.pending, stats.free), (0, capacity, 0));
        let err = pool.allocate(256, 0).unwrap_err();
        assert_eq!(exhausted(&err), ("capacity", capacity));
        assert!(
            err.to_string().contains("waiting for stream events"),
            "{err}"
        );
        assert_eq!(pool.reclaim().unwrap(), 0);

        // Once the stream has run past the free, the block comes back and is handed out again.
        gate.open();
        other.synchronize().unwrap();
        assert_eq!(pool.reclaim().unwrap(), capacity);
        assert_eq!(pool.stats().pending, 0);
        let again = pool.allocate(capacity, 0).unwrap();
        assert_eq!(again, addr);
        pool.deallocate(again).unwrap();
    }

    /// An error that cudarc recorded in the context object earlier (a failed call in some
    /// drop of the user's) is the user's: the pool's events and waits neither fail for it
    /// (which would set a block aside for good) nor clear it. The same run as above, with such
    /// an error stored before the free, before the look at its event, and before a view's
    /// copy, and still there at the end.
    #[test]
    fn an_error_cudarc_recorded_in_the_context_neither_fails_the_pool_nor_is_cleared() {
        let Some((_device, home)) = gpu() else { return };
        use cudarc::driver::DriverError;
        use cudarc::driver::sys::CUresult;
        let other = home.context().new_stream().unwrap();
        let capacity = 4 << 20;
        let pool = Pool::builder(capacity)
            .thread_heaps(0)
            .build_cuda(home.clone())
            .unwrap();
        pool.register_stream(&other).unwrap();
        let stored = || {
            home.context()
                .record_err::<()>(Err(DriverError(CUresult::CUDA_ERROR_INVALID_VALUE)));
        };
        let addr = pool.allocate(capacity, 0).unwrap();
        stored();
        pool.deallocate_on(addr, stream_id(&other)).unwrap();
        assert_eq!(pool.stats().pending, capacity);
        // (The driver's wait: cudarc's own would hand out, and clear, the stored error.)
        devarena::backend::cuda::synchronize_stream(&other).unwrap();
        stored();
        assert_eq!(pool.reclaim().unwrap(), capacity);
        let stats = pool.stats();
        assert_eq!(
            (stats.pending, stats.quarantined, stats.failures),
            (0, 0, 0)
        );
        let mut s = pool.alloc_slice::<u32>(16).unwrap();
        stored();
        s.device_view_mut(&home).unwrap().upload(&[9; 16]).unwrap();
        assert_eq!(s.device_view(&home).unwrap().to_vec().unwrap(), [9; 16]);
        drop(s);
        // Still the user's to see (once: cudarc hands it out and clears it).
        assert_eq!(
            home.context().check_err(),
            Err(DriverError(CUresult::CUDA_ERROR_INVALID_VALUE))
        );
        assert_eq!(home.context().check_err(), Ok(()));
    }

    #[test]
    fn a_home_stream_free_is_reused_at_once_and_other_streams_wait_for_it() {
        let Some((_device, home)) = gpu() else { return };
        let other = home.context().new_stream().unwrap();
        let capacity = 4 << 20;
        // The pool's own index (a heap for the other stream would reuse its free there at
        // once, with nothing parked: `a_heap_for_another_stream_…` tests that path).
        let pool = Pool::builder(capacity)
            .thread_heaps(0)
            .build_cuda(home.clone())
            .unwrap();
        pool.register_stream(&other).unwrap();

        // The home stream is busy, yet its own free is reusable at once: later work on the
        // home stream runs after the work that used the block.
        let gate = StreamGate::block(&home);
        let addr = pool.allocate(capacity, 0).unwrap();
        pool.deallocate(addr).unwrap();
        assert_eq!(pool.stats().pending, 0);
        let again = pool.allocate(capacity, 0).unwrap();
        assert_eq!(again, addr);
        pool.deallocate(again).unwrap();

        // Handing that block to another stream makes the other stream wait for the home
        // stream: work queued there now cannot finish before the home stream's.
        let for_other = pool.allocate_on(capacity, 0, stream_id(&other)).unwrap();
        assert_eq!(for_other, addr);
        assert_waits_at_gate(
            &other,
            &gate,
            "the other stream ran ahead of the home stream's free",
        );
        pool.deallocate_on(for_other, stream_id(&other)).unwrap();
        other.synchronize().unwrap();
        assert_eq!(pool.reclaim().unwrap(), capacity);
    }

    #[test]
    fn quotas_and_the_capacity_hold_on_a_device_pool() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        let pool = Pool::builder(8 << 20)
            .name("shared-gpu")
            .build_cuda(stream.clone())
            .unwrap();
        let model_a = pool.client("model-a", 4 << 20);
        let model_b = pool.client("model-b", 6 << 20);

        let mut weights = model_a.alloc_slice::<f32>(1 << 20).unwrap(); // 4 MiB: the quota
        let data: Vec<f32> = (0..1 << 20).map(|i| i as f32 * 0.5).collect();
        weights
            .device_view_mut(&stream)
            .unwrap()
            .upload(&data)
            .unwrap();

        let err = model_a.allocate(256, 0).unwrap_err();
        assert_eq!(exhausted(&err).0, "quota");
        let text = err.to_string();
        assert!(
            text.contains("model-a") && text.contains("4194304"),
            "{text}"
        );

        let err = model_b.allocate(5 << 20, 0).unwrap_err();
        assert_eq!(exhausted(&err).0, "capacity");
        assert!(err.to_string().contains("model-b"), "{err}");
        let err = pool.allocate(usize::MAX / 2, 0).unwrap_err();
        assert_eq!(exhausted(&err).0, "capacity");

        // Nothing already allocated was disturbed.
        assert_eq!(
            weights.device_view(&stream).unwrap().to_vec().unwrap(),
            data
        );
        let b = model_b.allocate(4 << 20, 0).unwrap();
        assert_eq!(pool.stats().in_use, 8 << 20);
        model_b.deallocate(b).unwrap();
        let stats = pool.client_stats();
        assert_eq!(stats[1].failures, 1);
        assert_eq!(stats[2].failures, 1);
    }

    #[test]
    fn footprint_dropping_the_last_handle_returns_a_classic_region_to_the_driver() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        const MIB: usize = 1 << 20;
        let capacity = 256 * MIB;
        stream.synchronize().unwrap();
        let (free_before, total) = mem_info(&stream).unwrap();
        println!(
            "free before: {} MiB of {} MiB",
            free_before / MIB,
            total / MIB
        );

        let pool = Pool::builder(capacity)
            .region(RegionKind::Classic)
            .build_cuda(stream.clone())
            .unwrap();
        let (free_with_pool, _) = mem_info(&stream).unwrap();
        assert!(
            free_before.saturating_sub(free_with_pool) >= capacity - 2 * MIB,
            "the pool's region was not reserved up front: free went from {free_before} to \
             {free_with_pool}"
        );
        // Sub-allocations come from the region: free device memory does not move.
        let mut slices: Vec<_> = (0..32)
            .map(|_| pool.alloc_slice::<u8>(4 * MIB).unwrap())
            .collect();
        for s in &mut slices {
            s.device_view_mut(&stream).unwrap().fill_bytes(1).unwrap();
        }
        stream.synchronize().unwrap();
        let (free_full, _) = mem_info(&stream).unwrap();
        assert!(free_full.abs_diff(free_with_pool) <= 2 * MIB);

        // A slice keeps the region alive after the pool handle is gone.
        let last = slices.pop().unwrap();
        drop(slices);
        drop(pool);
        let (free_slice_alive, _) = mem_info(&stream).unwrap();
        assert!(free_slice_alive.abs_diff(free_with_pool) <= 2 * MIB);
        drop(last);
        let (free_after, _) = mem_info(&stream).unwrap();
        println!(
            "free with pool: {} MiB, after drop: {} MiB",
            free_with_pool / MIB,
            free_after / MIB
        );
        assert!(
            free_after.abs_diff(free_before) <= 2 * MIB,
            "free device memory after the drop ({free_after}) is not within 2 MiB of before \
             ({free_before})"
        );
    }

    // `deliberate_*`: it provokes an out-of-memory error on purpose, which compute-sanitizer reports;
    // scripts/gpu-sanitize.sh skips it.
    #[test]
    fn deliberate_oom_a_classic_device_pool_larger_than_the_device_is_an_error() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        let (_, total) = mem_info(&stream).unwrap();
        let err = Pool::builder(total * 2)
            .region(RegionKind::Classic)
            .build_cuda(stream.clone())
            .unwrap_err();
        match &err {
            Error::OutOfMemory {
                backend, requested, ..
            } => {
                assert_eq!(*backend, "cuda");
                assert!(*requested >= total * 2);
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        // The device is still usable.
        let pool = Pool::cuda(stream, 1 << 20).unwrap();
        assert!(pool.allocate(1000, 0).is_ok());
    }

    /// A classic device pool of `capacity` as built by default (a thread gets a heap for a
    /// stream other than the home stream at its first request there, and then one for the
    /// home stream too), with a second stream registered.
    fn stream_heap_pool(
        home: &std::sync::Arc<devarena::backend::cuda::CudaStream>,
        capacity: usize,
    ) -> (
        Pool,
        std::sync::Arc<devarena::backend::cuda::CudaStream>,
        devarena::pool::StreamId,
    ) {
        let other = home.context().new_stream().unwrap();
        let pool = Pool::builder(capacity)
            .region(RegionKind::Classic)
            .log_leaks_on_drop(false)
            .build_cuda(home.clone())
            .unwrap();
        let id = pool.register_stream(&other).unwrap();
        (pool, other, id)
    }

    #[test]
    fn a_heap_for_another_stream_reuses_its_blocks_at_once_and_gives_them_back_in_order() {
        let Some((_device, home)) = gpu() else { return };
        let capacity = 4 << 20;
        let (pool, other, id) = stream_heap_pool(&home, capacity);
        std::thread::scope(|s| {
            s.spawn(|| {
                // `other` is busy (held at a gate), yet its own frees are reusable on it at
                // once: later work there runs after the work that used the block.
                let gate = StreamGate::block(&other);
                let a = pool.allocate_on(1 << 20, 0, id).unwrap();
                pool.deallocate_on(a, id).unwrap();
                assert_eq!(pool.allocate_on(1 << 20, 0, id).unwrap(), a);
                pool.deallocate_on(a, id).unwrap();
                assert_eq!(pool.thread_heaps(), 1);
                // Statistics take nothing back: the heap keeps its span, free for `other`, and
                // nothing is parked.
                let stats = pool.stats();
                assert_eq!((stats.in_use, stats.pending, stats.free), (0, 0, capacity));
                assert_eq!(pool.thread_heaps(), 1);
                // A request that needs them: the home stream waits for `other` (work queued
                // on it now cannot finish before `other`'s), and the pool takes them.
                // (The thread's new home-stream heap finds no room for a span in a pool with
                // nothing free: it steps aside, and the pool's index serves the home stream.)
                let all = pool.allocate(capacity, 0).unwrap();
                assert_eq!(pool.stats().pending, 0);
                assert_eq!(pool.thread_heaps(), 1, "home's heap stepped aside");
                assert_waits_at_gate(
                    &home,
                    &gate,
                    "the home stream ran ahead of the other stream's frees",
                );
                pool.deallocate(all).unwrap();
                // The per-thread default stream is another stream on each thread: no heap.
                let per_thread = devarena::pool::StreamId(2);
                let b = pool.allocate_on(4096, 0, per_thread).unwrap();
                assert_eq!(pool.thread_heaps(), 1, "the heap for `other` only");
                pool.deallocate_on(b, per_thread).unwrap();
                assert_eq!(
                    pool.stats().pending,
                    4096,
                    "parked until that stream is done"
                );
                home.context().synchronize().unwrap();
                assert_eq!(pool.reclaim().unwrap(), 4096);
            });
        });
    }

    #[test]
    fn a_refusal_makes_the_home_stream_wait_for_a_heap_of_another_stream() {
        let Some((_device, home)) = gpu() else { return };
        let capacity = 4 << 20;
        let (pool, other, id) = stream_heap_pool(&home, capacity);
        let gate = StreamGate::block(&other);
        let (ready, is_ready) = std::sync::mpsc::channel();
        let (finish, finished) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let pool = &pool;
            s.spawn(move || {
                let a = pool.allocate_on(1 << 20, 0, id).unwrap();
                pool.deallocate_on(a, id).unwrap();
                ready.send(()).unwrap();
                finished.recv().unwrap();
            });
            is_ready.recv().unwrap();
            // Only with the other stream's heap's blocks: the pool makes the home stream wait
            // for `other` and takes them. Work queued on the home stream now cannot finish
            // before `other`'s.
            let all = pool.allocate(capacity, 0).unwrap();
            assert_waits_at_gate(
                &home,
                &gate,
                "the home stream ran ahead of the other stream's frees",
            );
            pool.deallocate(all).unwrap();
            finish.send(()).unwrap();
        });
    }

    #[test]
    fn four_threads_on_their_own_streams_fill_and_check_their_slices() {
        // 3,000 operations on each of four threads, each on a stream of its own: slices of up
        // to 256 KiB filled with the thread's byte on its stream, checked now and then, dropped
        // (freed on their stream); statistics now and then lock every heap. A block
        // handed to a stream while another still wrote it would show another thread's byte.
        let Some((_device, home)) = gpu() else { return };
        let pool = Pool::builder(64 << 20)
            .region(RegionKind::Classic)
            .log_leaks_on_drop(false)
            .build_cuda(home.clone())
            .unwrap();
        let streams: Vec<_> = (0..4)
            .map(|_| {
                let stream = home.context().new_stream().unwrap();
                let id = pool.register_stream(&stream).unwrap();
                (stream, id)
            })
            .collect();
        std::thread::scope(|s| {
            for (t, (stream, id)) in streams.iter().enumerate() {
                let pool = &pool;
                s.spawn(move || {
                    stream.context().bind_to_thread().unwrap();
                    let mark = 0x10 + t as u8;
                    let mut x = 0x9E37_79B9u64 ^ t as u64;
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let mut live: Vec<devarena::pool::PoolSlice<u8>> = Vec::new();
                    for op in 0..3000u64 {
                        if live.len() < 16 && next() % 3 != 0 {
                            let len = 1 + (next() % (256 << 10)) as usize;
                            let mut slice =
                                pool.own_client().alloc_slice_on::<u8>(len, *id).unwrap();
                            slice
                                .device_view_mut(stream)
                                .unwrap()
                                .fill_bytes(mark)
                                .unwrap();
                            live.push(slice);
                        } else if !live.is_empty() {
                            let i = (next() % live.len() as u64) as usize;
                            drop(live.swap_remove(i));
                        }
                        if op % 64 == 0 && !live.is_empty() {
                            let i = (next() % live.len() as u64) as usize;
                            let bytes = live[i].device_view(stream).unwrap().to_vec().unwrap();
                            assert!(bytes.iter().all(|&b| b == mark), "thread {t}, op {op}");
                        }
                        if op % 500 == 0 {
                            let _ = pool.stats();
                        }
                    }
                    for slice in &live {
                        let bytes = slice.device_view(stream).unwrap().to_vec().unwrap();
                        assert!(bytes.iter().all(|&b| b == mark), "thread {t}");
                    }
                });
            }
        });
        // The threads' heaps go back in their thread-local destructors, which may run after
        // the scope has seen the threads finish: wait for them before the final counts.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while pool.thread_heaps() > 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        for (stream, _) in &streams {
            stream.synchronize().unwrap();
        }
        pool.reclaim().unwrap();
        let stats = pool.stats();
        assert_eq!((stats.in_use, stats.pending), (0, 0));
        assert_eq!(stats.allocations, stats.frees);
    }
}

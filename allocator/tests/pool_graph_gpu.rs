//! Pools in CUDA graphs on a device (`Pool::capture`, `PoolGraph`): a graph whose temporaries
//! come from the pool replays a thousand times with correct results while another thread
//! allocates, writes, checks and frees around it and never gets the graph's bytes; the pool
//! grows (maps device memory) in the middle of the capture; a capture on the home stream; a
//! free or an ordinary allocation that would need the capturing stream is refused and the
//! capture survives; a failed capture gives its blocks back. The same rules are tested on the
//! host with `ManualStreams` in `pool_graph.rs`. The PyTorch library's pattern (home on the
//! legacy default stream, a global-mode capture on a non-blocking stream, allocations from the
//! capturing thread and another one) keeps the capture valid with both region kinds, and the
//! capture status query sees a capture that another thread's `cuMemAlloc` invalidated.
//!
//! Without a CUDA driver or device each test prints `skipped: no CUDA device` and passes; with
//! `DEVARENA_REQUIRE_GPU=1` set they fail instead.

mod gpu_common;

#[cfg(not(feature = "cuda"))]
#[test]
fn pool_graph_tests_need_the_cuda_feature() {
    gpu_common::skip_or_fail("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use devarena::backend::cuda::event::RecordedEvent;
    use devarena::backend::cuda::{
        CaptureStatus, CudaFunction, CudaStream, DeviceView, DeviceViewMut, LaunchConfig, Ptx,
        PushKernelArg, capture_status_raw, default_stream, driver_error, is_capturing,
    };
    use devarena::pool::cuda::stream_id;
    use devarena::pool::{AllocRequest, RegionKind};
    use devarena::{Error, Pool};

    use super::gpu_common::{StreamGate, gpu};

    const SCALE_ADD_PTX: &str = include_str!("kernels/scale_add.ptx");

    /// Elements of the graph's input and output (4 MiB of u32).
    const N: usize = 1 << 20;
    /// Elements of each temporary of the large graph (16 MiB, of which the kernels use `N`):
    /// more than the pool has mapped and free when the capture begins, so it maps memory in
    /// the middle of the capture.
    const TEMP: usize = 4 * N;

    fn scale_add(stream: &Arc<CudaStream>) -> CudaFunction {
        let module = stream
            .context()
            .load_module(Ptx::from_src(SCALE_ADD_PTX))
            .unwrap();
        module.load_function("scale_add_u32").unwrap()
    }

    /// Queues `y = a * x + b` on `stream`.
    fn launch(
        f: &CudaFunction,
        stream: &Arc<CudaStream>,
        x: &DeviceView<'_, u32>,
        y: &mut DeviceViewMut<'_, u32>,
        (a, b): (u32, u32),
    ) -> Result<(), Error> {
        let n = x.len().min(y.len()) as u32;
        let mut args = stream.launch_builder(f);
        args.arg(x).arg(y).arg(&a).arg(&b).arg(&n);
        // SAFETY: `scale_add_u32(const u32*, u32*, u32, u32, u32)` reads `n` elements of `x` and
        // writes `n` of `y`; both views hold at least `n` elements and are ordered on `stream`.
        unsafe { args.launch(LaunchConfig::for_num_elems(n)) }
            .map(drop)
            .map_err(|e| driver_error("cuLaunchKernel", e))
    }

    /// The input of replay `r`.
    fn input(r: u32) -> Vec<u32> {
        (0..N as u32)
            .map(|i| {
                i.wrapping_mul(2_654_435_761)
                    .wrapping_add(r.wrapping_mul(40_503))
            })
            .collect()
    }

    /// What the captured chain of three kernels makes of `x`.
    fn expected(x: u32) -> u32 {
        x.wrapping_mul(3)
            .wrapping_add(1)
            .wrapping_mul(5)
            .wrapping_add(7)
            .wrapping_mul(9)
            .wrapping_add(11)
    }

    fn overlaps((a, a_len): (u64, u64), (b, b_len): (u64, u64)) -> bool {
        a < b + b_len && b < a + a_len
    }

    /// What the thread that allocates around the graph saw.
    #[derive(Debug, Default)]
    struct Around {
        rounds: u64,
        checked: u64,
        overlaps: Vec<u64>,
        corrupted: Vec<String>,
    }

    /// Until `stop`: allocates slices of varied sizes on the home stream (and now and then on
    /// `other`), fills each with a pattern of its own, reads patterns back, frees; records any
    /// block that overlaps the graph's temporaries and any pattern that changed.
    fn allocate_around(
        pool: &Pool,
        home: &Arc<CudaStream>,
        other: &Arc<CudaStream>,
        graph_blocks: &[(u64, u64)],
        stop: &AtomicBool,
    ) -> Around {
        let other_id = stream_id(other);
        let mut around = Around::default();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut live = std::collections::VecDeque::new();
        while !stop.load(Ordering::Relaxed) || around.rounds < 50 {
            around.rounds += 1;
            let len = 64 + (next() % (256 << 10)) as usize;
            let on_other = next() % 4 == 0;
            let (slice, stream) = if on_other {
                (
                    pool.own_client().alloc_slice_on::<u32>(len, other_id),
                    other,
                )
            } else {
                (pool.alloc_slice::<u32>(len), home)
            };
            let mut slice = slice.unwrap();
            let bytes = (len * 4) as u64;
            if graph_blocks
                .iter()
                .any(|&b| overlaps((slice.addr(), bytes), b))
            {
                around.overlaps.push(slice.addr());
            }
            let pattern = (next() as u32) | 1;
            let data: Vec<u32> = (0..len as u32).map(|i| i ^ pattern).collect();
            slice
                .device_view_mut(stream)
                .unwrap()
                .upload(&data)
                .unwrap();
            live.push_back((slice, stream, pattern));
            if live.len() > 8 {
                let (slice, stream, pattern) = live.pop_front().unwrap();
                let got = slice.device_view(stream).unwrap().to_vec().unwrap();
                around.checked += 1;
                if let Some(i) = (0..got.len()).find(|&i| got[i] != i as u32 ^ pattern) {
                    around.corrupted.push(format!(
                        "block {:#x} ({} elements): element {i} is {:#x}, wrote {:#x}",
                        slice.addr(),
                        got.len(),
                        got[i],
                        i as u32 ^ pattern
                    ));
                }
            }
        }
        around
    }

    #[test]
    fn a_graph_with_pool_temporaries_replays_a_thousand_times_while_other_code_allocates_around_it()
    {
        let Some((_device, home)) = gpu() else {
            return;
        };
        let f = scale_add(&home);
        let pool = Pool::builder(256 << 20)
            .name("graph-temporaries")
            .build_cuda(home.clone())
            .unwrap();
        let s = home.context().new_stream().unwrap();
        let other = home.context().new_stream().unwrap();
        let sid = pool.register_stream(&s).unwrap();
        pool.register_stream(&other).unwrap();
        // The graph's input and output: the caller's, allocated before the capture and kept
        // alive across it.
        let mut x = pool.own_client().alloc_slice_on::<u32>(N, sid).unwrap();
        let mut y = pool.own_client().alloc_slice_on::<u32>(N, sid).unwrap();
        // A free on the home stream just before: the capture's allocations wait for the home
        // stream on the host instead of making the capturing stream wait.
        pool.deallocate(pool.allocate(1 << 20, 0).unwrap()).unwrap();

        let stop = AtomicBool::new(false);
        let mut graph_blocks = Vec::new();
        std::thread::scope(|scope| {
            // Other code allocates, writes and frees from the same pool all along, on the home
            // stream and another: during the capture and every replay.
            let around = {
                let (pool, home, other, stop) = (&pool, &home, &other, &stop);
                let blocks = std::sync::Mutex::new(Vec::<(u64, u64)>::new());
                let blocks = Arc::new(blocks);
                let seen = blocks.clone();
                let handle = scope.spawn(move || {
                    // Starts before the capture; learns the graph's blocks once it exists.
                    let mut around = Around::default();
                    loop {
                        let known = seen.lock().unwrap().clone();
                        if !known.is_empty() {
                            let later = allocate_around(pool, home, other, &known, stop);
                            around.rounds += later.rounds;
                            around.checked += later.checked;
                            around.overlaps.extend(later.overlaps);
                            around.corrupted.extend(later.corrupted);
                            return around;
                        }
                        let during =
                            allocate_around(pool, home, other, &[], &AtomicBool::new(true));
                        around.rounds += during.rounds;
                        around.checked += during.checked;
                        around.corrupted.extend(during.corrupted);
                    }
                });
                (handle, blocks)
            };

            let maps_before = pool.stats().maps;
            // SAFETY: it reaches the graph's blocks, and slices freed in stream order after it.
            let graph = unsafe {
                pool.capture(&s, |c| {
                    let mut t1 = c.alloc_slice::<u32>(TEMP)?;
                    let mut t2 = c.alloc_slice::<u32>(TEMP)?;
                    let st = c.stream();
                    launch(
                        &f,
                        st,
                        &x.device_view(st)?,
                        &mut t1.device_view_mut(st)?,
                        (3, 1),
                    )?;
                    // The first `N` elements of `t1`: what the first kernel wrote (reading
                    // the rest would read memory nothing initialized).
                    launch(
                        &f,
                        st,
                        &t1.device_view(st)?.slice(..N)?,
                        &mut t2.device_view_mut(st)?,
                        (5, 7),
                    )?;
                    launch(
                        &f,
                        st,
                        &t2.device_view(st)?,
                        &mut y.device_view_mut(st)?,
                        (9, 11),
                    )?;
                    graph_blocks.push((t1.addr(), (TEMP * 4) as u64));
                    graph_blocks.push((t2.addr(), (TEMP * 4) as u64));
                    assert!(is_capturing(st)?, "recorded, not run");
                    Ok(())
                    // `t1` and `t2` are dropped here: freed on the capturing stream, held.
                })
            }
            .unwrap();
            let stats = pool.stats();
            println!(
                "captured {} nodes; the pool mapped {} chunks during the capture; {:?}",
                graph.nodes(),
                stats.maps - maps_before,
                graph.stats()
            );
            assert_eq!(graph.nodes(), 3);
            assert!(
                stats.maps > maps_before,
                "the capture's temporaries needed new device memory, mapped mid-capture: {stats:?}"
            );
            let g = graph.stats();
            assert_eq!((g.allocations, g.live, g.held), (2, 0, 2));
            assert_eq!(g.held_bytes, 2 * TEMP * 4);
            assert!(stats.pending >= 2 * TEMP * 4);
            assert!(!is_capturing(&s).unwrap());
            *around.1.lock().unwrap() = graph_blocks.clone();

            let mut out = vec![0u32; N];
            for r in 0..1000 {
                let data = input(r);
                x.device_view_mut(&s).unwrap().upload(&data).unwrap();
                graph.launch().unwrap();
                y.device_view(&s).unwrap().download(&mut out).unwrap();
                if let Some(i) = (0..N).find(|&i| out[i] != expected(data[i])) {
                    panic!(
                        "replay {r}: element {i} is {:#x}, expected {:#x}",
                        out[i],
                        expected(data[i])
                    );
                }
            }
            // Back-to-back replays, read once.
            for _ in 0..50 {
                graph.launch().unwrap();
            }
            graph.synchronize().unwrap();
            stop.store(true, Ordering::Relaxed);
            let around = around.0.join().unwrap();
            println!(
                "other code around the graph: {} allocations, {} checked, overlaps {:?}",
                around.rounds, around.checked, around.overlaps
            );
            assert!(around.rounds >= 100, "{around:?}");
            assert!(around.overlaps.is_empty(), "{around:?}");
            assert!(around.corrupted.is_empty(), "{around:?}");

            // Dropped: the temporaries go back once the replays are done.
            drop(graph);
        });
        s.synchronize().unwrap();
        other.synchronize().unwrap();
        home.synchronize().unwrap();
        pool.reclaim().unwrap();
        let stats = pool.stats();
        assert_eq!((stats.pending, stats.quarantined), (0, 0), "{stats:?}");
        assert_eq!(stats.live, 2, "x and y");
        drop((x, y));
        // The temporaries' bytes are allocatable again.
        let again = pool.own_client().alloc_slice_on::<u32>(N, sid).unwrap();
        assert!(pool.contains(again.addr()));
    }

    #[test]
    fn allocate_for_capture_serves_a_global_capture_as_pytorch_asks_for_it() {
        let Some((_device, s)) = gpu() else {
            return;
        };
        // As the PyTorch library does it: the pool's home is the legacy default stream, the
        // capture runs in global mode on a non-blocking stream begun by someone else, and the
        // allocation in the middle of it grows the pool.
        let legacy = default_stream(0).unwrap();
        let pool = Pool::builder(512 << 20)
            .name("as-pytorch")
            .build_cuda(legacy)
            .unwrap();
        let sid = pool.register_stream(&s).unwrap();
        let other = s.context().new_stream().unwrap();
        let oid = pool.register_stream(&other).unwrap();
        // Before the capture: a free on the home stream (the host waits for it mid-capture)
        // and one on another stream (an event the pool queries mid-capture).
        pool.deallocate(pool.allocate(8 << 20, 0).unwrap()).unwrap();
        let b = pool.allocate_on(4 << 20, 0, oid).unwrap();
        pool.deallocate_on(b, oid).unwrap();
        other.synchronize().unwrap();
        let maps = pool.stats().maps;
        let len = 64 << 20;

        // Global mode, as `torch.cuda.graph` captures by default.
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .unwrap();
        let recorded = (|| {
            let g = pool.allocate_for_capture(AllocRequest::new(len, 512).on(sid))?;
            // SAFETY: `g` is a live allocation of `len` bytes of the pool on `s`'s device, and
            // this view is the only access to it while it lives.
            let mut view = unsafe { DeviceViewMut::<u8>::from_raw(g, len, &s) };
            view.fill_bytes(0x5A)?; // recorded, not run
            Ok::<u64, Error>(g)
        })();
        // Whatever happened, the capture ends here; it must not have been invalidated.
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        let ended = graph
            .as_ref()
            .map(|g| g.is_some())
            .map_err(|e| driver_error("cuStreamEndCapture", *e));
        println!("allocation during a global capture: {recorded:?}; a graph came out: {ended:?}");
        let g = recorded.unwrap();
        assert!(
            matches!(ended, Ok(true)),
            "the capture survived the pool's calls: {ended:?}"
        );
        let graph = graph.unwrap().unwrap();
        assert!(!is_capturing(&s).unwrap());
        let stats = pool.stats();
        assert!(stats.maps > maps, "the pool grew mid-capture: {stats:?}");
        graph.launch().unwrap();
        s.synchronize().unwrap();
        // SAFETY: as above; the replay is done (the stream was synchronized).
        let bytes = unsafe { DeviceView::<u8>::from_raw(g, len, &s) }
            .to_vec()
            .unwrap();
        assert!(bytes.iter().all(|&b| b == 0x5A));
        drop(graph);
        pool.deallocate_on(g, sid).unwrap();
    }

    /// The capture status of `s` (`cuStreamGetCaptureInfo`).
    fn status(s: &Arc<CudaStream>) -> CaptureStatus {
        // SAFETY: `s` is a live stream of its context.
        unsafe { capture_status_raw(s.context(), s.cu_stream() as u64) }.unwrap()
    }

    #[test]
    fn the_torch_library_pattern_keeps_a_global_capture_valid_with_both_region_kinds() {
        let Some((_device, s)) = gpu() else {
            return;
        };
        for kind in [RegionKind::Classic, RegionKind::Growable] {
            // As `torch_allocator` is used by `torch.cuda.graph`: home on the legacy default
            // stream, segments for a global-mode capture on a non-blocking stream, asked for by
            // the capturing thread and by a second thread (autograd's device thread runs
            // backward), each after a home-stream free (the host waits for the home stream)
            // and with a block parked on the capturing stream (its event is queried). No
            // relaxed mode around the calls: the pool must keep the capture valid on its own.
            let legacy = default_stream(0).unwrap();
            let pool = Pool::builder(512 << 20)
                .name("torch-pattern")
                .region(kind)
                .reuse(0, 0)
                .build_cuda(legacy)
                .unwrap();
            let sid = pool.register_stream(&s).unwrap();
            let parked = pool.allocate_on(2 << 20, 512, sid).unwrap();
            pool.deallocate_on(parked, sid).unwrap();
            pool.deallocate(pool.allocate(8 << 20, 0).unwrap()).unwrap();
            s.synchronize().unwrap();
            let len = 24 << 20;

            s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
                .unwrap();
            let id = match status(&s) {
                CaptureStatus::Active { id } => id,
                other => panic!("{kind:?}: the capture began: {other}"),
            };
            let first = pool.allocate_for_capture(AllocRequest::new(len, 512).on(sid));
            let after_first = status(&s);
            // A home-stream free in between: the next capture allocation waits for it again.
            let home_free = pool
                .allocate(1 << 20, 0)
                .and_then(|a| pool.deallocate(a).map(|()| a));
            let second = std::thread::scope(|t| {
                t.spawn(|| pool.allocate_for_capture(AllocRequest::new(len, 512).on(sid)))
                    .join()
                    .unwrap()
            });
            let after_second = status(&s);
            let recorded = (|| {
                for g in [first.clone()?, second.clone()?] {
                    // SAFETY: `g` is a live allocation of `len` bytes of the pool on `s`'s
                    // device; this view is the only access to it while it lives.
                    let mut view = unsafe { DeviceViewMut::<u8>::from_raw(g, len, &s) };
                    view.fill_bytes(0x3C)?; // recorded, not run
                }
                Ok::<(), Error>(())
            })();
            let graph = s.end_capture(CUgraphInstantiate_flags(0));
            let ended = graph
                .as_ref()
                .map(|g| g.is_some())
                .map_err(|e| driver_error("cuStreamEndCapture", *e));
            println!(
                "{kind:?}: capture #{id}: first {first:?} -> {after_first}; home free \
                 {home_free:?}; second (other thread) {second:?} -> {after_second}; recorded \
                 {recorded:?}; a graph came out: {ended:?}; {}",
                pool.stats()
            );
            assert_eq!(after_first, CaptureStatus::Active { id }, "{kind:?}");
            assert_eq!(after_second, CaptureStatus::Active { id }, "{kind:?}");
            let (first, second) = (first.unwrap(), second.unwrap());
            recorded.unwrap();
            home_free.unwrap();
            assert!(matches!(ended, Ok(true)), "{kind:?}: {ended:?}");
            assert_eq!(status(&s), CaptureStatus::None);
            let graph = graph.unwrap().unwrap();
            graph.launch().unwrap();
            s.synchronize().unwrap();
            for g in [first, second] {
                // SAFETY: as above; the replay is done (the stream was synchronized).
                let bytes = unsafe { DeviceView::<u8>::from_raw(g, len, &s) }
                    .to_vec()
                    .unwrap();
                assert!(bytes.iter().all(|&b| b == 0x3C), "{kind:?}");
            }
            drop(graph);
            pool.deallocate_on(first, sid).unwrap();
            pool.deallocate_on(second, sid).unwrap();
        }
    }

    #[test]
    fn deliberate_api_error_a_cumemalloc_on_another_thread_during_a_global_capture_shows_in_its_status()
     {
        let Some((_device, s)) = gpu() else {
            return;
        };
        // What a library that lazily makes a handle on a thread of its own during someone's
        // global capture does (cuBLAS or cuDNN on autograd's device thread, in PyTorch): the
        // call is refused, and the capture status query sees what became of the capture.
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .unwrap();
        let before = status(&s);
        let ctx = s.context().clone();
        let refused = std::thread::spawn(move || {
            ctx.bind_to_thread().unwrap();
            // SAFETY: a plain allocation, freed below if it was made.
            unsafe { cudarc::driver::result::malloc_sync(1 << 20) }
        })
        .join()
        .unwrap();
        let after = status(&s);
        let ended = s
            .end_capture(CUgraphInstantiate_flags(0))
            .map(|g| g.is_some())
            .map_err(|e| driver_error("cuStreamEndCapture", e));
        println!(
            "cuMemAlloc on another thread during a global capture: {refused:?}; status {before} \
             -> {after}; end: {ended:?}"
        );
        assert!(matches!(before, CaptureStatus::Active { .. }), "{before}");
        let e = refused.expect_err("the driver refuses cuMemAlloc during a global capture");
        let name = driver_error("cuMemAlloc", e).to_string();
        assert!(name.contains("CUDA_ERROR_STREAM_CAPTURE"), "{name}");
        match after {
            CaptureStatus::Invalidated { .. } => assert!(ended.is_err(), "{ended:?}"),
            CaptureStatus::Active { .. } => assert!(ended.is_ok(), "{ended:?}"),
            CaptureStatus::None => panic!("the capture was still open"),
        }
        assert!(!is_capturing(&s).unwrap());
    }

    #[test]
    fn a_graph_captured_on_the_home_stream_holds_its_temporaries() {
        let Some((_device, home)) = gpu() else {
            return;
        };
        let f = scale_add(&home);
        let pool = Pool::cuda(home.clone(), 64 << 20).unwrap();
        let mut x = pool.alloc_slice::<u32>(N).unwrap();
        let mut y = pool.alloc_slice::<u32>(N).unwrap();
        let mut temp = 0;
        // SAFETY: it reaches the graph's blocks, and slices freed in stream order after it.
        let graph = unsafe {
            pool.capture(&home, |c| {
                let mut t = c.alloc_slice::<u32>(N)?;
                temp = t.addr();
                let st = c.stream();
                launch(
                    &f,
                    st,
                    &x.device_view(st)?,
                    &mut t.device_view_mut(st)?,
                    (3, 1),
                )?;
                launch(
                    &f,
                    st,
                    &t.device_view(st)?,
                    &mut y.device_view_mut(st)?,
                    (5, 7),
                )
            })
        }
        .unwrap();
        // The temporary was freed on the home stream, where frees are reusable at once: held.
        let later = pool.alloc_slice::<u32>(N).unwrap();
        assert_ne!(later.addr(), temp);
        let mut out = vec![0u32; N];
        for r in 0..100 {
            let data = input(r);
            x.device_view_mut(&home).unwrap().upload(&data).unwrap();
            graph.launch().unwrap();
            y.device_view(&home).unwrap().download(&mut out).unwrap();
            let want = |v: u32| {
                v.wrapping_mul(3)
                    .wrapping_add(1)
                    .wrapping_mul(5)
                    .wrapping_add(7)
            };
            assert!((0..N).all(|i| out[i] == want(data[i])), "replay {r}");
        }
        drop(graph);
        drop(later);
        home.synchronize().unwrap();
        pool.reclaim().unwrap();
        assert_eq!(pool.stats().pending, 0);
    }

    #[test]
    fn a_graph_dropped_with_a_replay_still_queued_keeps_its_blocks_until_the_replay_is_done() {
        let Some((_device, home)) = gpu() else {
            return;
        };
        let pool = Pool::cuda(home.clone(), 64 << 20).unwrap();
        let s = home.context().new_stream().unwrap();
        // SAFETY: it reaches the graph's blocks, and slices freed in stream order after it.
        let graph = unsafe {
            pool.capture(&s, |c| {
                let mut t = c.alloc_slice::<u32>(N)?;
                t.device_view_mut(c.stream())?.fill_bytes(1)
            })
        }
        .unwrap();
        // A replay queued behind work that cannot finish yet, then the graph dropped.
        let gate = StreamGate::block(&s);
        graph.launch().unwrap();
        drop(graph);
        assert_eq!(pool.reclaim().unwrap(), 0, "the replay has not run");
        assert_eq!(pool.stats().pending, N * 4);
        gate.open();
        s.synchronize().unwrap();
        assert_eq!(pool.reclaim().unwrap(), N * 4);
        assert_eq!(pool.stats().pending, 0);
    }

    #[test]
    fn deliberate_api_error_calls_that_need_the_capturing_stream_are_refused_and_the_capture_survives()
     {
        let Some((_device, home)) = gpu() else {
            return;
        };
        // As built by default: the requests on `sid` below get this thread a heap for it, which
        // the capture's reservation gives back before the capture begins (a heap would reuse a
        // free on its stream at once, without asking whether it captures).
        let pool = Pool::cuda(home.clone(), 64 << 20).unwrap();
        let s = home.context().new_stream().unwrap();
        let sid = pool.register_stream(&s).unwrap();
        let outside = pool.allocate_on(4096, 0, sid).unwrap();
        let mut y = pool.own_client().alloc_slice_on::<u32>(1024, sid).unwrap();
        assert_eq!(pool.thread_heaps(), 1);
        // SAFETY: it reaches the graph's blocks, and slices freed in stream order after it.
        let graph = unsafe {
            pool.capture(&s, |c| {
                // A block that is not the graph's, freed on the capturing stream: its event
                // would be recorded into the graph. Refused; it stays allocated.
                let e = pool.deallocate_on(outside, sid).unwrap_err();
                println!("free on the capturing stream: {e}");
                assert!(e.to_string().contains("is capturing"), "{e}");
                // An ordinary allocation for the capturing stream after a home-stream free
                // would make it wait for the home stream. Refused; nothing changes.
                pool.deallocate(pool.allocate(256, 0)?)?;
                let e = pool.allocate_on(256, 0, sid).unwrap_err();
                println!("ordinary allocation for the capturing stream: {e}");
                assert!(e.to_string().contains("is capturing"), "{e}");
                // The capture carries on, and no heap came back for its stream.
                assert!(is_capturing(c.stream())?);
                assert_eq!(pool.thread_heaps(), 0);
                y.device_view_mut(c.stream())?.fill_bytes(5)
            })
        }
        .unwrap();
        graph.launch().unwrap();
        assert_eq!(
            y.device_view(&s).unwrap().to_vec().unwrap(),
            vec![0x0505_0505; 1024]
        );
        assert_eq!(pool.stats().live, 2, "`outside` is still allocated");
        pool.deallocate_on(outside, sid).unwrap();
    }

    /// What the stream runtime's "not capturing, then record (or wait)" meets when another
    /// thread begins a capture on the stream in between (observed on an H100, driver 580):
    /// - an event recorded into the capture never passes for the stream's earlier work being
    ///   done: a query fails (`CUDA_ERROR_CAPTURED_EVENT` during the capture, which it
    ///   invalidates; `CUDA_ERROR_INVALID_VALUE` after it), and the pool sets the block aside;
    /// - a stream outside the capture made to wait for it while the capture is open is not
    ///   ordered by that wait: the driver pulls the stream into the capture (its fork; the
    ///   test also takes a refused wait, as another driver may do), which is why the
    ///   runtime's `order_after` asks whether the producer captures after its record, before
    ///   it waits; after the capture the wait fails;
    /// - a capturing stream made to wait for an event recorded outside the capture is refused
    ///   (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`).
    #[test]
    fn deliberate_api_error_events_that_cross_a_capture_boundary_never_order_streams_unseen() {
        let Some((_device, home)) = gpu() else {
            return;
        };
        let s = home.context().new_stream().unwrap();
        let w = home.context().new_stream().unwrap();
        let error_name = |r: &Result<bool, Error>| match r {
            Err(Error::Driver { name, .. }) => Some(name.clone()),
            _ => None,
        };

        // The wait first, while the capture is open and valid.
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .unwrap();
        // SAFETY: `s` is a live stream of `home`'s context.
        let event = unsafe { RecordedEvent::record(home.context(), s.cu_stream() as u64) };
        // SAFETY: `w` is a live stream of the event's context.
        let waited = event
            .as_ref()
            .map(|e| unsafe { e.make_wait(w.cu_stream() as u64) }.map(|()| true))
            .map_err(Error::clone);
        let w_capturing = is_capturing(&w);
        let during = event
            .as_ref()
            .map(|e| e.is_complete())
            .map_err(Error::clone);
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        let event = event.expect("the driver records an event into a capture");
        let after = event.is_complete();
        // SAFETY: `home` is a live stream of the event's context.
        let waited_after = unsafe { event.make_wait(home.cu_stream() as u64) }.map(|()| true);
        println!(
            "event recorded in a capture: another stream waits for it: {waited:?}, capturing \
             then: {w_capturing:?}; queried during the capture: {during:?}; capture ended: \
             {:?}; the other stream capturing now: {:?}; queried after: {after:?}; waited for \
             after: {waited_after:?}",
            graph.as_ref().map(|g| g.is_some()),
            is_capturing(&w)
        );
        assert!(
            waited.unwrap().is_err() || w_capturing.unwrap(),
            "a wait for an event in an open capture neither failed nor joined the capture"
        );
        assert_eq!(
            error_name(&during.unwrap()).as_deref(),
            Some("CUDA_ERROR_CAPTURED_EVENT")
        );
        assert!(error_name(&after).is_some(), "{after:?}");
        assert!(error_name(&waited_after).is_some(), "{waited_after:?}");
        drop(graph);
        drop(event);
        assert!(!is_capturing(&s).unwrap());

        // A capturing stream made to wait for an event recorded outside the capture.
        // SAFETY: `home` is a live stream of its context.
        let outside =
            unsafe { RecordedEvent::record(home.context(), home.cu_stream() as u64) }.unwrap();
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .unwrap();
        // SAFETY: `s` is a live stream of the event's context.
        let wait = unsafe { outside.make_wait(s.cu_stream() as u64) }.map(|()| true);
        let ended = s.end_capture(CUgraphInstantiate_flags(0));
        println!(
            "wait in a capture for an event outside it: {wait:?}; capture ended: {:?}",
            ended.as_ref().map(|g| g.is_some())
        );
        assert!(
            error_name(&wait).is_some_and(|name| name.starts_with("CUDA_ERROR_STREAM_CAPTURE")),
            "{wait:?}"
        );
        drop(ended);
        assert!(!is_capturing(&s).unwrap());
        s.synchronize().unwrap();
    }

    /// Frees and the runtime's synchronizes on a stream that another thread keeps beginning
    /// and ending captures on: each free either parks its block behind an event recorded
    /// outside the captures or is refused and leaves the block live, where a capture that
    /// began between the runtime's "is it capturing?" and its record would have held the
    /// event (the first query of it, while the capture was open, invalidated the capture and
    /// set the block aside); each synchronize waits or is refused, where a
    /// `cuStreamSynchronize` in a capture begun since the question would have broken the
    /// capture. Every capture ends valid and no block is set aside. (Each capture is held
    /// open for 100 µs, far longer than a record and a question, so none begins and ends in
    /// between.)
    #[test]
    fn frees_racing_another_threads_captures_on_their_stream_never_break_a_capture() {
        let Some((_device, home)) = gpu() else {
            return;
        };
        const CAPTURES: usize = 2_000;
        let hold = std::time::Duration::from_micros(100);
        let pool = Pool::cuda(home.clone(), 64 << 20).unwrap();
        let s = home.context().new_stream().unwrap();
        let sid = pool.register_stream(&s).unwrap();
        let spin = move || {
            let start = std::time::Instant::now();
            while start.elapsed() < hold {
                std::hint::spin_loop();
            }
        };
        let capturing = AtomicBool::new(true);
        let (mut synced, mut sync_refused) = (0usize, 0usize);
        let (ended, (freed, refused)) = std::thread::scope(|scope| {
            let captures = scope.spawn(|| {
                let mut ended = Vec::with_capacity(CAPTURES);
                for _ in 0..CAPTURES {
                    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                        .unwrap();
                    spin();
                    ended.push(s.end_capture(CUgraphInstantiate_flags(0)).map(drop));
                    spin();
                }
                capturing.store(false, Ordering::SeqCst);
                ended
            });
            let (mut freed, mut refused) = (0usize, 0usize);
            let runtime = pool.stream_runtime().unwrap();
            let mut round = 0usize;
            while capturing.load(Ordering::SeqCst) {
                round += 1;
                if round % 4 == 0 {
                    // The runtime's synchronize of the stream: done, or refused.
                    match runtime.synchronize(sid) {
                        Ok(()) => synced += 1,
                        Err(e) => {
                            assert!(e.to_string().contains("is capturing a CUDA graph"), "{e}");
                            sync_refused += 1;
                        }
                    }
                }
                let addr = pool.allocate(4096, 256).unwrap();
                match pool.deallocate_on(addr, sid) {
                    Ok(()) => freed += 1,
                    Err(e) => {
                        assert!(e.to_string().contains("is capturing a CUDA graph"), "{e}");
                        refused += 1;
                        // Still live: freed on the home stream instead.
                        pool.deallocate(addr).unwrap();
                    }
                }
                // Queries the events of the blocks parked so far.
                pool.reclaim().unwrap();
            }
            (captures.join().unwrap(), (freed, refused))
        });
        let broken: Vec<String> = ended
            .iter()
            .filter_map(|e| e.as_ref().err().map(|e| format!("{e:?}")))
            .collect();
        s.synchronize().unwrap();
        pool.reclaim().unwrap();
        let stats = pool.stats();
        println!(
            "{CAPTURES} captures, {} broken; frees on the stream: {freed} parked, {refused} \
             refused; synchronizes: {synced} done, {sync_refused} refused; quarantined {} \
             bytes",
            broken.len(),
            stats.quarantined
        );
        assert!(
            broken.is_empty(),
            "captures that did not end valid: {broken:?}"
        );
        assert!(freed > 0 && refused > 0, "{freed} {refused}");
        assert!(synced > 0 && sync_refused > 0, "{synced} {sync_refused}");
        assert_eq!(
            (stats.live, stats.pending, stats.quarantined),
            (0, 0, 0),
            "{stats:?}"
        );
    }

    #[test]
    fn deliberate_api_error_a_failed_capture_gives_its_blocks_back() {
        let Some((_device, home)) = gpu() else {
            return;
        };
        let pool = Pool::cuda(home.clone(), 64 << 20).unwrap();
        let s = home.context().new_stream().unwrap();
        // SAFETY: it reaches the graph's blocks, and slices freed in stream order after it.
        let e = unsafe {
            pool.capture(&s, |c| {
                let mut t = c.alloc_slice::<u32>(N)?;
                // A synchronous copy cannot be captured.
                t.device_view_mut(c.stream())?.upload(&vec![1; N])
            })
        }
        .unwrap_err();
        println!("upload during a pool capture: {e}");
        assert!(
            matches!(&e, Error::Driver { name, .. } if name.starts_with("CUDA_ERROR_STREAM_CAPTURE")),
            "{e}"
        );
        assert!(!is_capturing(&s).unwrap());
        s.synchronize().unwrap();
        pool.reclaim().unwrap();
        let stats = pool.stats();
        assert_eq!((stats.live, stats.pending, stats.quarantined), (0, 0, 0));
        // The stream and the pool work on.
        // SAFETY: it reaches the graph's blocks, and slices freed in stream order after it.
        let graph = unsafe {
            pool.capture(&s, |c| {
                c.alloc_slice::<u32>(16)?
                    .device_view_mut(c.stream())?
                    .fill_bytes(0)
            })
        }
        .unwrap();
        graph.launch().unwrap();
        // A pool without a CUDA stream runtime cannot capture.
        let host = Pool::host(1 << 20).unwrap();
        // SAFETY: it reaches the graph's blocks, and slices freed in stream order after it.
        let e = unsafe { host.capture(&s, |_| Ok(())) }.unwrap_err();
        assert!(e.to_string().contains("no CUDA stream runtime"), "{e}");
    }
}

//! Growable device pools on the CUDA virtual memory API: nothing mapped until used, growth
//! across thousands of chunks with earlier data intact, threads on heaps of their own mapping
//! their blocks, `trim` giving the device its memory back (seen in `cuMemGetInfo`), `trim` waiting for the home stream, and a map that fails
//! under real device exhaustion leaving the pool unchanged and serving.
//!
//! Each test runs in well under a minute on an H200. They compare free-memory readings, so they
//! take the device one at a time (each holds `gpu_common`'s device lock), also under `cargo
//! test`'s parallel tests.

mod gpu_common;

#[cfg(not(feature = "cuda"))]
#[test]
fn growable_device_pool_tests_need_the_cuda_feature() {
    gpu_common::skip_or_fail("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use devarena::backend::cuda::{CudaStream, PointerMemory, mem_info, pointer_info};
    use devarena::pool::{PoolStats, RegionKind};
    use devarena::{Error, Pool};

    use super::gpu_common::{StreamGate, gpu};

    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;

    /// A memset, a copy each way and a mapping on a small growable pool, given back: whatever
    /// the driver sets up lazily for these (its memset kernel, staging buffers) exists before a
    /// test reads free memory.
    fn warm_up(stream: &Arc<CudaStream>) {
        let pool = Pool::cuda(stream.clone(), 64 * MIB).unwrap();
        let mut s = pool.alloc_slice::<u32>(MIB).unwrap();
        s.device_view_mut(stream).unwrap().fill_bytes(1).unwrap();
        s.device_view_mut(stream)
            .unwrap()
            .slice_mut(..16)
            .unwrap()
            .upload(&[2; 16])
            .unwrap();
        assert_eq!(
            s.device_view(stream).unwrap().to_vec().unwrap()[16],
            0x0101_0101
        );
        drop(s);
        drop(pool);
        stream.synchronize().unwrap();
    }

    /// Free device memory once the stream is idle.
    fn free_now(stream: &CudaStream) -> usize {
        stream.synchronize().unwrap();
        mem_info(stream).unwrap().0
    }

    fn mib(bytes: usize) -> f64 {
        bytes as f64 / MIB as f64
    }

    #[test]
    fn footprint_a_growable_pool_costs_nothing_until_used_and_maps_device_memory() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        warm_up(&stream);
        let free0 = free_now(&stream);
        let (_, total) = mem_info(&stream).unwrap();
        // The whole device as the cap: only addresses until allocations reach them.
        let t = Instant::now();
        let pool = Pool::cuda(stream.clone(), total).unwrap();
        println!(
            "reserved {:.0} MiB of addresses in {:?}",
            mib(pool.capacity()),
            t.elapsed()
        );
        assert_eq!(pool.region_kind(), RegionKind::Growable);
        assert_eq!(pool.backend_name(), "cuda-vmm");
        assert_eq!(pool.capacity(), total & !255);
        let chunk = pool.stats().chunk;
        println!("chunk: {} bytes", chunk);
        assert!(chunk.is_power_of_two() && chunk >= 64 << 10);
        assert_eq!(pool.stats().mapped, 0);
        let free1 = free_now(&stream);
        assert!(
            free0.abs_diff(free1) <= chunk,
            "reserving the addresses took device memory: free {free0} -> {free1}"
        );

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
            assert!(pool.contains(addr));
            assert_eq!(addr % align.max(256) as u64, 0);
            let info = pointer_info(&stream, addr).unwrap();
            assert_eq!(info.memory_type, PointerMemory::Device, "{addr:#x}");
            assert_eq!(info.device_ordinal, Some(0));
            // The driver's range is the mapped chunk(s) around the address, inside the region.
            assert!(info.range_start >= pool.base());
            assert!(info.range_start <= addr);
            addrs.push(addr);
        }
        let stats = pool.stats();
        println!("{stats}");
        assert!(stats.mapped >= stats.in_use && stats.mapped <= stats.in_use + 2 * chunk);
        let free2 = free_now(&stream);
        assert!(
            (free1 - free2).abs_diff(stats.mapped) <= chunk,
            "cuMemGetInfo saw {} MiB taken, the pool says {} MiB mapped",
            mib(free1 - free2),
            mib(stats.mapped)
        );

        // Typed slices: data through the views, on the new memory.
        let n = (1 << 20) + 3;
        let input: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let mut xs = pool.alloc_slice::<u32>(n).unwrap();
        xs.device_view_mut(&stream).unwrap().upload(&input).unwrap();
        assert_eq!(xs.device_view(&stream).unwrap().to_vec().unwrap(), input);
        drop(xs);
        for addr in addrs {
            pool.deallocate(addr).unwrap();
        }
        assert_eq!(pool.stats().live, 0);
    }

    #[test]
    fn growth_across_thousands_of_chunks_keeps_earlier_data() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        let (_, total) = mem_info(&stream).unwrap();
        let pool = Pool::cuda(stream.clone(), (32 * GIB).min(total / 2)).unwrap();
        let chunk = pool.stats().chunk;
        let want_chunks = 3000;
        // Sizes from 1 MiB to 5 MiB in 4 KiB steps (a fixed sequence): blocks straddle chunk
        // boundaries, most allocations map a chunk or two, some none.
        let mut slices = Vec::new();
        let t = Instant::now();
        let mut i = 0usize;
        while (pool.stats().maps as usize) < want_chunks {
            let size = MIB + (i * 7919 % 1024) * 4096;
            let mut s = pool.alloc_slice::<u8>(size).unwrap();
            s.device_view_mut(&stream)
                .unwrap()
                .fill_bytes((i % 251) as u8 + 1)
                .unwrap();
            slices.push(s);
            i += 1;
            assert!(i < 20_000, "the pool stopped growing");
        }
        stream.synchronize().unwrap();
        let grew = t.elapsed();
        let stats = pool.stats();
        println!(
            "{} blocks, {} chunks mapped ({:.0} MiB) in {grew:?}: {:.1} us per chunk with the \
             fills; {stats}",
            slices.len(),
            stats.maps,
            mib(stats.mapped),
            grew.as_secs_f64() * 1e6 / stats.maps as f64
        );
        assert!(stats.maps as usize >= want_chunks);
        // Blocks were only ever added: they lie end to end, and the mapping covers them to
        // the chunk.
        assert!(stats.mapped >= stats.in_use && stats.mapped - stats.in_use < chunk);
        assert_eq!(stats.peak_mapped, stats.mapped);

        // Every block still holds what was written into it before the pool grew past it: the
        // first and last 4 KiB of each, every byte of every 100th.
        for (i, s) in slices.iter().enumerate() {
            let want = (i % 251) as u8 + 1;
            let view = s.device_view(&stream).unwrap();
            let n = view.len();
            let head = view.slice(..4096).unwrap().to_vec().unwrap();
            let tail = view.slice(n - 4096..).unwrap().to_vec().unwrap();
            assert!(
                head.iter().chain(&tail).all(|&b| b == want),
                "block {i} at {:#x} lost its data",
                s.addr()
            );
            if i % 100 == 0 {
                assert!(
                    view.to_vec().unwrap().iter().all(|&b| b == want),
                    "block {i}"
                );
            }
        }
        let first = pointer_info(&stream, slices[0].addr()).unwrap();
        assert_eq!(first.memory_type, PointerMemory::Device);
    }

    #[test]
    fn footprint_threads_on_heaps_of_a_growable_pool_map_device_memory_and_trim_gives_it_back() {
        // Four threads, each on a heap of its own from its first allocation: their blocks'
        // chunks are mapped from the heaps (under the pool's lock), hold what each thread
        // writes, and once the threads have exited (their heaps given back) a trim returns the
        // device to its free memory before the pool.
        const THREADS: usize = 4;
        let Some((_device, stream)) = gpu() else {
            return;
        };
        warm_up(&stream);
        let free0 = free_now(&stream);
        let pool = Pool::builder(4 * GIB)
            .name("heaps-vmm")
            .eager_thread_heaps(true)
            .build_cuda(stream.clone())
            .unwrap();
        assert_eq!(pool.region_kind(), RegionKind::Growable);
        let chunk = pool.stats().chunk;
        let start = std::sync::Barrier::new(THREADS);
        let heaps = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            let mut threads = Vec::new();
            for t in 0..THREADS {
                let (pool, stream, start, heaps) = (&pool, &stream, &start, &heaps);
                threads.push(s.spawn(move || {
                    stream.context().bind_to_thread().unwrap();
                    start.wait();
                    let mut slices = Vec::new();
                    for i in 0..96usize {
                        let len = (64 << 10) + (i * 7919 + t * 104_729) % (3 * MIB);
                        let mut slice = pool.alloc_slice::<u8>(len).unwrap();
                        let mark = ((t * 96 + i) % 251) as u8 + 1;
                        slice
                            .device_view_mut(stream)
                            .unwrap()
                            .fill_bytes(mark)
                            .unwrap();
                        slices.push((slice, mark));
                        if i % 3 == 2 {
                            slices.swap_remove(i * 31 % slices.len());
                        }
                    }
                    heaps.fetch_max(pool.thread_heaps(), Ordering::Relaxed);
                    for (slice, mark) in &slices {
                        let bytes = slice.device_view(stream).unwrap().to_vec().unwrap();
                        assert!(
                            bytes.iter().all(|b| b == mark),
                            "thread {t}: the block at {:#x} lost its data",
                            slice.addr()
                        );
                    }
                }));
            }
            // Joined one by one: a join waits for the thread's thread-local destructors,
            // which give its heap back; the end of the scope alone does not.
            for thread in threads {
                thread.join().unwrap();
            }
        });
        println!("up to {} heaps", heaps.load(Ordering::Relaxed));
        assert!(heaps.load(Ordering::Relaxed) >= 2);
        assert_eq!(pool.thread_heaps(), 0, "the threads gave their heaps back");
        let stats = pool.stats();
        println!("{stats}");
        assert_eq!((stats.live, stats.in_use), (0, 0));
        assert!(stats.maps > 0 && stats.mapped > 0);
        let free1 = free_now(&stream);
        assert!(
            (free0 - free1).abs_diff(stats.mapped) <= chunk,
            "cuMemGetInfo saw {} MiB taken, the pool says {} MiB mapped",
            mib(free0 - free1),
            mib(stats.mapped)
        );
        assert_eq!(pool.trim().unwrap(), stats.mapped);
        let free2 = free_now(&stream);
        assert!(
            free2.abs_diff(free0) <= chunk,
            "after trim the device has {free2} bytes free, before the pool {free0}"
        );
    }

    #[test]
    fn footprint_trim_gives_the_device_its_memory_back_within_one_chunk() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        warm_up(&stream);
        let free0 = free_now(&stream);
        let (_, total) = mem_info(&stream).unwrap();
        let pool = Pool::cuda(stream.clone(), total).unwrap();
        let chunk = pool.stats().chunk;
        // 1 GiB in 64 blocks of 16 MiB, written.
        let mut slices: Vec<_> = (0..64)
            .map(|_| pool.alloc_slice::<u8>(16 * MIB).unwrap())
            .collect();
        for s in &mut slices {
            s.device_view_mut(&stream)
                .unwrap()
                .fill_bytes(0x5A)
                .unwrap();
        }
        let free1 = free_now(&stream);
        let mapped = pool.stats().mapped;
        assert_eq!(mapped, GIB);
        println!(
            "free before the pool {:.0} MiB; with 1 GiB mapped {:.0} MiB (taken: {:.0} MiB)",
            mib(free0),
            mib(free1),
            mib(free0 - free1)
        );
        assert!((free0 - free1).abs_diff(mapped) <= chunk);

        // Keep one block: its chunks stay; every other chunk goes back.
        let kept = slices.pop().unwrap();
        drop(slices);
        let t = Instant::now();
        let released = pool.trim().unwrap();
        println!(
            "trim: {:.0} MiB unmapped in {:?}",
            mib(released),
            t.elapsed()
        );
        assert_eq!(released, GIB - 16 * MIB);
        assert_eq!(
            kept.device_view(&stream).unwrap().to_vec().unwrap()[..16],
            [0x5A; 16]
        );
        drop(kept);
        assert_eq!(pool.trim().unwrap(), 16 * MIB);
        let free2 = free_now(&stream);
        println!("free after trim {:.0} MiB", mib(free2));
        assert!(
            free2.abs_diff(free0) <= chunk,
            "after trim the device has {free2} bytes free, before the pool {free0}"
        );
        let stats = pool.stats();
        assert_eq!(stats.mapped, 0);
        assert_eq!(stats.maps, stats.unmaps);
        assert_eq!(stats.peak_mapped, GIB);

        // The same addresses map again.
        let mut again = pool.alloc_slice::<u32>(16 << 20).unwrap();
        again
            .device_view_mut(&stream)
            .unwrap()
            .fill_bytes(3)
            .unwrap();
        assert_eq!(
            again.device_view(&stream).unwrap().to_vec().unwrap()[7],
            0x0303_0303
        );
        assert_eq!(again.addr(), pool.base());
        drop(again);
        drop(pool);
        let free3 = free_now(&stream);
        assert!(
            free3.abs_diff(free0) <= chunk,
            "after the drop: {free3} vs {free0}"
        );
    }

    #[test]
    fn trim_waits_for_work_queued_on_the_home_stream() {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        let pool = Pool::cuda(stream.clone(), GIB).unwrap();
        let mut s = pool.alloc_slice::<u8>(64 * MIB).unwrap();
        // A memset queued behind a closed gate, then the block freed on the home stream: free
        // at once for the pool, but the device has not written it yet.
        let gate = StreamGate::block(&stream);
        s.device_view_mut(&stream).unwrap().fill_bytes(7).unwrap();
        drop(s);
        let opened = Arc::new(AtomicBool::new(false));
        let opener = {
            let (opened, gate) = (opened.clone(), gate.opener());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                opened.store(true, Ordering::SeqCst);
                gate.open();
            })
        };
        let released = pool.trim().unwrap();
        assert!(
            opened.load(Ordering::SeqCst),
            "trim unmapped memory while the home stream still had work queued on it"
        );
        assert_eq!(released, 64 * MIB);
        opener.join().unwrap();
        // The memset ran on mapped memory: the stream finishes without a fault.
        stream.synchronize().unwrap();
        drop(gate);
    }

    #[test]
    fn deliberate_oom_a_map_that_fails_under_real_exhaustion_is_out_of_memory_and_changes_nothing()
    {
        let Some((_device, stream)) = gpu() else {
            return;
        };
        warm_up(&stream);
        let free0 = free_now(&stream);
        let (_, total) = mem_info(&stream).unwrap();
        // A cap beyond the device: the device runs out first.
        let pool = Pool::builder(2 * total)
            .name("exhaust")
            .build_cuda(stream.clone())
            .unwrap();
        let chunk = pool.stats().chunk;
        let t = Instant::now();
        let mut blocks = Vec::new();
        let (before, err) = loop {
            let before: PoolStats = pool.stats();
            match pool.allocate(GIB, 0) {
                Ok(addr) => blocks.push(addr),
                Err(err) => break (before, err),
            }
            assert!(blocks.len() <= 2 * total / GIB, "never ran out");
        };
        println!(
            "mapped {} GiB in {:?} before the device ran out: {err}",
            blocks.len(),
            t.elapsed()
        );
        match &err {
            Error::OutOfMemory {
                backend, detail, ..
            } => {
                assert_eq!(*backend, "cuda-vmm");
                assert_eq!(*detail, Some("CUDA_ERROR_OUT_OF_MEMORY"));
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        // Only the failure was counted; the chunks mapped for the failed request are gone.
        let after = pool.stats();
        assert_eq!(after.failures, before.failures + 1);
        assert_eq!(
            PoolStats {
                failures: before.failures,
                maps: before.maps,
                unmaps: before.unmaps,
                ..after
            },
            before
        );
        assert_eq!(after.maps - before.maps, after.unmaps - before.unmaps);
        assert!(blocks.len() * GIB + GIB > free0.saturating_sub(4 * GIB));

        // Memory stranded in free blocks serves a larger request: every other block freed
        // (pieces of 1 GiB, none next to another), a request of 2 GiB finds no mapped run that
        // holds it and the device is full, so the pool gives the chunks of its free blocks back
        // to the device and maps the request's.
        let kept: Vec<u64> = blocks.iter().copied().step_by(2).collect();
        for &addr in blocks.iter().skip(1).step_by(2) {
            pool.deallocate(addr).unwrap();
        }
        let stranded = pool.stats();
        let t = Instant::now();
        let big = pool
            .allocate(2 * GIB, 0)
            .unwrap_or_else(|e| panic!("2 GiB with {} GiB free in pieces: {e}", blocks.len() / 2));
        let given = pool.stats();
        println!(
            "2 GiB with the device full and {:.0} MiB free in pieces: {:?}, {:.0} MiB given \
             back",
            mib(stranded.mapped - stranded.in_use),
            t.elapsed(),
            mib((given.unmaps - stranded.unmaps) as usize * chunk)
        );
        assert!(given.unmaps > stranded.unmaps);
        assert!(given.mapped <= stranded.mapped + 2 * GIB);
        assert_eq!(given.in_use, stranded.in_use + 2 * GIB);
        // Its memory is there, to its far end.
        for at in [big, big + 2 * GIB as u64 - 4] {
            let info = pointer_info(&stream, at).unwrap();
            assert_eq!(info.memory_type, PointerMemory::Device, "{at:#x}");
        }
        let mut blocks = kept;
        blocks.push(big);

        // The pool keeps serving: a freed block's memory (or what is left on the device) serves
        // a new request.
        pool.deallocate(blocks.pop().unwrap()).unwrap();
        let mut s = pool.alloc_slice::<u32>(64 << 20).unwrap();
        s.device_view_mut(&stream).unwrap().fill_bytes(1).unwrap();
        assert_eq!(
            s.device_view(&stream).unwrap().to_vec().unwrap()[12345],
            0x0101_0101
        );
        drop(s);
        for addr in blocks {
            pool.deallocate(addr).unwrap();
        }
        let t = Instant::now();
        let released = pool.trim().unwrap();
        println!("trim: {:.0} MiB in {:?}", mib(released), t.elapsed());
        let free1 = free_now(&stream);
        assert!(
            free1.abs_diff(free0) <= chunk,
            "after trim: {free1} vs {free0}"
        );
    }
}

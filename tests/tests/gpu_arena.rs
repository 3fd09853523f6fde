//! GPU tests of the CUDA backends and the hardware verifier. Without a GPU each prints
//! `skipped: no CUDA device`; with `DEVARENA_REQUIRE_GPU=1` they fail instead.

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    devarena_tests::skip_or_fail("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use devarena::backend::cuda::{
        CudaBackend, DevicePtr, ManagedBackend, PinnedBackend, PushKernelArg, mem_info,
    };
    use devarena::{Arena, DeviceLayout, Error};
    use devarena_kernels::pipeline::Frame;
    use devarena_kernels::verify::{Region, TmaCheck, Verifier, tag_byte};
    use devarena_tests::{Many, gpu_stream};
    use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

    /// The `footprint_*` tests compare readings of the device's free memory: they run alone,
    /// the binary's other tests (which allocate GiBs) beside one another. So `cargo test` runs
    /// this file with its default parallel tests.
    static DEVICE_MEMORY: RwLock<()> = RwLock::new(());

    /// For a test that allocates: it may run beside the others but not beside a footprint test.
    fn shared() -> RwLockReadGuard<'static, ()> {
        DEVICE_MEMORY.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// For a test that reads the device's free memory: it runs alone.
    fn alone() -> RwLockWriteGuard<'static, ()> {
        DEVICE_MEMORY
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    #[derive(DeviceLayout)]
    struct Params {
        scale: [f32; 4],
        #[layout(align = 1024)]
        lut: [u8; 300],
    }

    #[derive(DeviceLayout)]
    #[layout(align = 16)]
    struct Mixed {
        a: [u8; 3],
        #[layout(align = 4096)]
        b: [f64; 1000],
        params: Params,
        #[layout(align = 2048)]
        c: [u16; 7],
    }

    /// Several GiB: 1.5 Gi f32 + 1 GiB of bytes + a small tail.
    #[derive(DeviceLayout)]
    struct Huge {
        big: [f32; 3 << 29],
        bytes: [u8; 1 << 30],
        #[layout(align = 4096)]
        tail: [u32; 1000],
    }

    /// 1 TiB: more than any GPU has.
    #[derive(DeviceLayout)]
    struct TooBig {
        a: [u8; 1 << 40],
    }

    /// Small enough for managed memory.
    #[derive(DeviceLayout)]
    struct Small {
        input: [u32; 1 << 20],
        #[layout(align = 4096)]
        output: [f32; 1 << 20],
    }

    fn check_report(report: &devarena_kernels::Report, sm90: bool) {
        println!("{report}");
        assert!(report.passed(), "verification failed:\n{report}");
        for f in &report.fields {
            assert_eq!(f.alignment.residue, 0, "{}", f.region.name);
            let widest = [16usize, 8, 4, 2, 1]
                .into_iter()
                .find(|&w| w <= f.region.align && w <= f.region.size)
                .unwrap_or(0);
            assert_eq!(
                f.alignment.access_bytes as usize, widest,
                "{}",
                f.region.name
            );
            if sm90 && f.region.align >= 16 && f.region.size >= 16 {
                assert!(
                    matches!(f.tma, TmaCheck::Passed { .. }),
                    "{}: {:?}",
                    f.region.name,
                    f.tma
                );
            }
        }
    }

    fn is_sm90(stream: &devarena::backend::cuda::CudaStream) -> bool {
        stream.context().compute_capability().unwrap().0 >= 9
    }

    #[test]
    fn pipeline_frame_is_one_allocation_and_passes_the_verifier() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        let backend = CudaBackend::new(stream.clone());
        let mut arena = Arena::<Frame, _>::new_in(backend.clone()).unwrap();
        assert_eq!(backend.stats().allocations, 1);
        assert_eq!(arena.addr() % Frame::ALIGN as u64, 0);
        let report = devarena_kernels::verify(&mut arena).unwrap();
        check_report(&report, is_sm90(&stream));
        assert_eq!(report.fields.len(), 8); // the frame's eight buffers
        drop(arena);
        assert_eq!(backend.stats().frees, 1);
    }

    #[test]
    fn thousand_mixed_fields_pass_the_verifier() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        assert_eq!(Many::FIELDS.len(), 1000);
        assert!(Many::FIELDS.iter().any(|f| f.align == 4096));
        assert!(Many::FIELDS.iter().any(|f| f.align == 1));
        for backend in [
            CudaBackend::new(stream.clone()),
            CudaBackend::stream_ordered(stream.clone()),
        ] {
            let mut arena = Arena::<Many, _>::new_in(backend).unwrap();
            assert_eq!(arena.addr() % 4096, 0, "base honours ALIGN = 4096");
            let report = devarena_kernels::verify(&mut arena).unwrap();
            check_report(&report, is_sm90(&stream));
        }
    }

    #[test]
    fn nested_and_mixed_alignments_pass_the_verifier_on_both_device_backends() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        for backend in [
            CudaBackend::new(stream.clone()),
            CudaBackend::stream_ordered(stream.clone()),
        ] {
            let mut arena = Arena::<Mixed, _>::new_in(backend).unwrap();
            assert_eq!(arena.addr() % Mixed::ALIGN as u64, 0);
            let report = devarena_kernels::verify(&mut arena).unwrap();
            check_report(&report, is_sm90(&stream));
        }
    }

    #[test]
    fn views_upload_download_and_launch_as_kernel_arguments() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        let mut arena = Arena::<Mixed, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let base = arena.addr();
        let b: Vec<f64> = (0..1000).map(|i| i as f64 * 0.5).collect();
        {
            let mut v = arena.views_mut();
            v.a.upload(&[1, 2, 3]).unwrap();
            v.b.upload(&b).unwrap();
            v.params.scale.upload(&[1.0, 2.0, 3.0, 4.0]).unwrap();
            v.params.lut.fill_bytes(7).unwrap();
            v.c.upload(&[9; 7]).unwrap();
            // Wrong lengths are errors that name both lengths, not panics.
            let err = v.c.upload(&[1, 2]).unwrap_err();
            assert!(
                err.to_string().contains("7") && err.to_string().contains("2"),
                "{err}"
            );
            // A view's device pointer is the arena's base plus the planned offset.
            let (ptr, _sync) = v.b.device_ptr(&stream);
            assert_eq!(ptr, base + Mixed::OFFSETS.b as u64);
        }
        // A kernel compiled at run time takes the views as arguments directly.
        let ptx = cudarc::nvrtc::compile_ptx(
            r#"extern "C" __global__ void axpy(const double* x, double* y, unsigned n, double k) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] = k * x[i] + y[i];
            }"#,
        )
        .unwrap();
        let module = stream.context().load_module(ptx).unwrap();
        let axpy = module.load_function("axpy").unwrap();
        let mut other = Arena::<Mixed, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let mut o = other.views_mut();
        o.b.upload(&vec![1.0; 1000]).unwrap();
        let v = arena.views();
        let n = 1000u32;
        let k = 2.0f64;
        // SAFETY: x and y hold n doubles each.
        unsafe {
            stream
                .launch_builder(&axpy)
                .arg(&v.b)
                .arg(&mut o.b)
                .arg(&n)
                .arg(&k)
                .launch(cudarc::driver::LaunchConfig::for_num_elems(n))
        }
        .unwrap();
        let y = o.b.to_vec().unwrap();
        for (i, y) in y.iter().enumerate() {
            assert_eq!(*y, 2.0 * (i as f64 * 0.5) + 1.0);
        }
        assert_eq!(v.a.to_vec().unwrap(), vec![1, 2, 3]);
        assert_eq!(v.params.scale.to_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert!(v.params.lut.to_vec().unwrap().iter().all(|&x| x == 7));
        assert_eq!(v.c.to_vec().unwrap(), vec![9; 7]);
        // cudarc's own copy functions accept the views too.
        let mut back = vec![0f64; 1000];
        stream.memcpy_dtoh(&v.b, &mut back).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(back, b);
    }

    #[test]
    fn footprint_an_arena_of_several_gib() {
        let _memory = alone();
        let Some(stream) = gpu_stream() else { return };
        const { assert!(Huge::SIZE > 3 << 30) };
        let (free, _) = mem_info(&stream).unwrap();
        if free < Huge::SIZE + (1 << 30) {
            devarena_tests::skip_or_fail("not enough free device memory for the several-GiB arena");
            return;
        }
        let mut arena = Arena::<Huge, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let (after, _) = mem_info(&stream).unwrap();
        assert!(free - after >= Huge::SIZE, "{} bytes taken", free - after);
        {
            let mut v = arena.views_mut();
            let mut last = v.big.slice_mut(v.big.len() - 4..).unwrap();
            last.upload(&[1.0, 2.0, 3.0, 4.0]).unwrap();
            v.tail.upload(&[5; 1000]).unwrap();
            let v = arena.views();
            assert_eq!(
                v.big.slice(v.big.len() - 4..).unwrap().to_vec().unwrap(),
                vec![1.0, 2.0, 3.0, 4.0]
            );
            assert_eq!(v.tail.to_vec().unwrap(), vec![5; 1000]);
        }
        let report = devarena_kernels::verify(&mut arena).unwrap();
        check_report(&report, is_sm90(&stream));
    }

    // `deliberate_*`: it provokes out-of-memory errors on purpose, which compute-sanitizer reports;
    // scripts/gpu-sanitize.sh skips it.
    #[test]
    fn deliberate_oom_is_an_error_and_the_device_stays_usable() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        let backend = CudaBackend::new(stream.clone());
        let err = Arena::<TooBig, _>::new_in(backend.clone()).unwrap_err();
        match &err {
            Error::OutOfMemory {
                requested, detail, ..
            } => {
                assert!(*requested >= 1 << 40);
                assert_eq!(*detail, Some("CUDA_ERROR_OUT_OF_MEMORY"));
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        println!("out-of-memory error: {err}");
        assert_eq!(backend.stats().failures, 1);
        assert_eq!(backend.stats().allocations, 0);
        let async_err =
            Arena::<TooBig, _>::new_in(CudaBackend::stream_ordered(stream.clone())).unwrap_err();
        assert!(
            matches!(async_err, Error::OutOfMemory { .. }),
            "{async_err:?}"
        );
        // Nothing was disturbed: a normal arena still works.
        let mut arena = Arena::<Small, _>::new_in(backend).unwrap();
        let mut v = arena.views_mut();
        v.input.upload(&vec![3; 1 << 20]).unwrap();
        assert_eq!(v.input.to_vec().unwrap()[12345], 3);
    }

    #[test]
    fn footprint_dropping_an_arena_gives_its_memory_back() {
        let _memory = alone();
        let Some(stream) = gpu_stream() else { return };
        #[derive(DeviceLayout)]
        struct GiB {
            a: [u8; 1 << 30],
        }
        // Warm up the context so its own allocations do not count.
        drop(Arena::<Small, _>::new_in(CudaBackend::new(stream.clone())).unwrap());
        for backend in [
            CudaBackend::new(stream.clone()),
            CudaBackend::stream_ordered(stream.clone()),
        ] {
            let stream_ordered =
                backend.mode() == devarena::backend::cuda::DeviceAlloc::StreamOrdered;
            let (before, _) = mem_info(&stream).unwrap();
            let arena = Arena::<GiB, _>::new_in(backend).unwrap();
            let (during, _) = mem_info(&stream).unwrap();
            drop(arena);
            stream.synchronize().unwrap();
            if stream_ordered {
                // The stream-ordered pool keeps freed memory until trimmed.
                stream.context().synchronize().unwrap();
                // SAFETY: trims the device's default memory pool; no allocation of it is live.
                unsafe {
                    let mut pool = std::mem::MaybeUninit::uninit();
                    cudarc::driver::sys::cuDeviceGetDefaultMemPool(
                        pool.as_mut_ptr(),
                        stream.context().cu_device(),
                    )
                    .result()
                    .unwrap();
                    cudarc::driver::sys::cuMemPoolTrimTo(pool.assume_init(), 0)
                        .result()
                        .unwrap();
                }
            }
            let (after, _) = mem_info(&stream).unwrap();
            println!(
                "stream_ordered={stream_ordered}: free before {before}, during {during}, after {after}"
            );
            assert!(before - during >= 1 << 30);
            let diff = before.abs_diff(after);
            assert!(
                diff <= 2 << 20,
                "free memory moved by {diff} bytes after drop"
            );
        }
    }

    #[test]
    fn managed_arena_host_writes_prefetch_device_reads() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        let backend = ManagedBackend::new(stream.clone());
        let mut arena = Arena::<Small, _>::new_in(backend.clone()).unwrap();
        {
            let v = arena.host_views_mut().unwrap();
            for (i, x) in v.input.iter_mut().enumerate() {
                *x = i as u32 * 3;
            }
        }
        arena.prefetch_to_device().unwrap();
        // The device sees what the host wrote.
        let got = arena.views().input.to_vec().unwrap();
        assert!(got.iter().enumerate().all(|(i, &x)| x == i as u32 * 3));
        // The device writes (the verifier's tags); the host reads them after prefetching back.
        let verifier = Verifier::new(&stream).unwrap();
        let report = verifier.verify(&mut arena).unwrap();
        check_report(&report, is_sm90(&stream));
        arena.prefetch_to_host().unwrap();
        let v = arena.host_views().unwrap();
        let bytes: &[u8] = bytemuck_u32(v.input);
        for (j, b) in bytes.iter().enumerate().take(4096) {
            let expect = tag_byte(0, j as u64);
            // TMA added 1 to the first box of each region aligned to 16.
            let expect = if is_sm90(&stream) && j < 256 {
                expect.wrapping_add(1)
            } else {
                expect
            };
            assert_eq!(*b, expect, "byte {j}");
        }
    }

    /// A managed arena's host views read its bytes as soon as it is made: they are zeros, never
    /// what the driver left there (here, in memory just freed by an arena that wrote 0xff).
    /// The driver of the H200 machine zero-fills managed pages at first use itself, so there
    /// this holds with or without `ManagedBackend`'s own memset: the test holds the backend to
    /// its promise where a driver does not.
    #[test]
    fn a_new_managed_arena_reads_zeros() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        let backend = ManagedBackend::new(stream.clone());
        for round in 0..4 {
            let mut arena = Arena::<Small, _>::new_in(backend.clone()).unwrap();
            let v = arena.host_views().unwrap();
            let dirty = v.input.iter().filter(|&&x| x != 0).count();
            assert_eq!(dirty, 0, "round {round}: {dirty} words not zero");
            arena.host_views_mut().unwrap().input.fill(u32::MAX);
            arena.views_mut().input.fill_bytes(0xff).unwrap();
        }
    }

    fn bytemuck_u32(v: &[u32]) -> &[u8] {
        // SAFETY: u32 has no padding and u8 has alignment 1; the length covers the same bytes.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
    }

    #[test]
    fn pinned_arena_stages_copies_and_maps_into_kernels() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        let mut staging = Arena::<Small, _>::new_in(PinnedBackend::new(stream.clone())).unwrap();
        let mut device = Arena::<Small, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        {
            let v = staging.try_views_mut().unwrap();
            for (i, x) in v.input.iter_mut().enumerate() {
                *x = (i as u32).wrapping_mul(2_654_435_761);
            }
        }
        {
            let s = staging.try_views().unwrap();
            let mut d = device.views_mut();
            stream.memcpy_htod(s.input, &mut d.input).unwrap();
        }
        let got = device.views().input.to_vec().unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &x)| x == (i as u32).wrapping_mul(2_654_435_761))
        );
        // Mapped pinned memory: the device reads the host bytes through the mapped address.
        let dv = staging.device_views_mut().unwrap();
        let mapped = dv.input.to_vec().unwrap();
        assert_eq!(mapped, got);
    }

    #[test]
    fn a_verifier_on_another_stream_waits_for_the_arenas_stream() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        let other = stream.context().new_stream().unwrap();
        let mut arena = Arena::<Mixed, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        arena.views_mut().b.upload(&[1.5; 1000]).unwrap();
        let verifier = Verifier::new(&other).unwrap();
        let report = verifier.verify(&mut arena).unwrap();
        check_report(&report, is_sm90(&stream));
        // The verifier's kernels have finished: the arena's own stream reads the tags.
        let bytes = arena.views().a.to_vec().unwrap();
        // `a` is field 0 and 3 bytes long: below 16, so no TMA round trip changed its tags.
        let want: Vec<u8> = (0..3).map(|j| tag_byte(0, j)).collect();
        assert_eq!(bytes, want);
    }

    #[test]
    fn the_verifier_reports_an_overlapping_pair() {
        let _memory = shared();
        let Some(stream) = gpu_stream() else { return };
        let arena = Arena::<Small, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        let base = arena.addr();
        let overlapping = vec![
            Region {
                name: "first".into(),
                offset: 0,
                addr: base,
                size: 1 << 16,
                align: 256,
            },
            Region {
                name: "second (overlaps first)".into(),
                offset: 1 << 15,
                addr: base + (1 << 15),
                size: 1 << 16,
                align: 256,
            },
            Region {
                name: "third (apart)".into(),
                offset: 1 << 20,
                addr: base + (1 << 20),
                size: 1 << 10,
                align: 256,
            },
        ];
        let verifier = Verifier::new(&stream).unwrap();
        // SAFETY: the three regions lie inside the arena's live device allocation (1 MiB +
        // 1 KiB of its 8 MiB); no view of the arena exists while the call runs, and the call
        // returns after its kernels.
        let mismatches = unsafe { verifier.disjoint(&overlapping) }.unwrap();
        println!("mismatches per region: {mismatches:?}");
        assert!(
            mismatches[0] + mismatches[1] > 0,
            "the overlap of the first two regions must be detected"
        );
        assert!(mismatches[0] <= 1 << 15 && mismatches[1] <= 1 << 15);
        assert_eq!(mismatches[2], 0);
    }
}

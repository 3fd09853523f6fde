//! Negative test on the GPU: a deliberately misaligned view fails the hardware alignment check
//! with `CUDA_ERROR_MISALIGNED_ADDRESS`. It has a binary of its own because that error leaves
//! the CUDA context unusable for the rest of the process.

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    devarena_tests::skip_or_fail("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
// `deliberate_*`: it provokes a misaligned-address fault on purpose, which compute-sanitizer reports;
// scripts/gpu-sanitize.sh skips it.
#[test]
fn deliberate_fault_a_misaligned_view_fails_the_hardware_check() {
    use devarena::backend::cuda::CudaBackend;
    use devarena::{Arena, DeviceLayout, Error};
    use devarena_kernels::verify::{Region, Verifier};

    #[derive(DeviceLayout)]
    struct Block {
        data: [u32; 4096],
    }

    let Some(stream) = devarena_tests::gpu_stream() else {
        return;
    };
    let arena = Arena::<Block, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
    let verifier = Verifier::new(&stream).unwrap();
    // The honest view passes with a 16-byte vector access.
    let honest = Region {
        name: "data".into(),
        offset: 0,
        addr: arena.addr(),
        size: 64,
        align: 256,
    };
    // SAFETY: the region is the first 64 bytes of the arena's live device allocation; no view
    // of the arena exists while the call runs, and the call returns after its kernels.
    let ok = unsafe { verifier.alignment(std::slice::from_ref(&honest)) }.unwrap();
    assert_eq!((ok[0].residue, ok[0].access_bytes), (0, 16));
    // A view 4 bytes in that claims 16-byte alignment: the v4 access must fault.
    let liar = Region {
        name: "data+4 claiming align 16".into(),
        offset: 4,
        addr: arena.addr() + 4,
        size: 64,
        align: 16,
    };
    // SAFETY: as above: 64 bytes inside the arena's allocation, 4 bytes in.
    let err = unsafe { verifier.alignment(&[liar]) }.unwrap_err();
    println!("misaligned view: {err}");
    match err {
        Error::Driver { name, .. } => assert_eq!(name, "CUDA_ERROR_MISALIGNED_ADDRESS"),
        other => panic!("expected CUDA_ERROR_MISALIGNED_ADDRESS, got {other:?}"),
    }
    // The arena's drop runs on a broken context: it must not panic.
    drop(arena);
}

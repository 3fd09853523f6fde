//! Host access to pinned memory after a failed wait is an error, never a view: a kernel that
//! traps breaks the CUDA context, every later `cuStreamSynchronize` fails, and a pinned arena
//! then refuses its host views. It has a binary of its own because the trap leaves the context
//! unusable for the rest of the process (and compute-sanitizer reports it: the sanitizer runs
//! leave this binary out).

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    devarena_tests::skip_or_fail("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
#[test]
fn deliberate_fault_pinned_views_after_a_failed_wait_are_errors() {
    use devarena::backend::cuda::{LaunchConfig, PinnedBackend, Ptx};
    use devarena::{Arena, DeviceLayout, Error};

    #[derive(DeviceLayout)]
    struct Staging {
        input: [u32; 1024],
    }

    /// One thread that executes `trap`: the launch fails asynchronously.
    const TRAP_PTX: &str = "
        .version 7.0
        .target sm_70
        .address_size 64
        .visible .entry trap_now() { trap; ret; }
    ";

    let Some(stream) = devarena_tests::gpu_stream() else {
        return;
    };
    let backend = PinnedBackend::new(stream.clone());
    let mut staging = Arena::<Staging, _>::new_in(backend.clone()).unwrap();
    // Before the fault the host writes and reads its views as usual.
    staging.try_views_mut().unwrap().input.fill(7);
    assert_eq!(staging.try_views().unwrap().input[1023], 7);

    let module = stream
        .context()
        .load_module(Ptx::from_src(TRAP_PTX))
        .unwrap();
    let trap = module.load_function("trap_now").unwrap();
    // SAFETY: the kernel takes no arguments and touches no memory; it only traps.
    unsafe {
        stream
            .launch_builder(&trap)
            .launch(LaunchConfig::for_num_elems(1))
    }
    .unwrap();

    // The wait before host access fails: no views, an error with the CUDA error name.
    let Err(err) = staging.try_views_mut() else {
        panic!("host views of pinned memory after a failed wait");
    };
    println!("host views after the trap: {err}");
    match &err {
        Error::Driver { name, call, .. } => {
            assert_eq!(*call, "cuStreamSynchronize");
            assert!(name.starts_with("CUDA_ERROR_"), "{name}");
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    assert!(staging.try_views().is_err());
    // Freeing on the broken context reports instead of panicking, and the statistics do not
    // count a free that did not happen: the memory is still the driver's.
    assert!(staging.free().is_err());
    let stats = backend.stats();
    assert_eq!((stats.allocations, stats.frees), (1, 0), "{stats:?}");
    assert_eq!(stats.live_allocations(), 1);
}

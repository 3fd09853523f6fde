//! The README's `rust,ignore` blocks need a GPU, a kernel and the context around them, so the
//! README's own doctests cannot build them. Each one appears here line for line, inside the
//! context it assumes: compiled with the `cuda` feature and run on a GPU. A host test checks
//! that every such block of the README is found here, so the README cannot drift away from
//! code that compiles.

/// Every `rust,ignore` block of the README appears in this file, its lines in order (leading
/// and trailing spaces aside).
#[test]
fn every_ignored_readme_block_is_compiled_here() {
    let readme = include_str!("../../README.md");
    let here: Vec<&str> = include_str!("readme_snippets.rs")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut blocks = 0;
    for rest in readme.split("```rust,ignore\n").skip(1) {
        let block = &rest[..rest.find("```").expect("the block ends")];
        let lines: Vec<&str> = block
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert!(
            here.windows(lines.len()).any(|w| w == lines.as_slice()),
            "a `rust,ignore` block of the README is not in tests/tests/readme_snippets.rs \
             as it is written there:\n{block}"
        );
        blocks += 1;
    }
    assert!(blocks >= 3, "{blocks} blocks");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    devarena_tests::skip_or_fail("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use devarena::backend::cuda::{CudaStream, LaunchConfig, Ptx, driver_error};
    use devarena::{Arena, DeviceLayout, Pool};

    #[derive(DeviceLayout)]
    struct Frame {
        rgb: [u8; 64 * 64 * 3],
        gray: [f32; 64 * 64],
    }

    /// A kernel of two pointer arguments that does nothing: the blocks launch it.
    const PTX: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
        .visible .entry k(.param .u64 a, .param .u64 b) { ret; }\n";

    #[test]
    fn the_readme_gpu_blocks_run() {
        let Some(stream) = devarena_tests::gpu_stream() else {
            return;
        };
        readme_blocks(&stream).unwrap();
    }

    /// The README's blocks in order, in the context they assume (`rustfmt::skip`: as the
    /// README writes them).
    #[rustfmt::skip]
    fn readme_blocks(context: &CudaStream) -> Result<(), devarena::Error> {
        let module = context
            .context()
            .load_module(Ptx::from_src(PTX))
            .map_err(|e| driver_error("cuModuleLoadData", e))?;
        let gray_kernel = module.load_function("k").map_err(|e| driver_error("cuModuleGetFunction", e))?;
        let (blur, sobel) = (gray_kernel.clone(), gray_kernel.clone());
        let cfg = LaunchConfig::for_num_elems(64 * 64);
        let rgb_bytes = vec![0u8; 64 * 64 * 3];
        let frames = vec![rgb_bytes.clone(); 2];
        let n = 64 * 64;

use devarena::backend::cuda::{cuda_stream, driver_error, CudaBackend, PushKernelArg};

let stream = cuda_stream(0)?; // Err(Error::NoDevice { .. }) without a driver or device
let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone()))?;
let mut v = arena.views_mut(); // DeviceViewMut<'_, u8>, DeviceViewMut<'_, f32>, ...
v.rgb.upload(&rgb_bytes)?;
// SAFETY: `gray_kernel` reads `rgb` and writes `gray` within their lengths.
unsafe { stream.launch_builder(&gray_kernel).arg(&v.rgb).arg(&mut v.gray).launch(cfg) }
    .map_err(|e| driver_error("cuLaunchKernel", e))?; // cudarc's DriverError as a devarena::Error
let report = devarena_kernels::verify(&mut arena)?; // alignment + overlap + TMA on hardware

        assert_eq!(report.fields.len(), 2);

use devarena::Capture;

let record = |c: &mut Capture<'_, Frame, CudaBackend>| { // recorded on the arena's stream, not run
    let mut v = c.views_mut();
    // SAFETY: as above.
    unsafe { stream.launch_builder(&gray_kernel).arg(&v.rgb).arg(&mut v.gray).launch(cfg) }
        .map_err(|e| driver_error("cuLaunchKernel", e))?;
    Ok(())                                            // a cuMemAlloc or a sync in here: an Err
};
// SAFETY: the recorded work reaches the arena's views alone, and `gray_kernel`'s module stays
// loaded until the graph is dropped.
let mut graph = unsafe { arena.capture(record) }?;
for frame in &frames {
    graph.views_mut().rgb.upload(frame)?;             // the input, between replays
    graph.launch()?;                                  // one call per frame
}
drop(graph);                                          // the arena is yours again

        let pool = Pool::cuda(stream.clone(), 64 << 20)?;
        let input_slice = pool.alloc_slice::<f32>(n)?;
        let mut output_slice = pool.alloc_slice::<f32>(n)?;
        let input = input_slice.device_view(&stream)?;
        let mut output = output_slice.device_view_mut(&stream)?;

use devarena::pool::PoolCapture;

let record = |c: &mut PoolCapture<'_>| {              // a pool with CUDA streams (Pool::cuda)
    let mut temp = c.alloc_slice::<f32>(n)?;          // the graph's own block
    let mut t = temp.device_view_mut(c.stream())?;
    // SAFETY: `blur` stays within the `n` elements of its arguments.
    unsafe { stream.launch_builder(&blur).arg(&input).arg(&mut t).launch(cfg) }
        .map_err(|e| driver_error("cuLaunchKernel", e))?;
    // SAFETY: as `blur`, for `sobel`.
    unsafe { stream.launch_builder(&sobel).arg(&t).arg(&mut output).launch(cfg) }
        .map_err(|e| driver_error("cuLaunchKernel", e))?;
    Ok(())                                            // `temp` freed here: held, not reused
};
// SAFETY: besides its own blocks, the graph reaches `input` and `output` and the kernels'
// module, all freed after its last replay.
let graph = unsafe { pool.capture(&stream, record) }?;
graph.launch()?;                                      // other threads use `pool` meanwhile
drop(graph);                                          // `temp` comes back after the last replay

        graph_done(&stream)
    }

    /// Waits for the replays, so that the slices go after them.
    fn graph_done(stream: &CudaStream) -> Result<(), devarena::Error> {
        stream
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }
}

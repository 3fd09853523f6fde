//! Shared pieces of devarena's integration tests: test layouts and the GPU gate.
//!
//! GPU tests call [`gpu_stream`]: without a CUDA driver or device it prints
//! `skipped: no CUDA device` and the test passes; with `DEVARENA_REQUIRE_GPU=1` set (the GPU
//! runner sets it) it fails instead.

mod many_fields;
pub use many_fields::Many;

/// Whether the environment demands a GPU (`DEVARENA_REQUIRE_GPU=1`).
pub fn gpu_required() -> bool {
    std::env::var("DEVARENA_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Skips (prints `skipped: no CUDA device`) or, when a GPU is required, fails with `why`.
pub fn skip_or_fail(why: &str) {
    assert!(
        !gpu_required(),
        "DEVARENA_REQUIRE_GPU=1 but no CUDA device is usable: {why}"
    );
    println!("skipped: no CUDA device ({why})");
}

/// A stream on GPU 0, or `None` after [`skip_or_fail`].
#[cfg(feature = "cuda")]
pub fn gpu_stream() -> Option<std::sync::Arc<devarena::backend::cuda::CudaStream>> {
    match devarena::backend::cuda::cuda_stream(0) {
        Ok(stream) => Some(stream),
        Err(e) => {
            skip_or_fail(&e.to_string());
            None
        }
    }
}

/// Without the `cuda` feature there is never a GPU.
#[cfg(not(feature = "cuda"))]
pub fn gpu_stream() -> Option<()> {
    skip_or_fail("built without the `cuda` feature");
    None
}

//! Shared pieces of devarena's integration tests: the layouts several test files use (so the
//! hand-computed numbers in `tests/layouts.rs`, the arena tests and the builder comparisons all
//! speak of the very same structs) and the GPU gate.
//!
//! GPU tests call [`gpu_stream`]: without a CUDA driver or device it prints
//! `skipped: no CUDA device` and the test passes; with `DEVARENA_REQUIRE_GPU=1` set (the GPU
//! runner sets it) it fails instead.

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub mod fuzz;
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

// Layout structs describe memory; they are never values, so they have nothing to debug-print.
#[allow(missing_debug_implementations)]
pub mod fixtures {
    //! Layouts used by several test files. Their expected offsets are computed by hand in
    //! `tests/layouts.rs`. The 1080p layout is not here: the tests use the image pipeline's
    //! own, [`devarena_kernels::pipeline::Frame`], as the example and the benchmarks do.

    use devarena::DeviceLayout;

    /// Alignments from 1 to 4096 in one layout; the struct default is 1.
    #[derive(DeviceLayout)]
    #[layout(align = 1)]
    pub struct Mixed {
        /// Field align 1.
        #[layout(align = 1)]
        pub a: [u8; 3],
        /// Field align 2.
        #[layout(align = 2)]
        pub b: [u16; 3],
        /// Field align 8 on bytes.
        #[layout(align = 8)]
        pub c: [u8; 5],
        /// Field align 16.
        #[layout(align = 16)]
        pub d: [f32; 3],
        /// Field align 512.
        #[layout(align = 512)]
        pub e: [u8; 1],
        /// Field align 4096.
        #[layout(align = 4096)]
        pub f: [u8; 10],
        /// The struct default (1).
        pub g: [u8; 7],
        /// The struct default (1), raised to the element's 8.
        pub h: [u64; 2],
    }

    /// A layout with an alignment of its own, to nest.
    #[derive(DeviceLayout)]
    #[layout(align = 1024)]
    pub struct Inner {
        /// Ten coefficients.
        pub coeffs: [f32; 10],
    }

    /// One level of nesting.
    #[derive(DeviceLayout)]
    pub struct Middle {
        /// Bytes before the nested layout.
        pub head: [u8; 100],
        /// Nested layout (align 1024).
        pub inner: Inner,
        /// Bytes after it.
        pub tail: [u16; 50],
    }

    /// Two levels of nesting.
    #[derive(DeviceLayout)]
    pub struct Outer {
        /// One word.
        pub flag: [u32; 1],
        /// Nested twice.
        pub middle: Middle,
        /// Nested once.
        pub inner: Inner,
        /// One byte at the end.
        pub last: [u8; 1],
    }

    /// A layout with padding between and after its fields.
    #[derive(DeviceLayout)]
    pub struct Padded {
        /// 100 bytes.
        pub a: [u8; 100],
        /// 40 bytes.
        pub b: [u32; 10],
        /// 6 bytes at 1024.
        #[layout(align = 1024)]
        pub c: [u16; 3],
    }

    /// A const-generic frame: one parameter per distinct length.
    #[derive(DeviceLayout)]
    pub struct Frame<const PIXELS: usize, const BYTES: usize> {
        /// Interleaved RGB.
        pub rgb: [u8; BYTES],
        /// Grayscale.
        pub gray: [f32; PIXELS],
        /// Histogram on its own 4 KiB page.
        #[layout(align = 4096)]
        pub hist: [u32; 256],
    }

    /// A 640×480 [`Frame`].
    pub type FrameVga = Frame<{ 640 * 480 }, { 640 * 480 * 3 }>;
    /// A 100×100 [`Frame`].
    pub type FrameTiny = Frame<{ 100 * 100 }, { 100 * 100 * 3 }>;

    /// No fields at all.
    #[derive(DeviceLayout)]
    pub struct Empty {}
}

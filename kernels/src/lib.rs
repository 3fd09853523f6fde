//! PTX kernels for devarena, embedded as text so building needs no CUDA toolkit, and their host
//! reference implementations.
//!
//! * [`pipeline`]: a 1080p image pipeline (grayscale, Gaussian blur, Sobel, histogram, Otsu,
//!   edge mask) whose every buffer lives in one [`pipeline::Frame`] arena. [`pipeline::host`]
//!   runs it anywhere; with feature `cuda`, `pipeline::cuda` runs the same stages as PTX kernels
//!   that compute the same bits.

pub mod pipeline;

/// The cudarc this crate's launch wrappers are written against (0.19), for naming its traits
/// (`DevicePtr`, `DevicePtrMut`) and types without a separate dependency.
#[cfg(feature = "cuda")]
pub use cudarc;

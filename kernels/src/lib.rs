//! PTX kernels for devarena, embedded as text so building needs no CUDA toolkit, and their host
//! reference implementations.
//!
//! * [`pipeline`]: an image pipeline (grayscale, Gaussian blur, Sobel, histogram, Otsu, edge
//!   mask) whose every buffer lives in one [`pipeline::Frame`] arena, or in the aliased
//!   [`pipeline::FrameStaged`] arena whose later stages reuse the bytes of dead buffers; the
//!   layouts are planned for 3840×2160 and each image runs at its own size.
//!   [`pipeline::host`] runs it anywhere; with feature `cuda`, `pipeline::cuda` runs the same
//!   stages as PTX kernels that compute the same bits, launched eagerly or replayed from a CUDA
//!   graph of the arena.
//! * `verify` (feature `cuda`): the hardware verifier. PTX kernels prove on a real GPU that
//!   every view of an arena honours its promised alignment (with the widest vector access it
//!   permits), that no two views overlap, and (sm_90) that the bulk tensor copy engine accepts
//!   every view aligned to 16 bytes or more; for a layout with stages, per stage
//!   (`verify_stages`).
//!
//! The CUDA C sources are in `kernels/cuda/`, the committed PTX in `kernels/ptx/`, and
//! `kernels/build-ptx.sh` regenerates the PTX with the exact commands.

pub mod pipeline;

#[cfg(feature = "cuda")]
pub mod verify;

#[cfg(feature = "cuda")]
pub use verify::{Report, StagesReport, Verifier, VerifyTarget, verify, verify_stages};

/// The cudarc this crate's launch wrappers are written against (0.19), for naming its traits
/// (`DevicePtr`, `DevicePtrMut`) and types without a separate dependency.
#[cfg(feature = "cuda")]
pub use cudarc;

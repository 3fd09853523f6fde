//! PTX kernels for devarena, embedded as text so building needs no CUDA toolkit.
//!
//! * [`verify`] (feature `cuda`): the hardware verifier. PTX kernels prove on a real GPU that
//!   every view of an arena honours its promised alignment (with the widest vector access it
//!   permits), that no two views overlap, and (sm_90) that the bulk tensor copy engine accepts
//!   every view aligned to 16 bytes or more.
//!
//! The CUDA C sources are in `kernels/cuda/`, the committed PTX in `kernels/ptx/`, and
//! `kernels/build-ptx.sh` regenerates the PTX with the exact commands.

#[cfg(feature = "cuda")]
pub mod verify;

#[cfg(feature = "cuda")]
pub use verify::{Report, Verifier, verify};

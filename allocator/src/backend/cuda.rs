//! The CUDA backends.

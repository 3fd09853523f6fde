//! PTX kernels for devarena, embedded as text so building needs no CUDA toolkit.

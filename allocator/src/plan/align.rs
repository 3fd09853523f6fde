//! Alignment arithmetic: the one home of the numbers and the rounding that the planner, the
//! pool, its TLSF index and the backends share.

/// What `cuMemAlloc`, `cuMemAllocAsync` and `cuMemAllocManaged` guarantee: every address they
/// return is a multiple of 256 bytes. devarena's default buffer alignment and the pool's block
/// granule are this number, so a view or a pool block can go anywhere a `cudaMalloc` pointer
/// can.
pub const CUDA_ALIGN: usize = 256;

/// The alignment of every buffer that asks for nothing else: what `cudaMalloc` guarantees, so a
/// view can go anywhere a `cudaMalloc` pointer can (cuBLAS, cuDNN, TMA, TensorRT).
pub const DEFAULT_ALIGN: usize = CUDA_ALIGN;

/// The largest alignment the planner accepts (1 GiB); larger requests are almost always a typo.
pub const MAX_ALIGN: usize = 1 << 30;

/// Whether `align` is an alignment the planner accepts: a power of two up to [`MAX_ALIGN`].
///
/// ```
/// use devarena::plan::is_valid_align;
/// assert!(is_valid_align(1) && is_valid_align(256) && is_valid_align(1 << 30));
/// assert!(!is_valid_align(0) && !is_valid_align(48) && !is_valid_align(1 << 31));
/// ```
pub const fn is_valid_align(align: usize) -> bool {
    align.is_power_of_two() && align <= MAX_ALIGN
}

/// Rounds `value` up to a multiple of `align` (a power of two); `None` on overflow.
///
/// ```
/// assert_eq!(devarena::plan::align_up(0, 256), Some(0));
/// assert_eq!(devarena::plan::align_up(257, 256), Some(512));
/// assert_eq!(devarena::plan::align_up(usize::MAX, 2), None);
/// ```
pub const fn align_up(value: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    match value.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

/// [`align_up`] for addresses (`u64`: a host address or a `CUdeviceptr`, whatever the width of
/// `usize`).
///
/// ```
/// assert_eq!(devarena::plan::align_up_u64(0x1001, 0x1000), Some(0x2000));
/// assert_eq!(devarena::plan::align_up_u64(u64::MAX, 2), None);
/// ```
#[inline]
pub const fn align_up_u64(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    match value.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_and_detects_overflow() {
        assert_eq!(align_up(1, 1), Some(1));
        assert_eq!(align_up(1, 256), Some(256));
        assert_eq!(align_up(256, 256), Some(256));
        assert_eq!(align_up(usize::MAX - 254, 256), None);
        assert_eq!(align_up(usize::MAX - 255, 256), Some(usize::MAX - 255));
        assert_eq!(align_up_u64(u64::MAX - 254, 256), None);
        assert_eq!(align_up_u64(4097, 4096), Some(8192));
    }
}

//! The host backend: aligned, zeroed host memory. The embedded default.

use alloc::alloc::{Layout, alloc_zeroed, dealloc};
use alloc::format;
use alloc::sync::Arc;

use super::{Allocation, Backend, BackendStats, Counters, DirectViews, MemoryKind};
use crate::error::Error;
use crate::layout::{HostBase, HostMut, HostRef};
use crate::plan::align_up_u64;

/// Alignments up to this come from the global allocator's zeroing path as they are (`calloc`);
/// larger ones are reached by asking for that much more at this alignment and aligning the
/// address, so the memory still comes zeroed from `calloc`, whose large blocks are fresh pages
/// that stay untouched until used, instead of an aligned allocation zeroed byte by byte up
/// front (which touches every page of it: a huge arena on a machine that overcommits memory
/// would be killed for it instead of failing or costing nothing).
const CALLOC_ALIGN: usize = 16;

/// The layout asked of the global allocator for `bytes` at `align`; `None` when `align` is not
/// a power of two or the numbers overflow.
fn raw_layout(bytes: usize, align: usize) -> Option<Layout> {
    if !align.is_power_of_two() {
        return None;
    }
    if align <= CALLOC_ALIGN {
        return Layout::from_size_align(bytes, align).ok();
    }
    let padded = bytes.checked_add(align - CALLOC_ALIGN)?;
    // The aligned end must stay below `isize::MAX` as a layout of `bytes` at `align` would.
    Layout::from_size_align(bytes, align).ok()?;
    Layout::from_size_align(padded, CALLOC_ALIGN).ok()
}

/// Aligned host memory from the global allocator, zeroed so every view starts readable.
///
/// Clones share their counters, so a test can keep a clone and watch what an arena did with the
/// other:
///
/// ```
/// use devarena::{Arena, DeviceLayout, HostBackend};
///
/// #[derive(DeviceLayout)]
/// struct Pair { a: [u32; 100], b: [f32; 100] }
///
/// let backend = HostBackend::new();
/// {
///     let mut arena = Arena::<Pair>::new_in(backend.clone())?;
///     let views = arena.views_mut();
///     views.a.fill(7);
///     views.b.fill(0.5);
/// }
/// let stats = backend.stats();
/// assert_eq!((stats.allocations, stats.frees), (1, 1));
/// # Ok::<(), devarena::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct HostBackend {
    counters: Arc<Counters>,
}

impl HostBackend {
    /// A backend with fresh counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// What this backend (and its clones) did so far.
    pub fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }
}

// SAFETY: nothing but the borrow checker stands between the host and its own memory.
unsafe impl DirectViews for HostBackend {}

// SAFETY: `allocate` returns a fresh region from the global allocator, at least `bytes` long
// from an address aligned to `align` (over-allocating for alignments above 16), or a dangling,
// aligned address for zero bytes, which no view dereferences; `base_*` address exactly that
// region.
unsafe impl Backend for HostBackend {
    type Mut = HostMut;
    type Ref = HostRef;

    fn name(&self) -> &'static str {
        "host"
    }

    fn memory(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error> {
        let layout = raw_layout(bytes, align).ok_or_else(|| {
            self.counters.failed();
            Error::invalid(format!(
                "host backend: {bytes} bytes at alignment {align} is not a valid allocation \
                 (alignment must be a power of two; size rounded up must fit in isize)"
            ))
        })?;
        if bytes == 0 {
            self.counters.allocated(0);
            return Ok(Allocation {
                addr: align as u64,
                raw_addr: align as u64,
                bytes,
                align,
            });
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            self.counters.failed();
            return Err(Error::OutOfMemory {
                backend: "host",
                requested: bytes,
                free: None,
                detail: None,
            });
        }
        self.counters.allocated(bytes);
        let raw = ptr as u64;
        Ok(Allocation {
            // Inside the over-allocation (`raw_layout`), so it cannot overflow.
            addr: align_up_u64(raw, align as u64).unwrap_or(raw),
            raw_addr: raw,
            bytes,
            align,
        })
    }

    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        if allocation.bytes != 0 {
            if let Some(layout) = raw_layout(allocation.bytes, allocation.align) {
                // SAFETY: the allocation came from `allocate` with this size and alignment,
                // which gave this same layout, at `raw_addr`, and is freed once (the caller's
                // contract).
                unsafe { dealloc(allocation.raw_addr as usize as *mut u8, layout) };
            }
        }
        self.counters.freed(allocation.bytes);
        Ok(())
    }

    unsafe fn base_mut<'a>(&'a self, allocation: &Allocation) -> HostBase<'a> {
        // SAFETY: the caller keeps the allocation live and exclusively borrowed for `'a`.
        unsafe { HostBase::new(allocation.addr as usize as *mut u8) }
    }

    unsafe fn base_ref<'a>(&'a self, allocation: &Allocation) -> HostBase<'a> {
        // SAFETY: the caller keeps the allocation live and unwritten for `'a`.
        unsafe { HostBase::new(allocation.addr as usize as *mut u8) }
    }

    fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }
}

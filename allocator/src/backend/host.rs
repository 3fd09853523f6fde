//! The host backend: aligned, zeroed host memory. The embedded default.

use alloc::alloc::{Layout, alloc_zeroed, dealloc};
use alloc::format;
use alloc::sync::Arc;

use super::{Allocation, Backend, BackendStats, Counters, DirectViews, MemoryKind};
use crate::error::Error;
use crate::layout::{HostBase, HostMut, HostRef};

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

// SAFETY: `allocate` returns a fresh region from the global allocator with the requested size
// and alignment (or a dangling, aligned address for zero bytes, which no view dereferences);
// `base_*` address exactly that region.
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
        let layout = Layout::from_size_align(bytes, align).map_err(|_| {
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
        Ok(Allocation {
            addr: ptr as u64,
            raw_addr: ptr as u64,
            bytes,
            align,
        })
    }

    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        if allocation.bytes != 0 {
            // SAFETY: the allocation came from `allocate` with this size and alignment, which
            // formed a valid layout, and is freed once (the caller's contract).
            unsafe {
                dealloc(
                    allocation.addr as usize as *mut u8,
                    Layout::from_size_align_unchecked(allocation.bytes, allocation.align),
                );
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

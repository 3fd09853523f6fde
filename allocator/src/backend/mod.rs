//! Backends: where an arena's one allocation comes from.
//!
//! | backend | allocation |
//! | --- | --- |
//! | [`HostBackend`] | aligned, zeroed host memory (`alloc::alloc`): runs anywhere, the reference for tests |
//! | `CudaBackend` (feature `cuda`) | `cuMemAlloc` or `cuMemAllocAsync` through cudarc |
//! | `ManagedBackend` (feature `cuda`) | `cuMemAllocManaged` |
//! | `PinnedBackend` (feature `cuda`) | `cuMemHostAlloc` |
//!
//! A backend knows nothing of the arenas and pools that use it: it hands out allocations,
//! the bases views are cut from, and says what kind of memory it holds ([`MemoryKind`]).
//!
//! Beside the backends, [`VirtualMemory`]: address space reserved once and backed in chunks
//! on demand, what a growable pool region is made of (`CudaVirtualMemory` with `cuda`, and a
//! host stand-in for tests, [`HostVirtualMemory`]).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::error::Error;
use crate::layout::ViewKind;

mod host;
mod virtual_memory;
pub use host::HostBackend;
pub use virtual_memory::VirtualMemory;
#[cfg(feature = "std")]
pub use virtual_memory::{HostVirtualMemory, VmCall};

#[cfg(feature = "cuda")]
pub mod cuda;

/// One allocation made by a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Start address (host address or `CUdeviceptr`), aligned to `align`.
    pub addr: u64,
    /// The address the underlying allocator returned (what is freed); below `addr` when the
    /// backend over-allocated to reach an alignment its allocator does not guarantee.
    pub raw_addr: u64,
    /// Bytes requested.
    pub bytes: usize,
    /// Alignment requested.
    pub align: usize,
}

/// What kind of memory a backend hands out: what the code above a backend may do with an
/// address without asking the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Plain host memory: the CPU may read and write it whenever Rust's borrows allow.
    Host,
    /// Device memory (`cuMemAlloc`, `cuMemAllocAsync`): only kernels and copies reach it.
    Device,
    /// Managed (unified) memory: one address for the host and the device, migrated on demand.
    Managed,
    /// Page-locked host memory: the CPU reaches it, and so do asynchronous copies and kernels
    /// (through its mapped device address), so host access waits for the stream first.
    Pinned,
}

impl MemoryKind {
    /// Whether device code reaches the memory at the address the backend returned (device and
    /// managed memory; pinned memory has a device address of its own).
    pub fn is_device_addressable(self) -> bool {
        matches!(self, MemoryKind::Device | MemoryKind::Managed)
    }
}

/// A source of memory for arenas and pools.
///
/// A backend counts what it does ([`BackendStats`]), so a test can prove that a whole layout
/// took exactly one allocation, and a pipeline can prove it allocates nothing after setup.
///
/// # Safety
///
/// `allocate` must return a region of at least `bytes` bytes aligned to `align` that stays valid
/// until it is passed to `deallocate`, and no two live regions may overlap. `base_mut` and
/// `base_ref` must address that region. `memory` must tell the truth: code above the backend
/// hands out `&mut [T]` and `&[T]` over an allocation of [`MemoryKind::Host`] (for element
/// types that accept every bit pattern), so such an allocation must be initialized host memory
/// (zeroed, as [`HostBackend`]'s is, or filled): reading never-written bytes would be undefined
/// behaviour.
pub unsafe trait Backend {
    /// The views a mutable borrow of an arena hands out.
    type Mut: ViewKind;
    /// The views a shared borrow of an arena hands out.
    type Ref: ViewKind;

    /// A short name for messages and reports ("host", "cuda", ...).
    fn name(&self) -> &'static str;

    /// The kind of memory the allocations are.
    fn memory(&self) -> MemoryKind;

    /// Allocates `bytes` bytes aligned to `align` (a power of two). `bytes` may be zero.
    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error>;

    /// Frees an allocation made by this backend.
    ///
    /// # Safety
    ///
    /// `allocation` must come from `allocate` on this backend and not have been freed; no view
    /// of it may be used afterwards.
    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error>;

    /// Makes `allocation` ready for views: waits for whatever may still use it where the
    /// views give the host direct access (pinned memory waits for its stream). An error (a
    /// failed wait) means no view may be made. Nothing to do for most backends, which
    /// implement [`DirectViews`].
    fn ready(&self, allocation: &Allocation) -> Result<(), Error> {
        let _ = allocation;
        Ok(())
    }

    /// The base of an allocation for mutable views.
    ///
    /// # Safety
    ///
    /// `allocation` must be live for `'a`, and the caller must hold it exclusively for `'a`.
    /// Unless the backend implements [`DirectViews`], [`ready`](Self::ready) must have returned
    /// `Ok` for it under the same exclusive hold.
    unsafe fn base_mut<'a>(&'a self, allocation: &Allocation) -> <Self::Mut as ViewKind>::Base<'a>;

    /// The base of an allocation for shared views.
    ///
    /// # Safety
    ///
    /// `allocation` must be live for `'a`, and nothing may write it during `'a`. Unless the
    /// backend implements [`DirectViews`], [`ready`](Self::ready) must have returned `Ok` for
    /// it since anything last wrote it.
    unsafe fn base_ref<'a>(&'a self, allocation: &Allocation) -> <Self::Ref as ViewKind>::Base<'a>;

    /// What the backend has done so far.
    fn stats(&self) -> BackendStats;
}

/// A backend whose views need no fallible step first: [`Backend::ready`] always succeeds and
/// [`Backend::base_mut`] / [`Backend::base_ref`] may be called without it. Arenas on these
/// backends hand out views infallibly (`Arena::views_mut`); on the others (pinned memory,
/// which waits for its stream before the host touches it) through `Arena::try_views_mut`.
///
/// # Safety
///
/// `ready` must have nothing to do: views made from `base_mut`/`base_ref` alone must be sound
/// under the borrows the caller holds.
#[diagnostic::on_unimplemented(
    message = "views of `{Self}` memory need a fallible step first",
    label = "the host reaches this memory only after waiting for its stream",
    note = "use `try_views_mut()` / `try_views()` (or `try_stage_mut::<S>()`), which return the wait's error"
)]
pub unsafe trait DirectViews: Backend {}

/// Counters every backend keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Successful allocations.
    pub allocations: u64,
    /// Frees done (a free the driver refused is not counted: its memory is still allocated).
    pub frees: u64,
    /// Failed allocations.
    pub failures: u64,
    /// Bytes currently allocated.
    pub live_bytes: usize,
    /// Most bytes allocated at once.
    pub peak_bytes: usize,
}

impl BackendStats {
    /// Allocations not yet freed. The counters are read one by one while other threads may
    /// allocate and free, so a snapshot can hold a free whose allocation it missed: that
    /// counts as none live, not an overflow.
    pub fn live_allocations(&self) -> u64 {
        self.allocations.saturating_sub(self.frees)
    }
}

/// Lock-free counters a backend embeds (shared between clones of the backend).
#[derive(Debug, Default)]
pub struct Counters {
    allocations: AtomicU64,
    frees: AtomicU64,
    failures: AtomicU64,
    live_bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
}

impl Counters {
    /// Records a successful allocation of `bytes`.
    pub fn allocated(&self, bytes: usize) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let live = self.live_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_bytes.fetch_max(live, Ordering::Relaxed);
    }

    /// Records a free of `bytes`.
    pub fn freed(&self, bytes: usize) {
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Records a failed allocation.
    pub fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot.
    pub fn snapshot(&self) -> BackendStats {
        BackendStats {
            allocations: self.allocations.load(Ordering::Relaxed),
            frees: self.frees.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            live_bytes: self.live_bytes.load(Ordering::Relaxed),
            peak_bytes: self.peak_bytes.load(Ordering::Relaxed),
        }
    }
}

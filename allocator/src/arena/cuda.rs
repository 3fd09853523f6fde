//! CUDA conveniences for arenas: prefetching and host views of managed arenas, device views of
//! pinned arenas. They go through what the backends offer; no driver call happens here.

use super::{Arena, Disjoint};
use crate::backend::cuda::{CudaMut, ManagedBackend, PinnedBackend};
use crate::error::Error;
use crate::layout::{HostMut, HostRef};

impl<L: Disjoint> Arena<L, ManagedBackend> {
    /// Queues a migration of the whole arena to the device on the arena's stream: call it after
    /// the host has written its inputs and before the kernels run.
    pub fn prefetch_to_device(&self) -> Result<(), Error> {
        self.backend().prefetch(&self.allocation(), true)
    }

    /// Migrates the whole arena to host memory and waits, so the host reads without faults.
    pub fn prefetch_to_host(&self) -> Result<(), Error> {
        self.backend().prefetch(&self.allocation(), false)?;
        self.backend().synchronize()
    }

    /// Host views of every field. Waits for the arena's stream first, so no kernel of this
    /// stream still uses the memory while the host touches it.
    pub fn host_views_mut(&mut self) -> Result<L::Views<'_, HostMut>, Error> {
        // SAFETY: the allocation is live and exclusively borrowed for the views' lifetime.
        let base = unsafe { self.backend.host_base(&self.allocation)? };
        // SAFETY: the base addresses `L::SIZE` bytes at `L::ALIGN`, exclusively borrowed;
        // `L: Disjoint` means no two fields share bytes.
        Ok(unsafe { L::views::<HostMut>(base) })
    }

    /// Read-only host views (waits for the arena's stream first).
    pub fn host_views(&self) -> Result<L::Views<'_, HostRef>, Error> {
        // SAFETY: the allocation is live and borrowed for the views' lifetime; a shared borrow
        // lets nothing write it through the arena.
        let base = unsafe { self.backend.host_base(&self.allocation)? };
        // SAFETY: as above, with shared views.
        Ok(unsafe { L::views::<HostRef>(base) })
    }
}

impl<L: Disjoint> Arena<L, PinnedBackend> {
    /// Device views of the pinned memory (zero-copy access from kernels through the mapped
    /// address), ordered on the arena's stream.
    pub fn device_views_mut(&mut self) -> Result<L::Views<'_, CudaMut>, Error> {
        // SAFETY: the allocation is live and exclusively borrowed for the views' lifetime.
        let base = unsafe { self.backend.mapped_base(&self.allocation)? };
        // SAFETY: the mapped base addresses the arena's `L::SIZE` bytes, exclusively borrowed;
        // `L: Disjoint` means no two fields share bytes.
        Ok(unsafe { L::views::<CudaMut>(base) })
    }
}

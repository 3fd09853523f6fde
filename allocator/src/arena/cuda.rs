//! CUDA conveniences for arenas: prefetching and host views of managed arenas, device views of
//! pinned arenas. They go through what the backends offer; no driver call happens here.

use alloc::sync::Arc;
use core::ops::{Deref, DerefMut};

use super::{Arena, Disjoint, Stage};
use crate::backend::DirectViews;
use crate::backend::cuda::{
    CudaBase, CudaMut, CudaStream, ManagedBackend, PinnedBackend, StreamOrdered, order_streams,
};
use crate::error::Error;
use crate::layout::{DeviceLayout, HostMut, HostRef};

/// Views of an arena made for another stream than the arena's ([`Arena::views_mut_on`]):
/// they dereference to the views, whose stream is that other stream. When they are dropped,
/// the arena's stream waits for everything queued on the other stream so far, so work queued
/// on the arena's stream afterwards runs after it.
pub struct OnStream<'a, V> {
    views: V,
    arena_stream: &'a Arc<CudaStream>,
    stream: &'a Arc<CudaStream>,
}

impl<V> Deref for OnStream<'_, V> {
    type Target = V;
    fn deref(&self) -> &V {
        &self.views
    }
}

impl<V> DerefMut for OnStream<'_, V> {
    fn deref_mut(&mut self) -> &mut V {
        &mut self.views
    }
}

impl<V> core::fmt::Debug for OnStream<'_, V> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OnStream")
            .field("arena_stream", &self.arena_stream.cu_stream())
            .field("stream", &self.stream.cu_stream())
            .finish_non_exhaustive()
    }
}

impl<V> Drop for OnStream<'_, V> {
    fn drop(&mut self) {
        // A failure here is the driver's (a broken context): kept in the context's error
        // state, where the next call on it reports it.
        if let Err(error) = order_streams(self.arena_stream, self.stream) {
            log::error!(
                target: "devarena::arena",
                "ordering the arena's stream after the views' stream failed: {error}"
            );
        }
    }
}

impl<L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> Arena<L, B> {
    /// Mutable device views of every field for work on `stream`, another stream than the
    /// arena's: `stream` first waits for everything queued on the arena's stream, the views
    /// carry `stream` (so kernels launched and copies queued on it with them are ordered), and
    /// when they are dropped the arena's stream waits for `stream`. An error when the first
    /// wait cannot be queued; `stream` must belong to the arena's device.
    pub fn views_mut_on<'a>(
        &'a mut self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<OnStream<'a, L::Views<'a, CudaMut>>, Error>
    where
        L: Disjoint,
    {
        let base = self.base_on(stream)?;
        // SAFETY: the base addresses the arena's `L::SIZE` bytes, exclusively borrowed for
        // `'a`; `L: Disjoint` means no two fields share bytes; `B: DirectViews` needs no
        // `ready`.
        let views = unsafe { L::views::<CudaMut>(base) };
        Ok(OnStream {
            views,
            arena_stream: self.backend.stream(),
            stream,
        })
    }

    /// [`stage_mut`](Arena::stage_mut) for work on another stream, ordered as
    /// [`views_mut_on`](Self::views_mut_on).
    pub fn stage_mut_on<'a, const S: usize>(
        &'a mut self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<OnStream<'a, <L as Stage<S>>::StageViews<'a, CudaMut>>, Error>
    where
        L: Stage<S>,
    {
        let base = self.base_on(stream)?;
        // SAFETY: as `views_mut_on`; the fields of one stage are disjoint (`Stage`'s contract).
        let views = unsafe { L::stage_views::<CudaMut>(base) };
        Ok(OnStream {
            views,
            arena_stream: self.backend.stream(),
            stream,
        })
    }

    /// Orders `stream` after the arena's stream and returns the base of views ordered on it.
    fn base_on<'a>(&'a self, stream: &'a Arc<CudaStream>) -> Result<CudaBase<'a>, Error> {
        if stream.context().ordinal() != self.backend.stream().context().ordinal() {
            return Err(Error::invalid(alloc::format!(
                "arena of `{}`: views for a stream of device {} were asked for; the arena lives \
                 on device {}",
                L::NAME,
                stream.context().ordinal(),
                self.backend.stream().context().ordinal()
            )));
        }
        order_streams(stream, self.backend.stream())?;
        // SAFETY: the arena's allocation, device memory of this device (`B::Mut` is
        // `CudaMut`), live and borrowed as the caller's borrow of the arena says.
        Ok(unsafe { CudaBase::new(self.allocation.addr, stream) })
    }
}

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

//! CUDA conveniences for arenas: views for another stream ([`Arena::views_mut_on`],
//! [`Arena::stage_mut_on`]), prefetching and host views of managed arenas, device views of
//! pinned arenas. They go through what the backends offer; no driver call happens here.

use alloc::sync::Arc;

use super::{Arena, Disjoint, Stage};
use crate::backend::DirectViews;
use crate::backend::cuda::{
    CudaBase, CudaMut, CudaStream, ManagedBackend, PinnedBackend, StreamOrdered, order_streams,
    synchronize_stream,
};
use crate::error::Error;
use crate::layout::{DeviceLayout, HostMut, HostRef};

impl<L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> Arena<L, B> {
    /// Runs `f` with mutable device views of every field made for `stream`, another stream
    /// than the arena's, and orders that work both ways:
    ///
    /// * before `f` runs, `stream` waits for everything queued on the arena's stream so far;
    /// * the views carry `stream`, so kernels launched and copies queued on it with them are
    ///   ordered there;
    /// * once `f` has returned — or panicked — the arena's stream waits for everything queued
    ///   on `stream` so far, so what is queued on the arena's stream afterwards (work with the
    ///   arena's views, a managed arena's [`host_views`](Arena::host_views), the arena's free)
    ///   runs after `f`'s work.
    ///
    /// As with `std::thread::scope`, the views live only inside `f`: they cannot be kept past
    /// it, and nothing the caller holds can skip the final wait.
    ///
    /// Returns what `f` returns. Errors:
    ///
    /// * `stream` belongs to another context than the arena's (another device, say), or the
    ///   first wait cannot be queued: `f` is not called;
    /// * `f`'s own error, after the final wait;
    /// * the final wait cannot be queued (a driver failure): its error comes back instead of
    ///   `f`'s result, which is dropped. The host then waits for `stream` to finish
    ///   (`cuStreamSynchronize`) before returning, so the arena's later work still runs after
    ///   `f`'s; should that fail too, the context is broken and refuses further work.
    ///
    /// ```no_run
    /// use devarena::backend::cuda::{CudaBackend, cuda_stream};
    /// use devarena::{Arena, DeviceLayout};
    ///
    /// #[derive(DeviceLayout)]
    /// struct Frame {
    ///     gray: [f32; 1024],
    /// }
    ///
    /// let stream = cuda_stream(0)?;
    /// let other = stream.context().new_stream().map_err(|e| {
    ///     devarena::backend::cuda::driver_error("cuStreamCreate", e)
    /// })?;
    /// let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream))?;
    /// arena.views_mut().gray.upload(&[1.0; 1024])?; // on the arena's stream
    /// let words = arena.views_mut_on(&other, |mut v| {
    ///     // Queued on `other`, after the upload; kernels go `other.launch_builder(..).arg(&v.gray)`.
    ///     v.gray.fill_bytes(0)?;
    ///     Ok(v.gray.len())
    /// })?;
    /// // On the arena's stream again, after the fill on `other`.
    /// assert_eq!(arena.views().gray.to_vec()?, vec![0.0; words]);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn views_mut_on<R>(
        &mut self,
        stream: &Arc<CudaStream>,
        f: impl FnOnce(L::Views<'_, CudaMut>) -> Result<R, Error>,
    ) -> Result<R, Error>
    where
        L: Disjoint,
    {
        let after = self.backend.stream().clone();
        self.views_mut_after(&after, stream, f)
    }

    /// [`views_mut_on`](Self::views_mut_on), with `stream` ordered after `after` (the arena's
    /// stream, or the stream a capture records) and `after` after it.
    pub(super) fn views_mut_after<R>(
        &mut self,
        after: &Arc<CudaStream>,
        stream: &Arc<CudaStream>,
        f: impl FnOnce(L::Views<'_, CudaMut>) -> Result<R, Error>,
    ) -> Result<R, Error>
    where
        L: Disjoint,
    {
        let base = self.base_on(after, stream)?;
        let join = JoinOnExit::new(after, stream);
        // SAFETY: the base addresses the arena's `L::SIZE` bytes, exclusively borrowed (`&mut
        // self`) until this call returns, and `f` cannot keep the views past its own return
        // (it must accept them for any lifetime, so none can be named outside it); `L:
        // Disjoint` means no two fields share bytes; `B: DirectViews` needs no `ready`. The
        // device work queued with them on `stream` runs after the arena's earlier work
        // (`base_on`) and before its later work: `join` makes the arena's stream wait for
        // `stream` on every way out of `f`, returning or unwinding.
        let views = unsafe { L::views::<CudaMut>(base) };
        let result = f(views);
        join.finish()?;
        result
    }

    /// [`stage_mut`](Arena::stage_mut) for work on another stream, run in `f` and ordered as
    /// [`views_mut_on`](Self::views_mut_on): `arena.stage_mut_on::<1, _>(&other, |v| ..)` (the
    /// `_` is `f`'s result type, left to inference: a turbofish names every generic argument).
    pub fn stage_mut_on<const S: usize, R>(
        &mut self,
        stream: &Arc<CudaStream>,
        f: impl FnOnce(<L as Stage<S>>::StageViews<'_, CudaMut>) -> Result<R, Error>,
    ) -> Result<R, Error>
    where
        L: Stage<S>,
    {
        let after = self.backend.stream().clone();
        self.stage_mut_after::<S, R>(&after, stream, f)
    }

    /// [`stage_mut_on`](Self::stage_mut_on), ordered as
    /// [`views_mut_after`](Self::views_mut_after).
    pub(super) fn stage_mut_after<const S: usize, R>(
        &mut self,
        after: &Arc<CudaStream>,
        stream: &Arc<CudaStream>,
        f: impl FnOnce(<L as Stage<S>>::StageViews<'_, CudaMut>) -> Result<R, Error>,
    ) -> Result<R, Error>
    where
        L: Stage<S>,
    {
        let base = self.base_on(after, stream)?;
        let join = JoinOnExit::new(after, stream);
        // SAFETY: as in `views_mut_on` (the same borrow, the same join on every way out of
        // `f`); the fields of one stage are disjoint (`Stage`'s contract).
        let views = unsafe { L::stage_views::<CudaMut>(base) };
        let result = f(views);
        join.finish()?;
        result
    }

    /// Orders `stream` after `after` (the arena's stream, or a capture's) and returns the base
    /// of views ordered on it. CUDA's per-thread default stream is refused: it names another
    /// stream on each thread, and the views may be sent to one.
    fn base_on<'a>(
        &'a self,
        after: &CudaStream,
        stream: &'a Arc<CudaStream>,
    ) -> Result<CudaBase<'a>, Error> {
        if crate::backend::cuda::is_per_thread(stream) {
            return Err(Error::invalid(alloc::format!(
                "arena of `{}`: views for CUDA's per-thread default stream were asked for, \
                 which names a different stream on each thread (the views may be sent to \
                 another): use a stream of your own (`ctx.new_stream()`)",
                L::NAME
            )));
        }
        let (theirs, ours) = (stream.context(), self.backend.stream().context());
        // The context, not only the device: the arena's addresses mean nothing in another
        // context, even one of the same device.
        if theirs.cu_ctx() != ours.cu_ctx() {
            return Err(Error::invalid(alloc::format!(
                "arena of `{}`: views for a stream of {} were asked for; the arena lives in the \
                 context of device {}",
                L::NAME,
                if theirs.ordinal() == ours.ordinal() {
                    alloc::format!("another context of device {}", theirs.ordinal())
                } else {
                    alloc::format!("device {}", theirs.ordinal())
                },
                ours.ordinal()
            )));
        }
        order_streams(stream, after)?;
        // SAFETY: the arena's allocation, device memory of this device (`B::Mut` is
        // `CudaMut`), live and borrowed as the caller's borrow of the arena says.
        Ok(unsafe { CudaBase::new(self.allocation.addr, stream) })
    }
}

/// The final wait of [`Arena::views_mut_on`]: the arena's stream waits for the views' stream
/// when [`finish`](Self::finish) is called or, if the closure panicked, when this is dropped
/// during the unwinding. Private, so no caller can leak it and skip the wait.
struct JoinOnExit<'a> {
    arena_stream: &'a CudaStream,
    stream: &'a CudaStream,
    done: bool,
}

impl<'a> JoinOnExit<'a> {
    fn new(arena_stream: &'a CudaStream, stream: &'a CudaStream) -> Self {
        JoinOnExit {
            arena_stream,
            stream,
            done: false,
        }
    }

    /// The wait, its error returned.
    fn finish(mut self) -> Result<(), Error> {
        self.done = true;
        join(self.arena_stream, self.stream)
    }
}

impl Drop for JoinOnExit<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Only while a panic of the closure unwinds: the error cannot be returned, so it is
        // logged.
        if let Err(error) = join(self.arena_stream, self.stream) {
            log::error!(
                target: "devarena::arena",
                "ordering the arena's stream after the views' stream failed: {error}"
            );
        }
    }
}

/// Makes `arena_stream` wait for everything queued on `stream`. When the driver cannot queue
/// the wait (creating the event can fail), the host waits for `stream` instead, so the order
/// holds anyway; the first error comes back either way.
fn join(arena_stream: &CudaStream, stream: &CudaStream) -> Result<(), Error> {
    order_streams(arena_stream, stream).inspect_err(|_| {
        if let Err(error) = synchronize_stream(stream) {
            log::error!(
                target: "devarena::arena",
                "waiting on the host for the views' stream failed too: {error}"
            );
        }
    })
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

//! [`Arena`]: one allocation of a layout's `SIZE`, sliced into typed views.

use core::fmt;
use core::marker::PhantomData;

use crate::backend::{Allocation, Backend, DirectViews, HostBackend};
use crate::error::Error;
use crate::layout::{DeviceLayout, FieldPlacement, ViewKind};

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod graph;
#[cfg(feature = "cuda")]
pub use graph::{ArenaGraph, Capture};

/// Marks layouts in which every field has bytes of its own (no stages, so no sharing): only
/// these hand out all their views at once. The derive implements it for layouts without
/// `#[layout(stages = ..)]`.
///
/// # Safety
///
/// [`Arena::views_mut`] hands out a `&mut` view of every field at once, so an implementation
/// promises that no two fields of [`DeviceLayout::FIELDS`] share a byte (their
/// `offset..offset + size` ranges are pairwise disjoint) and that [`DeviceLayout::views`] makes
/// each view from its own field's range. A layout with stages shares bytes between fields and
/// must not implement it; leave the impl to `#[derive(DeviceLayout)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` shares bytes between fields whose stages never meet",
    label = "its views are handed out per stage",
    note = "use the arena's stage views (`stage_mut::<K>()`) for a layout with stages"
)]
pub unsafe trait Disjoint: DeviceLayout {}

/// The fields of a layout live in stage `S`: what `#[derive(DeviceLayout)]` generates for each
/// stage of a `#[layout(stages = N)]` layout. Fields live in the same stage all meet, so the
/// planner kept them apart: their views are disjoint.
///
/// # Safety
///
/// [`stage_views`](Self::stage_views) makes views of fields live in stage `S` only, each from
/// its own placement in [`DeviceLayout::FIELDS`], and no two of them share a byte: the arena
/// hands them out mutably together. Leave the impl to `#[derive(DeviceLayout)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no stage {S}",
    label = "stages are numbered from 0 to `#[layout(stages = N)]` minus one",
    note = "a layout without `#[layout(stages = ..)]` has no stages: use `views_mut()`"
)]
pub unsafe trait Stage<const S: usize>: DeviceLayout {
    /// The generated views struct of the fields live in stage `S`.
    type StageViews<'a, K: ViewKind>;

    /// Slices the region at `base` into the views of the fields live in stage `S`.
    ///
    /// # Safety
    ///
    /// `base` must address a region of at least `SIZE` bytes aligned to `ALIGN` that stays
    /// valid and, for mutable kinds, unaliased for `'a` (the fields of one stage share no
    /// byte, so any layout may make them).
    unsafe fn stage_views<'a, K: ViewKind>(base: K::Base<'a>) -> Self::StageViews<'a, K>;
}

/// Exactly one backing allocation of `L::SIZE` bytes at `L::ALIGN`, handing out disjoint,
/// borrow-checked views of every field. Freed once, on drop.
///
/// ```
/// use devarena::{Arena, DeviceLayout};
///
/// #[derive(DeviceLayout)]
/// struct Frame {
///     gray: [f32; 64 * 64],
///     hist: [u32; 256],
/// }
///
/// let mut arena = Arena::<Frame>::new()?;
/// let views = arena.views_mut();
/// views.gray.fill(0.25);
/// views.hist[3] = 9;
/// assert_eq!(arena.views().hist[3], 9);
/// # Ok::<(), devarena::Error>(())
/// ```
pub struct Arena<L: DeviceLayout, B: Backend = HostBackend> {
    backend: B,
    allocation: Allocation,
    _layout: PhantomData<fn() -> L>,
}

impl<L: DeviceLayout> Arena<L, HostBackend> {
    /// An arena on a fresh host backend (aligned, zeroed host memory).
    pub fn new() -> Result<Self, Error> {
        Self::new_in(HostBackend::new())
    }
}

impl<L: DeviceLayout, B: Backend> Arena<L, B> {
    /// Makes the one allocation of `L::SIZE` bytes at `L::ALIGN` on `backend`.
    pub fn new_in(backend: B) -> Result<Self, Error> {
        let allocation = backend.allocate(L::SIZE, L::ALIGN)?;
        Ok(Arena {
            backend,
            allocation,
            _layout: PhantomData,
        })
    }

    /// Mutable views of every field, disjoint and borrowed from the arena.
    pub fn views_mut(&mut self) -> L::Views<'_, B::Mut>
    where
        L: Disjoint,
        B: DirectViews,
    {
        // SAFETY: the allocation is live while `self` is borrowed, is `L::SIZE` bytes at
        // `L::ALIGN`, and the `&mut self` borrow makes these the only views; `L: Disjoint`
        // means no two fields share bytes; `B: DirectViews` needs no `ready` first.
        unsafe { L::views::<B::Mut>(self.backend.base_mut(&self.allocation)) }
    }

    /// Shared views of every field.
    pub fn views(&self) -> L::Views<'_, B::Ref>
    where
        L: Disjoint,
        B: DirectViews,
    {
        // SAFETY: the allocation is live while `self` is borrowed and nothing can write it
        // through the arena during a shared borrow; `B: DirectViews` needs no `ready` first.
        unsafe { L::views::<B::Ref>(self.backend.base_ref(&self.allocation)) }
    }

    /// Mutable views of every field on any backend: first [`Backend::ready`] (pinned memory
    /// waits for its stream), and its error, if any, instead of views.
    pub fn try_views_mut(&mut self) -> Result<L::Views<'_, B::Mut>, Error>
    where
        L: Disjoint,
    {
        self.backend.ready(&self.allocation)?;
        // SAFETY: as `views_mut`, and `ready` returned `Ok` under this exclusive borrow.
        Ok(unsafe { L::views::<B::Mut>(self.backend.base_mut(&self.allocation)) })
    }

    /// Shared views of every field on any backend, after [`Backend::ready`].
    pub fn try_views(&self) -> Result<L::Views<'_, B::Ref>, Error>
    where
        L: Disjoint,
    {
        self.backend.ready(&self.allocation)?;
        // SAFETY: as `views`, and `ready` returned `Ok` after the last write (nothing writes
        // through a shared borrow).
        Ok(unsafe { L::views::<B::Ref>(self.backend.base_ref(&self.allocation)) })
    }

    /// Mutable views of the fields live in stage `S` of a layout with stages.
    ///
    /// The views borrow the arena mutably, so no two stages' views exist at once and no code
    /// can touch a buffer outside its live range: bytes a later stage reuses are never reached
    /// through an earlier stage's view. A buffer that becomes live holds whatever bytes were
    /// there (every bit pattern is a valid element) until written.
    ///
    /// On a GPU this is sound for work queued on the arena's stream: the kernels of stage
    /// `S + 1` run after those of stage `S`, in stream order, so a buffer's bytes are not
    /// reused while an earlier kernel still reads them. Work spread over several streams must
    /// order them between stages (record an event on every stream that used stage `S` and make
    /// the streams of stage `S + 1` wait for it, or synchronize).
    ///
    /// ```
    /// use devarena::{Arena, DeviceLayout};
    ///
    /// #[derive(DeviceLayout)]
    /// #[layout(stages = 3)]
    /// struct Steps {
    ///     #[layout(live = 0..=1)]
    ///     input: [f32; 1024],
    ///     #[layout(live = 1..=2)]
    ///     output: [f32; 1024],
    ///     #[layout(live = 0..=0)]
    ///     scratch: [f32; 1024], // shares bytes with `output`
    /// }
    /// assert!(Steps::SIZE < Steps::UNALIASED_SIZE);
    ///
    /// let mut arena = Arena::<Steps>::new()?;
    /// let s0 = arena.stage_mut::<0>();
    /// s0.input.fill(1.0);
    /// s0.scratch.fill(2.0);
    /// let s1 = arena.stage_mut::<1>();
    /// for (o, i) in s1.output.iter_mut().zip(s1.input.iter()) {
    ///     *o = *i * 3.0;
    /// }
    /// assert_eq!(arena.stage::<2>().output[0], 3.0);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn stage_mut<const S: usize>(&mut self) -> <L as Stage<S>>::StageViews<'_, B::Mut>
    where
        L: Stage<S>,
        B: DirectViews,
    {
        // SAFETY: the allocation is live and exclusively borrowed; the fields of one stage are
        // disjoint (`Stage`'s contract); `B: DirectViews` needs no `ready` first.
        unsafe { L::stage_views::<B::Mut>(self.backend.base_mut(&self.allocation)) }
    }

    /// Shared views of the fields live in stage `S`.
    pub fn stage<const S: usize>(&self) -> <L as Stage<S>>::StageViews<'_, B::Ref>
    where
        L: Stage<S>,
        B: DirectViews,
    {
        // SAFETY: the allocation is live; a shared borrow lets nothing write it through the
        // arena; `B: DirectViews` needs no `ready` first.
        unsafe { L::stage_views::<B::Ref>(self.backend.base_ref(&self.allocation)) }
    }

    /// [`stage_mut`](Self::stage_mut) on any backend, after [`Backend::ready`].
    pub fn try_stage_mut<const S: usize>(
        &mut self,
    ) -> Result<<L as Stage<S>>::StageViews<'_, B::Mut>, Error>
    where
        L: Stage<S>,
    {
        self.backend.ready(&self.allocation)?;
        // SAFETY: as `stage_mut`, and `ready` returned `Ok` under this exclusive borrow.
        Ok(unsafe { L::stage_views::<B::Mut>(self.backend.base_mut(&self.allocation)) })
    }

    /// [`stage`](Self::stage) on any backend, after [`Backend::ready`].
    pub fn try_stage<const S: usize>(
        &self,
    ) -> Result<<L as Stage<S>>::StageViews<'_, B::Ref>, Error>
    where
        L: Stage<S>,
    {
        self.backend.ready(&self.allocation)?;
        // SAFETY: as `stage`, and `ready` returned `Ok` after the last write.
        Ok(unsafe { L::stage_views::<B::Ref>(self.backend.base_ref(&self.allocation)) })
    }

    /// The backend the allocation came from.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backing allocation (address, bytes, alignment).
    pub fn allocation(&self) -> Allocation {
        self.allocation
    }

    /// Start address of the backing allocation (host address or `CUdeviceptr`). Unsafe code
    /// that writes host memory through it must leave every byte it writes initialized
    /// (padding included): the arena's views read them as values of their element types,
    /// from safe code.
    pub fn addr(&self) -> u64 {
        self.allocation.addr
    }

    /// Bytes of the backing allocation: `L::SIZE`.
    pub fn size(&self) -> usize {
        self.allocation.bytes
    }

    /// Where every field lives, in declaration order.
    pub fn fields(&self) -> &'static [FieldPlacement] {
        L::FIELDS
    }

    /// Frees the allocation now and reports a failure instead of only logging it on drop.
    pub fn free(self) -> Result<(), Error> {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so the allocation is freed exactly once, here; no view
        // can outlive the move of `self`.
        let result = unsafe { this.backend.deallocate(&this.allocation) };
        // SAFETY: the backend is moved out once and `this` is not used again.
        drop(unsafe { core::ptr::read(&this.backend) });
        result
    }
}

impl<L: DeviceLayout, B: Backend> Drop for Arena<L, B> {
    fn drop(&mut self) {
        // SAFETY: the allocation came from this backend and is freed exactly once: here, or in
        // `free`, which skips this drop. No view outlives the arena's borrow.
        let _ = unsafe { self.backend.deallocate(&self.allocation) };
    }
}

impl<L: DeviceLayout, B: Backend + fmt::Debug> fmt::Debug for Arena<L, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("layout", &L::NAME)
            .field("backend", &self.backend)
            .field("addr", &format_args!("{:#x}", self.allocation.addr))
            .field("size", &self.allocation.bytes)
            .field("align", &self.allocation.align)
            .finish()
    }
}

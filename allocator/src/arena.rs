//! [`Arena`]: one allocation of a layout's `SIZE`, sliced into typed views.

use core::fmt;
use core::marker::PhantomData;

use crate::backend::{Allocation, Backend, HostBackend};
use crate::error::Error;
use crate::layout::{DeviceLayout, FieldPlacement};

/// Marks layouts in which every field has bytes of its own (no stages, so no sharing): only
/// these hand out all their views at once. The derive implements it for layouts without
/// `#[layout(stages = ..)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` shares bytes between fields whose stages never meet",
    label = "its views are handed out per stage",
    note = "use the arena's stage views (`stage_mut::<K>()`) for a layout with stages"
)]
pub trait Disjoint: DeviceLayout {}

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
    {
        // SAFETY: the allocation is live while `self` is borrowed, is `L::SIZE` bytes at
        // `L::ALIGN`, and the `&mut self` borrow makes these the only views; `L: Disjoint`
        // means no two fields share bytes.
        unsafe { L::views::<B::Mut>(self.backend.base_mut(&self.allocation)) }
    }

    /// Shared views of every field.
    pub fn views(&self) -> L::Views<'_, B::Ref>
    where
        L: Disjoint,
    {
        // SAFETY: the allocation is live while `self` is borrowed and nothing can write it
        // through the arena during a shared borrow.
        unsafe { L::views::<B::Ref>(self.backend.base_ref(&self.allocation)) }
    }

    /// The backend the allocation came from.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backing allocation (address, bytes, alignment).
    pub fn allocation(&self) -> Allocation {
        self.allocation
    }

    /// Start address of the backing allocation (host address or `CUdeviceptr`).
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

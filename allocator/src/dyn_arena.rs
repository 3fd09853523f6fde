//! [`DynArena`]: the arena of a layout built at run time with [`LayoutBuilder`].
//!
//! [`LayoutBuilder`]: crate::LayoutBuilder

use alloc::format;
use core::fmt;

use crate::backend::{Allocation, Backend, HostBackend};
use crate::builder::{RuntimeField, RuntimeLayout};
use crate::error::Error;
use crate::layout::{Element, ViewKind};

/// One allocation of a [`RuntimeLayout`]'s `size`, handing out typed views of its fields by
/// name. The run-time twin of [`Arena`](crate::Arena): the same planner placed the fields, and
/// the arena checks at run time what the compiler checks for a derived layout (element size
/// and alignment, disjointness of the views handed out together).
///
/// ```
/// use devarena::{DynArena, HostBackend, LayoutBuilder};
///
/// let (w, h) = (640, 480); // known only at run time
/// let layout = LayoutBuilder::new("Frame")
///     .array::<u8>("rgb", w * h * 3)
///     .array::<f32>("gray", w * h)
///     .build()?;
/// let backend = HostBackend::new();
/// let mut arena = DynArena::new_in(layout, backend.clone())?;
/// let [rgb] = arena.views_mut::<u8, 1>(["rgb"])?;
/// rgb.fill(255);
/// let gray = arena.view_mut::<f32>("gray")?;
/// gray.fill(1.0);
/// assert!(arena.view_mut::<f32>("depth").is_err()); // no such field
/// assert!(arena.view_mut::<[u8; 7]>("rgb").is_err()); // 921_600 bytes are not whole 7-byte elements
/// assert!(arena.views_mut::<u8, 2>(["rgb", "rgb"]).is_err()); // one field borrowed twice
/// assert_eq!(backend.stats().allocations, 1);
/// # Ok::<(), devarena::Error>(())
/// ```
pub struct DynArena<B: Backend = HostBackend> {
    layout: RuntimeLayout,
    backend: B,
    allocation: Allocation,
}

impl DynArena<HostBackend> {
    /// An arena of `layout` on a fresh host backend.
    pub fn new(layout: RuntimeLayout) -> Result<Self, Error> {
        Self::new_in(layout, HostBackend::new())
    }
}

impl<B: Backend> DynArena<B> {
    /// Makes the one allocation of `layout.size()` bytes at `layout.align()` on `backend`.
    pub fn new_in(layout: RuntimeLayout, backend: B) -> Result<Self, Error> {
        let allocation = backend.allocate(layout.size(), layout.align())?;
        Ok(DynArena {
            layout,
            backend,
            allocation,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &RuntimeLayout {
        &self.layout
    }

    /// The backend the allocation came from.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Start address of the backing allocation.
    pub fn addr(&self) -> u64 {
        self.allocation.addr
    }

    fn field<T: Element>(&self, name: &str) -> Result<(&RuntimeField, usize), Error> {
        let field = self.layout.field(name).ok_or_else(|| {
            Error::invalid(format!(
                "layout `{}` has no field `{name}`",
                self.layout.name()
            ))
        })?;
        // The planner places every field inside the allocation; checked here all the same,
        // so that the views below stay in bounds whatever a layout says.
        let end = field.offset.checked_add(field.size);
        if end.is_none_or(|end| end > self.allocation.bytes) {
            return Err(Error::invalid(format!(
                "field `{name}` of layout `{}`: {} bytes at offset {} end past the arena's {} \
                 bytes",
                self.layout.name(),
                field.size,
                field.offset,
                self.allocation.bytes
            )));
        }
        let elem = core::mem::size_of::<T>();
        let align = core::mem::align_of::<T>();
        let ty = core::any::type_name::<T>();
        if elem == 0 {
            return Err(Error::invalid(format!(
                "field `{name}`: `{ty}` has size 0 and cannot view device memory"
            )));
        }
        if field.size % elem != 0 {
            return Err(Error::invalid(format!(
                "field `{name}` of layout `{}`: {} bytes are not a whole number of `{ty}` \
                 ({elem} bytes each)",
                self.layout.name(),
                field.size
            )));
        }
        let addr = self.allocation.addr + field.offset as u64;
        if addr % align as u64 != 0 {
            return Err(Error::invalid(format!(
                "field `{name}` of layout `{}`: address {addr:#x} (offset {}) is not aligned \
                 to {align} bytes for `{ty}`",
                self.layout.name(),
                field.offset
            )));
        }
        Ok((field, field.size / elem))
    }

    /// A mutable view of the field `name` as elements of `T`.
    pub fn view_mut<T: Element>(
        &mut self,
        name: &str,
    ) -> Result<<B::Mut as ViewKind>::Slice<'_, T>, Error> {
        let (field, len) = self.field::<T>(name)?;
        let offset = field.offset;
        self.backend.ready(&self.allocation)?;
        // SAFETY: the allocation is live and exclusively borrowed, and ready; the field lies
        // inside it and its address is aligned for `T` (both checked by `field`).
        unsafe {
            let base = self.backend.base_mut(&self.allocation);
            Ok(<B::Mut as ViewKind>::slice::<T>(base, offset, len))
        }
    }

    /// A shared view of the field `name` as elements of `T`.
    pub fn view<T: Element>(
        &self,
        name: &str,
    ) -> Result<<B::Ref as ViewKind>::Slice<'_, T>, Error> {
        let (field, len) = self.field::<T>(name)?;
        self.backend.ready(&self.allocation)?;
        // SAFETY: the allocation is live and ready; a shared borrow lets nothing write it
        // through the arena; the field lies inside it and is aligned for `T` (checked by
        // `field`).
        unsafe {
            let base = self.backend.base_ref(&self.allocation);
            Ok(<B::Ref as ViewKind>::slice::<T>(base, field.offset, len))
        }
    }

    /// Mutable views of `N` fields at once, as elements of `T`. The fields must not share a
    /// byte (in a layout with stages, fields whose live ranges never meet may).
    pub fn views_mut<T: Element, const N: usize>(
        &mut self,
        names: [&str; N],
    ) -> Result<[<B::Mut as ViewKind>::Slice<'_, T>; N], Error> {
        let mut spans = [(0usize, 0usize, 0usize); N];
        for (i, name) in names.iter().enumerate() {
            let (field, len) = self.field::<T>(name)?;
            spans[i] = (field.offset, field.size, len);
            for (j, other) in names.iter().enumerate().take(i) {
                let (o, s, _) = spans[j];
                let overlap = field.size != 0
                    && s != 0
                    && field.offset < o + s
                    && o < field.offset + field.size;
                if overlap || other == name {
                    return Err(Error::invalid(format!(
                        "fields `{other}` and `{name}` of layout `{}` share bytes: they cannot \
                         be borrowed mutably at once",
                        self.layout.name()
                    )));
                }
            }
        }
        self.backend.ready(&self.allocation)?;
        // SAFETY: the allocation is live, ready and exclusively borrowed for the views'
        // lifetime; each field lies inside it and is aligned for `T` (checked by `field`), and
        // no two of them share a byte (checked above).
        let base = unsafe { self.backend.base_mut(&self.allocation) };
        Ok(spans.map(|(offset, _, len)| {
            // SAFETY: as above.
            unsafe { <B::Mut as ViewKind>::slice::<T>(base, offset, len) }
        }))
    }
}

impl<B: Backend> Drop for DynArena<B> {
    fn drop(&mut self) {
        // SAFETY: the allocation came from this backend and is freed exactly once, here; no view
        // outlives the arena's borrow.
        let _ = unsafe { self.backend.deallocate(&self.allocation) };
    }
}

impl<B: Backend + fmt::Debug> fmt::Debug for DynArena<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynArena")
            .field("layout", &self.layout.name())
            .field("backend", &self.backend)
            .field("addr", &format_args!("{:#x}", self.allocation.addr))
            .field("size", &self.allocation.bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LayoutBuilder;
    use alloc::string::ToString;

    /// A layout whose field reaches past the allocation (no planner makes one) gets an error,
    /// not a view out of bounds.
    #[test]
    fn a_field_past_the_allocation_is_an_error_not_a_view() {
        let mut layout = LayoutBuilder::new("Frame")
            .array::<u32>("a", 16)
            .array::<u32>("b", 16)
            .build()
            .unwrap();
        let size = layout.size();
        let b = layout
            .fields_mut()
            .iter_mut()
            .find(|f| f.name == "b")
            .unwrap();
        b.offset = size - 32;
        b.size = 64;
        let mut arena = DynArena::new(layout).unwrap();
        let err = arena.view_mut::<u32>("b").unwrap_err().to_string();
        assert!(
            err.contains(&format!("field `b` of layout `Frame`: 64 bytes at offset {} end past the arena's {size} bytes", size - 32)),
            "{err}"
        );
        assert!(arena.view::<u32>("b").is_err());
        assert!(arena.views_mut::<u32, 2>(["a", "b"]).is_err());
        // An offset whose end overflows.
        let mut layout = LayoutBuilder::new("Frame")
            .array::<u32>("a", 16)
            .build()
            .unwrap();
        layout.fields_mut()[0].offset = usize::MAX - 8;
        let arena = DynArena::new(layout).unwrap();
        assert!(arena.view::<u32>("a").is_err());
        // The fields as planned still view.
        let layout = LayoutBuilder::new("Frame")
            .array::<u32>("a", 16)
            .build()
            .unwrap();
        let mut arena = DynArena::new(layout).unwrap();
        assert_eq!(arena.view_mut::<u32>("a").unwrap().len(), 16);
    }
}

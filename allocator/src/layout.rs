//! The [`DeviceLayout`] trait, element types, and view kinds.

use crate::plan::{LiveRange, Slot};

/// A plain element type that may live in a device buffer: `Copy`, no padding bytes, every bit
/// pattern a valid value, no pointers into host memory.
///
/// Implemented for the numeric primitives and for arrays of elements. For your own plain
/// types, `#[derive(Element)]` checks `#[repr(C)]`, that every field is an `Element` and that
/// there is no padding; or implement it by hand:
///
/// ```
/// #[derive(Clone, Copy)]
/// #[repr(C)]
/// struct Rgba { r: u8, g: u8, b: u8, a: u8 }
///
/// // SAFETY: four `u8`s, `repr(C)`: no padding, every bit pattern is a valid `Rgba`.
/// unsafe impl devarena::Element for Rgba {}
///
/// #[derive(devarena::DeviceLayout)]
/// struct Image { pixels: [Rgba; 64 * 64] }
/// assert_eq!(Image::SIZE, 64 * 64 * 4);
/// # use devarena::DeviceLayout;
/// ```
///
/// With the `cuda` feature, `cudarc::driver::DeviceRepr` is what cudarc's own copy functions
/// ask for; devarena's views and copy helpers need only `Element`.
///
/// # Safety
///
/// The type must have no padding bytes, accept every bit pattern as a valid value (device memory
/// is read back byte by byte), and hold no references or host pointers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a device element type",
    label = "a device buffer holds plain elements",
    note = "implement `unsafe impl devarena::Element for {Self} {{}}` for a `#[repr(C)]` plain type with no padding"
)]
pub unsafe trait Element: Copy + Send + Sync + 'static {}

macro_rules! impl_element {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number: no padding, every bit pattern valid.
        unsafe impl Element for $t {}
    )* };
}
impl_element!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64
);
// SAFETY: an array of elements has no padding between them and inherits their validity.
unsafe impl<T: Element, const N: usize> Element for [T; N] {}

/// Where one field of a layout was placed: the public face of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FieldPlacement {
    /// The field's name.
    pub name: &'static str,
    /// Byte offset from the start of the allocation.
    pub offset: usize,
    /// Bytes of the field.
    pub size: usize,
    /// Alignment the field was placed at.
    pub align: usize,
}

impl FieldPlacement {
    /// Builds a placement from a plan slot.
    pub const fn new(name: &'static str, slot: Slot) -> Self {
        FieldPlacement {
            name,
            offset: slot.offset,
            size: slot.size,
            align: slot.align,
        }
    }

    /// One past the last byte of the field (`usize::MAX` for a placement that runs past it).
    pub const fn end(&self) -> usize {
        self.offset.saturating_add(self.size)
    }
}

/// A struct of fixed-size buffers whose placement the compiler computed: derive it with
/// `#[derive(DeviceLayout)]`.
///
/// All constants are evaluated at compile time; `SIZE` can size a static array.
///
/// # Safety
///
/// Arenas allocate `SIZE` bytes at `ALIGN` and hand out the views [`views`](Self::views)
/// makes, trusting the constants. An impl promises that `ALIGN` is a power of two and `SIZE` a
/// multiple of it; that every field's placement in `FIELDS` lies inside `SIZE`, aligned for its
/// element; that `views` makes each field's view from that field's placement alone, and
/// nested layouts' views from their own blocks; and that fields share bytes only where their
/// live ranges (`LIVE`, over `STAGES` stages) never meet. Leave the impl to
/// `#[derive(DeviceLayout)]`, which plans and checks all of this at compile time.
///
/// ```
/// use devarena::DeviceLayout;
///
/// #[derive(DeviceLayout)]
/// struct Frame {
///     rgb: [u8; 640 * 480 * 3],
///     gray: [f32; 640 * 480],
///     #[layout(align = 4096)]
///     hist: [u32; 256],
/// }
///
/// assert_eq!(Frame::OFFSETS.rgb, 0);
/// assert_eq!(Frame::OFFSETS.gray, 921_600); // 640*480*3 is a multiple of 256
/// assert_eq!(Frame::OFFSETS.hist, 2_150_400); // 921_600 + 1_228_800 = 525 * 4096 exactly
/// assert_eq!(Frame::ALIGN, 4096);
/// assert_eq!(Frame::SIZE, 2_154_496); // hist ends at 2_151_424, rounded up to 526 * 4096
/// static SCRATCH: [u8; Frame::FIELDS.len()] = [0; 3];
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is neither a fixed-size buffer `[T; N]` nor a `DeviceLayout`",
    label = "expected a `#[derive(DeviceLayout)]` struct (or, as a layout's field, an array `[T; N]`)",
    note = "add `#[derive(DeviceLayout)]` to `{Self}` (the trait is `unsafe`: the derive implements it), or make a field of this type an array such as `[f32; 1024]`",
    note = "the derive sees a field's type as written: an array behind a type alias (`type Gray = [f32; 1024]`) or a macro counts as a nested layout; write the array type `[T; N]` in the field itself"
)]
pub unsafe trait DeviceLayout {
    /// The struct's name.
    const NAME: &'static str;
    /// Bytes of the backing allocation: a multiple of `ALIGN`.
    const SIZE: usize;
    /// Alignment of the backing allocation.
    const ALIGN: usize;
    /// Placement of every field, in declaration order.
    const FIELDS: &'static [FieldPlacement];
    /// Type name of every field (as written in the struct), in declaration order.
    const FIELD_TYPES: &'static [&'static str];
    /// Live range of every field, in declaration order ([`LiveRange::ALL`] without stages).
    const LIVE: &'static [LiveRange];
    /// Number of stages (`#[layout(stages = N)]`), 0 when the layout declares none.
    const STAGES: usize;
    /// Names of the stages when declared as `#[layout(stages(a, b, ..))]`; empty otherwise.
    const STAGE_NAMES: &'static [&'static str] = &[];
    /// What `SIZE` would be if no two fields shared bytes; equal to `SIZE` without stages.
    const UNALIASED_SIZE: usize;
    /// A lower bound on `SIZE`: over stages, the bytes the live fields need side by side (see
    /// [`Totals::peak_live_bound`](crate::plan::Totals::peak_live_bound)); with one alignment
    /// for every field, the largest sum of the live fields' sizes each rounded up to it.
    const PEAK_LIVE_BOUND: usize;

    /// The generated struct of views, one per field, of the given kind (host slices, device
    /// views, ...). Nested layouts give nested view structs.
    type Views<'a, K: ViewKind>;

    /// Slices the region at `base` into views.
    ///
    /// # Safety
    ///
    /// `base` must address a region of at least `SIZE` bytes aligned to `ALIGN` that stays
    /// valid and, for mutable kinds, unaliased for `'a`. For a mutable kind the layout must
    /// also have no two fields sharing a byte ([`Disjoint`](crate::Disjoint), or no stages):
    /// the views of a layout with stages include fields whose bytes are shared, and those
    /// would alias (its mutable views are made per stage, by [`Stage`](crate::Stage)).
    unsafe fn views<'a, K: ViewKind>(base: K::Base<'a>) -> Self::Views<'a, K>;
}

/// How a region is sliced into per-field views: host slices, device views, and so on.
///
/// # Safety
///
/// `slice` must produce a view of exactly the `len` elements at `offset` bytes from `base`, and
/// nothing else; the arena relies on this to hand out disjoint views.
pub unsafe trait ViewKind {
    /// The start of a region, with the lifetime of the borrow it came from.
    type Base<'a>: Copy;
    /// The view of one buffer.
    type Slice<'a, T: Element>;

    /// The base moved forward by `offset` bytes (for a nested layout).
    ///
    /// # Safety
    ///
    /// `offset` must stay inside the region.
    unsafe fn offset<'a>(base: Self::Base<'a>, offset: usize) -> Self::Base<'a>;

    /// The view of `len` elements at `offset` bytes from `base`.
    ///
    /// # Safety
    ///
    /// The elements must lie inside the region, be aligned for `T`, and belong to no other view
    /// of a mutable kind.
    unsafe fn slice<'a, T: Element>(
        base: Self::Base<'a>,
        offset: usize,
        len: usize,
    ) -> Self::Slice<'a, T>;
}

/// Host views you can write: `&'a mut [T]` per field.
#[derive(Debug, Clone, Copy)]
pub enum HostMut {}

/// Host views you can read: `&'a [T]` per field.
#[derive(Debug, Clone, Copy)]
pub enum HostRef {}

/// The start of a host region, borrowed for `'a`.
#[derive(Debug, Clone, Copy)]
pub struct HostBase<'a> {
    ptr: *mut u8,
    _borrow: core::marker::PhantomData<&'a mut [u8]>,
}

impl HostBase<'_> {
    /// # Safety
    ///
    /// `ptr` must address a live region valid for the lifetime chosen by the caller.
    pub unsafe fn new(ptr: *mut u8) -> Self {
        HostBase {
            ptr,
            _borrow: core::marker::PhantomData,
        }
    }

    /// The address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

// SAFETY: `slice` builds a slice of exactly `len` elements at `offset` from the base.
unsafe impl ViewKind for HostMut {
    type Base<'a> = HostBase<'a>;
    type Slice<'a, T: Element> = &'a mut [T];

    unsafe fn offset<'a>(base: Self::Base<'a>, offset: usize) -> Self::Base<'a> {
        // SAFETY: the caller keeps `offset` inside the region.
        unsafe { HostBase::new(base.ptr.add(offset)) }
    }

    unsafe fn slice<'a, T: Element>(
        base: Self::Base<'a>,
        offset: usize,
        len: usize,
    ) -> Self::Slice<'a, T> {
        // SAFETY: the caller guarantees the elements lie in the region, are aligned for `T`,
        // belong to no other view, and that the region lives and is unaliased for `'a`.
        unsafe { core::slice::from_raw_parts_mut(base.ptr.add(offset).cast::<T>(), len) }
    }
}

// SAFETY: `slice` builds a slice of exactly `len` elements at `offset` from the base.
unsafe impl ViewKind for HostRef {
    type Base<'a> = HostBase<'a>;
    type Slice<'a, T: Element> = &'a [T];

    unsafe fn offset<'a>(base: Self::Base<'a>, offset: usize) -> Self::Base<'a> {
        // SAFETY: the caller keeps `offset` inside the region.
        unsafe { HostBase::new(base.ptr.add(offset)) }
    }

    unsafe fn slice<'a, T: Element>(
        base: Self::Base<'a>,
        offset: usize,
        len: usize,
    ) -> Self::Slice<'a, T> {
        // SAFETY: the caller guarantees the elements lie in the region and are aligned for `T`;
        // shared views may overlap nothing mutable while `'a` lasts.
        unsafe { core::slice::from_raw_parts(base.ptr.add(offset).cast::<T>(), len) }
    }
}

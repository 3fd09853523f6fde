//! The layout planner: `const fn` arithmetic shared by `#[derive(DeviceLayout)]` (evaluated by
//! the compiler) and [`LayoutBuilder`](crate::LayoutBuilder) (evaluated at run time).
//!
//! Nothing here knows about CUDA or allocation; it only turns a list of [`FieldSpec`]s into
//! [`Slot`]s (offset, size, alignment) plus [`Totals`], or a [`PlanError`] that names the
//! offending field and the numbers.
//!
//! # The placement rule
//!
//! * A field's alignment is its own `#[layout(align = N)]`, else the layout's
//!   `#[layout(align = N)]`, else [`DEFAULT_ALIGN`] (256 bytes, what `cudaMalloc` guarantees).
//!   A layout-level default below the element's alignment is raised to it; a field-level
//!   alignment below the element's alignment is an error.
//! * Without stages, fields are placed in declaration order:
//!   `offset = align_up(end of previous field, alignment)`.
//! * `ALIGN` is the largest field alignment (or the layout's default when it has no fields);
//!   `SIZE = align_up(end of the last field, ALIGN)`.
//! * With stages (`#[layout(stages = N)]`), fields whose live ranges never meet may share bytes:
//!   see [`plan_into`].
//!
//! # Rooms
//!
//! * alignment: the arithmetic every floor of the crate shares
//!   ([`align_up`], [`DEFAULT_ALIGN`], [`MAX_ALIGN`]);
//! * the placement rule: checks of one field and [`plan_into`] / [`plan`];
//! * stage aliasing: [`Strategy`], [`place_with`], [`alias_into`] (the greedy planner);
//! * the search: [`Engine`] (MiniMalloc's branch and bound over canonical plans), its drivers
//!   [`Search`] (run time) and [`improve_step`] (compile time);
//! * [`validate()`]: an independent check of any plan;
//! * errors: [`PlanError`] and the const-built [`Message`] the compiler prints.

mod align;
mod derive;
mod drive;
mod error;
mod place;
mod search;
mod sort;
mod stages;
mod sweep;
mod timeline;
mod validate;

/// The planner's tests' pseudo-random numbers (xorshift from `seed`): `next(m)` is below `m`.
#[cfg(test)]
pub(crate) fn test_rng(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |m| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % m as u64) as usize
    }
}

pub use align::{CUDA_ALIGN, DEFAULT_ALIGN, MAX_ALIGN, align_up, align_up_u64, is_valid_align};
#[doc(hidden)]
pub use derive::{Check, derive_check, derive_plan, element_padding_check};
pub use drive::{
    COMPILE_TIME_SCRATCH_MAX, COMPILE_TIME_STEPS, COMPILE_TIME_WORK, Goal, Improving, Schedule,
    Search, Step, Try, improve, improve_slots, improve_slots_with, improve_step, plan_as_derive,
    search_len,
};
pub use error::{Message, PlanError, PlanErrorKind};
pub(crate) use place::check_max_bytes;
#[doc(hidden)]
pub use place::{Prepared, plan_prepared, prepare};
pub use place::{
    check_align, check_field, check_live, check_size, layout_default_align, plan, plan_into,
    plan_into_with, plan_with, smaller, within_max_bytes,
};
pub use search::{Engine, Outcome, Preorder, Sizes, Suspended, measure};
pub use stages::{Strategy, alias_into, place_with, scratch_len};
pub(crate) use sweep::plan_within;
pub use validate::{Placed, Violation, validate};

/// The most stages a layout may declare (2^24, about 16.7 million: room for every operation of
/// a large model's graph). Planning never walks the stages one by one, so its cost does not
/// grow with the count; the limit only turns an absurd count into an error. (The derive allows
/// fewer, 4096, because it writes one view struct per stage.)
pub const MAX_STAGES: usize = 1 << 24;

/// The inclusive range of stages in which a field is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiveRange {
    /// First stage in which the field is live.
    pub first: usize,
    /// Last stage in which the field is live (inclusive).
    pub last: usize,
}

impl LiveRange {
    /// Live in every stage: the default of a field without `#[layout(live = ..)]`.
    pub const ALL: LiveRange = LiveRange {
        first: 0,
        last: usize::MAX,
    };

    /// Live from `first` to `last`, both inclusive.
    pub const fn new(first: usize, last: usize) -> Self {
        LiveRange { first, last }
    }

    /// Whether the two ranges share at least one stage.
    pub const fn meets(&self, other: &LiveRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }

    /// Whether the field is live in `stage`.
    pub const fn contains(&self, stage: usize) -> bool {
        self.first <= stage && stage <= self.last
    }

    /// The range clipped to the stages `0..stages` (for display).
    pub const fn clip(&self, stages: usize) -> LiveRange {
        let last = if stages == 0 {
            0
        } else if self.last >= stages {
            stages - 1
        } else {
            self.last
        };
        LiveRange {
            first: self.first,
            last,
        }
    }
}

/// What the planner needs to know about one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FieldSpec {
    /// `size_of` of one element (for a nested layout: its `SIZE`).
    pub elem_size: usize,
    /// `align_of` of one element (for a nested layout: its `ALIGN`).
    pub elem_align: usize,
    /// Number of elements (for a nested layout: 1).
    pub len: usize,
    /// The field's own alignment request; `None` when it asked for none. (`Some(0)` is a
    /// request too, and an invalid one: zero is not a power of two.)
    pub align: Option<usize>,
    /// Stages in which the field is live.
    pub live: LiveRange,
    /// Whether the field is a nested layout (an empty nested layout is allowed).
    pub nested: bool,
}

impl FieldSpec {
    /// A `[T; len]` buffer whose element has the given size and alignment.
    pub const fn array(elem_size: usize, elem_align: usize, len: usize) -> Self {
        FieldSpec {
            elem_size,
            elem_align,
            len,
            align: None,
            live: LiveRange::ALL,
            nested: false,
        }
    }

    /// A `[T; len]` buffer of a concrete element type.
    pub const fn of<T>(len: usize) -> Self {
        Self::array(core::mem::size_of::<T>(), core::mem::align_of::<T>(), len)
    }

    /// A nested layout: one block of `size` bytes whose alignment is at least `align`.
    pub const fn nested(size: usize, align: usize) -> Self {
        FieldSpec {
            elem_size: size,
            elem_align: align,
            len: 1,
            align: None,
            live: LiveRange::ALL,
            nested: true,
        }
    }

    /// Asks for an alignment of its own (a power of two, not below the element's alignment).
    pub const fn with_align(mut self, align: usize) -> Self {
        self.align = Some(align);
        self
    }

    /// Declares the stages in which the field is live (inclusive).
    pub const fn with_live(mut self, first: usize, last: usize) -> Self {
        self.live = LiveRange::new(first, last);
        self
    }
}

/// Layout-wide settings: `#[layout(align = .., max_bytes = .., stages = ..)]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayoutSpec {
    /// Default alignment of every field; `None` for [`DEFAULT_ALIGN`].
    pub align: Option<usize>,
    /// Largest `SIZE` allowed; `usize::MAX` for no limit.
    pub max_bytes: usize,
    /// Number of stages; 0 when the layout declares none (every field lives throughout).
    pub stages: usize,
}

impl LayoutSpec {
    /// Default settings: 256-byte alignment, no size limit, no stages.
    pub const DEFAULT: LayoutSpec = LayoutSpec {
        align: None,
        max_bytes: usize::MAX,
        stages: 0,
    };

    /// Sets the default alignment of the fields.
    pub const fn with_align(mut self, align: usize) -> Self {
        self.align = Some(align);
        self
    }

    /// Sets the size limit.
    pub const fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Declares stages `0..stages`.
    pub const fn with_stages(mut self, stages: usize) -> Self {
        self.stages = stages;
        self
    }
}

/// Where one field was placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Byte offset from the start of the allocation.
    pub offset: usize,
    /// Bytes of the field (`elem_size * len`).
    pub size: usize,
    /// The alignment the field was placed at.
    pub align: usize,
}

impl Slot {
    /// An empty slot, used to initialise arrays before planning.
    pub const EMPTY: Slot = Slot {
        offset: 0,
        size: 0,
        align: 1,
    };

    /// One past the last byte of the field (`usize::MAX` for a slot that runs past it: a
    /// planner never makes one, but a slot's fields are anyone's to set).
    pub const fn end(&self) -> usize {
        self.offset.saturating_add(self.size)
    }

    /// Whether the two slots share at least one byte (empty slots share none).
    pub const fn overlaps(&self, other: &Slot) -> bool {
        self.size != 0 && other.size != 0 && self.offset < other.end() && other.offset < self.end()
    }
}

/// Layout-wide results of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Totals {
    /// Bytes of the backing allocation: a multiple of `align`.
    pub size: usize,
    /// Alignment of the backing allocation.
    pub align: usize,
    /// Sum of the fields' sizes: the bytes actually asked for.
    pub requested: usize,
    /// What `size` would be if no two fields shared bytes (declaration order).
    pub unaliased_size: usize,
    /// A lower bound on any plan's size: over all stages, the bytes the live fields need side
    /// by side (each rounded up to the smallest alignment among them, the last one unrounded),
    /// rounded up to `align`. With one alignment for every field (256 by default) it is the
    /// largest sum of the live fields' sizes, each rounded up to its alignment.
    pub peak_live_bound: usize,
}

impl Totals {
    /// Whether aliasing may make a plan smaller than the declaration-order one: not where
    /// that plan meets the lower bound already (every field live at once somewhere, say).
    pub(crate) const fn aliasing_may_help(&self) -> bool {
        self.unaliased_size > self.peak_live_bound
    }
}

/// A complete plan of `N` fields, as the derive stores it in a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Plan<const N: usize> {
    /// Placement of every field, in declaration order.
    pub slots: [Slot; N],
    /// Layout-wide results.
    pub totals: Totals,
}

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

/// The alignment of every buffer that asks for nothing else: what `cudaMalloc` guarantees, so a
/// view can go anywhere a `cudaMalloc` pointer can (cuBLAS, cuDNN, TMA, TensorRT).
pub const DEFAULT_ALIGN: usize = 256;

mod derive;
#[doc(hidden)]
pub use derive::{Check, derive_check, derive_plan, element_padding_check};

/// The largest alignment the planner accepts (1 GiB); larger requests are almost always a typo.
pub const MAX_ALIGN: usize = 1 << 30;

/// Rounds `value` up to a multiple of `align` (a power of two); `None` on overflow.
///
/// ```
/// assert_eq!(devarena::plan::align_up(0, 256), Some(0));
/// assert_eq!(devarena::plan::align_up(257, 256), Some(512));
/// assert_eq!(devarena::plan::align_up(usize::MAX, 2), None);
/// ```
pub const fn align_up(value: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    match value.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

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

    /// One past the last byte of the field.
    pub const fn end(&self) -> usize {
        self.offset + self.size
    }

    /// Whether the two slots share at least one byte (empty slots share none).
    pub const fn overlaps(&self, other: &Slot) -> bool {
        self.size != 0
            && other.size != 0
            && self.offset < other.offset + other.size
            && other.offset < self.offset + self.size
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

/// A complete plan of `N` fields, as the derive stores it in a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Plan<const N: usize> {
    /// Placement of every field, in declaration order.
    pub slots: [Slot; N],
    /// Layout-wide results.
    pub totals: Totals,
}

/// What went wrong while planning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlanErrorKind {
    /// An alignment that is not a power of two (or is over [`MAX_ALIGN`]).
    AlignNotPowerOfTwo {
        /// The alignment asked for.
        align: usize,
    },
    /// A field-level alignment below the alignment of the field's element type.
    AlignBelowElement {
        /// The alignment asked for.
        align: usize,
        /// `align_of` the element.
        elem_align: usize,
    },
    /// A buffer of zero elements.
    ZeroLength,
    /// `elem_size * len` does not fit in `usize`.
    SizeOverflow {
        /// Bytes of one element.
        elem_size: usize,
        /// Number of elements.
        len: usize,
    },
    /// The field's end (its offset, aligned, plus its size), or `SIZE` rounded up to the
    /// layout's alignment, does not fit in `usize`.
    OffsetOverflow {
        /// Where the previous field ends (for the layout: where the last field ends).
        offset: usize,
        /// Bytes of the field (0 for the layout).
        size: usize,
        /// The alignment the field (or the layout's `SIZE`) is rounded up to.
        align: usize,
    },
    /// `SIZE` is over `max_bytes`.
    OverMaxBytes {
        /// The planned size.
        size: usize,
        /// The limit.
        max_bytes: usize,
    },
    /// A live range that is empty, reversed, or outside `0..stages`.
    BadLiveRange {
        /// First stage of the range.
        first: usize,
        /// Last stage of the range.
        last: usize,
        /// Number of stages of the layout (0: the layout declares none).
        stages: usize,
    },
}

/// A planning error: what went wrong and, where it belongs to one field, which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanError {
    /// Index of the offending field in declaration order, or `None` for the layout itself.
    pub field: Option<usize>,
    /// What went wrong.
    pub kind: PlanErrorKind,
}

const fn field_err(field: usize, kind: PlanErrorKind) -> PlanError {
    PlanError {
        field: Some(field),
        kind,
    }
}

const fn valid_align(align: usize) -> bool {
    align.is_power_of_two() && align <= MAX_ALIGN
}

/// The default alignment of the layout's fields.
pub const fn layout_default_align(layout: &LayoutSpec) -> Result<usize, PlanError> {
    let align = match layout.align {
        Some(a) => a,
        None => return Ok(DEFAULT_ALIGN),
    };
    if !valid_align(align) {
        return Err(PlanError {
            field: None,
            kind: PlanErrorKind::AlignNotPowerOfTwo { align },
        });
    }
    Ok(align)
}

/// The alignment a field is placed at, or why its alignment is wrong.
pub const fn check_align(
    layout: &LayoutSpec,
    index: usize,
    spec: &FieldSpec,
) -> Result<usize, PlanError> {
    let default = match layout_default_align(layout) {
        Ok(a) => a,
        Err(e) => return Err(e),
    };
    if !spec.elem_align.is_power_of_two() {
        // Only reachable through a hand-written FieldSpec; the compiler's alignments are powers.
        return Err(field_err(
            index,
            PlanErrorKind::AlignNotPowerOfTwo {
                align: spec.elem_align,
            },
        ));
    }
    if let Some(align) = spec.align {
        if !valid_align(align) {
            return Err(field_err(
                index,
                PlanErrorKind::AlignNotPowerOfTwo { align },
            ));
        }
        if align < spec.elem_align {
            return Err(field_err(
                index,
                PlanErrorKind::AlignBelowElement {
                    align,
                    elem_align: spec.elem_align,
                },
            ));
        }
        Ok(align)
    } else if default < spec.elem_align {
        Ok(spec.elem_align)
    } else {
        Ok(default)
    }
}

/// The bytes of a field, or why its size is wrong.
pub const fn check_size(index: usize, spec: &FieldSpec) -> Result<usize, PlanError> {
    if spec.len == 0 && !spec.nested {
        return Err(field_err(index, PlanErrorKind::ZeroLength));
    }
    match spec.elem_size.checked_mul(spec.len) {
        Some(s) => Ok(s),
        None => Err(field_err(
            index,
            PlanErrorKind::SizeOverflow {
                elem_size: spec.elem_size,
                len: spec.len,
            },
        )),
    }
}

/// Checks that a field's live range lies inside the layout's stages.
pub const fn check_live(
    layout: &LayoutSpec,
    index: usize,
    spec: &FieldSpec,
) -> Result<(), PlanError> {
    let all = spec.live.first == LiveRange::ALL.first && spec.live.last == LiveRange::ALL.last;
    if all {
        return Ok(());
    }
    if layout.stages == 0 || spec.live.first > spec.live.last || spec.live.last >= layout.stages {
        return Err(field_err(
            index,
            PlanErrorKind::BadLiveRange {
                first: spec.live.first,
                last: spec.live.last,
                stages: layout.stages,
            },
        ));
    }
    Ok(())
}

/// Checks one field on its own and returns its slot with offset 0: its size and alignment.
pub const fn check_field(
    layout: &LayoutSpec,
    index: usize,
    spec: &FieldSpec,
) -> Result<Slot, PlanError> {
    let align = match check_align(layout, index, spec) {
        Ok(a) => a,
        Err(e) => return Err(e),
    };
    let size = match check_size(index, spec) {
        Ok(s) => s,
        Err(e) => return Err(e),
    };
    if let Err(e) = check_live(layout, index, spec) {
        return Err(e);
    }
    Ok(Slot {
        offset: 0,
        size,
        align,
    })
}

/// Plans `specs` into `out` and returns the totals; `best` and `current` are scratch space.
/// All four slices hold one entry per field.
///
/// Without stages, fields are placed in declaration order. With stages, fields whose live
/// ranges never meet may share bytes: see [`alias_into`].
pub const fn plan_into(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    out: &mut [Slot],
    best: &mut [usize],
    current: &mut [usize],
) -> Result<Totals, PlanError> {
    assert!(
        specs.len() == out.len() && best.len() == out.len() && current.len() == out.len(),
        "plan_into: specs, out and the two scratch slices must have one entry per field"
    );
    let mut align = match layout_default_align(layout) {
        Ok(a) => a,
        Err(e) => return Err(e),
    };
    if !specs.is_empty() {
        align = 1;
    }
    let mut requested: usize = 0;
    let mut end: usize = 0;
    let mut i = 0;
    while i < specs.len() {
        let slot = match check_field(layout, i, &specs[i]) {
            Ok(s) => s,
            Err(e) => return Err(e),
        };
        let offset = match align_up(end, slot.align) {
            Some(o) => o,
            None => {
                return Err(field_err(
                    i,
                    PlanErrorKind::OffsetOverflow {
                        offset: end,
                        size: slot.size,
                        align: slot.align,
                    },
                ));
            }
        };
        end = match offset.checked_add(slot.size) {
            Some(e) => e,
            None => {
                return Err(field_err(
                    i,
                    PlanErrorKind::OffsetOverflow {
                        offset: end,
                        size: slot.size,
                        align: slot.align,
                    },
                ));
            }
        };
        // `requested` can't overflow where `end` didn't: it is never larger.
        requested += slot.size;
        if slot.align > align {
            align = slot.align;
        }
        out[i] = Slot {
            offset,
            size: slot.size,
            align: slot.align,
        };
        i += 1;
    }
    let unaliased_size = match align_up(end, align) {
        Some(s) => s,
        None => {
            return Err(PlanError {
                field: None,
                kind: PlanErrorKind::OffsetOverflow {
                    offset: end,
                    size: 0,
                    align,
                },
            });
        }
    };
    let mut totals = Totals {
        size: unaliased_size,
        align,
        requested,
        unaliased_size,
        peak_live_bound: 0,
    };
    totals.peak_live_bound = peak_live_bound(layout, specs, out, align);
    if layout.stages > 0 {
        totals.size = match alias_into(layout, specs, out, align, best, current) {
            Ok(s) => s,
            Err(e) => return Err(e),
        };
    }
    if totals.size > layout.max_bytes {
        return Err(PlanError {
            field: None,
            kind: PlanErrorKind::OverMaxBytes {
                size: totals.size,
                max_bytes: layout.max_bytes,
            },
        });
    }
    Ok(totals)
}

/// A lower bound on the size of any plan: over all stages, the bytes the fields live in that
/// stage need side by side, rounded up to the layout's alignment.
///
/// In one stage, every live field starts at a multiple of the smallest alignment `m` among
/// them (alignments are powers of two), so each occupies its size rounded up to `m`, except
/// that the field placed last needs no rounding: the stage needs at least
/// `Σ align_up(size, m) − max(align_up(size, m) − size)` bytes, and `SIZE`, a multiple of
/// `ALIGN`, at least that rounded up to `ALIGN`. When every field has the same alignment
/// (256 by default) this is the sum of the live sizes, each rounded up to its alignment.
const fn peak_live_bound(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    slots: &[Slot],
    align: usize,
) -> usize {
    let stages = if layout.stages == 0 { 1 } else { layout.stages };
    let mut best = 0;
    let mut stage = 0;
    while stage < stages {
        let mut m = usize::MAX;
        let mut i = 0;
        while i < specs.len() {
            if (layout.stages == 0 || specs[i].live.contains(stage))
                && slots[i].size > 0
                && slots[i].align < m
            {
                m = slots[i].align;
            }
            i += 1;
        }
        let mut sum: usize = 0;
        let mut slack = 0;
        let mut i = 0;
        while i < specs.len() {
            if (layout.stages == 0 || specs[i].live.contains(stage)) && slots[i].size > 0 {
                // Each term is at most the field's unaliased footprint, which did not overflow.
                let rounded = match align_up(slots[i].size, m) {
                    Some(r) => r,
                    None => slots[i].size,
                };
                sum = sum.saturating_add(rounded);
                if rounded - slots[i].size > slack {
                    slack = rounded - slots[i].size;
                }
            }
            i += 1;
        }
        let need = match align_up(sum - slack, align) {
            Some(n) => n,
            None => sum - slack,
        };
        if need > best {
            best = need;
        }
        stage += 1;
    }
    best
}

/// How the aliasing planner orders buffers before placing each at the lowest offset that keeps
/// it apart from the conflicting buffers already placed. The planner runs every strategy and
/// keeps the smallest plan (as XLA's heap simulator does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Declaration order. Never worse than placing every field apart, so with it among the
    /// strategies `SIZE <= UNALIASED_SIZE` always holds.
    Declaration,
    /// Largest first (TensorFlow Lite Micro's greedy planner); ties by earlier first stage.
    BySize,
    /// Earliest first stage first; ties by larger size.
    ByStart,
    /// Longest live range first; ties by larger size.
    ByDuration,
}

impl Strategy {
    /// Every strategy, in the order the planner tries them (the first smallest wins).
    pub const ALL: [Strategy; 4] = [
        Strategy::BySize,
        Strategy::ByStart,
        Strategy::ByDuration,
        Strategy::Declaration,
    ];
}

/// No plan yet: larger than any end.
const UNPLACED: usize = usize::MAX;

/// Whether buffer `a` goes before buffer `b` under `strategy` (a strict total order).
const fn before(
    strategy: Strategy,
    specs: &[FieldSpec],
    slots: &[Slot],
    a: usize,
    b: usize,
) -> bool {
    let (la, lb) = (specs[a].live, specs[b].live);
    let (sa, sb) = (slots[a].size, slots[b].size);
    let (da, db) = (la.last - la.first, lb.last - lb.first);
    let primary = match strategy {
        Strategy::Declaration => return a < b,
        Strategy::BySize => {
            if sa != sb {
                return sa > sb;
            }
            (la.first, lb.first)
        }
        Strategy::ByStart => {
            if la.first != lb.first {
                return la.first < lb.first;
            }
            (sb, sa)
        }
        Strategy::ByDuration => {
            if da != db {
                return da > db;
            }
            (sb, sa)
        }
    };
    if primary.0 != primary.1 {
        return primary.0 < primary.1;
    }
    a < b
}

/// Places every buffer in `strategy`'s order at the lowest aligned offset that keeps it apart
/// from the conflicting buffers already placed; writes the offsets to `placed` and returns the
/// end of the highest buffer. `slots` gives the sizes and alignments (offsets are ignored);
/// `order` is scratch space for the placement order. `order` and `placed` hold one entry per
/// field.
///
/// [`alias_into`] runs every strategy and keeps the smallest; this runs one, to compare.
///
/// The compiler evaluates this for every derived layout with stages, so it is written for
/// const evaluation: the order is sorted once, and each buffer looks only at the buffers
/// placed before it.
pub const fn place_with(
    strategy: Strategy,
    specs: &[FieldSpec],
    slots: &[Slot],
    order: &mut [usize],
    placed: &mut [usize],
) -> Result<usize, PlanError> {
    let n = specs.len();
    assert!(
        slots.len() == n && order.len() == n && placed.len() == n,
        "place_with: slots, order and placed must have one entry per field"
    );
    // Insertion sort into the strategy's order (`before` is a strict total order).
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j > 0 && before(strategy, specs, slots, i, order[j - 1]) {
            order[j] = order[j - 1];
            j -= 1;
        }
        order[j] = i;
        i += 1;
    }
    let mut end = 0usize;
    let mut step = 0;
    while step < n {
        let b = order[step];
        let (first, last) = (specs[b].live.first, specs[b].live.last);
        let size = slots[b].size;
        // The lowest feasible offset: start at 0 and, while the span overlaps conflicting
        // placed buffers, jump past the furthest of them (aligned). The offset only grows, and
        // every offset jumped over overlaps one of them, so the first that fits is the lowest;
        // it takes as many passes as jumps, usually one or two.
        let mut at: usize = 0;
        if size != 0 {
            loop {
                let mut past = 0;
                let mut k = 0;
                while k < step {
                    let c = order[k];
                    let (c_at, c_size) = (placed[c], slots[c].size);
                    // `at + size` cannot overflow: `at` was checked when it was chosen.
                    if c_at < at + size
                        && at < c_at + c_size
                        && c_size != 0
                        && specs[c].live.first <= last
                        && first <= specs[c].live.last
                        && c_at + c_size > past
                    {
                        past = c_at + c_size;
                    }
                    k += 1;
                }
                if past == 0 {
                    break;
                }
                at = match align_up(past, slots[b].align) {
                    Some(next) if next.checked_add(size).is_some() => next,
                    // Past every conflicting buffer would overflow usize.
                    _ => {
                        return Err(field_err(
                            b,
                            PlanErrorKind::OffsetOverflow {
                                offset: past,
                                size,
                                align: slots[b].align,
                            },
                        ));
                    }
                };
            }
        }
        placed[b] = at;
        if at + size > end {
            end = at + size;
        }
        step += 1;
    }
    Ok(end)
}

/// The aliasing planner (stages): places fields so that only fields whose live ranges meet are
/// kept apart, and returns the planned size (rounded up to `align`). `slots` holds the sizes
/// and alignments on entry and the aliased offsets on return; `best` and `current` are scratch
/// space of one entry per field each.
///
/// Every [`Strategy`] is tried and the smallest plan is kept. On the classic five-buffer case
/// (sizes 10, 20, 30, 40, 50; live 0–1, 1–2, 2–3, 3–4, 0–1) greedy-by-size alone needs 90
/// bytes; the planner reaches the lower bound of 80:
///
/// ```
/// use devarena::plan::{alias_into, FieldSpec, LayoutSpec, Slot};
///
/// let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(5);
/// let live = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 1)];
/// let specs: Vec<FieldSpec> = [10, 20, 30, 40, 50]
///     .iter()
///     .zip(live)
///     .map(|(&n, (a, b))| FieldSpec::of::<u8>(n).with_live(a, b))
///     .collect();
/// let mut slots: Vec<Slot> = [10, 20, 30, 40, 50]
///     .iter()
///     .map(|&size| Slot { offset: 0, size, align: 1 })
///     .collect();
/// let (mut best, mut current) = ([0; 5], [0; 5]);
/// assert_eq!(alias_into(&layout, &specs, &mut slots, 1, &mut best, &mut current), Ok(80));
/// ```
pub const fn alias_into(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    slots: &mut [Slot],
    align: usize,
    best: &mut [usize],
    current: &mut [usize],
) -> Result<usize, PlanError> {
    let _ = layout;
    let n = specs.len();
    assert!(
        slots.len() == n && best.len() == n && current.len() == n,
        "alias_into: slots, best and current must have one entry per field"
    );
    // `best` holds the placement order, `current` a strategy's offsets; the smallest plan so
    // far goes straight into `slots`.
    let mut best_end = UNPLACED;
    let mut s = 0;
    while s < Strategy::ALL.len() {
        let end = match place_with(Strategy::ALL[s], specs, slots, best, current) {
            Ok(e) => e,
            Err(e) => return Err(e),
        };
        if end < best_end {
            best_end = end;
            let mut i = 0;
            while i < n {
                slots[i].offset = current[i];
                i += 1;
            }
        }
        s += 1;
    }
    let end = if n == 0 { 0 } else { best_end };
    match align_up(end, align) {
        Some(size) => Ok(size),
        None => Err(PlanError {
            field: None,
            kind: PlanErrorKind::OffsetOverflow {
                offset: end,
                size: 0,
                align,
            },
        }),
    }
}

/// Plans a fixed number of fields: what the derive stores in its hidden constant.
pub const fn plan<const N: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
) -> Result<Plan<N>, PlanError> {
    let mut slots = [Slot::EMPTY; N];
    let (mut best, mut current) = ([0usize; N], [0usize; N]);
    match plan_into(layout, specs, &mut slots, &mut best, &mut current) {
        Ok(totals) => Ok(Plan { slots, totals }),
        Err(e) => Err(e),
    }
}

/// A message in a fixed buffer, built in const context (the compiler prints it in the error).
#[derive(Clone, Copy)]
pub struct Message {
    buf: [u8; Message::CAPACITY],
    len: usize,
}

impl core::fmt::Debug for Message {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Message {
    /// Bytes a message can hold; longer text is cut at a character boundary.
    pub const CAPACITY: usize = 480;

    /// An empty message.
    pub const fn new() -> Self {
        Message {
            buf: [0; Message::CAPACITY],
            len: 0,
        }
    }

    /// Appends a string, cutting at a character boundary if the buffer is full.
    pub const fn push_str(mut self, s: &str) -> Self {
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() && self.len < Message::CAPACITY {
            // Stop before a multi-byte character that would not fit whole.
            let b = bytes[i];
            let width = if b < 0x80 {
                1
            } else if b >= 0xF0 {
                4
            } else if b >= 0xE0 {
                3
            } else {
                2
            };
            if self.len + width > Message::CAPACITY {
                break;
            }
            let mut k = 0;
            while k < width {
                self.buf[self.len] = bytes[i + k];
                self.len += 1;
                k += 1;
            }
            i += width;
        }
        self
    }

    /// Appends a number in decimal.
    pub const fn push_usize(self, mut v: usize) -> Self {
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        let mut out = [0u8; 20];
        let mut i = 0;
        while i < n {
            out[i] = digits[n - 1 - i];
            i += 1;
        }
        let (s, _) = out.split_at(n);
        match core::str::from_utf8(s) {
            Ok(s) => self.push_str(s),
            Err(_) => self,
        }
    }

    /// The text.
    pub const fn as_str(&self) -> &str {
        let (s, _) = self.buf.split_at(self.len);
        match core::str::from_utf8(s) {
            Ok(s) => s,
            Err(_) => "",
        }
    }
}

impl Default for Message {
    fn default() -> Self {
        Self::new()
    }
}

impl PlanError {
    /// Describes the error, naming the layout, the field (and its type, when given) and the
    /// numbers. The same text appears in compile errors and in run-time [`Display`] output.
    ///
    /// [`Display`]: core::fmt::Display
    pub const fn message(&self, layout: &str, field: &str, ty: &str) -> Message {
        let m = Message::new()
            .push_str("layout `")
            .push_str(layout)
            .push_str("`");
        let m = if self.field.is_some() {
            let m = m.push_str(", field `").push_str(field).push_str("`");
            if ty.is_empty() {
                m
            } else {
                m.push_str(" (").push_str(ty).push_str(")")
            }
        } else {
            m
        };
        let m = m.push_str(": ");
        match self.kind {
            PlanErrorKind::AlignNotPowerOfTwo { align } => m
                .push_str("alignment ")
                .push_usize(align)
                .push_str(" is not a power of two between 1 and 2^30"),
            PlanErrorKind::AlignBelowElement { align, elem_align } => m
                .push_str("alignment ")
                .push_usize(align)
                .push_str(" is below the element's own alignment of ")
                .push_usize(elem_align)
                .push_str(" bytes; ask for ")
                .push_usize(elem_align)
                .push_str(" or more"),
            PlanErrorKind::ZeroLength => {
                m.push_str("a buffer of 0 elements gets no memory; give it at least one element")
            }
            PlanErrorKind::SizeOverflow { elem_size, len } => m
                .push_str("size overflows usize: ")
                .push_usize(len)
                .push_str(" elements of ")
                .push_usize(elem_size)
                .push_str(" bytes exceed ")
                .push_usize(usize::MAX)
                .push_str(" bytes"),
            PlanErrorKind::OffsetOverflow {
                offset,
                size,
                align,
            } => {
                if self.field.is_some() {
                    m.push_str("offset overflows usize: ")
                        .push_usize(size)
                        .push_str(" bytes at alignment ")
                        .push_usize(align)
                        .push_str(", placed after the previous field's end at byte ")
                        .push_usize(offset)
                        .push_str(", would end past byte ")
                        .push_usize(usize::MAX)
                } else {
                    m.push_str("size overflows usize: the fields end at byte ")
                        .push_usize(offset)
                        .push_str(", which cannot be rounded up to the layout's alignment of ")
                        .push_usize(align)
                        .push_str(" bytes")
                }
            }
            PlanErrorKind::OverMaxBytes { size, max_bytes } => m
                .push_str("needs ")
                .push_usize(size)
                .push_str(" bytes, over its max_bytes limit of ")
                .push_usize(max_bytes)
                .push_str(" by ")
                .push_usize(size - max_bytes)
                .push_str(" bytes"),
            PlanErrorKind::BadLiveRange {
                first,
                last,
                stages,
            } => {
                if stages == 0 {
                    m.push_str("a live range needs `#[layout(stages = N)]` on the layout")
                } else {
                    let m = m
                        .push_str("live range ")
                        .push_usize(first)
                        .push_str("..=")
                        .push_usize(last);
                    if first > last {
                        m.push_str(" is empty (its first stage is after its last)")
                    } else {
                        m.push_str(" is outside the stages 0..").push_usize(stages)
                    }
                }
            }
        }
    }

    /// Panics with [`message`](Self::message) (a compile error when evaluated by the compiler).
    #[track_caller]
    pub const fn panic(&self, layout: &str, names: &[&str], types: &[&str]) -> ! {
        let (field, ty) = match self.field {
            Some(i) if i < names.len() && i < types.len() => (names[i], types[i]),
            _ => ("", ""),
        };
        let msg = self.message(layout, field, ty);
        panic!("{}", msg.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_and_detects_overflow() {
        assert_eq!(align_up(1, 1), Some(1));
        assert_eq!(align_up(1, 256), Some(256));
        assert_eq!(align_up(256, 256), Some(256));
        assert_eq!(align_up(usize::MAX - 254, 256), None);
        assert_eq!(align_up(usize::MAX - 255, 256), Some(usize::MAX - 255));
    }

    #[test]
    fn messages_name_the_numbers() {
        let e = PlanError {
            field: Some(1),
            kind: PlanErrorKind::AlignBelowElement {
                align: 2,
                elem_align: 8,
            },
        };
        assert_eq!(
            e.message("Frame", "gray", "f64").as_str(),
            "layout `Frame`, field `gray` (f64): alignment 2 is below the element's own \
             alignment of 8 bytes; ask for 8 or more"
        );
        let e = PlanError {
            field: None,
            kind: PlanErrorKind::OverMaxBytes {
                size: 1024,
                max_bytes: 1000,
            },
        };
        assert_eq!(
            e.message("Frame", "", "").as_str(),
            "layout `Frame`: needs 1024 bytes, over its max_bytes limit of 1000 by 24 bytes"
        );
    }

    #[test]
    fn message_cuts_long_text_at_a_char_boundary() {
        let long = "é".repeat(400);
        let m = Message::new().push_str(&long);
        assert!(m.as_str().len() <= Message::CAPACITY);
        assert!(m.as_str().chars().all(|c| c == 'é'));
        assert_eq!(Message::new().push_usize(0).as_str(), "0");
        assert_eq!(
            Message::new().push_usize(usize::MAX).as_str(),
            "18446744073709551615"
        );
    }
}

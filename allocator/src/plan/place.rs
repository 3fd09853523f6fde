//! The placement rule: each field checked on its own, then placed in declaration order (or,
//! with stages, by the aliasing planner of [`stages`](super::alias_into)).

use super::align::{DEFAULT_ALIGN, align_up, is_valid_align};
use super::error::{PlanError, PlanErrorKind, field_err};
use super::stages::alias_into;
use super::{FieldSpec, LayoutSpec, LiveRange, MAX_STAGES, Plan, Slot, Totals};

/// The default alignment of the layout's fields.
pub const fn layout_default_align(layout: &LayoutSpec) -> Result<usize, PlanError> {
    let align = match layout.align {
        Some(a) => a,
        None => return Ok(DEFAULT_ALIGN),
    };
    if !is_valid_align(align) {
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
    if !is_valid_align(spec.elem_align) {
        return Err(field_err(
            index,
            PlanErrorKind::ElementAlignTooLarge {
                elem_align: spec.elem_align,
            },
        ));
    }
    if let Some(align) = spec.align {
        if !is_valid_align(align) {
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
    if layout.stages > MAX_STAGES {
        return Err(PlanError {
            field: None,
            kind: PlanErrorKind::TooManyStages {
                stages: layout.stages,
                max: MAX_STAGES,
            },
        });
    }
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

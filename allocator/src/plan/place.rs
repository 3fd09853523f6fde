//! The placement rule: each field checked on its own, then placed in declaration order (or,
//! with stages, by the aliasing planner of [`stages`](super::alias_into)).
//!
//! [`alias_into`]: super::alias_into

use super::align::{DEFAULT_ALIGN, align_up, is_valid_align};
use super::error::{PlanError, PlanErrorKind, field_err};
use super::stages::{Strategy, greedy, peak_live_bound, round_size, scratch_len, spans};
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

/// Plans `specs` into `out` and returns the totals. `out` holds one entry per field,
/// `scratch` at least [`scratch_len`]`(specs.len())` entries.
///
/// Without stages, fields are placed in declaration order. With stages, fields whose live
/// ranges never meet may share bytes: see [`alias_into`](super::alias_into).
pub const fn plan_into(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    out: &mut [Slot],
    scratch: &mut [usize],
) -> Result<Totals, PlanError> {
    plan_into_with(layout, specs, out, scratch, &Strategy::ALL)
}

/// [`plan_into`] with only some of the greedy [`Strategy`]s (each is a full pass over the
/// fields; the derive runs them in separate constants to keep each evaluation short).
pub const fn plan_into_with(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    out: &mut [Slot],
    scratch: &mut [usize],
    strategies: &[Strategy],
) -> Result<Totals, PlanError> {
    let n = specs.len();
    assert!(
        out.len() == n && scratch.len() >= scratch_len(n),
        "plan_into: out needs one entry per field, scratch scratch_len(fields)"
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
    let (lo, rest) = scratch.split_at_mut(n);
    let (hi, rest) = rest.split_at_mut(n);
    let (work, rest) = rest.split_at_mut(6 * n);
    let count = spans(layout, specs, out, lo, hi, work);
    totals.peak_live_bound = peak_live_bound(out, lo, hi, count, align, work);
    if layout.stages > 0 {
        let (best, rest) = rest.split_at_mut(n);
        let end = match greedy(strategies, specs, out, lo, hi, count, best, rest) {
            Ok(e) => e,
            Err(e) => return Err(e),
        };
        let mut i = 0;
        while i < n {
            out[i].offset = best[i];
            i += 1;
        }
        totals.size = match round_size(end, align) {
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

/// Plans a fixed number of fields: what the derive stores in its hidden constant. `SCRATCH` is
/// the length of the scratch space, at least [`scratch_len`]`(N)`.
pub const fn plan<const N: usize, const SCRATCH: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
) -> Result<Plan<N>, PlanError> {
    plan_with::<N, SCRATCH>(layout, specs, &Strategy::ALL)
}

/// [`plan`] with only some of the greedy [`Strategy`]s; [`smaller`] keeps the better of two.
pub const fn plan_with<const N: usize, const SCRATCH: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
    strategies: &[Strategy],
) -> Result<Plan<N>, PlanError> {
    let mut slots = [Slot::EMPTY; N];
    let mut scratch = [0usize; SCRATCH];
    match plan_into_with(layout, specs, &mut slots, &mut scratch, strategies) {
        Ok(totals) => Ok(Plan { slots, totals }),
        Err(e) => Err(e),
    }
}

/// The smaller of two plans of one layout (the first on a tie), or the first error.
pub const fn smaller<const N: usize>(
    a: Result<Plan<N>, PlanError>,
    b: Result<Plan<N>, PlanError>,
) -> Result<Plan<N>, PlanError> {
    match (a, b) {
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        (Ok(a), Ok(b)) => Ok(if b.totals.size < a.totals.size { b } else { a }),
    }
}

/// `result`, or an error when its plan is over the layout's `max_bytes`: the derive checks its
/// final plan once, after the search (each greedy ordering alone may well be over).
pub const fn within_max_bytes<const N: usize>(
    layout: &LayoutSpec,
    result: Result<Plan<N>, PlanError>,
) -> Result<Plan<N>, PlanError> {
    match result {
        Ok(p) if p.totals.size > layout.max_bytes => Err(PlanError {
            field: None,
            kind: PlanErrorKind::OverMaxBytes {
                size: p.totals.size,
                max_bytes: layout.max_bytes,
            },
        }),
        other => other,
    }
}

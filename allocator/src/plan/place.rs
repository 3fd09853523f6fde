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
    let (lo, rest) = scratch.split_at_mut(n);
    let (hi, rest) = rest.split_at_mut(n);
    let (work, rest) = rest.split_at_mut(6 * n);
    let (totals, count) = match prepare_into(layout, specs, out, lo, hi, work) {
        Ok(t) => t,
        Err(e) => return Err(e),
    };
    alias_prepared(layout, specs, out, lo, hi, count, totals, rest, strategies)
}

/// The part of planning every greedy ordering shares: checks every field, places the fields
/// in declaration order in `out` (the unaliased plan), computes each field's span of
/// sections into `lo` and `hi` and the lower bound; returns the totals of the unaliased plan
/// and the number of sections. `work` holds `6n` entries.
pub(super) const fn prepare_into(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    out: &mut [Slot],
    lo: &mut [usize],
    hi: &mut [usize],
    work: &mut [usize],
) -> Result<(Totals, usize), PlanError> {
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
    let count = spans(layout, specs, out, lo, hi, work);
    totals.peak_live_bound = peak_live_bound(out, lo, hi, count, align, work);
    Ok((totals, count))
}

/// The rest of planning, after [`prepare_into`]: with stages, the greedy `strategies` move
/// the fields of `out` to their aliased offsets; then `max_bytes` is checked. `scratch`
/// holds what [`scratch_len`] leaves after `lo`, `hi` and `work`.
#[allow(clippy::too_many_arguments)]
const fn alias_prepared(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    out: &mut [Slot],
    lo: &[usize],
    hi: &[usize],
    count: usize,
    totals: Totals,
    scratch: &mut [usize],
    strategies: &[Strategy],
) -> Result<Totals, PlanError> {
    let n = specs.len();
    let mut totals = totals;
    // With stages, the greedy orderings alias the fields; where the declaration-order plan
    // already meets the lower bound (every field live at once somewhere, say), none can do
    // better, and they are not run: with many fields live together they take their
    // pairwise conflicts' time (10,000 fields live in one stage: 16 s) for nothing.
    if layout.stages > 0 && totals.aliasing_may_help() {
        let (best, rest) = scratch.split_at_mut(n);
        let end = match greedy(strategies, specs, out, lo, hi, count, best, rest) {
            Ok(e) => e,
            Err(e) => return Err(e),
        };
        let mut i = 0;
        while i < n {
            out[i].offset = best[i];
            i += 1;
        }
        totals.size = match round_size(end, totals.align) {
            Ok(s) => s,
            Err(e) => return Err(e),
        };
    }
    match check_max_bytes(layout, totals.size) {
        Ok(()) => Ok(totals),
        Err(e) => Err(e),
    }
}

/// What every greedy ordering of one layout shares, computed once: every field checked and
/// placed in declaration order (the unaliased plan, with its totals and lower bound), and
/// each field's span of sections. The derive keeps it in a constant of its own and runs each
/// ordering from it in another ([`plan_prepared`]); [`plan_with`] computes the same plans.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prepared<const N: usize> {
    unaliased: Result<Plan<N>, PlanError>,
    lo: [usize; N],
    hi: [usize; N],
    count: usize,
}

/// The shared part of planning `specs` ([`Prepared`]). `SCRATCH` is at least
/// [`scratch_len`]`(N)`.
#[doc(hidden)]
pub const fn prepare<const N: usize, const SCRATCH: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
) -> Prepared<N> {
    let mut slots = [Slot::EMPTY; N];
    let mut lo = [0usize; N];
    let mut hi = [0usize; N];
    let mut scratch = [0usize; SCRATCH];
    let (work, _) = scratch.split_at_mut(6 * N);
    let (unaliased, count) = match prepare_into(layout, specs, &mut slots, &mut lo, &mut hi, work) {
        Ok((totals, count)) => (Ok(Plan { slots, totals }), count),
        Err(e) => (Err(e), 0),
    };
    Prepared {
        unaliased,
        lo,
        hi,
        count,
    }
}

/// [`plan_with`] from the shared part `prepared` (of the same `layout` and `specs`): the
/// same plan, without checking the fields and finding the spans again. `SCRATCH` is at
/// least [`scratch_len`]`(N)`.
#[doc(hidden)]
pub const fn plan_prepared<const N: usize, const SCRATCH: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
    prepared: &Prepared<N>,
    strategies: &[Strategy],
) -> Result<Plan<N>, PlanError> {
    let plan = match prepared.unaliased {
        Ok(p) => p,
        Err(e) => return Err(e),
    };
    let mut slots = plan.slots;
    let mut scratch = [0usize; SCRATCH];
    match alias_prepared(
        layout,
        specs,
        &mut slots,
        &prepared.lo,
        &prepared.hi,
        prepared.count,
        plan.totals,
        &mut scratch,
        strategies,
    ) {
        Ok(totals) => Ok(Plan { slots, totals }),
        Err(e) => Err(e),
    }
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

/// The smaller of two plans of one layout (the first on a tie); where one ordering failed
/// (its placement overflowed where another's fits), the other; the first error where both
/// failed.
pub const fn smaller<const N: usize>(
    a: Result<Plan<N>, PlanError>,
    b: Result<Plan<N>, PlanError>,
) -> Result<Plan<N>, PlanError> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(if b.totals.size < a.totals.size { b } else { a }),
        (Ok(p), Err(_)) | (Err(_), Ok(p)) => Ok(p),
        (Err(e), Err(_)) => Err(e),
    }
}

/// `result`, or an error when its plan is over the layout's `max_bytes`: the derive checks its
/// final plan once, after the search (each greedy ordering alone may well be over).
pub const fn within_max_bytes<const N: usize>(
    layout: &LayoutSpec,
    result: Result<Plan<N>, PlanError>,
) -> Result<Plan<N>, PlanError> {
    match result {
        Ok(p) => match check_max_bytes(layout, p.totals.size) {
            Ok(()) => Ok(p),
            Err(e) => Err(e),
        },
        other => other,
    }
}

/// An error when a plan of `size` bytes is over the layout's `max_bytes`.
pub(crate) const fn check_max_bytes(layout: &LayoutSpec, size: usize) -> Result<(), PlanError> {
    if size > layout.max_bytes {
        return Err(PlanError {
            field: None,
            kind: PlanErrorKind::OverMaxBytes {
                size,
                max_bytes: layout.max_bytes,
            },
        });
    }
    Ok(())
}

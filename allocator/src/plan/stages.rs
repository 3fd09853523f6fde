//! Stage aliasing: buffers whose live ranges never meet may share bytes. Greedy placement
//! under several orderings, the smallest plan kept.

use super::align::align_up;
use super::error::{PlanError, PlanErrorKind, field_err};
use super::{FieldSpec, LayoutSpec, Slot};

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

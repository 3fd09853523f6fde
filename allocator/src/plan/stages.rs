//! Stage aliasing: buffers whose live ranges never meet may share bytes. Greedy placement
//! under several orderings, the smallest plan kept; and the lower bound every plan meets.

use super::align::{align_up, is_valid_align};
use super::error::{PlanError, PlanErrorKind, field_err};
use super::sort::sort_by_keys;
use super::timeline::{Index, index_len, sections};
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

/// Entries of scratch space that planning `fields` fields needs ([`plan_into`],
/// [`alias_into`], [`place_with`]): linear in the fields but for the interval index's
/// `O(n log n)`.
///
/// [`plan_into`]: super::plan_into
pub const fn scratch_len(fields: usize) -> usize {
    // lo, hi; the timeline's sort (6n); the strategy's order and keys (3n); offsets (n); the
    // conflicts of one buffer, their offsets and ends (3n); the interval index.
    14 * fields + index_len(fields)
}

/// The sections each buffer spans and the timeline's scratch, carved out of `scratch`: the
/// spans go to `lo` and `hi`; returns the number of sections. Without stages every buffer of
/// nonzero size spans the one section.
pub(super) const fn spans(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    slots: &[Slot],
    lo: &mut [usize],
    hi: &mut [usize],
    scratch: &mut [usize],
) -> usize {
    if layout.stages > 0 {
        return sections(specs, slots, lo, hi, scratch);
    }
    let mut i = 0;
    while i < specs.len() {
        lo[i] = 0;
        hi[i] = if slots[i].size == 0 { 0 } else { 1 };
        i += 1;
    }
    1
}

/// Fills the sort keys that put buffers in `strategy`'s order (ties by index).
const fn strategy_keys(
    strategy: Strategy,
    specs: &[FieldSpec],
    slots: &[Slot],
    k1: &mut [usize],
    k2: &mut [usize],
) {
    let mut i = 0;
    while i < specs.len() {
        let (size, live) = (slots[i].size, specs[i].live);
        // `!x` sorts larger first.
        let (a, b) = match strategy {
            Strategy::Declaration => (0, 0),
            Strategy::BySize => (!size, live.first),
            Strategy::ByStart => (live.first, !size),
            Strategy::ByDuration => (!(live.last - live.first), !size),
        };
        k1[i] = a;
        k2[i] = b;
        i += 1;
    }
}

/// The lowest offset, aligned to `align`, at which `size` bytes overlap none of the `k`
/// spans `off[j]..end[j]` (listed by `order[..k]`, which this sorts by offset).
/// `Err(past)` when the offset would not fit in `usize`, `past` being the end it had to clear.
const fn lowest_gap(
    size: usize,
    align: usize,
    order: &mut [usize],
    off: &[usize],
    end: &[usize],
    k: usize,
) -> Result<usize, usize> {
    let (order, _) = order.split_at_mut(k);
    sort_by_keys(order, off, end);
    let mut at = 0usize;
    let mut j = 0;
    while j < k {
        let c = order[j];
        // Sorted by offset: once a span starts at or past our end, so do all the rest.
        if off[c] >= at + size {
            break;
        }
        if end[c] > at {
            at = match align_up(end[c], align) {
                Some(next) if next.checked_add(size).is_some() => next,
                _ => return Err(end[c]),
            };
        }
        j += 1;
    }
    Ok(at)
}

/// The greedy core: places the buffers in `order` one by one, each at the lowest aligned
/// offset that overlaps no conflicting buffer placed before it; writes the offsets to
/// `placed` and returns the end of the highest buffer. `work` holds `3n` entries.
const fn place_in_order(
    order: &[usize],
    slots: &[Slot],
    lo: &[usize],
    hi: &[usize],
    index: &mut Index<'_>,
    placed: &mut [usize],
    work: &mut [usize],
) -> Result<usize, PlanError> {
    index.clear();
    let mut state = Placing { next: 0, end: 0 };
    match place_some(
        order,
        slots,
        lo,
        hi,
        index,
        placed,
        work,
        &mut state,
        u64::MAX,
    ) {
        Ok(_) => Ok(state.end),
        Err(e) => Err(e),
    }
}

/// Where a greedy placement stands: the next step of its order, the end of the highest
/// buffer placed so far.
pub(super) struct Placing {
    pub(super) next: usize,
    pub(super) end: usize,
}

/// [`place_in_order`]'s loop, from `state` on, until every buffer is placed or at least
/// `limit` units of work are done (a unit: a conflicting buffer looked at, or sorted);
/// returns the units done. The index holds the buffers placed before `state.next`.
#[allow(clippy::too_many_arguments)]
pub(super) const fn place_some(
    order: &[usize],
    slots: &[Slot],
    lo: &[usize],
    hi: &[usize],
    index: &mut Index<'_>,
    placed: &mut [usize],
    work: &mut [usize],
    state: &mut Placing,
    limit: u64,
) -> Result<u64, PlanError> {
    let n = order.len();
    let (found, rest) = work.split_at_mut(n);
    let (off, end_of) = rest.split_at_mut(n);
    let mut done = 0u64;
    while state.next < n && done < limit {
        let b = order[state.next];
        let (size, align) = (slots[b].size, slots[b].align);
        let mut at = 0;
        done += 1;
        if lo[b] < hi[b] {
            let k = index.meeting(lo[b], hi[b], found);
            // The sort of the `k` conflicts: about `k log k` steps.
            done += (k * (1 + (usize::BITS - k.leading_zeros()) as usize)) as u64;
            let mut j = 0;
            while j < k {
                let c = found[j];
                off[j] = placed[c];
                // Cannot overflow: `c`'s end was checked when it was placed.
                end_of[j] = placed[c] + slots[c].size;
                found[j] = j;
                j += 1;
            }
            at = match lowest_gap(size, align, found, off, end_of, k) {
                Ok(at) => at,
                Err(past) => {
                    return Err(field_err(
                        b,
                        PlanErrorKind::OffsetOverflow {
                            offset: past,
                            size,
                            align,
                        },
                    ));
                }
            };
            index.insert(b, lo[b], hi[b]);
        }
        placed[b] = at;
        if at + size > state.end {
            state.end = at + size;
        }
        state.next += 1;
    }
    Ok(done)
}

/// Up to this many buffers, the greedy placement walks the placed buffers in offset order
/// ([`place_by_list`]) instead of asking the interval index for the conflicting ones and
/// sorting them: the same offsets, in far fewer steps of the compiler's evaluator (no index
/// to build, no sort per buffer: a 454-field derive builds 3 s faster). Above it, the index
/// keeps large graphs near-linear; natively the two break even near this size (0.8 and
/// 1.0 ms for the four orderings of 500 buffers, the walk 2.3 times slower at 2,000).
const LIST_MAX: usize = 512;

/// No buffer: the end of [`place_by_list`]'s list.
const END: usize = usize::MAX;

/// The greedy core for small layouts: [`place_in_order`]'s offsets, found by walking every
/// buffer placed so far in increasing offset order (a list linked through `next`, `n`
/// entries), skipping those that do not conflict, until the gap is found. Each buffer is then
/// linked in after the last one at or below its offset.
const fn place_by_list(
    order: &[usize],
    slots: &[Slot],
    lo: &[usize],
    hi: &[usize],
    placed: &mut [usize],
    next: &mut [usize],
) -> Result<usize, PlanError> {
    let n = order.len();
    let mut head = END;
    let mut end = 0usize;
    let mut step = 0;
    while step < n {
        let b = order[step];
        let (size, align) = (slots[b].size, slots[b].align);
        let mut at = 0;
        if lo[b] < hi[b] {
            let mut after = END;
            let mut c = head;
            while c != END {
                let o = placed[c];
                // In offset order: once a buffer starts at or past our end, so do the rest.
                // (`at + size` was checked when `at` was raised.)
                if o >= at + size {
                    break;
                }
                if lo[c] < hi[b] && lo[b] < hi[c] {
                    // Cannot overflow: `c`'s end was checked when it was placed.
                    let e = o + slots[c].size;
                    if e > at {
                        at = match align_up(e, align) {
                            Some(v) if v.checked_add(size).is_some() => v,
                            _ => {
                                return Err(field_err(
                                    b,
                                    PlanErrorKind::OffsetOverflow {
                                        offset: e,
                                        size,
                                        align,
                                    },
                                ));
                            }
                        };
                    }
                }
                // Every buffer seen at or below `at` goes before `b` (`at` only grows, and
                // a buffer that raised it starts below it).
                if o <= at {
                    after = c;
                }
                c = next[c];
            }
            if after == END {
                next[b] = head;
                head = b;
            } else {
                next[b] = next[after];
                next[after] = b;
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

/// Places every buffer in `strategy`'s order at the lowest aligned offset that keeps it apart
/// from the conflicting buffers already placed; writes the offsets to `placed` and returns the
/// end of the highest buffer. `slots` gives the sizes and alignments (offsets are ignored);
/// `scratch` holds [`scratch_len`] entries. An alignment the planner does not accept or a live
/// range whose first stage is after its last is an error naming the buffer.
///
/// [`alias_into`] runs every strategy and keeps the smallest; this runs one, to compare.
///
/// Each buffer looks only at the placed buffers whose live ranges meet its own (an interval
/// index finds them), so a plan takes `O(n log n)` plus the conflicts: tens of thousands of
/// buffers plan in well under a second.
pub const fn place_with(
    strategy: Strategy,
    specs: &[FieldSpec],
    slots: &[Slot],
    placed: &mut [usize],
    scratch: &mut [usize],
) -> Result<usize, PlanError> {
    let n = specs.len();
    assert!(
        slots.len() == n && placed.len() == n && scratch.len() >= scratch_len(n),
        "place_with: slots and placed need one entry per field, scratch scratch_len(fields)"
    );
    if let Err(e) = check_given(specs, slots, usize::MAX) {
        return Err(e);
    }
    let (lo, rest) = scratch.split_at_mut(n);
    let (hi, rest) = rest.split_at_mut(n);
    let (timeline, rest) = rest.split_at_mut(6 * n);
    let count = sections(specs, slots, lo, hi, timeline);
    greedy(&[strategy], specs, slots, lo, hi, count, placed, rest)
}

/// What [`alias_into`] and [`place_with`] take as given instead of planning it, checked: every
/// slot's alignment is one the planner accepts and every live range runs forwards (the
/// orderings measure a range's length, the placement rounds up to the alignment).
const fn check_given(specs: &[FieldSpec], slots: &[Slot], stages: usize) -> Result<(), PlanError> {
    let mut i = 0;
    while i < specs.len() {
        let align = slots[i].align;
        if !is_valid_align(align) {
            return Err(field_err(i, PlanErrorKind::AlignNotPowerOfTwo { align }));
        }
        let live = specs[i].live;
        if live.first > live.last {
            return Err(field_err(
                i,
                PlanErrorKind::BadLiveRange {
                    first: live.first,
                    last: live.last,
                    stages,
                },
            ));
        }
        i += 1;
    }
    Ok(())
}

/// Runs `strategies` in turn and keeps the smallest plan: its offsets go to `best`, its end
/// is returned (0 without buffers). `scratch` holds `7n + index_len(n)` entries.
#[allow(clippy::too_many_arguments)]
pub(super) const fn greedy(
    strategies: &[Strategy],
    specs: &[FieldSpec],
    slots: &[Slot],
    lo: &[usize],
    hi: &[usize],
    count: usize,
    best: &mut [usize],
    scratch: &mut [usize],
) -> Result<usize, PlanError> {
    let n = specs.len();
    let (order, rest) = scratch.split_at_mut(n);
    let (k1, rest) = rest.split_at_mut(n);
    let (k2, rest) = rest.split_at_mut(n);
    let (work, rest) = rest.split_at_mut(3 * n);
    let (placed, rest) = rest.split_at_mut(n);
    let mut index = if n > LIST_MAX {
        Some(Index::new(lo, hi, count, rest))
    } else {
        None
    };
    let mut best_end = usize::MAX;
    // An ordering whose placement overflows is skipped: another may fit (the declaration
    // order never ends past the unaliased plan). Its error is returned only where none fits.
    let mut first_error = None;
    let mut s = 0;
    while s < strategies.len() {
        strategy_keys(strategies[s], specs, slots, k1, k2);
        let mut i = 0;
        while i < n {
            order[i] = i;
            i += 1;
        }
        sort_by_keys(order, k1, k2);
        let placement = match &mut index {
            Some(index) => place_in_order(order, slots, lo, hi, index, placed, work),
            None => place_by_list(order, slots, lo, hi, placed, work),
        };
        match placement {
            Ok(end) if end < best_end => {
                best_end = end;
                let mut i = 0;
                while i < n {
                    best[i] = placed[i];
                    i += 1;
                }
            }
            Ok(_) => {}
            Err(e) => {
                if first_error.is_none() {
                    first_error = Some(e);
                }
            }
        }
        s += 1;
    }
    if n == 0 {
        return Ok(0);
    }
    match first_error {
        Some(e) if best_end == usize::MAX => Err(e),
        _ => Ok(best_end),
    }
}

/// Work (see [`place_some`]) between two questions to [`greedy_within`]'s caller: small enough
/// that a time budget is checked every few hundred microseconds.
const CHUNK: u64 = 1 << 14;

/// A plan's offsets, one per buffer, and the end of its highest buffer.
pub(super) type Offsets = (alloc::vec::Vec<usize>, usize);

/// [`greedy`] over every [`Strategy`], at run time, asking `keep_going` (with the units of
/// work done since it last asked) before each strategy, after each sort and every [`CHUNK`]
/// units of placement: once it answers false, the orderings stop. Returns the offsets and end
/// of the smallest plan of the orderings that finished (the first on a tie; `None` if none
/// did) and whether all did: then the plan is [`greedy`]'s.
pub(super) fn greedy_within(
    specs: &[FieldSpec],
    slots: &[Slot],
    lo: &[usize],
    hi: &[usize],
    count: usize,
    keep_going: &mut dyn FnMut(u64) -> bool,
) -> Result<(Option<Offsets>, bool), PlanError> {
    use alloc::vec;
    if !keep_going(0) {
        return Ok((None, false));
    }
    let n = specs.len();
    let (mut order, mut k1, mut k2) = (vec![0; n], vec![0; n], vec![0; n]);
    let (mut work, mut placed, mut best) = (vec![0; 3 * n], vec![0; n], vec![0; n]);
    let mut index_scratch = vec![0; if n > LIST_MAX { index_len(n) } else { 0 }];
    let mut index = if n > LIST_MAX {
        Some(Index::new(lo, hi, count, &mut index_scratch))
    } else {
        None
    };
    let sort_work = (n * (1 + (usize::BITS - n.leading_zeros()) as usize)) as u64;
    let mut best_end = usize::MAX;
    // As in `greedy`: an ordering whose placement overflows is skipped.
    let mut first_error = None;
    // The best plan of the orderings finished so far.
    let so_far = |best: alloc::vec::Vec<usize>, best_end: usize| {
        Ok(((best_end < usize::MAX).then_some((best, best_end)), false))
    };
    'strategies: for strategy in Strategy::ALL {
        strategy_keys(strategy, specs, slots, &mut k1, &mut k2);
        for (i, o) in order.iter_mut().enumerate() {
            *o = i;
        }
        sort_by_keys(&mut order, &k1, &k2);
        if !keep_going(sort_work) {
            return so_far(best, best_end);
        }
        let end = match &mut index {
            Some(index) => {
                index.clear();
                let mut state = Placing { next: 0, end: 0 };
                while state.next < n {
                    let placed_some = place_some(
                        &order,
                        slots,
                        lo,
                        hi,
                        index,
                        &mut placed,
                        &mut work,
                        &mut state,
                        CHUNK,
                    );
                    let done = match placed_some {
                        Ok(done) => done,
                        Err(e) => {
                            first_error.get_or_insert(e);
                            continue 'strategies;
                        }
                    };
                    if !keep_going(done) {
                        return so_far(best, best_end);
                    }
                }
                state.end
            }
            None => match place_by_list(&order, slots, lo, hi, &mut placed, &mut work[..n]) {
                Ok(end) => end,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            },
        };
        if end < best_end {
            best_end = end;
            best.copy_from_slice(&placed);
        }
    }
    if n == 0 {
        return Ok((Some((best, 0)), true));
    }
    match first_error {
        Some(e) if best_end == usize::MAX => Err(e),
        _ => Ok((Some((best, best_end)), true)),
    }
}

/// The aliasing planner (stages): places fields so that only fields whose live ranges meet are
/// kept apart, and returns the planned size (rounded up to `align`). `slots` holds the sizes
/// and alignments on entry and the aliased offsets on return; `scratch` holds
/// [`scratch_len`] entries. An alignment (`align` or a slot's) the planner does not accept or
/// a live range whose first stage is after its last is an error naming the buffer.
///
/// Every [`Strategy`] is tried and the smallest plan is kept. On the classic five-buffer case
/// (sizes 10, 20, 30, 40, 50; live 0–1, 1–2, 2–3, 3–4, 0–1) greedy-by-size alone needs 90
/// bytes; the planner reaches the lower bound of 80:
///
/// ```
/// use devarena::plan::{alias_into, scratch_len, FieldSpec, LayoutSpec, Slot};
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
/// let mut scratch = vec![0; scratch_len(5)];
/// assert_eq!(alias_into(&layout, &specs, &mut slots, 1, &mut scratch), Ok(80));
/// ```
pub const fn alias_into(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    slots: &mut [Slot],
    align: usize,
    scratch: &mut [usize],
) -> Result<usize, PlanError> {
    let n = specs.len();
    assert!(
        slots.len() == n && scratch.len() >= scratch_len(n),
        "alias_into: slots needs one entry per field, scratch scratch_len(fields)"
    );
    if !is_valid_align(align) {
        return Err(PlanError {
            field: None,
            kind: PlanErrorKind::AlignNotPowerOfTwo { align },
        });
    }
    if let Err(e) = check_given(specs, slots, layout.stages) {
        return Err(e);
    }
    let (lo, rest) = scratch.split_at_mut(n);
    let (hi, rest) = rest.split_at_mut(n);
    let (timeline, rest) = rest.split_at_mut(6 * n);
    let count = spans(layout, specs, slots, lo, hi, timeline);
    let (best, rest) = rest.split_at_mut(n);
    let end = match greedy(&Strategy::ALL, specs, slots, lo, hi, count, best, rest) {
        Ok(e) => e,
        Err(e) => return Err(e),
    };
    let mut i = 0;
    while i < n {
        slots[i].offset = best[i];
        i += 1;
    }
    round_size(end, align)
}

/// `end` rounded up to the layout's alignment: the plan's `SIZE`.
pub(super) const fn round_size(end: usize, align: usize) -> Result<usize, PlanError> {
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

/// A lower bound on the size of any plan: over all sections, the bytes the fields live there
/// need side by side, rounded up to the layout's alignment.
///
/// In one section, every live field starts at a multiple of the smallest alignment `m` among
/// them (alignments are powers of two), so each occupies its size rounded up to `m`, except
/// that the field placed last needs no rounding: the section needs at least
/// `Σ align_up(size, m) − max(align_up(size, m) − size)` bytes, and `SIZE`, a multiple of
/// `ALIGN`, at least that rounded up to `ALIGN`. When every field has the same alignment
/// (256 by default) this is the sum of the live sizes, each rounded up to its alignment.
///
/// A sweep over the sections keeps, for every alignment `2^m`, the sum and the largest rounding
/// of the live fields aligned to at least `2^m`, updated as fields join and leave (at most 64
/// steps each): the cost is `O(n log n + sections + 64 n)`, not the sum over fields of the
/// sections each spans (quadratic for a staircase of fields that all live to the end: 30,000
/// of them took 0.78 s). Only where the field with the largest rounding leaves is that largest
/// rounding looked for again among the live fields, at the next section that needs it.
/// `scratch` holds `4n` entries.
#[allow(clippy::too_many_arguments)]
pub(super) const fn peak_live_bound(
    slots: &[Slot],
    lo: &[usize],
    hi: &[usize],
    count: usize,
    align: usize,
    scratch: &mut [usize],
) -> usize {
    let n = slots.len();
    let (by_lo, rest) = scratch.split_at_mut(n);
    let (by_hi, rest) = rest.split_at_mut(n);
    let (live, rest) = rest.split_at_mut(n);
    let (pos, _) = rest.split_at_mut(n);
    let mut i = 0;
    while i < n {
        by_lo[i] = i;
        by_hi[i] = i;
        i += 1;
    }
    sort_by_keys(by_lo, lo, lo);
    sort_by_keys(by_hi, hi, hi);
    // Bit k: some live field is aligned to exactly 2^k (`aligned[k]` of them).
    let mut present: u64 = 0;
    let mut aligned = [0usize; 64];
    // For each m: over the live fields aligned to at least 2^m, the sum of their sizes rounded
    // up to 2^m (exact: u128), the largest rounding and how many fields have it; bit m of
    // `stale`: those fields left, the largest rounding is to be looked for again.
    let mut sums = [0u128; 64];
    let mut largest = [0usize; 64];
    let mut at_largest = [0usize; 64];
    let mut stale: u64 = 0;
    let (mut next_lo, mut next_hi, mut live_len) = (0, 0, 0);
    let mut best = 0;
    let mut s = 0;
    while s < count {
        // Fields ending here leave; fields starting here join (empty spans never join).
        while next_hi < n && hi[by_hi[next_hi]] <= s {
            let f = by_hi[next_hi];
            if lo[f] < hi[f] {
                let last = live[live_len - 1];
                live[pos[f]] = last;
                pos[last] = pos[f];
                live_len -= 1;
                let k = exponent(slots[f].align);
                aligned[k] -= 1;
                if aligned[k] == 0 {
                    present &= !(1 << k);
                }
                let mut m = 0;
                while m <= k {
                    let (rounded, rounding) = rounded_to(slots[f].size, m);
                    sums[m] -= rounded as u128;
                    if stale & (1 << m) == 0 && rounding == largest[m] {
                        at_largest[m] -= 1;
                        if at_largest[m] == 0 {
                            stale |= 1 << m;
                        }
                    }
                    m += 1;
                }
            }
            next_hi += 1;
        }
        while next_lo < n && lo[by_lo[next_lo]] <= s {
            let f = by_lo[next_lo];
            if lo[f] < hi[f] {
                live[live_len] = f;
                pos[f] = live_len;
                live_len += 1;
                let k = exponent(slots[f].align);
                aligned[k] += 1;
                present |= 1 << k;
                let mut m = 0;
                while m <= k {
                    let (rounded, rounding) = rounded_to(slots[f].size, m);
                    sums[m] += rounded as u128;
                    if stale & (1 << m) == 0 {
                        if rounding > largest[m] || at_largest[m] == 0 {
                            largest[m] = rounding;
                            at_largest[m] = 1;
                        } else if rounding == largest[m] {
                            at_largest[m] += 1;
                        }
                    }
                    m += 1;
                }
            }
            next_lo += 1;
        }
        if present != 0 {
            let m = present.trailing_zeros() as usize;
            if stale & (1 << m) != 0 {
                // Every live field is aligned to at least 2^m.
                let (mut top, mut with_top) = (0, 0);
                let mut j = 0;
                while j < live_len {
                    let (_, rounding) = rounded_to(slots[live[j]].size, m);
                    if rounding > top || with_top == 0 {
                        top = rounding;
                        with_top = 1;
                    } else if rounding == top {
                        with_top += 1;
                    }
                    j += 1;
                }
                largest[m] = top;
                at_largest[m] = with_top;
                stale &= !(1 << m);
            }
            // Saturating, as a sum of the live sizes that passes the address space.
            let sum = if sums[m] > usize::MAX as u128 {
                usize::MAX
            } else {
                sums[m] as usize
            };
            let need = match align_up(sum - largest[m], align) {
                Some(n) => n,
                None => sum - largest[m],
            };
            if need > best {
                best = need;
            }
        }
        s += 1;
    }
    best
}

/// The exponent of a field's alignment (a power of two: `2^k`).
const fn exponent(align: usize) -> usize {
    let k = align.trailing_zeros() as usize;
    if k < 64 { k } else { 63 }
}

/// `size` rounded up to `2^m`, and the rounding added (`size` itself, nothing added, where the
/// rounded size would pass the address space).
const fn rounded_to(size: usize, m: usize) -> (usize, usize) {
    match align_up(size, 1 << m) {
        Some(r) => (r, r - size),
        None => (size, 0),
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::super::timeline::index_len;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// [`peak_live_bound`] by its definition: every section, every field live there.
    fn peak_live_bound_by_definition(
        slots: &[Slot],
        lo: &[usize],
        hi: &[usize],
        count: usize,
        align: usize,
    ) -> usize {
        let mut best = 0;
        for s in 0..count {
            let live: Vec<&Slot> = (0..slots.len())
                .filter(|&f| lo[f] <= s && s < hi[f])
                .map(|f| &slots[f])
                .collect();
            let Some(m) = live.iter().map(|f| f.align).min() else {
                continue;
            };
            let rounded = |f: &Slot| align_up(f.size, m).unwrap_or(f.size);
            let sum = live
                .iter()
                .fold(0usize, |a, f| a.saturating_add(rounded(f)));
            let slack = live.iter().map(|f| rounded(f) - f.size).max().unwrap_or(0);
            best = best.max(align_up(sum - slack, align).unwrap_or(sum - slack));
        }
        best
    }

    /// The incremental lower bound equals the one that looks at every live field in every
    /// section, on pseudo-random layouts: mixed alignments (so the smallest alignment changes
    /// as fields come and go), sizes that are and are not multiples of their alignment, sizes
    /// near the address space's end, empty spans, fields leaving while they hold the largest
    /// rounding; and on a staircase (every field lives to the end).
    #[test]
    fn the_incremental_peak_live_bound_equals_its_definition() {
        let mut next = crate::plan::test_rng(0x9E37_79B9_7F4A_7C15u64);
        for round in 0..3000 {
            let n = 1 + next(if round % 10 == 0 { 300 } else { 40 });
            let count = 1 + next(if round % 3 == 0 { 8 } else { 60 });
            let align = 1 << next(10);
            let mut slots = vec![];
            let (mut lo, mut hi) = (vec![], vec![]);
            for _ in 0..n {
                let field_align = 1usize << next(if round % 2 == 0 { 4 } else { 13 });
                let size = match next(12) {
                    0 => 0,
                    1 => usize::MAX - next(1 << 12),
                    2 => field_align * (1 + next(8)),
                    _ => {
                        let bits = 1 + next(16);
                        1 + next(1 << bits)
                    }
                };
                slots.push(Slot {
                    offset: 0,
                    size,
                    align: field_align,
                });
                let (a, b) = (next(count + 1), next(count + 1));
                lo.push(a.min(b));
                hi.push(if round % 5 == 0 { count } else { a.max(b) });
            }
            let mut scratch = vec![0; 4 * n];
            let fast = peak_live_bound(&slots, &lo, &hi, count, align, &mut scratch);
            let slow = peak_live_bound_by_definition(&slots, &lo, &hi, count, align);
            assert_eq!(fast, slow, "round {round}: {n} fields, {count} sections");
        }
    }

    /// The list walk and the interval index give every buffer the same offset, under every
    /// ordering, on pseudo-random layouts (sizes, alignments, live ranges, zero-size buffers).
    #[test]
    fn list_and_index_place_alike() {
        let mut next = crate::plan::test_rng(0x2545_F491_4F6C_DD1Du64);
        for round in 0..200 {
            let n = 1 + next(120);
            let stages = 1 + next(40);
            let mut specs = vec![];
            let mut slots = vec![];
            for _ in 0..n {
                let (a, b) = (next(stages), next(stages));
                let bits = 1 + next(16);
                let size = if next(20) == 0 {
                    0
                } else {
                    1 + next(1 << bits)
                };
                specs.push(FieldSpec::of::<u8>(size).with_live(a.min(b), a.max(b)));
                slots.push(Slot {
                    offset: 0,
                    size,
                    align: 1 << next(9),
                });
            }
            let (mut lo, mut hi, mut timeline) = (vec![0; n], vec![0; n], vec![0; 6 * n]);
            let count = sections(&specs, &slots, &mut lo, &mut hi, &mut timeline);
            for strategy in Strategy::ALL {
                let (mut k1, mut k2) = (vec![0; n], vec![0; n]);
                strategy_keys(strategy, &specs, &slots, &mut k1, &mut k2);
                let mut order: vec::Vec<usize> = (0..n).collect();
                sort_by_keys(&mut order, &k1, &k2);
                let mut scratch = vec![0; index_len(n)];
                let mut index = Index::new(&lo, &hi, count, &mut scratch);
                let (mut by_index, mut work) = (vec![0; n], vec![0; 3 * n]);
                let e1 = place_in_order(
                    &order,
                    &slots,
                    &lo,
                    &hi,
                    &mut index,
                    &mut by_index,
                    &mut work,
                );
                let (mut by_list, mut links) = (vec![0; n], vec![0; n]);
                let e2 = place_by_list(&order, &slots, &lo, &hi, &mut by_list, &mut links);
                assert_eq!(e1, e2, "round {round}, {strategy:?}");
                assert_eq!(by_index, by_list, "round {round}, {strategy:?}");
            }
        }
    }
}

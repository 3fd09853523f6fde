//! Planning under a time budget, at run time: a first plan in `O(n log n)` whatever the
//! layout (a best-fit sweep), then the greedy orderings, each checked against the budget as it
//! goes. [`LayoutBuilder::search`](crate::LayoutBuilder::search) starts from it.
//!
//! The greedy orderings look at every conflicting buffer of every buffer they place, and sort
//! them: on a layout where thousands of buffers are live at once that is seconds for 100,000
//! buffers. The sweep only ever looks at the free space: it walks the buffers by first
//! section, gives back the bytes of the buffers whose live ranges ended, and puts each buffer
//! in the smallest free gap that holds it (aligned), or on top of the plan when none does.
//! Every buffer it places is apart from every buffer live at the same time (those hold the
//! bytes that are not free), so its plan is valid.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec;
use alloc::vec::Vec;
use core::cmp::Reverse;

use super::align::align_up;
use super::error::PlanError;
use super::place::prepare_into;
use super::stages::{greedy_within, round_size};
use super::{FieldSpec, LayoutSpec, Slot, Totals};

/// A plan made within a budget ([`plan_within`]).
#[derive(Debug)]
pub(crate) struct Within {
    /// Every field's slot.
    pub(crate) slots: Vec<Slot>,
    /// The plan's totals.
    pub(crate) totals: Totals,
    /// Whether every greedy ordering ran: the plan is then never larger than
    /// [`plan_into`](super::plan_into)'s.
    pub(crate) complete: bool,
}

/// Plans `specs` like [`plan_into`](super::plan_into) (without checking `max_bytes`), asking
/// `keep_going`, with the units of work done since it last asked, while the greedy orderings
/// run. Every field is checked and the sweep's plan made first, in `O(n log n)` plus the
/// sections the fields span (for the lower bound); then the greedy orderings run until
/// `keep_going` answers false (`complete` false). The smallest plan of the sweep's, the
/// unaliased one and those of the orderings that finished is kept; on a tie, an ordering's.
pub(crate) fn plan_within(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    keep_going: &mut dyn FnMut(u64) -> bool,
) -> Result<Within, PlanError> {
    let n = specs.len();
    let mut slots = vec![Slot::EMPTY; n];
    let (mut lo, mut hi, mut work) = (vec![0; n], vec![0; n], vec![0; 6 * n]);
    let (mut totals, count) = prepare_into(layout, specs, &mut slots, &mut lo, &mut hi, &mut work)?;
    drop(work);
    // Without stages, or with the declaration-order plan at the lower bound already, the
    // unaliased plan is the plan, as in `plan_into`.
    if layout.stages == 0 || !totals.aliasing_may_help() {
        return Ok(Within {
            slots,
            totals,
            complete: true,
        });
    }
    // The unaliased plan (declaration order) is valid: the sweep's must beat it.
    let mut best: Vec<usize> = slots.iter().map(|s| s.offset).collect();
    let mut best_size = totals.unaliased_size;
    if let Some((offsets, end)) = sweep(&slots, &lo, &hi)
        && let Ok(size) = round_size(end, totals.align)
        && size < best_size
    {
        best = offsets;
        best_size = size;
    }
    let (greedy, complete) = greedy_within(specs, &slots, &lo, &hi, count, keep_going)?;
    if let Some((offsets, end)) = greedy {
        let size = round_size(end, totals.align)?;
        // On a tie, the orderings' plan: with all of them run, `plan_into`'s.
        if size <= best_size {
            best = offsets;
            best_size = size;
        }
    }
    for (slot, offset) in slots.iter_mut().zip(best) {
        slot.offset = offset;
    }
    totals.size = best_size;
    Ok(Within {
        slots,
        totals,
        complete,
    })
}

/// The best-fit sweep: the offsets of every buffer (spanning sections `lo[b]..hi[b]`, with
/// `slots`' sizes and alignments) and the end of the highest, or `None` when an offset would
/// not fit in `usize`. `O(n log n)`.
pub(super) fn sweep(slots: &[Slot], lo: &[usize], hi: &[usize]) -> Option<(Vec<usize>, usize)> {
    let n = slots.len();
    // Buffers of zero bytes span nothing and stay at 0.
    let mut by_lo: Vec<usize> = (0..n).filter(|&b| lo[b] < hi[b]).collect();
    // Larger first among buffers that start together: they are the harder to fit later.
    by_lo.sort_unstable_by_key(|&b| (lo[b], Reverse(slots[b].size), b));
    let mut by_hi = by_lo.clone();
    by_hi.sort_unstable_by_key(|&b| (hi[b], b));
    let mut offsets = vec![0; n];
    let mut free = Free::default();
    let (mut closed, mut end) = (0, 0);
    for &b in &by_lo {
        // Buffers whose spans end by this one's first section no longer hold their bytes
        // (each started before this one, so it is placed).
        while closed < by_hi.len() && hi[by_hi[closed]] <= lo[b] {
            let c = by_hi[closed];
            free.give_back(offsets[c], slots[c].size);
            closed += 1;
        }
        let at = free.take(slots[b].size, slots[b].align)?;
        offsets[b] = at;
        end = end.max(at + slots[b].size);
    }
    Some((offsets, end))
}

/// Best-fit candidates looked at before taking a gap wide enough for any alignment.
const CANDIDATES: usize = 8;

/// The free bytes below the top of the plan, as gaps `[start, end)` (by start and by length),
/// and the top, above which everything is free.
#[derive(Default)]
struct Free {
    by_start: BTreeMap<usize, usize>,
    by_len: BTreeSet<(usize, usize)>,
    top: usize,
}

impl Free {
    fn add(&mut self, start: usize, end: usize) {
        if start < end {
            self.by_start.insert(start, end);
            self.by_len.insert((end - start, start));
        }
    }

    fn remove(&mut self, start: usize, end: usize) {
        self.by_start.remove(&start);
        self.by_len.remove(&(end - start, start));
    }

    /// The offset of `size` bytes at `align`: the smallest gap that holds them (of the first
    /// [`CANDIDATES`] at least `size` long, else the smallest that holds them at any
    /// alignment), else the top. `None` past `usize::MAX`.
    fn take(&mut self, size: usize, align: usize) -> Option<usize> {
        let fits = |start: usize, end: usize| {
            align_up(start, align)
                .and_then(|at| at.checked_add(size))
                .is_some_and(|top| top <= end)
        };
        let mut pick = self
            .by_len
            .range((size, 0)..)
            .take(CANDIDATES)
            .map(|&(len, start)| (start, start + len))
            .find(|&(start, end)| fits(start, end));
        if pick.is_none()
            && let Some(wide) = size.checked_add(align - 1)
        {
            pick = self
                .by_len
                .range((wide, 0)..)
                .next()
                .map(|&(len, start)| (start, start + len));
        }
        match pick {
            Some((start, end)) => {
                self.remove(start, end);
                let at = align_up(start, align)?;
                self.add(start, at);
                self.add(at + size, end);
                Some(at)
            }
            None => {
                let at = align_up(self.top, align)?;
                let top = at.checked_add(size)?;
                self.add(self.top, at);
                self.top = top;
                Some(at)
            }
        }
    }

    /// Frees `size` bytes at `offset`, merged with the free bytes either side.
    fn give_back(&mut self, offset: usize, size: usize) {
        let (mut start, mut end) = (offset, offset + size);
        if let Some((&s, &e)) = self.by_start.range(..start).next_back()
            && e == start
        {
            self.remove(s, e);
            start = s;
        }
        if let Some(&e) = self.by_start.get(&end) {
            self.remove(end, e);
            end = e;
        }
        if end == self.top {
            self.top = start;
        } else {
            self.add(start, end);
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::super::validate::{Placed, validate};
    use super::super::{plan_into, scratch_len};
    use super::*;

    /// Pseudo-random layouts: sizes (some zero), alignments up to 4096, live ranges.
    fn layouts(rounds: usize, mut body: impl FnMut(usize, &LayoutSpec, &[FieldSpec])) {
        let mut next = crate::plan::test_rng(0x5DEE_CE66_D1CE_5EEDu64);
        for round in 0..rounds {
            let n = next(if round % 100 == 0 { 2000 } else { 100 });
            let stages = 1 + next(60);
            let specs: Vec<FieldSpec> = (0..n)
                .map(|_| {
                    let (a, b) = (next(stages), next(stages));
                    let spec = match next(12) {
                        0 => FieldSpec::nested(0, 1 << next(6)),
                        _ => {
                            let bits = 1 + next(20);
                            FieldSpec::of::<u8>(1 + next(1 << bits)).with_align(1 << next(13))
                        }
                    };
                    spec.with_live(a.min(b), a.max(b))
                })
                .collect();
            let layout = LayoutSpec::DEFAULT
                .with_align(1 << next(9))
                .with_stages(stages);
            body(round, &layout, &specs);
        }
    }

    fn check(round: usize, specs: &[FieldSpec], within: &Within) {
        let placed: Vec<Placed> = within
            .slots
            .iter()
            .zip(specs)
            .map(|(s, f)| Placed::of(s, f.live))
            .collect();
        assert_eq!(
            validate(&placed, within.totals.size),
            Ok(()),
            "round {round}"
        );
        assert_eq!(within.totals.size % within.totals.align, 0, "round {round}");
        assert!(
            within.totals.size <= within.totals.unaliased_size,
            "round {round}"
        );
    }

    /// Whatever point the budget stops at (before the orderings, in the middle of one, never),
    /// the plan is valid, within the unaliased size; with every ordering run it is never
    /// larger than `plan_into`'s, and the same plan when the sweep does not beat it; the
    /// totals but the size are `plan_into`'s; stopped early, the sweep's plan is kept.
    #[test]
    fn a_plan_within_any_budget_is_valid() {
        let mut swept = 0;
        layouts(200, |round, layout, specs| {
            let n = specs.len();
            let mut slots = vec![Slot::EMPTY; n];
            let mut scratch = vec![0; scratch_len(n)];
            let full = plan_into(layout, specs, &mut slots, &mut scratch).unwrap();
            for stop_after in [0u64, 1, 3, 40_000, u64::MAX] {
                let mut done = 0u64;
                let mut asks = 0;
                let within = plan_within(layout, specs, &mut |units| {
                    done += units;
                    asks += 1;
                    asks <= stop_after
                })
                .unwrap();
                check(round, specs, &within);
                assert_eq!(
                    Totals {
                        size: full.size,
                        ..within.totals
                    },
                    full,
                    "round {round}"
                );
                if within.complete {
                    assert!(within.totals.size <= full.size, "round {round}");
                    if within.totals.size == full.size {
                        let offsets: Vec<usize> = within.slots.iter().map(|s| s.offset).collect();
                        let want: Vec<usize> = slots.iter().map(|s| s.offset).collect();
                        assert_eq!(offsets, want, "round {round}");
                    }
                } else {
                    assert!(stop_after < u64::MAX, "round {round}");
                    swept += (within.totals.size < full.unaliased_size) as usize;
                }
            }
        });
        // Stopped early, the plan is the sweep's, below the unaliased one, in most rounds.
        assert!(swept >= 200, "{swept}");
    }

    /// Buffers all live at once stack up in the sweep (every offset apart), and buffers that
    /// never meet share the bottom; a gap left by a buffer whose life ended is reused, at the
    /// alignment asked for.
    #[test]
    fn the_sweep_reuses_freed_gaps() {
        let slot = |size, align| Slot {
            offset: 0,
            size,
            align,
        };
        // a: 0..100 in sections 0..2; b: 100..164 in 0..1; c (64 at 64) after b ends reuses
        // b's bytes; d (128) after a ends gets 0.
        let slots = [slot(100, 1), slot(64, 4), slot(60, 64), slot(128, 1)];
        let (lo, hi) = ([0, 0, 1, 2], [2, 1, 2, 3]);
        let (offsets, end) = sweep(&slots, &lo, &hi).unwrap();
        assert_eq!(offsets, [0, 100, 128, 0]);
        assert_eq!(end, 188);
        let (offsets, end) = sweep(&[slot(5, 1); 4], &[0; 4], &[1; 4]).unwrap();
        assert_eq!((offsets, end), (vec![0, 5, 10, 15], 20));
    }
}

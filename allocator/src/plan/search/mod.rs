//! The search: a complete, anytime branch and bound over *canonical* plans, as MiniMalloc
//! (Moffitt, ASPLOS 2023) describes them.
//!
//! A plan is canonical when every buffer sits at the lowest aligned offset above the buffers
//! it conflicts with that were placed before it. Every plan can be pushed down into a
//! canonical one that is no higher, so searching the canonical plans alone loses nothing. The
//! search builds a plan one buffer at a time and branches on *which buffer comes next*; the
//! next buffer's offset is then fixed. Buffers are tried by their lowest possible offset, ties
//! broken by a static preorder ([`Preorder`]). It prunes with:
//!
//! * canonical order: offsets never decrease along a branch (ties by preorder), so each plan
//!   is built in one order only;
//! * spatial inference: in every section of the timeline, the buffers still to place need
//!   their total size above the section's floor (the top of what is placed there, and never
//!   below the offset just chosen): a branch that cannot fit them under the capacity is cut;
//! * dominance: a buffer placed at or above the lowest top any waiting buffer could reach
//!   would leave a gap that buffer could fill: that branch is cut, its mirror with the waiting
//!   buffer placed first is explored instead;
//! * a buffer that conflicts with no waiting buffer changes nothing for them: if the branch
//!   with it placed now fails, so do its siblings;
//! * decomposition: when no waiting buffer is live across some boundary between sections, the
//!   two sides are solved one after the other, and a failure on one side never revisits the
//!   choices made on the other.
//!
//! One run of [`Engine::run`] answers a decision question, "is there a plan of at most `cap`
//! bytes?", within a number of nodes; a [`Search`](super::Search) asks it repeatedly, part by
//! part, with tighter capacities and other preorders. Everything is `const fn` over scratch
//! space, and iterative: the compiler runs the very same code when it plans a derived layout.

use super::sort::sort_by_keys;
use super::stages::spans;
use super::timeline::{Index, index_len};
use super::{FieldSpec, LayoutSpec, Slot};

// The branch and bound's steps.
mod branch;
mod order;

pub use order::Preorder;

/// Not placed, no buffer, no frame.
const NONE: usize = usize::MAX;
/// A frame's first candidate is not known yet: `next_candidate` looks for it.
const UNKNOWN: usize = usize::MAX - 2;
/// The owner of the independent parts the timeline falls into before anything is placed: a
/// failure there is a failure of the whole question.
const GLOBAL: usize = usize::MAX - 1;

/// The answer of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A plan that fits: its highest byte ends at `end` (at most the capacity). The engine
    /// keeps its offsets ([`Engine::offsets`]).
    Found {
        /// End of the highest buffer.
        end: usize,
    },
    /// No plan fits the capacity: the search was exhaustive.
    Infeasible,
    /// The node limit (or the work limit, [`Engine::set_work_stop`]) ran out first.
    OutOfNodes,
}

/// The sizes the search needs, measured on the layout: how many sections, conflicting pairs
/// and (buffer, section) pairs it has. [`Sizes::scratch_len`] turns them into scratch space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sizes {
    /// Buffers (fields).
    pub buffers: usize,
    /// Sections of the timeline.
    pub sections: usize,
    /// Pairs of buffers whose live ranges meet (both of nonzero size).
    pub conflicts: usize,
    /// Sum over the buffers of the sections each spans.
    pub spanned: usize,
}

impl Sizes {
    /// Entries of scratch space an [`Engine`] over these sizes needs.
    pub const fn scratch_len(&self) -> usize {
        let (n, s) = (self.buffers, self.sections);
        // Per buffer: lo, hi, rank, off, min_off, free, free_pos, best and the three sort
        // keys (11), the adjacency's bases and its first section's place in `at`
        // (2 (n + 1)), seventeen frame fields (n + 1 frames). Per section: total0, cuts0,
        // floor, total, cuts, three pending-group fields, the lowest waiting offset and how
        // many wait at it, how many wait there, a stamp and the members' bases (13). The
        // members and where each (buffer, section) sits among them (two per spanned section).
        // The adjacency (both directions) and the trail (index and old value per change:
        // one per conflicting pair and one per spanned section along a branch). Building
        // needs the timeline's and the index's scratch besides.
        11 * n
            + 2 * (n + 1)
            + FRAME_FIELDS * (n + 1)
            + 13 * (s + 1)
            + 2 * self.spanned
            + 2 * self.conflicts
            + 2 * (self.conflicts + self.spanned)
            + 12 * n
            + index_len(n)
    }
}

/// Measures what an engine over `slots` (sizes and alignments) needs; `scratch` holds
/// [`scratch_len`](super::scratch_len)`(n)` entries.
///
/// `O(n log n)`, however many pairs conflict: a sweep over the spans by first section counts,
/// as each span starts, the spans still open (a span `[lo, hi)` closes before any span that
/// starts at or after `hi`). So a layout too large to search is known to be so at once.
pub const fn measure(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    slots: &[Slot],
    scratch: &mut [usize],
) -> Sizes {
    let n = specs.len();
    let (lo, rest) = scratch.split_at_mut(n);
    let (hi, rest) = rest.split_at_mut(n);
    let (timeline, rest) = rest.split_at_mut(6 * n);
    let count = spans(layout, specs, slots, lo, hi, timeline);
    let (by_lo, rest) = rest.split_at_mut(n);
    let (by_hi, _) = rest.split_at_mut(n);
    // Only spans that are not empty: `m` of them.
    let mut m = 0;
    let mut spanned = 0;
    let mut b = 0;
    while b < n {
        if lo[b] < hi[b] {
            by_lo[m] = b;
            by_hi[m] = b;
            m += 1;
            spanned += hi[b] - lo[b];
        }
        b += 1;
    }
    let (by_lo, _) = by_lo.split_at_mut(m);
    let (by_hi, _) = by_hi.split_at_mut(m);
    sort_by_keys(by_lo, lo, lo);
    sort_by_keys(by_hi, hi, hi);
    let (mut open, mut closed, mut conflicts) = (0usize, 0, 0usize);
    let mut i = 0;
    while i < m {
        let b = by_lo[i];
        while closed < m && hi[by_hi[closed]] <= lo[b] {
            closed += 1;
            open -= 1;
        }
        conflicts += open;
        open += 1;
        i += 1;
    }
    Sizes {
        buffers: n,
        sections: count,
        conflicts,
        spanned,
    }
}

/// Where a run of the search stands between two calls: a run cut off by its work or node
/// limit goes on with [`Engine::resume`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Run {
    /// A run is under way.
    on: bool,
    /// Its depth, sections, capacity and node limit.
    d: usize,
    slo: usize,
    shi: usize,
    cap: usize,
    stop: u64,
}

impl Run {
    const NONE: Run = Run {
        on: false,
        d: 0,
        slo: 0,
        shi: 0,
        cap: 0,
        stop: 0,
    };
}

/// An [`Engine`]'s numbers, apart from its scratch space: with that space, all
/// [`Engine::reattach`] needs to go on where [`Engine::suspend`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Suspended {
    sizes: Sizes,
    count: usize,
    free_len: usize,
    trail_len: usize,
    pend_len: usize,
    tick: usize,
    trail_mark: usize,
    most0: usize,
    most_next: usize,
    preorder: Preorder,
    rerank: bool,
    floors: bool,
    rtrail_len: usize,
    nodes: u64,
    work: u64,
    work_stop: u64,
    run: Run,
}

impl Suspended {
    /// Units of work the engine had done ([`Engine::work`]).
    pub const fn work(&self) -> u64 {
        self.work
    }

    /// A new engine's numbers.
    const fn fresh(sizes: &Sizes, count: usize, most0: usize) -> Suspended {
        Suspended {
            sizes: *sizes,
            count,
            free_len: 0,
            trail_len: 0,
            pend_len: 0,
            tick: 0,
            trail_mark: 0,
            most0,
            most_next: 0,
            preorder: Preorder::Wat,
            rerank: false,
            floors: true,
            rtrail_len: 0,
            nodes: 0,
            work: 0,
            work_stop: u64::MAX,
            run: Run::NONE,
        }
    }
}

/// Takes `$len` entries off the front of the scratch slice `$rest` as `$name`.
macro_rules! carve {
    ($rest:ident, $name:ident, $len:expr) => {
        let ($name, $rest) = $rest.split_at_mut($len);
    };
}

/// The search's state over borrowed scratch space (see the module's documentation).
pub struct Engine<'a> {
    n: usize,
    count: usize,
    slots: &'a [Slot],
    lo: &'a mut [usize],
    hi: &'a mut [usize],
    adj_base: &'a mut [usize],
    adj: &'a mut [usize],
    total0: &'a mut [usize],
    cuts0: &'a mut [usize],
    rank: &'a mut [usize],
    keys: &'a mut [usize],
    off: &'a mut [usize],
    min_off: &'a mut [usize],
    best: &'a mut [usize],
    floor: &'a mut [usize],
    total: &'a mut [usize],
    cuts: &'a mut [usize],
    free: &'a mut [usize],
    free_pos: &'a mut [usize],
    free_len: usize,
    trail_i: &'a mut [usize],
    trail_v: &'a mut [usize],
    trail_len: usize,
    pend_lo: &'a mut [usize],
    pend_hi: &'a mut [usize],
    pend_owner: &'a mut [usize],
    pend_len: usize,
    frames: &'a mut [usize],
    sec_base: &'a mut [usize],
    sec_mem: &'a mut [usize],
    least: &'a mut [usize],
    least_n: &'a mut [usize],
    waiting: &'a mut [usize],
    span_base: &'a mut [usize],
    at: &'a mut [usize],
    stamp: &'a mut [usize],
    tmp_s: &'a mut [usize],
    tick: usize,
    trail_mark: usize,
    most0: usize,
    most_next: usize,
    preorder: Preorder,
    rerank: bool,
    floors: bool,
    rtrail_i: &'a mut [usize],
    rtrail_v: &'a mut [usize],
    rtrail_len: usize,
    nodes: u64,
    work: u64,
    work_stop: u64,
    run: Run,
    sizes: Sizes,
}

impl core::fmt::Debug for Engine<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Engine")
            .field("buffers", &self.n)
            .field("sections", &self.count)
            .field("conflicts", &(self.adj.len() / 2))
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// The fields of a frame (one level of the search), each an array of `n + 1` in `frames`.
const F_BUF: usize = 0; // the buffer placed at this level (NONE while choosing)
const F_OFF: usize = 1; // the last candidate tried: its offset
const F_RANK: usize = 2; // and its rank
const F_LAST_OFF: usize = 3; // canonical order: the candidate's key must not be below
const F_LAST_RANK: usize = 4; // (offset, rank) of the buffer placed before in this part
const F_SLO: usize = 5; // the part of the timeline being solved: sections [slo, shi)
const F_SHI: usize = 6;
const F_HEIGHT: usize = 7; // dominance: the lowest top any waiting buffer can reach
const F_TRAIL: usize = 8; // the trail's length before this level's placement
const F_BARRIER: usize = 9; // where a failure of this level goes back to (NONE: the parent)
const F_PEND: usize = 10; // pending parts before this level's placement
const F_HAT: usize = 11; // whether the placed buffer conflicts with a waiting one
const F_DONE: usize = 12; // whether the frame has no candidates left
const F_RMARK: usize = 13; // the rank trail's length before this frame reordered its part
const F_FIRST: usize = 14; // the first candidate, found by `open` (or UNKNOWN)
const F_TOTAL: usize = 15; // no section of the part holds more waiting bytes than this
const F_SECOND: usize = 16; // the second candidate, found by `open` (or UNKNOWN)
const FRAME_FIELDS: usize = 17;

impl<'a> Engine<'a> {
    /// Builds the engine for `slots` (sizes and alignments), measured as `sizes`, in
    /// `scratch` (at least [`Sizes::scratch_len`] entries).
    pub const fn new(
        layout: &LayoutSpec,
        specs: &[FieldSpec],
        slots: &'a [Slot],
        sizes: &Sizes,
        scratch: &'a mut [usize],
    ) -> Engine<'a> {
        Engine::make(layout, specs, slots, sizes, scratch, None)
    }

    /// The engine [`suspend`](Self::suspend) left in `scratch`, as it was: its scratch space
    /// holds everything but the numbers in `state`, so a search goes on where it stopped (in
    /// another constant of the derive, which carries the scratch space as a value). `layout`,
    /// `specs` and `slots` are those it was built with (its [`Sizes`] are in `state`).
    pub const fn reattach(
        layout: &LayoutSpec,
        specs: &[FieldSpec],
        slots: &'a [Slot],
        scratch: &'a mut [usize],
        state: &Suspended,
    ) -> Engine<'a> {
        Engine::make(layout, specs, slots, &state.sizes, scratch, Some(state))
    }

    /// What [`reattach`](Self::reattach) needs besides the scratch space.
    pub const fn suspend(&self) -> Suspended {
        Suspended {
            sizes: self.sizes,
            count: self.count,
            free_len: self.free_len,
            trail_len: self.trail_len,
            pend_len: self.pend_len,
            tick: self.tick,
            trail_mark: self.trail_mark,
            most0: self.most0,
            most_next: self.most_next,
            preorder: self.preorder,
            rerank: self.rerank,
            floors: self.floors,
            rtrail_len: self.rtrail_len,
            nodes: self.nodes,
            work: self.work,
            work_stop: self.work_stop,
            run: self.run,
        }
    }

    /// Carves the engine's arrays out of `scratch`; builds them, or takes them as `state`
    /// left them.
    const fn make(
        layout: &LayoutSpec,
        specs: &[FieldSpec],
        slots: &'a [Slot],
        sizes: &Sizes,
        scratch: &'a mut [usize],
        state: Option<&Suspended>,
    ) -> Engine<'a> {
        let n = specs.len();
        assert!(
            slots.len() == n && sizes.buffers == n && scratch.len() >= sizes.scratch_len(),
            "Engine::new: slots need one entry per field, scratch Sizes::scratch_len()"
        );
        let s = sizes.sections;
        let rest = scratch;
        carve!(rest, lo, n);
        carve!(rest, hi, n);
        carve!(rest, timeline, 6 * n);
        let count = match state {
            Some(st) => st.count,
            None => spans(layout, specs, slots, lo, hi, timeline),
        };
        carve!(rest, adj_base, n + 1);
        carve!(rest, adj, 2 * sizes.conflicts);
        carve!(rest, total0, s + 1);
        carve!(rest, cuts0, s + 1);
        carve!(rest, rank, n);
        carve!(rest, keys, 3 * n);
        carve!(rest, off, n);
        carve!(rest, min_off, n);
        carve!(rest, best, n);
        carve!(rest, floor, s + 1);
        carve!(rest, total, s + 1);
        carve!(rest, cuts, s + 1);
        carve!(rest, free, n);
        carve!(rest, free_pos, n);
        carve!(rest, trail_i, sizes.conflicts + sizes.spanned);
        carve!(rest, trail_v, sizes.conflicts + sizes.spanned);
        carve!(rest, pend_lo, s + 1);
        carve!(rest, pend_hi, s + 1);
        carve!(rest, pend_owner, s + 1);
        carve!(rest, frames, FRAME_FIELDS * (n + 1));
        carve!(rest, sec_base, s + 1);
        carve!(rest, sec_mem, sizes.spanned);
        carve!(rest, least, s + 1);
        carve!(rest, least_n, s + 1);
        carve!(rest, waiting, s + 1);
        carve!(rest, span_base, n + 1);
        carve!(rest, at, sizes.spanned);
        carve!(rest, stamp, s + 1);
        carve!(rest, tmp_s, n);
        carve!(rest, rtrail_i, 2 * n);
        carve!(rest, rtrail_v, 2 * n);
        carve!(rest, found, n);
        let mut most0 = 0;
        if state.is_none() {
            // The adjacency, both directions: count the degrees with the interval index, then
            // fill each buffer's list.
            let mut index = Index::new(lo, hi, count, rest);
            let mut b = 0;
            while b <= n {
                adj_base[b] = 0;
                b += 1;
            }
            let mut b = 0;
            while b < n {
                if lo[b] < hi[b] {
                    let k = index.meeting(lo[b], hi[b], found);
                    adj_base[b] += k;
                    let mut j = 0;
                    while j < k {
                        adj_base[found[j]] += 1;
                        j += 1;
                    }
                    index.insert(b, lo[b], hi[b]);
                }
                b += 1;
            }
            // Bases from the degrees; `keys` counts each list's fill.
            let mut sum = 0;
            let mut b = 0;
            while b < n {
                let d = adj_base[b];
                adj_base[b] = sum;
                keys[b] = sum;
                sum += d;
                b += 1;
            }
            adj_base[n] = sum;
            index.clear();
            let mut b = 0;
            while b < n {
                if lo[b] < hi[b] {
                    let k = index.meeting(lo[b], hi[b], found);
                    let mut j = 0;
                    while j < k {
                        let c = found[j];
                        adj[keys[b]] = c;
                        keys[b] += 1;
                        adj[keys[c]] = b;
                        keys[c] += 1;
                        j += 1;
                    }
                    index.insert(b, lo[b], hi[b]);
                }
                b += 1;
            }
            // What each section holds, and how many buffers cross each boundary.
            let mut x = 0;
            while x <= s {
                total0[x] = 0;
                cuts0[x] = 0;
                sec_base[x] = 0;
                stamp[x] = 0;
                x += 1;
            }
            let mut b = 0;
            while b < n {
                let mut x = lo[b];
                while x < hi[b] {
                    total0[x] = total0[x].saturating_add(slots[b].size);
                    if x + 1 < hi[b] {
                        cuts0[x] += 1;
                    }
                    sec_base[x] += 1;
                    x += 1;
                }
                b += 1;
            }
            let mut x = 0;
            while x <= s {
                if total0[x] > most0 {
                    most0 = total0[x];
                }
                x += 1;
            }
            // Each section's members, back to back (`least` counts the fill).
            let mut sum = 0;
            let mut x = 0;
            while x <= s {
                let c = sec_base[x];
                sec_base[x] = sum;
                least[x] = sum;
                sum += c;
                x += 1;
            }
            // Where each buffer's first section sits in `at`.
            let mut b = 0;
            let mut sum = 0;
            while b < n {
                span_base[b] = sum;
                sum += hi[b] - lo[b];
                b += 1;
            }
            span_base[n] = sum;
            let mut b = 0;
            while b < n {
                let mut x = lo[b];
                while x < hi[b] {
                    sec_mem[least[x]] = b;
                    at[span_base[b] + x - lo[b]] = least[x];
                    least[x] += 1;
                    x += 1;
                }
                b += 1;
            }
        }
        let fresh = Suspended::fresh(sizes, count, most0);
        let st = match state {
            Some(st) => st,
            None => &fresh,
        };
        Engine {
            n,
            count,
            slots,
            lo,
            hi,
            adj_base,
            adj,
            total0,
            cuts0,
            rank,
            keys,
            off,
            min_off,
            best,
            floor,
            total,
            cuts,
            free,
            free_pos,
            free_len: st.free_len,
            trail_i,
            trail_v,
            trail_len: st.trail_len,
            pend_lo,
            pend_hi,
            pend_owner,
            pend_len: st.pend_len,
            frames,
            sec_base,
            sec_mem,
            least,
            least_n,
            waiting,
            span_base,
            at,
            stamp,
            tmp_s,
            tick: st.tick,
            trail_mark: st.trail_mark,
            most0: st.most0,
            most_next: st.most_next,
            preorder: st.preorder,
            rerank: st.rerank,
            floors: st.floors,
            rtrail_i,
            rtrail_v,
            rtrail_len: st.rtrail_len,
            nodes: st.nodes,
            work: st.work,
            work_stop: st.work_stop,
            run: st.run,
            sizes: *sizes,
        }
    }

    /// Nodes (placements tried) over all runs so far.
    pub const fn nodes(&self) -> u64 {
        self.nodes
    }

    /// Units of work done so far: inner-loop steps (a buffer looked at, a conflict or a
    /// section visited), a measure of time that is the same on every machine and that the
    /// compiler's step count follows.
    pub const fn work(&self) -> u64 {
        self.work
    }

    /// Makes every later run stop ([`Outcome::OutOfNodes`]) once [`work`](Self::work)
    /// reaches `stop` (no limit by default): the derive's bound on one constant's evaluation.
    pub const fn set_work_stop(&mut self, stop: u64) {
        self.work_stop = stop;
    }

    /// The best plan's offsets: the incumbent ([`set_incumbent`](Self::set_incumbent)) with
    /// each part replaced by the last plan found for it.
    pub const fn offsets(&self) -> &[usize] {
        self.best
    }

    /// Sets the plan the search starts from (a complete, valid one, such as the greedy
    /// planner's): each part found later replaces its own buffers' offsets.
    pub const fn set_incumbent(&mut self, offsets: &[usize]) {
        let mut b = 0;
        while b < self.n {
            self.best[b] = offsets[b];
            b += 1;
        }
    }

    /// The end of the highest buffer of the best plan in part `i` (below
    /// [`parts`](Self::parts)).
    pub const fn part_end(&self, i: usize) -> usize {
        let (slo, shi) = self.part(i);
        let mut end = 0;
        let mut b = 0;
        while b < self.n {
            if self.lo[b] < self.hi[b] && self.lo[b] >= slo && self.lo[b] < shi {
                let top = self.best[b] + self.slots[b].size;
                if top > end {
                    end = top;
                }
            }
            b += 1;
        }
        end
    }

    /// The end of the highest buffer of the best plan.
    pub const fn end(&self) -> usize {
        let mut end = 0;
        let mut b = 0;
        while b < self.n {
            let top = self.best[b] + self.slots[b].size;
            if top > end {
                end = top;
            }
            b += 1;
        }
        end
    }

    /// Buffers (fields) the engine plans.
    pub const fn buffers(&self) -> usize {
        self.n
    }
}

#[cfg(test)]
mod tests;

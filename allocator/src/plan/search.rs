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

use super::align::align_up;
use super::sort::{Keys, sort};
use super::stages::spans;
use super::timeline::{Index, index_len};
use super::{FieldSpec, LayoutSpec, Slot};

/// Not placed, no buffer, no frame.
const NONE: usize = usize::MAX;
/// The owner of the independent parts the timeline falls into before anything is placed: a
/// failure there is a failure of the whole question.
const GLOBAL: usize = usize::MAX - 1;

/// The order that breaks ties between buffers of equal lowest offset: MiniMalloc's three
/// preorders, each by three measures, larger first, with *width* counted two ways. *Width* is
/// the number of stages a buffer lives (or, for the `Section` variants, the number of sections
/// it spans: the stages where something starts or ends), *area* its size times its width,
/// *total* the most bytes still waiting in any of its sections. The search recomputes the
/// order of each independent part of the timeline when it starts on it, with the totals of
/// that moment. Each preorder suits some layouts and not others: drivers try them in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preorder {
    /// Width (stages), then area, then total.
    Wat,
    /// Total, then area, then width (stages).
    Taw,
    /// Total, then width (stages), then area.
    Twa,
    /// Width (sections), then area, then total.
    SectionWat,
    /// Total, then area, then width (sections).
    SectionTaw,
    /// Total, then width (sections), then area.
    SectionTwa,
}

impl Preorder {
    /// All preorders, in the order the drivers try them.
    pub const ALL: [Preorder; 6] = [
        Preorder::Wat,
        Preorder::Taw,
        Preorder::Twa,
        Preorder::SectionWat,
        Preorder::SectionTaw,
        Preorder::SectionTwa,
    ];

    /// Whether widths count sections rather than stages.
    const fn by_sections(self) -> bool {
        matches!(
            self,
            Preorder::SectionWat | Preorder::SectionTaw | Preorder::SectionTwa
        )
    }
}

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
        // keys (11), the adjacency's bases (n + 1), fourteen frame fields (n + 1 frames).
        // Per section: total0, cuts0, floor, total, cuts, three pending-group fields, the
        // lowest waiting offset, a stamp and the members' bases (11). The members (one per
        // spanned section).
        // The adjacency (both directions) and the trail (index and old value per change:
        // one per conflicting pair and one per spanned section along a branch). Building
        // needs the timeline's and the index's scratch besides.
        11 * n
            + (n + 1)
            + 14 * (n + 1)
            + 11 * (s + 1)
            + self.spanned
            + 2 * self.conflicts
            + 2 * (self.conflicts + self.spanned)
            + 12 * n
            + index_len(n)
    }
}

/// Measures what an engine over `slots` (sizes and alignments) needs; `scratch` holds
/// [`scratch_len`](super::scratch_len)`(n)` entries.
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
    let (found, rest) = rest.split_at_mut(n);
    let mut index = Index::new(lo, hi, count, rest);
    let (mut conflicts, mut spanned) = (0, 0);
    let mut b = 0;
    while b < n {
        if lo[b] < hi[b] {
            conflicts += index.meeting(lo[b], hi[b], found);
            spanned += hi[b] - lo[b];
            index.insert(b, lo[b], hi[b]);
        }
        b += 1;
    }
    Sizes {
        buffers: n,
        sections: count,
        conflicts,
        spanned,
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
    low: &'a mut [usize],
    stamp: &'a mut [usize],
    tmp_s: &'a mut [usize],
    tick: usize,
    trail_mark: usize,
    preorder: Preorder,
    rerank: bool,
    floors: bool,
    rtrail_i: &'a mut [usize],
    rtrail_v: &'a mut [usize],
    rtrail_len: usize,
    nodes: u64,
    work: u64,
    work_stop: u64,
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
const FRAME_FIELDS: usize = 14;

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
        let count = spans(layout, specs, slots, lo, hi, timeline);
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
        carve!(rest, low, s + 1);
        carve!(rest, stamp, s + 1);
        carve!(rest, tmp_s, n);
        carve!(rest, rtrail_i, 2 * n);
        carve!(rest, rtrail_v, 2 * n);
        carve!(rest, found, n);
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
        // Each section's members, back to back (`low` counts the fill).
        let mut sum = 0;
        let mut x = 0;
        while x <= s {
            let c = sec_base[x];
            sec_base[x] = sum;
            low[x] = sum;
            sum += c;
            x += 1;
        }
        let mut b = 0;
        while b < n {
            let mut x = lo[b];
            while x < hi[b] {
                sec_mem[low[x]] = b;
                low[x] += 1;
                x += 1;
            }
            b += 1;
        }
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
            free_len: 0,
            trail_i,
            trail_v,
            trail_len: 0,
            pend_lo,
            pend_hi,
            pend_owner,
            pend_len: 0,
            frames,
            sec_base,
            sec_mem,
            low,
            stamp,
            tmp_s,
            tick: 0,
            trail_mark: 0,
            preorder: Preorder::Wat,
            rerank: false,
            floors: true,
            rtrail_i,
            rtrail_v,
            rtrail_len: 0,
            nodes: 0,
            work: 0,
            work_stop: u64::MAX,
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

    /// Sets the preorder that breaks ties between equal offsets. `stages` bounds the widths
    /// of buffers live in every stage.
    pub const fn set_preorder(&mut self, preorder: Preorder, specs: &[FieldSpec], stages: usize) {
        let n = self.n;
        self.preorder = preorder;
        self.rerank = true;
        let (kw, rest) = self.keys.split_at_mut(n);
        let (ka, _) = rest.split_at_mut(n);
        let mut b = 0;
        while b < n {
            let width = if preorder.by_sections() {
                self.hi[b] - self.lo[b]
            } else {
                let live = specs[b].live;
                let last = if stages > 0 && live.last >= stages {
                    stages - 1
                } else {
                    live.last
                };
                (last - live.first).saturating_add(1)
            };
            // Larger first: sort by the complements.
            kw[b] = !width;
            ka[b] = !width.saturating_mul(self.slots[b].size);
            self.free[b] = b;
            b += 1;
        }
        // The whole timeline's order; each part reorders its own buffers when it starts.
        self.reset();
        let mut i = 0;
        while i < self.free_len {
            self.tmp_s[i] = self.free[i];
            i += 1;
        }
        self.rank_list(self.free_len);
    }

    /// Orders the buffers listed in `tmp_s[..m]` by the preorder, with the current totals,
    /// and gives them the ranks `0..m`.
    const fn rank_list(&mut self, m: usize) {
        let n = self.n;
        let (kw, rest) = self.keys.split_at_mut(n);
        let (ka, kt) = rest.split_at_mut(n);
        let mut i = 0;
        while i < m {
            let b = self.tmp_s[i];
            let mut most = 0;
            let mut x = self.lo[b];
            while x < self.hi[b] {
                if self.total[x] > most {
                    most = self.total[x];
                }
                x += 1;
            }
            kt[b] = !most;
            i += 1;
        }
        let (order, _) = self.tmp_s.split_at_mut(m);
        let keys = match self.preorder {
            Preorder::Wat | Preorder::SectionWat => Keys::three(kw, ka, kt),
            Preorder::Taw | Preorder::SectionTaw => Keys::three(kt, ka, kw),
            Preorder::Twa | Preorder::SectionTwa => Keys::three(kt, kw, ka),
        };
        sort(order, keys);
        let mut i = 0;
        while i < m {
            self.rank[self.tmp_s[i]] = i;
            i += 1;
        }
    }

    /// Reorders the waiting buffers of the part `[slo, shi)` about to start, with the totals
    /// of this moment, if the rank trail has room to take it back.
    const fn rerank_part(&mut self, slo: usize, shi: usize) {
        if !self.rerank {
            return;
        }
        let mut m = 0;
        self.work += 2 * self.free_len as u64;
        let mut i = 0;
        while i < self.free_len {
            let b = self.free[i];
            if self.lo[b] >= slo && self.lo[b] < shi {
                self.tmp_s[m] = b;
                m += 1;
            }
            i += 1;
        }
        if m < 2 || self.rtrail_len + m > self.rtrail_i.len() {
            return;
        }
        let mut i = 0;
        while i < m {
            let b = self.tmp_s[i];
            self.rtrail_i[self.rtrail_len] = b;
            self.rtrail_v[self.rtrail_len] = self.rank[b];
            self.rtrail_len += 1;
            i += 1;
        }
        self.rank_list(m);
    }

    /// Takes back the reorderings made since the rank trail was `mark` long.
    const fn restore_ranks(&mut self, mark: usize) {
        while self.rtrail_len > mark {
            self.rtrail_len -= 1;
            self.rank[self.rtrail_i[self.rtrail_len]] = self.rtrail_v[self.rtrail_len];
        }
    }

    /// Whether each independent part reorders its buffers when it starts (on after
    /// [`set_preorder`](Self::set_preorder)); off, the whole search keeps one order.
    pub const fn set_reorder_parts(&mut self, on: bool) {
        self.rerank = on;
    }

    /// Whether spatial inference also puts what waits in a section above the lowest offset
    /// any of it can take (on by default: it prunes much more, at some cost per node).
    pub const fn set_waiting_floors(&mut self, on: bool) {
        self.floors = on;
    }

    /// Sets the preorder directly: `ranks[b]` is buffer `b`'s place in it (a permutation of
    /// `0..n`; lower goes first among equal offsets).
    pub const fn set_ranks(&mut self, ranks: &[usize]) {
        self.rerank = false;
        let mut b = 0;
        while b < self.n {
            self.rank[b] = ranks[b];
            b += 1;
        }
    }

    /// Shuffles the preorder a little: each buffer's rank moves by a pseudo-random amount below
    /// `window`, from `seed` (a restart with other ties, for drivers that try many).
    pub const fn jitter(&mut self, mut seed: u64, window: usize) {
        let n = self.n;
        let (k1, rest) = self.keys.split_at_mut(n);
        let (k2, _) = rest.split_at_mut(n);
        let mut b = 0;
        while b < n {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            k1[b] = self.rank[b] + (seed % (window as u64 + 1)) as usize;
            k2[b] = self.rank[b];
            self.free[b] = b;
            b += 1;
        }
        sort(self.free, Keys::three(k1, k2, k2));
        let mut i = 0;
        while i < n {
            self.rank[self.free[i]] = i;
            i += 1;
        }
    }

    /// Reads field `field` of frame `d`.
    const fn fr(&self, d: usize, field: usize) -> usize {
        self.frames[field * (self.n + 1) + d]
    }

    /// Writes field `field` of frame `d`.
    const fn set(&mut self, d: usize, field: usize, v: usize) {
        self.frames[field * (self.n + 1) + d] = v;
    }

    /// Back to nothing placed.
    const fn reset(&mut self) {
        self.work += (self.n + self.count) as u64 + 1;
        self.free_len = 0;
        let mut b = 0;
        while b < self.n {
            self.min_off[b] = 0;
            if self.lo[b] < self.hi[b] {
                self.off[b] = NONE;
                self.free[self.free_len] = b;
                self.free_pos[b] = self.free_len;
                self.free_len += 1;
            } else {
                // Zero bytes: at offset 0, in nobody's way.
                self.off[b] = 0;
            }
            b += 1;
        }
        let mut x = 0;
        while x <= self.count {
            self.floor[x] = 0;
            self.total[x] = self.total0[x];
            self.cuts[x] = self.cuts0[x];
            self.low[x] = self.total0[x];
            x += 1;
        }
        self.trail_len = 0;
        self.pend_len = 0;
    }

    /// Opens frame `d` on the part `[slo, shi)` of the timeline. An empty part gives way to
    /// the next pending one; returns false when there is none left: every buffer is placed.
    /// A part with a buffer that can no longer fit under `cap` opens with no candidates.
    #[allow(clippy::too_many_arguments)]
    const fn open(
        &mut self,
        d: usize,
        mut slo: usize,
        mut shi: usize,
        mut last_off: usize,
        mut last_rank: usize,
        mut barrier: usize,
        mut root: bool,
        cap: usize,
    ) -> bool {
        self.set(d, F_RMARK, self.rtrail_len);
        loop {
            let mut members = 0;
            let mut height = usize::MAX;
            let mut dead = false;
            self.work += self.free_len as u64 + 1;
            let mut i = 0;
            while i < self.free_len {
                let b = self.free[i];
                if self.lo[b] >= slo && self.lo[b] < shi {
                    members += 1;
                    let top = self.min_off[b].saturating_add(self.slots[b].size);
                    if top > cap {
                        dead = true;
                    }
                    if top < height {
                        height = top;
                    }
                }
                i += 1;
            }
            if members > 0 {
                if root {
                    self.rerank_part(slo, shi);
                }
                self.set(d, F_BUF, NONE);
                self.set(d, F_OFF, NONE);
                self.set(d, F_RANK, NONE);
                // A buffer that cannot fit any more: exhausted before it starts.
                self.set(d, F_DONE, dead as usize);
                self.set(d, F_LAST_OFF, last_off);
                self.set(d, F_LAST_RANK, last_rank);
                self.set(d, F_SLO, slo);
                self.set(d, F_SHI, shi);
                self.set(d, F_HEIGHT, height);
                self.set(d, F_BARRIER, barrier);
                self.set(d, F_PEND, self.pend_len);
                return true;
            }
            if self.pend_len == 0 {
                return false;
            }
            self.pend_len -= 1;
            slo = self.pend_lo[self.pend_len];
            shi = self.pend_hi[self.pend_len];
            barrier = self.pend_owner[self.pend_len];
            last_off = 0;
            last_rank = 0;
            root = true;
        }
    }

    /// The next candidate of frame `d` (the waiting buffer of its part with the smallest
    /// (lowest offset, rank) after the last one tried that canonical order and dominance
    /// allow), or NONE.
    const fn next_candidate(&mut self, d: usize) -> usize {
        if self.fr(d, F_DONE) == 1 {
            return NONE;
        }
        let (cur_off, cur_rank) = (self.fr(d, F_OFF), self.fr(d, F_RANK));
        let (last_off, last_rank) = (self.fr(d, F_LAST_OFF), self.fr(d, F_LAST_RANK));
        let (slo, shi, height) = (self.fr(d, F_SLO), self.fr(d, F_SHI), self.fr(d, F_HEIGHT));
        let (mut pick, mut pick_off, mut pick_rank) = (NONE, usize::MAX, usize::MAX);
        self.work += self.free_len as u64 + 1;
        let mut i = 0;
        while i < self.free_len {
            let b = self.free[i];
            i += 1;
            if self.lo[b] < slo || self.lo[b] >= shi {
                continue;
            }
            let (o, r) = (self.min_off[b], self.rank[b]);
            if o >= height || o < last_off || (o == last_off && r < last_rank) {
                continue;
            }
            if cur_off != NONE && (o < cur_off || (o == cur_off && r <= cur_rank)) {
                continue;
            }
            if o < pick_off || (o == pick_off && r < pick_rank) {
                pick = b;
                pick_off = o;
                pick_rank = r;
            }
        }
        if pick == NONE {
            self.set(d, F_DONE, 1);
        } else {
            self.set(d, F_OFF, pick_off);
            self.set(d, F_RANK, pick_rank);
        }
        pick
    }

    /// Records a change of `min_off` (index below `n`) or of a section's floor (`n + s`).
    const fn remember(&mut self, i: usize, old: usize) {
        self.trail_i[self.trail_len] = i;
        self.trail_v[self.trail_len] = old;
        self.trail_len += 1;
    }

    /// Places `b` at its lowest offset as frame `d`'s choice and returns whether every
    /// section of the frame's part can still hold what waits there under `cap`.
    const fn place(&mut self, d: usize, b: usize, cap: usize) -> bool {
        self.set(d, F_BUF, b);
        self.set(d, F_TRAIL, self.trail_len);
        self.trail_mark = self.trail_len;
        let o = self.min_off[b];
        let size = self.slots[b].size;
        let top = o + size;
        self.off[b] = o;
        // Out of the waiting list (put back by `unplace`, last out first in).
        let p = self.free_pos[b];
        let last = self.free[self.free_len - 1];
        self.free[p] = last;
        self.free_pos[last] = p;
        self.free[self.free_len - 1] = b;
        self.free_pos[b] = self.free_len - 1;
        self.free_len -= 1;
        // Waiting neighbours now start above it.
        let mut hat = 0;
        let mut e = self.adj_base[b];
        while e < self.adj_base[b + 1] {
            let c = self.adj[e];
            e += 1;
            if self.off[c] != NONE {
                continue;
            }
            hat = 1;
            let above = match align_up(top, self.slots[c].align) {
                Some(v) => v,
                None => usize::MAX,
            };
            if self.min_off[c] < above {
                self.remember(c, self.min_off[c]);
                self.min_off[c] = above;
            }
        }
        self.set(d, F_HAT, hat);
        self.work += (self.adj_base[b + 1] - self.adj_base[b]) as u64
            + (self.hi[b] - self.lo[b]) as u64
            + (self.fr(d, F_SHI) - self.fr(d, F_SLO)) as u64;
        let mut x = self.lo[b];
        while x < self.hi[b] {
            self.remember(self.n + x, self.floor[x]);
            self.floor[x] = top;
            self.total[x] -= size;
            if x + 1 < self.hi[b] {
                self.cuts[x] -= 1;
            }
            x += 1;
        }
        if self.floors {
            self.refresh_lows(b);
        }
        let mut x = self.fr(d, F_SLO);
        let shi = self.fr(d, F_SHI);
        while x < shi {
            // What waits in a section sits above the offset just chosen (canonical order),
            // above what is placed there, and above the lowest offset any of it can take.
            let floor = if self.floor[x] > o { self.floor[x] } else { o };
            if floor.saturating_add(self.total[x]) > cap || self.low[x] > cap {
                return false;
            }
            x += 1;
        }
        true
    }

    /// Recomputes the lowest waiting offset of every section where it may have changed since
    /// frame `d`'s trail mark: the sections of `b` and of each buffer whose lowest offset the
    /// trail records.
    const fn refresh_lows(&mut self, b: usize) {
        self.tick += 1;
        let mark = self.trail_mark;
        self.refresh_span(b);
        let mut t = mark;
        while t < self.trail_len {
            if self.trail_i[t] < self.n {
                self.refresh_span(self.trail_i[t]);
            }
            t += 1;
        }
    }

    /// Recomputes the lowest waiting offset of `b`'s sections not yet seen this tick.
    const fn refresh_span(&mut self, b: usize) {
        let mut x = self.lo[b];
        while x < self.hi[b] {
            if self.stamp[x] != self.tick {
                self.stamp[x] = self.tick;
                let mut low = NONE;
                self.work += (self.sec_base[x + 1] - self.sec_base[x]) as u64 + 1;
                let mut e = self.sec_base[x];
                while e < self.sec_base[x + 1] {
                    let u = self.sec_mem[e];
                    if self.off[u] == NONE && self.min_off[u] < low {
                        low = self.min_off[u];
                    }
                    e += 1;
                }
                // What waits here stacks above the lowest offset any of it can take.
                self.low[x] = if low == NONE {
                    0
                } else {
                    low.saturating_add(self.total[x])
                };
            }
            x += 1;
        }
    }

    /// Takes back frame `d`'s placement.
    const fn unplace(&mut self, d: usize) {
        let b = self.fr(d, F_BUF);
        let mark = self.fr(d, F_TRAIL);
        let end = self.trail_len;
        self.work += (end - mark) as u64 + (self.hi[b] - self.lo[b]) as u64 + 1;
        while self.trail_len > mark {
            self.trail_len -= 1;
            let (i, v) = (self.trail_i[self.trail_len], self.trail_v[self.trail_len]);
            if i < self.n {
                self.min_off[i] = v;
            } else {
                self.floor[i - self.n] = v;
            }
        }
        let size = self.slots[b].size;
        let mut x = self.lo[b];
        while x < self.hi[b] {
            self.total[x] += size;
            if x + 1 < self.hi[b] {
                self.cuts[x] += 1;
            }
            x += 1;
        }
        self.off[b] = NONE;
        self.free_len += 1;
        self.set(d, F_BUF, NONE);
        if !self.floors {
            return;
        }
        // The same sections as when it was placed, now with the old lowest offsets.
        self.tick += 1;
        self.refresh_span(b);
        let mut t = mark;
        while t < end {
            if self.trail_i[t] < self.n {
                self.refresh_span(self.trail_i[t]);
            }
            t += 1;
        }
    }

    /// Pushes the independent parts `[p1, p2) .. [pk, shi)` of frame `d`'s part that
    /// placing `b` made (boundaries inside `b`'s span that no waiting buffer crosses now),
    /// and returns `p1` (or `shi` when nothing split): the child solves `[slo, p1)` first.
    const fn split(&mut self, d: usize, b: usize) -> usize {
        let (slo, shi) = (self.fr(d, F_SLO), self.fr(d, F_SHI));
        let start = self.pend_len;
        let mut first = shi;
        let mut prev = NONE;
        let mut x = self.lo[b];
        while x + 1 < self.hi[b] {
            let cut = x + 1;
            if self.cuts[x] == 0 && cut > slo && cut < shi {
                if prev == NONE {
                    first = cut;
                } else {
                    self.push_part(prev, cut, d);
                }
                prev = cut;
            }
            x += 1;
        }
        if prev != NONE {
            self.push_part(prev, shi, d);
            // Reverse what was pushed: the leftmost part is taken first.
            let (mut i, mut j) = (start, self.pend_len - 1);
            while i < j {
                let (l, h) = (self.pend_lo[i], self.pend_hi[i]);
                self.pend_lo[i] = self.pend_lo[j];
                self.pend_hi[i] = self.pend_hi[j];
                self.pend_lo[j] = l;
                self.pend_hi[j] = h;
                i += 1;
                j -= 1;
            }
        }
        first
    }

    const fn push_part(&mut self, lo: usize, hi: usize, owner: usize) {
        self.pend_lo[self.pend_len] = lo;
        self.pend_hi[self.pend_len] = hi;
        self.pend_owner[self.pend_len] = owner;
        self.pend_len += 1;
    }

    /// Pushes the independent parts of the whole timeline (boundaries no buffer crosses) and
    /// returns the end of the first.
    const fn split_root(&mut self) -> usize {
        let mut first = self.count;
        let mut prev = NONE;
        let mut x = 0;
        while x + 1 < self.count {
            if self.cuts[x] == 0 {
                let cut = x + 1;
                if prev == NONE {
                    first = cut;
                } else {
                    self.push_part(prev, cut, GLOBAL);
                }
                prev = cut;
            }
            x += 1;
        }
        if prev != NONE {
            self.push_part(prev, self.count, GLOBAL);
            let (mut i, mut j) = (0, self.pend_len - 1);
            while i < j {
                let (l, h) = (self.pend_lo[i], self.pend_hi[i]);
                self.pend_lo[i] = self.pend_lo[j];
                self.pend_hi[i] = self.pend_hi[j];
                self.pend_lo[j] = l;
                self.pend_hi[j] = h;
                i += 1;
                j -= 1;
            }
        }
        first
    }

    /// The plan of the sections `[slo, shi)` just completed: the offsets of the buffers there
    /// become the best, their end is returned.
    const fn record(&mut self, slo: usize, shi: usize) -> usize {
        self.work += self.n as u64;
        let mut end = 0;
        let mut b = 0;
        while b < self.n {
            if self.lo[b] >= slo && self.lo[b] < shi || self.lo[b] == self.hi[b] {
                self.best[b] = self.off[b];
                let top = self.off[b] + self.slots[b].size;
                if top > end {
                    end = top;
                }
            }
            b += 1;
        }
        end
    }

    /// The independent parts of the timeline: runs of sections that no buffer crosses between.
    /// They can be solved one at a time ([`run_part`](Self::run_part)), each with the preorder
    /// that suits it.
    pub const fn parts(&self) -> usize {
        let mut parts = 1;
        let mut x = 0;
        while x + 1 < self.count {
            if self.cuts0[x] == 0 {
                parts += 1;
            }
            x += 1;
        }
        parts
    }

    /// The sections `[lo, hi)` of independent part `i` (below [`parts`](Self::parts)).
    pub const fn part(&self, i: usize) -> (usize, usize) {
        let (mut k, mut start) = (0, 0);
        let mut x = 0;
        while x + 1 < self.count {
            if self.cuts0[x] == 0 {
                if k == i {
                    return (start, x + 1);
                }
                k += 1;
                start = x + 1;
            }
            x += 1;
        }
        (start, self.count)
    }

    /// [`run`](Self::run) on independent part `i` alone: only its buffers are placed (and
    /// their offsets recorded); the others are left as they were.
    pub const fn run_part(&mut self, i: usize, cap: usize, limit: u64) -> Outcome {
        let (slo, shi) = self.part(i);
        self.search(slo, shi, false, cap, limit)
    }

    /// Searches for a plan whose highest byte ends at most at `cap`, trying at most `limit`
    /// nodes, with the preorder last set by [`set_preorder`](Self::set_preorder).
    pub const fn run(&mut self, cap: usize, limit: u64) -> Outcome {
        self.search(0, self.count, true, cap, limit)
    }

    /// The search over the sections `[slo, shi)`: the whole timeline (`whole`, split into its
    /// independent parts up front) or one part.
    const fn search(
        &mut self,
        slo: usize,
        shi: usize,
        whole: bool,
        cap: usize,
        limit: u64,
    ) -> Outcome {
        self.reset();
        let stop = self.nodes.saturating_add(limit);
        let first = if whole { self.split_root() } else { shi };
        self.rtrail_len = 0;
        if !self.open(0, slo, first, 0, 0, GLOBAL, false, cap) {
            return Outcome::Found {
                end: self.record(slo, shi),
            };
        }
        let mut d = 0;
        loop {
            let b = self.next_candidate(d);
            if b == NONE {
                // Frame `d` is exhausted: go back to where its failure belongs.
                let barrier = self.fr(d, F_BARRIER);
                let target = if barrier == GLOBAL {
                    return Outcome::Infeasible;
                } else if barrier != NONE {
                    barrier
                } else {
                    d - 1
                };
                self.restore_ranks(self.fr(target + 1, F_RMARK));
                while d > target {
                    d -= 1;
                    self.unplace(d);
                }
                self.pend_len = self.fr(d, F_PEND);
                if self.fr(d, F_HAT) == 0 {
                    // Its buffer was in nobody's way: its siblings fail as it did.
                    self.set(d, F_DONE, 1);
                }
                continue;
            }
            if self.nodes >= stop || self.work >= self.work_stop {
                return Outcome::OutOfNodes;
            }
            self.nodes += 1;
            if !self.place(d, b, cap) {
                self.unplace(d);
                if self.fr(d, F_HAT) == 0 {
                    self.set(d, F_DONE, 1);
                }
                continue;
            }
            let first = self.split(d, b);
            let (slo_all, shi_all) = (slo, shi);
            let (slo, shi) = (self.fr(d, F_SLO), self.fr(d, F_SHI));
            let (o, r) = (self.off[b], self.rank[b]);
            let opened = if first == shi {
                self.open(d + 1, slo, shi, o, r, NONE, false, cap)
            } else {
                self.open(d + 1, slo, first, 0, 0, NONE, true, cap)
            };
            if !opened {
                let end = self.record(slo_all, shi_all);
                return Outcome::Found { end };
            }
            d += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// The smallest end over every order of placing each buffer at the lowest aligned offset
    /// above the conflicting buffers placed before it: the optimum (every plan pushes down
    /// into such a one).
    fn brute_force(b: &[(usize, usize, usize, usize)]) -> usize {
        fn go(
            b: &[(usize, usize, usize, usize)],
            placed: &mut Vec<(usize, usize)>,
            used: &mut Vec<bool>,
            best: &mut usize,
        ) {
            if placed.len() == b.len() {
                let end = placed.iter().map(|&(i, o)| o + b[i].0).max().unwrap_or(0);
                *best = (*best).min(end);
                return;
            }
            for i in 0..b.len() {
                if used[i] {
                    continue;
                }
                let (size, align, first, last) = b[i];
                let mut at = 0;
                for &(j, o) in placed.iter() {
                    let (s2, _, f2, l2) = b[j];
                    if first <= l2 && f2 <= last && s2 > 0 && size > 0 {
                        at = at.max(o + s2);
                    }
                }
                let at = at.next_multiple_of(align);
                used[i] = true;
                placed.push((i, at));
                go(b, placed, used, best);
                placed.pop();
                used[i] = false;
            }
        }
        let mut best = usize::MAX;
        go(b, &mut Vec::new(), &mut vec![false; b.len()], &mut best);
        best
    }

    fn check(b: &[(usize, usize, usize, usize)], stages: usize) {
        let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(stages);
        let specs: Vec<FieldSpec> = b
            .iter()
            .map(|&(s, a, f, l)| FieldSpec::of::<u8>(s.max(1)).with_align(a).with_live(f, l))
            .collect();
        let slots: Vec<Slot> = b
            .iter()
            .map(|&(size, align, _, _)| Slot {
                offset: 0,
                size,
                align,
            })
            .collect();
        let n = b.len();
        let mut head = vec![0; crate::plan::scratch_len(n)];
        let sizes = measure(&layout, &specs, &slots, &mut head);
        let mut scratch = vec![0; sizes.scratch_len()];
        let mut engine = Engine::new(&layout, &specs, &slots, &sizes, &mut scratch);
        let opt = brute_force(b);
        for p in Preorder::ALL {
            engine.set_preorder(p, &specs, stages);
            match engine.run(opt, u64::MAX) {
                Outcome::Found { end } => {
                    assert!(end <= opt, "{b:?}: found {end} above {opt}");
                    let off = engine.offsets();
                    for i in 0..n {
                        assert_eq!(off[i] % b[i].1, 0, "{b:?}: misaligned");
                        assert!(off[i] + b[i].0 <= end);
                        for j in 0..i {
                            let meet = b[i].2 <= b[j].3 && b[j].2 <= b[i].3;
                            let overlap = off[i] < off[j] + b[j].0 && off[j] < off[i] + b[i].0;
                            assert!(!(meet && overlap), "{b:?}: {i} and {j} overlap");
                        }
                    }
                }
                other => panic!("{b:?} {p:?}: {other:?} at the optimum {opt}"),
            }
            if opt > 0 {
                assert_eq!(
                    engine.run(opt - 1, u64::MAX),
                    Outcome::Infeasible,
                    "{b:?} {p:?} below the optimum {opt}"
                );
            }
        }
    }

    #[test]
    fn finds_the_optimum_and_proves_nothing_is_lower() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for _ in 0..400 {
            let stages = 1 + next(6);
            let n = 1 + next(6);
            let b: Vec<_> = (0..n)
                .map(|_| {
                    let (x, y) = (next(stages), next(stages));
                    (next(9), 1 << next(3), x.min(y), x.max(y))
                })
                .collect();
            check(&b, stages);
        }
    }
}

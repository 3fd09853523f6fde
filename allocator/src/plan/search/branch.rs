//! The search's steps over its frames: opening a part of the timeline, choosing the next
//! candidate in canonical order, placing and unplacing a buffer (with spatial inference and
//! dominance), splitting the timeline into independent parts, and the iterative branch and
//! bound that runs them.

use super::super::align::align_up;
use super::{
    Engine, F_BARRIER, F_BUF, F_DONE, F_FIRST, F_HAT, F_HEIGHT, F_LAST_OFF, F_LAST_RANK, F_OFF,
    F_PEND, F_RANK, F_RMARK, F_SECOND, F_SHI, F_SLO, F_TOTAL, F_TRAIL, GLOBAL, NONE, Outcome, Run,
    UNKNOWN,
};

impl<'a> Engine<'a> {
    /// Reads field `field` of frame `d`.
    pub(super) const fn fr(&self, d: usize, field: usize) -> usize {
        self.frames[field * (self.n + 1) + d]
    }

    /// Writes field `field` of frame `d`.
    pub(super) const fn set(&mut self, d: usize, field: usize, v: usize) {
        self.frames[field * (self.n + 1) + d] = v;
    }

    /// Back to nothing placed.
    pub(super) const fn reset(&mut self) {
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
            // Every buffer waits at offset 0.
            let members = if x < self.count {
                self.sec_base[x + 1] - self.sec_base[x]
            } else {
                0
            };
            self.least[x] = if members > 0 { 0 } else { NONE };
            self.least_n[x] = members;
            self.waiting[x] = members;
            x += 1;
        }
        self.trail_len = 0;
        self.pend_len = 0;
    }

    /// Opens frame `d` on the part `[slo, shi)` of the timeline. An empty part gives way to
    /// the next pending one; returns false when there is none left: every buffer is placed.
    /// A part with a buffer that can no longer fit under `cap` opens with no candidates.
    /// `most` bounds the waiting bytes of any section of the part (see [`place`](Self::place)).
    /// The one look at the waiting buffers also finds the frame's first candidate, as
    /// [`next_candidate`](Self::next_candidate) would.
    #[allow(clippy::too_many_arguments)]
    pub(super) const fn open(
        &mut self,
        d: usize,
        mut slo: usize,
        mut shi: usize,
        mut last_off: usize,
        mut last_rank: usize,
        mut barrier: usize,
        mut root: bool,
        cap: usize,
        mut most: usize,
    ) -> bool {
        self.set(d, F_RMARK, self.rtrail_len);
        loop {
            let mut members = 0;
            let mut height = usize::MAX;
            let mut dead = false;
            let (mut pick, mut pick_off, mut pick_rank) = (NONE, usize::MAX, usize::MAX);
            let (mut second, mut second_off, mut second_rank) = (NONE, usize::MAX, usize::MAX);
            self.work += self.free_len as u64 + 1;
            let mut i = 0;
            while i < self.free_len {
                let b = self.free[i];
                i += 1;
                if self.lo[b] < slo || self.lo[b] >= shi {
                    continue;
                }
                members += 1;
                let o = self.min_off[b];
                let top = o.saturating_add(self.slots[b].size);
                if top > cap {
                    dead = true;
                }
                if top < height {
                    height = top;
                }
                let r = self.rank[b];
                if o < last_off || (o == last_off && r < last_rank) {
                    continue;
                }
                if o < pick_off || (o == pick_off && r < pick_rank) {
                    (second, second_off, second_rank) = (pick, pick_off, pick_rank);
                    (pick, pick_off, pick_rank) = (b, o, r);
                } else if o < second_off || (o == second_off && r < second_rank) {
                    (second, second_off, second_rank) = (b, o, r);
                }
            }
            if members > 0 {
                if root && self.rerank_part(slo, shi) {
                    // New ranks: the first candidates are looked for again.
                    pick = UNKNOWN;
                    second = UNKNOWN;
                } else {
                    // Dominated, and so is every candidate after it.
                    if pick != NONE && pick_off >= height {
                        pick = NONE;
                    }
                    if second != NONE && second_off >= height {
                        second = NONE;
                    }
                }
                self.set(d, F_BUF, NONE);
                self.set(d, F_OFF, NONE);
                self.set(d, F_RANK, NONE);
                self.set(d, F_FIRST, pick);
                self.set(d, F_SECOND, second);
                self.set(d, F_TOTAL, most);
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
            most = self.most0;
        }
    }

    /// The next candidate of frame `d` (the waiting buffer of its part with the smallest
    /// (lowest offset, rank) after the last one tried that canonical order and dominance
    /// allow), or NONE.
    pub(super) const fn next_candidate(&mut self, d: usize) -> usize {
        if self.fr(d, F_DONE) == 1 {
            return NONE;
        }
        let (cur_off, cur_rank) = (self.fr(d, F_OFF), self.fr(d, F_RANK));
        // The first two: `open` found them.
        let known = if cur_off == NONE {
            self.fr(d, F_FIRST)
        } else {
            let second = self.fr(d, F_SECOND);
            self.set(d, F_SECOND, UNKNOWN);
            second
        };
        if known != UNKNOWN {
            self.work += 1;
            if known == NONE {
                self.set(d, F_DONE, 1);
            } else {
                self.set(d, F_OFF, self.min_off[known]);
                self.set(d, F_RANK, self.rank[known]);
            }
            return known;
        }
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
    pub(super) const fn remember(&mut self, i: usize, old: usize) {
        self.trail_i[self.trail_len] = i;
        self.trail_v[self.trail_len] = old;
        self.trail_len += 1;
    }

    /// Places `b` at its lowest offset as frame `d`'s choice and returns whether every
    /// section of the frame's part can still hold what waits there under `cap`.
    ///
    /// What waits in a section sits above what is placed there, above the offset just chosen
    /// (canonical order) and above the lowest offset any of it can take. Each holds in every
    /// section before the first placement (`search` checks), so only what this placement
    /// changes is looked at: the sections `b` spans (placed top and waiting bytes), those whose
    /// lowest waiting offset moved, and the offset against the most waiting bytes of any
    /// section of the part: that is bounded by the frame's `F_TOTAL` (waiting bytes only
    /// shrink along a branch), and counted afresh only when the bound is not low enough.
    /// The count, or the bound, goes to the child (`most_next`).
    pub(super) const fn place(&mut self, d: usize, b: usize, cap: usize) -> bool {
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
        self.work +=
            (self.adj_base[b + 1] - self.adj_base[b]) as u64 + (self.hi[b] - self.lo[b]) as u64 + 1;
        let mut fits = true;
        let mut x = self.lo[b];
        while x < self.hi[b] {
            self.remember(self.n + x, self.floor[x]);
            self.floor[x] = top;
            self.total[x] -= size;
            if top.saturating_add(self.total[x]) > cap {
                fits = false;
            }
            if x + 1 < self.hi[b] {
                self.cuts[x] -= 1;
            }
            if self.floors {
                // Out of the section's waiting members, to just past them (where taking the
                // placement back finds it: placements are taken back last first).
                let p = self.at[self.span_base[b] + x - self.lo[b]];
                let last = self.sec_base[x] + self.waiting[x] - 1;
                let u = self.sec_mem[last];
                self.sec_mem[p] = u;
                self.at[self.span_base[u] + x - self.lo[u]] = p;
                self.sec_mem[last] = b;
                self.at[self.span_base[b] + x - self.lo[b]] = last;
                self.waiting[x] -= 1;
            }
            x += 1;
        }
        if self.floors && !self.raise_least(b, cap) {
            fits = false;
        }
        let mut most = self.fr(d, F_TOTAL);
        if fits && o.saturating_add(most) > cap {
            let (slo, shi) = (self.fr(d, F_SLO), self.fr(d, F_SHI));
            self.work += (shi - slo) as u64;
            most = 0;
            let mut x = slo;
            while x < shi {
                if self.total[x] > most {
                    most = self.total[x];
                }
                x += 1;
            }
            if o.saturating_add(most) > cap {
                fits = false;
            }
        }
        self.most_next = most;
        fits
    }

    /// Updates the lowest waiting offset of each section (`least`, with `least_n` buffers
    /// at it) after a placement: `b` left the waiting buffers, and each buffer the trail
    /// records from the mark on rose from the offset recorded there. A section only needs a
    /// new look when every buffer at its lowest offset left it or rose. Returns whether what
    /// waits in `b`'s sections and in those looked at again still fits under `cap` above
    /// their lowest offset.
    pub(super) const fn raise_least(&mut self, b: usize, cap: usize) -> bool {
        self.tick += 1;
        let o = self.min_off[b];
        let mut fits = self.drop_least(b, o, cap, 0, 0);
        let mut t = self.trail_mark;
        while t < self.trail_len {
            let (c, was) = (self.trail_i[t], self.trail_v[t]);
            // Where `b` waited, at `o`, nothing waits lower: a buffer that waited above `o`
            // was not the lowest there.
            let (skip_lo, skip_hi) = if was > o {
                (self.lo[b], self.hi[b])
            } else {
                (0, 0)
            };
            if c < self.n && !self.drop_least(c, was, cap, skip_lo, skip_hi) {
                fits = false;
            }
            t += 1;
        }
        // `b`'s sections hold less now: the same lowest offset may no longer fit.
        self.work += (self.hi[b] - self.lo[b]) as u64;
        let mut x = self.lo[b];
        while x < self.hi[b] {
            if self.least[x] != NONE && self.least[x].saturating_add(self.total[x]) > cap {
                fits = false;
            }
            x += 1;
        }
        fits
    }

    /// `u`, waiting at offset `was` in its sections, left them or rose: see
    /// [`raise_least`](Self::raise_least). The sections `[skip_lo, skip_hi)` are left alone:
    /// their lowest waiting offset is known to be below `was`.
    pub(super) const fn drop_least(
        &mut self,
        u: usize,
        was: usize,
        cap: usize,
        skip_lo: usize,
        skip_hi: usize,
    ) -> bool {
        let mut fits = true;
        self.work += 1;
        let mut x = self.lo[u];
        while x < self.hi[u] {
            if x >= skip_lo && x < skip_hi {
                x = skip_hi;
                continue;
            }
            self.work += 1;
            if self.stamp[x] != self.tick && self.least[x] == was {
                self.least_n[x] -= 1;
                if self.least_n[x] == 0 {
                    // Looked at afresh, with every change of this placement made.
                    self.stamp[x] = self.tick;
                    let (mut least, mut count) = (NONE, 0);
                    let (mut e, end) = (self.sec_base[x], self.sec_base[x] + self.waiting[x]);
                    self.work += self.waiting[x] as u64;
                    while e < end {
                        let o = self.min_off[self.sec_mem[e]];
                        e += 1;
                        if o < least {
                            least = o;
                            count = 1;
                        } else if o == least {
                            count += 1;
                        }
                    }
                    self.least[x] = least;
                    self.least_n[x] = count;
                    if least != NONE && least.saturating_add(self.total[x]) > cap {
                        fits = false;
                    }
                }
            }
            x += 1;
        }
        fits
    }

    /// `u` waits again at offset `at` in its sections (the inverse of
    /// [`drop_least`](Self::drop_least), as a placement is taken back), but for the sections
    /// `[skip_lo, skip_hi)`, where something waits lower.
    pub(super) const fn lower_least(
        &mut self,
        u: usize,
        at: usize,
        skip_lo: usize,
        skip_hi: usize,
    ) {
        self.work += 1;
        let mut x = self.lo[u];
        while x < self.hi[u] {
            if x >= skip_lo && x < skip_hi {
                x = skip_hi;
                continue;
            }
            self.work += 1;
            if at < self.least[x] {
                self.least[x] = at;
                self.least_n[x] = 1;
            } else if at == self.least[x] {
                self.least_n[x] += 1;
            }
            x += 1;
        }
    }

    /// Takes back frame `d`'s placement.
    pub(super) const fn unplace(&mut self, d: usize) {
        let b = self.fr(d, F_BUF);
        let mark = self.fr(d, F_TRAIL);
        let end = self.trail_len;
        self.work += (end - mark) as u64 + (self.hi[b] - self.lo[b]) as u64 + 1;
        // `b` waits again at `o` first: where it waits, a buffer back above `o` changes
        // nothing.
        let o = self.min_off[b];
        if self.floors {
            self.lower_least(b, o, 0, 0);
        }
        while self.trail_len > mark {
            self.trail_len -= 1;
            let (i, v) = (self.trail_i[self.trail_len], self.trail_v[self.trail_len]);
            if i < self.n {
                self.min_off[i] = v;
                if self.floors {
                    if v > o {
                        self.lower_least(i, v, self.lo[b], self.hi[b]);
                    } else {
                        self.lower_least(i, v, 0, 0);
                    }
                }
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
            if self.floors {
                // Back where `place` put it, just past the waiting members.
                self.waiting[x] += 1;
            }
            x += 1;
        }
        self.off[b] = NONE;
        self.free_len += 1;
        self.set(d, F_BUF, NONE);
    }

    /// Pushes the independent parts `[p1, p2) .. [pk, shi)` of frame `d`'s part that
    /// placing `b` made (boundaries inside `b`'s span that no waiting buffer crosses now),
    /// and returns `p1` (or `shi` when nothing split): the child solves `[slo, p1)` first.
    pub(super) const fn split(&mut self, d: usize, b: usize) -> usize {
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
            self.reverse_parts(start);
        }
        first
    }

    /// Reverses the pending parts from `start` on (all pushed with one owner): the parts
    /// were pushed left to right, and the leftmost must be taken first.
    pub(super) const fn reverse_parts(&mut self, start: usize) {
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

    pub(super) const fn push_part(&mut self, lo: usize, hi: usize, owner: usize) {
        self.pend_lo[self.pend_len] = lo;
        self.pend_hi[self.pend_len] = hi;
        self.pend_owner[self.pend_len] = owner;
        self.pend_len += 1;
    }

    /// Pushes the independent parts of the whole timeline (boundaries no buffer crosses) and
    /// returns the end of the first.
    pub(super) const fn split_root(&mut self) -> usize {
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
            self.reverse_parts(0);
        }
        first
    }

    /// The plan of the sections `[slo, shi)` just completed: the offsets of the buffers there
    /// become the best, their end is returned.
    pub(super) const fn record(&mut self, slo: usize, shi: usize) -> usize {
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

    /// The first independent part from part `from` on (below [`parts`](Self::parts)) whose
    /// best plan ends above `cap`, or `parts()` when every one fits: what
    /// [`part_end`](Self::part_end) would find part by part, in one pass over the sections
    /// and the buffers (`O(n + sections)` however many parts there are).
    pub const fn first_part_over(&self, from: usize, cap: usize) -> usize {
        // The first section of part `from`.
        let (mut k, mut start) = (0, 0);
        let mut x = 0;
        while x + 1 < self.count && k < from {
            if self.cuts0[x] == 0 {
                k += 1;
                start = x + 1;
            }
            x += 1;
        }
        if k < from {
            return self.parts();
        }
        // The earliest first section, from there on, of a buffer that ends above `cap`.
        let mut first = usize::MAX;
        let mut b = 0;
        while b < self.n {
            if self.lo[b] < self.hi[b]
                && self.lo[b] >= start
                && self.lo[b] < first
                && self.best[b] + self.slots[b].size > cap
            {
                first = self.lo[b];
            }
            b += 1;
        }
        if first == usize::MAX {
            return self.parts();
        }
        // Its part: the parts that end before it.
        let mut part = from;
        let mut x = start;
        while x < first {
            if self.cuts0[x] == 0 {
                part += 1;
            }
            x += 1;
        }
        part
    }

    /// Whether the last run stopped because the work reached
    /// [`set_work_stop`](Self::set_work_stop)'s limit.
    pub const fn out_of_work(&self) -> bool {
        self.work >= self.work_stop
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
    pub(super) const fn search(
        &mut self,
        slo: usize,
        shi: usize,
        whole: bool,
        cap: usize,
        limit: u64,
    ) -> Outcome {
        self.reset();
        self.run.on = false;
        let stop = self.nodes.saturating_add(limit);
        let first = if whole { self.split_root() } else { shi };
        self.rtrail_len = 0;
        // What every section holds fits (`place` then looks only at what changes).
        let mut x = slo;
        while x < shi {
            if self.total0[x] > cap {
                return Outcome::Infeasible;
            }
            x += 1;
        }
        self.work += (shi - slo) as u64;
        if !self.open(0, slo, first, 0, 0, GLOBAL, false, cap, self.most0) {
            return Outcome::Found {
                end: self.record(slo, shi),
            };
        }
        self.run = Run {
            on: true,
            d: 0,
            slo,
            shi,
            cap,
            stop,
        };
        self.resume()
    }

    /// Goes on with the run that its node or work limit cut off ([`Outcome::OutOfNodes`]),
    /// from where it stopped, to the same answers as if it had not stopped; with a new
    /// [`set_work_stop`](Self::set_work_stop) if the work limit cut it off. Answers
    /// [`Outcome::OutOfNodes`] at once when no run is under way.
    pub const fn resume(&mut self) -> Outcome {
        if !self.run.on {
            return Outcome::OutOfNodes;
        }
        let Run {
            slo,
            shi,
            cap,
            stop,
            ..
        } = self.run;
        let mut d = self.run.d;
        loop {
            if self.nodes >= stop || self.work >= self.work_stop {
                self.run.d = d;
                return Outcome::OutOfNodes;
            }
            let b = self.next_candidate(d);
            if b == NONE {
                // Frame `d` is exhausted: go back to where its failure belongs.
                let barrier = self.fr(d, F_BARRIER);
                let target = if barrier == GLOBAL {
                    self.run.on = false;
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
            self.nodes += 1;
            if !self.place(d, b, cap) {
                self.unplace(d);
                if self.fr(d, F_HAT) == 0 {
                    self.set(d, F_DONE, 1);
                }
                continue;
            }
            let first = self.split(d, b);
            let (part_lo, part_hi) = (self.fr(d, F_SLO), self.fr(d, F_SHI));
            let (o, r) = (self.off[b], self.rank[b]);
            let opened = if first == part_hi {
                self.open(
                    d + 1,
                    part_lo,
                    part_hi,
                    o,
                    r,
                    NONE,
                    false,
                    cap,
                    self.most_next,
                )
            } else {
                self.open(d + 1, part_lo, first, 0, 0, NONE, true, cap, self.most_next)
            };
            if !opened {
                self.run.on = false;
                let end = self.record(slo, shi);
                return Outcome::Found { end };
            }
            d += 1;
        }
    }
}

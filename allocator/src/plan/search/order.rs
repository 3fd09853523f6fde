//! The order that breaks ties between buffers of equal lowest offset: the preorders, and the
//! engine's ranks (set from a preorder, given directly, shuffled, recomputed per part).

use super::super::FieldSpec;
use super::super::sort::{Keys, sort};
use super::Engine;

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

impl<'a> Engine<'a> {
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
    /// of this moment, if the rank trail has room to take it back; returns whether it did.
    pub(super) const fn rerank_part(&mut self, slo: usize, shi: usize) -> bool {
        if !self.rerank {
            return false;
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
            return false;
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
        true
    }

    /// Takes back the reorderings made since the rank trail was `mark` long.
    pub(super) const fn restore_ranks(&mut self, mark: usize) {
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
}

//! The timeline of a layout with stages, compressed: the stages where some buffer starts or
//! ends cut the timeline into *sections*, runs of stages in which the same buffers are live.
//! A buffer spans the sections `[lo, hi)`; two buffers conflict (must not share bytes) when
//! their spans meet. Everything after this works on sections, so its cost depends on the
//! number of buffers, never on the number of stages.
//!
//! Also here: the interval index that finds, for a buffer about to be placed, the buffers
//! already placed whose spans meet its own, in O(log sections + answers) — what keeps the
//! greedy planner near-linear on graphs of tens of thousands of buffers.

use super::sort::sort_by_keys;
use super::{FieldSpec, Slot};

/// Computes each buffer's span of sections into `lo` and `hi` and returns the number of
/// sections. A buffer of zero bytes spans nothing (`lo == hi`). `scratch` holds at least
/// `6 * specs.len()` entries.
pub(super) const fn sections(
    specs: &[FieldSpec],
    slots: &[Slot],
    lo: &mut [usize],
    hi: &mut [usize],
    scratch: &mut [usize],
) -> usize {
    let n = specs.len();
    let (points, rest) = scratch.split_at_mut(2 * n);
    let (order, rest) = rest.split_at_mut(2 * n);
    let (rank, _) = rest.split_at_mut(2 * n);
    let mut i = 0;
    while i < n {
        // A range's end, `last + 1`, saturates for `LiveRange::ALL`: only the order of the
        // points matters, and every checked range ends below `MAX_STAGES`.
        points[2 * i] = specs[i].live.first;
        points[2 * i + 1] = specs[i].live.last.saturating_add(1);
        order[2 * i] = 2 * i;
        order[2 * i + 1] = 2 * i + 1;
        i += 1;
    }
    sort_by_keys(order, points, points);
    // Dense ranks: equal points get equal ranks.
    let mut r = 0;
    let mut j = 0;
    while j < 2 * n {
        if j > 0 && points[order[j]] != points[order[j - 1]] {
            r += 1;
        }
        rank[order[j]] = r;
        j += 1;
    }
    let mut count = 0;
    let mut i = 0;
    while i < n {
        if slots[i].size == 0 {
            lo[i] = 0;
            hi[i] = 0;
        } else {
            lo[i] = rank[2 * i];
            hi[i] = rank[2 * i + 1];
            if hi[i] > count {
                count = hi[i];
            }
        }
        i += 1;
    }
    count
}

/// Bits needed for `v` (0 for 0).
const fn bit_length(v: usize) -> usize {
    (usize::BITS - v.leading_zeros()) as usize
}

/// Entries of scratch the index of `n` buffers needs at most (its sections are at most `2n`,
/// or the one section of a layout without stages).
pub(super) const fn index_len(n: usize) -> usize {
    // Nodes: 2S of them, S <= max(2n, 1); per tree a base (2S + 1) and a fill pointer (2S).
    // Entries: a span decomposes into at most 2 * bit_length(4n) nodes of the stabbing tree,
    // and a leaf has at most bit_length(4n) ancestors in the start tree.
    let nodes = if n == 0 { 2 } else { 4 * n };
    let depth = bit_length(4 * n) + 1;
    2 * (2 * nodes + 1) + n * 3 * depth
}

/// An index over the sections `[0, count)` of the buffers placed so far: a bottom-up segment
/// tree twice over. The *stabbing* tree keeps each placed buffer at the nodes that cover its
/// span exactly (a walk up from one section finds every buffer live there); the *start* tree
/// keeps it at every ancestor of its first section (a range of sections decomposes into a few
/// nodes that hold every buffer starting in it). A buffer meets `[lo, hi)` when it is live
/// at `lo` or starts inside `(lo, hi)`, and those two sets are disjoint: each answer comes
/// once. The lists live in one scratch slice, sized in advance for every buffer.
pub(super) struct Index<'a> {
    count: usize,
    stab_base: &'a mut [usize],
    stab_fill: &'a mut [usize],
    start_base: &'a mut [usize],
    start_fill: &'a mut [usize],
    entries: &'a mut [usize],
}

impl<'a> Index<'a> {
    /// Lays out the index for buffers spanning `lo[i]..hi[i]` over `count` sections, in
    /// `scratch` (at least [`index_len`] entries).
    pub(super) const fn new(
        lo: &[usize],
        hi: &[usize],
        count: usize,
        scratch: &'a mut [usize],
    ) -> Index<'a> {
        let nodes = 2 * count;
        let (stab_base, rest) = scratch.split_at_mut(nodes + 1);
        let (stab_fill, rest) = rest.split_at_mut(nodes);
        let (start_base, rest) = rest.split_at_mut(nodes + 1);
        let (start_fill, entries) = rest.split_at_mut(nodes);
        // Count each node's entries (in the fill arrays), then lay the lists out back to back.
        let mut x = 0;
        while x < nodes {
            stab_fill[x] = 0;
            start_fill[x] = 0;
            x += 1;
        }
        let mut i = 0;
        while i < lo.len() {
            if lo[i] < hi[i] {
                let (mut l, mut r) = (lo[i] + count, hi[i] + count);
                while l < r {
                    if l & 1 == 1 {
                        stab_fill[l] += 1;
                        l += 1;
                    }
                    if r & 1 == 1 {
                        r -= 1;
                        stab_fill[r] += 1;
                    }
                    l >>= 1;
                    r >>= 1;
                }
                let mut y = lo[i] + count;
                while y >= 1 {
                    start_fill[y] += 1;
                    y >>= 1;
                }
            }
            i += 1;
        }
        let (mut s, mut t) = (0, 0);
        let mut x = 0;
        while x < nodes {
            stab_base[x] = s;
            s += stab_fill[x];
            x += 1;
        }
        stab_base[nodes] = s;
        let mut x = 0;
        while x < nodes {
            start_base[x] = s + t;
            t += start_fill[x];
            x += 1;
        }
        start_base[nodes] = s + t;
        let mut index = Index {
            count,
            stab_base,
            stab_fill,
            start_base,
            start_fill,
            entries,
        };
        index.clear();
        index
    }

    /// Forgets every placed buffer.
    pub(super) const fn clear(&mut self) {
        let mut x = 0;
        while x < 2 * self.count {
            self.stab_fill[x] = self.stab_base[x];
            self.start_fill[x] = self.start_base[x];
            x += 1;
        }
    }

    /// Records buffer `b`, spanning `[lo, hi)` (not empty), as placed.
    pub(super) const fn insert(&mut self, b: usize, lo: usize, hi: usize) {
        let (mut l, mut r) = (lo + self.count, hi + self.count);
        while l < r {
            if l & 1 == 1 {
                self.entries[self.stab_fill[l]] = b;
                self.stab_fill[l] += 1;
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.entries[self.stab_fill[r]] = b;
                self.stab_fill[r] += 1;
            }
            l >>= 1;
            r >>= 1;
        }
        let mut y = lo + self.count;
        while y >= 1 {
            self.entries[self.start_fill[y]] = b;
            self.start_fill[y] += 1;
            y >>= 1;
        }
    }

    /// Writes the placed buffers whose spans meet `[lo, hi)` (not empty) to `out` and returns
    /// how many there are.
    pub(super) const fn meeting(&self, lo: usize, hi: usize, out: &mut [usize]) -> usize {
        let mut k = 0;
        // Live at `lo`: on the nodes above its leaf.
        let mut y = lo + self.count;
        while y >= 1 {
            let mut e = self.stab_base[y];
            while e < self.stab_fill[y] {
                out[k] = self.entries[e];
                k += 1;
                e += 1;
            }
            y >>= 1;
        }
        // Starting in `(lo, hi)`: on the nodes that make up that range.
        let (mut l, mut r) = (lo + 1 + self.count, hi + self.count);
        while l < r {
            if l & 1 == 1 {
                k = self.take(l, out, k);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                k = self.take(r, out, k);
            }
            l >>= 1;
            r >>= 1;
        }
        k
    }

    /// Appends node `x`'s start list to `out[k..]`; returns the new length.
    const fn take(&self, x: usize, out: &mut [usize], mut k: usize) -> usize {
        let mut e = self.start_base[x];
        while e < self.start_fill[x] {
            out[k] = self.entries[e];
            k += 1;
            e += 1;
        }
        k
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn sections_compress_the_stages() {
        let specs = [
            FieldSpec::of::<u8>(1).with_live(0, 1),
            FieldSpec::of::<u8>(1).with_live(5, 9),
            FieldSpec::of::<u8>(1).with_live(1, 5),
            FieldSpec::of::<u8>(1),
            FieldSpec::nested(0, 1).with_live(3, 3),
        ];
        let slots = [
            Slot {
                offset: 0,
                size: 1,
                align: 1,
            },
            Slot {
                offset: 0,
                size: 1,
                align: 1,
            },
            Slot {
                offset: 0,
                size: 1,
                align: 1,
            },
            Slot {
                offset: 0,
                size: 1,
                align: 1,
            },
            Slot::EMPTY,
        ];
        let (mut lo, mut hi, mut scratch) = ([0; 5], [0; 5], [0; 30]);
        let count = sections(&specs, &slots, &mut lo, &mut hi, &mut scratch);
        // Points 0, 1, 2, 3, 4, 5, 6, 10, MAX: ranks 0..=8.
        assert_eq!(lo, [0, 5, 1, 0, 0]);
        assert_eq!(hi, [2, 7, 6, 8, 0]);
        assert_eq!(count, 8);
    }

    /// The index against a brute-force scan, on pseudo-random spans.
    #[test]
    fn index_finds_exactly_the_placed_buffers_that_meet() {
        let mut next = crate::plan::test_rng(0x9E37_79B9_7F4A_7C15u64);
        for count in [1usize, 2, 3, 7, 16, 33] {
            let n = 40;
            let (mut lo, mut hi) = (vec![0; n], vec![0; n]);
            for i in 0..n {
                let a = next(count);
                let b = a + 1 + next(count - a);
                lo[i] = a;
                hi[i] = b.min(count);
            }
            let mut scratch = vec![0; index_len(n)];
            let mut index = Index::new(&lo, &hi, count, &mut scratch);
            let mut out = vec![0; n];
            for round in 0..2 {
                index.clear();
                let mut placed = Vec::new();
                for step in 0..n {
                    let b = (step * 7 + round) % n;
                    let k = index.meeting(lo[b], hi[b], &mut out);
                    let mut got: Vec<usize> = out[..k].to_vec();
                    got.sort();
                    let mut want: Vec<usize> = placed
                        .iter()
                        .copied()
                        .filter(|&c| lo[c] < hi[b] && lo[b] < hi[c])
                        .collect();
                    want.sort();
                    assert_eq!(got, want, "count {count}, buffer {b}");
                    index.insert(b, lo[b], hi[b]);
                    placed.push(b);
                }
            }
        }
    }
}

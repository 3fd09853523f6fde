//! Spans: pieces of the region that move between indices whole.
//!
//! A thread's heap is an index of its own over spans it took from the pool's index, each one
//! block there. It hands a span back either whole, when nothing in it is used
//! ([`Tlsf::take_span`]), or as its blocks: [`Tlsf::export_span`] takes them out of the
//! thread's index, and [`Tlsf::carve`] cuts the pool's block into the same blocks, the free ones
//! merged with their free neighbours. Afterwards the pool's index is what it would be had it
//! made those blocks itself.

use alloc::vec::Vec;

use super::{Block, GRANULE, NIL, Slots, Tlsf, size_class};

/// One block of a span handed back: its address and size, its slot in the index it leaves,
/// and whether it is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) block: u32,
    pub(crate) free: bool,
}

impl Tlsf {
    /// Adds `addr..addr + size` (multiples of [`GRANULE`], inside the region, apart from every
    /// other span) as one free block with no physical neighbour; returns it. That block stays
    /// the span's first for as long as the span is in the index: a block only ever merges into
    /// the block before it, and the first has none.
    pub(crate) fn add_span(&mut self, addr: u64, size: u64) -> u32 {
        debug_assert!(addr % GRANULE == 0 && size % GRANULE == 0 && size > 0);
        debug_assert!(addr >= self.base && addr - self.base + size <= self.size);
        let slot = if self.lists.spares == 0 {
            self.blocks.push(Block::UNUSED);
            debug_assert!(
                self.blocks.len() < u32::MAX as usize,
                "see MAX_POOL_CAPACITY"
            );
            (self.blocks.len() - 1) as u32
        } else {
            self.lists.pop_spare(&Slots(&mut self.blocks))
        };
        self.blocks[slot as usize] = Block {
            addr,
            size,
            ..Block::UNUSED
        };
        self.lists.free_bytes += size;
        self.lists.insert_free(&mut Slots(&mut self.blocks), slot);
        slot
    }

    /// Takes out the span whose first block is `first` when it is one free block (nothing in
    /// it used or cached); whether it did.
    pub(crate) fn take_span(&mut self, first: u32) -> bool {
        let Some(&b) = self.blocks.get(first as usize) else {
            return false;
        };
        if first == NIL || !b.free || b.prev_phys != NIL || b.next_phys != NIL {
            return false;
        }
        let blocks = &mut Slots(&mut self.blocks);
        self.lists.remove_free(blocks, first);
        self.lists.free_bytes -= b.size;
        self.lists.release_slot(blocks, first);
        true
    }

    /// Takes every block of the span whose first block is `first` out of the index, in address
    /// order, into `out`. The cache must be empty ([`flush`](Self::flush)): a cached block is
    /// neither free nor used.
    ///
    /// # Panics
    ///
    /// When `first` is not a slot of the block array.
    pub(crate) fn export_span(&mut self, first: u32, out: &mut Vec<Piece>) {
        assert!(
            (first as usize) < self.blocks.len() && first != NIL,
            "block {first} out of range"
        );
        debug_assert_eq!(self.cache.blocks, 0, "flush before exporting");
        let blocks = &mut Slots(&mut self.blocks);
        debug_assert_eq!(blocks.at(first).prev_phys, NIL, "a span's first block");
        let mut at = first;
        loop {
            let b = *blocks.at(at);
            debug_assert!(!b.cached);
            out.push(Piece {
                addr: b.addr,
                size: b.size,
                block: at,
                free: b.free,
            });
            if b.free {
                self.lists.remove_free(blocks, at);
                self.lists.free_bytes -= b.size;
            }
            self.lists.release_slot(blocks, at);
            if b.next_phys == NIL {
                break;
            }
            at = b.next_phys;
        }
    }

    /// Cuts the used block `block` into `pieces` (contiguous, in address order, covering it
    /// exactly, no two free pieces adjacent) and returns the free ones to the free lists,
    /// merged with free neighbours. `out` gets each piece's block here, [`NIL`] for the free
    /// ones (they may have merged into a neighbour).
    ///
    /// # Panics
    ///
    /// When `block` is not a slot of the block array.
    pub(crate) fn carve(&mut self, block: u32, pieces: &[Piece], out: &mut Vec<u32>) {
        assert!(
            (block as usize) < self.blocks.len() && block != NIL,
            "block {block} out of range"
        );
        let b = self.blocks[block as usize];
        debug_assert!(!b.free && !b.cached);
        debug_assert_eq!(pieces.iter().map(|p| p.size).sum::<u64>(), b.size);
        debug_assert!(pieces.first().is_some_and(|p| p.addr == b.addr));
        debug_assert!(
            pieces
                .windows(2)
                .all(|w| w[0].addr + w[0].size == w[1].addr)
        );
        debug_assert!(pieces.windows(2).all(|w| !(w[0].free && w[1].free)));
        while self.lists.spares < pieces.len() {
            self.add_spares();
        }
        let blocks = &mut Slots(&mut self.blocks);
        let next = b.next_phys;
        let mut prev = b.prev_phys;
        out.clear();
        for (i, p) in pieces.iter().enumerate() {
            let slot = if i == 0 {
                block
            } else {
                self.lists.pop_spare(blocks)
            };
            *blocks.at_mut(slot) = Block {
                addr: p.addr,
                size: p.size,
                prev_phys: prev,
                next_phys: NIL,
                // A used piece carries its size's class (a free one gets its list's below).
                class: size_class(p.size) as u16,
                ..Block::UNUSED
            };
            if i > 0 {
                blocks.at_mut(prev).next_phys = slot;
            }
            prev = slot;
            out.push(slot);
        }
        // The last piece takes the block's place before its successor (the sentinel when
        // there is none: a write there is harmless by design).
        blocks.at_mut(prev).next_phys = next;
        blocks.at_mut(next).prev_phys = prev;
        for (p, slot) in pieces.iter().zip(out.iter_mut()) {
            if p.free {
                self.lists.free(blocks, *slot);
                *slot = NIL;
            }
        }
    }

    /// The blocks of the span whose first block is `first`, in address order, into `out`;
    /// nothing changes.
    pub(crate) fn span_blocks(&self, first: u32, out: &mut Vec<Piece>) {
        let mut at = first;
        while at != NIL {
            let b = &self.blocks[at as usize];
            out.push(Piece {
                addr: b.addr,
                size: b.size,
                block: at,
                free: b.free,
            });
            at = b.next_phys;
        }
    }
}

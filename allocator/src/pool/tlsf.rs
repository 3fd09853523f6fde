//! Two-level segregated fit (TLSF) over one address range, with all metadata on the host.
//!
//! Free blocks sit in size-class lists indexed by two levels: the first by the power of two of
//! the size, the second by the next [`SL_SHIFT`] bits below it. A bitmap per level finds the
//! smallest non-empty class that fits in two `trailing_zeros`, so allocation and free are O(1);
//! free blocks merge with their free physical neighbours on free, so there are never two
//! adjacent free blocks.
//!
//! Addresses are absolute (`base..base + size`) and `u64`, so alignment is checked on the real
//! address and regions far beyond 4 GiB work. Every block starts on a [`GRANULE`] boundary and
//! is a multiple of [`GRANULE`] bytes.

use alloc::vec::Vec;

/// log2 of [`GRANULE`].
pub(crate) const GRANULE_SHIFT: u32 = 8;
/// The unit of placement: every block starts at a multiple of it and spans a multiple of it
/// (256 bytes, what `cudaMalloc` guarantees).
pub(crate) const GRANULE: u64 = 1 << GRANULE_SHIFT;
/// log2 of the number of second-level classes per power of two.
const SL_SHIFT: u32 = 5;
const SL_COUNT: usize = 1 << SL_SHIFT;
/// First-level classes: sizes in granules below 2^56 (every `u64` byte count).
const FL_COUNT: usize = (64 - GRANULE_SHIFT - SL_SHIFT + 1) as usize;
/// No block.
const NIL: u32 = u32::MAX;
/// How many blocks the fallback looks at in one size class before giving up.
const FALLBACK_SCAN: usize = 8;

#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
    free: bool,
}

/// The free-block index of one region.
#[derive(Debug)]
pub(crate) struct Tlsf {
    base: u64,
    size: u64,
    blocks: Vec<Block>,
    /// Slots of `blocks` no block uses (merged away).
    spare: Vec<u32>,
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    heads: [[u32; SL_COUNT]; FL_COUNT],
    free_bytes: u64,
    free_blocks: usize,
}

/// The class that holds blocks of `units` granules (rounds down). Branch-free: sizes are
/// random, and a mispredicted branch costs more than this whole function.
#[inline(always)]
fn mapping_insert(units: u64) -> (usize, usize) {
    // Below 2 * SL_COUNT granules every size has a class of its own (first levels 0 and 1).
    let big = (units >= SL_COUNT as u64) as u64;
    let log2 = 63 - (units | SL_COUNT as u64).leading_zeros();
    let fl = (log2 - SL_SHIFT) as u64 + big;
    let sl = (units >> (log2 - SL_SHIFT)) - (big << SL_SHIFT);
    (fl as usize, sl as usize)
}

/// The first class whose every block holds `units` granules (rounds up).
#[inline(always)]
fn mapping_search(units: u64) -> (usize, usize) {
    let log2 = 63 - (units | SL_COUNT as u64).leading_zeros();
    mapping_insert(units + (1u64 << (log2 - SL_SHIFT)) - 1)
}

/// The smallest free block size (bytes) that [`Tlsf::allocate`] always finds for a request of
/// `size` bytes (a multiple of [`GRANULE`]) at `align`: the request plus the worst alignment
/// padding, rounded up to the start of the next size class. `None` on overflow.
pub(crate) fn guaranteed_fit(size: u64, align: u64) -> Option<u64> {
    let padded = size.checked_add(align.max(GRANULE) - GRANULE)?;
    let units = padded >> GRANULE_SHIFT;
    if units < SL_COUNT as u64 {
        return Some(padded);
    }
    let log2 = 63 - units.leading_zeros();
    let step = 1u64 << (log2 - SL_SHIFT);
    let rounded = units.checked_add(step - 1)? & !(step - 1);
    rounded.checked_shl(GRANULE_SHIFT)
}

impl Tlsf {
    /// One free block spanning `base..base + size`. `base` and `size` must be multiples of
    /// [`GRANULE`] and `size` non-zero.
    pub(crate) fn new(base: u64, size: u64) -> Self {
        debug_assert!(base % GRANULE == 0 && size % GRANULE == 0 && size > 0);
        let mut tlsf = Tlsf {
            base,
            size,
            blocks: Vec::with_capacity(256),
            spare: Vec::new(),
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: [[NIL; SL_COUNT]; FL_COUNT],
            free_bytes: 0,
            free_blocks: 0,
        };
        let first = tlsf.new_block(Block {
            addr: base,
            size,
            prev_phys: NIL,
            next_phys: NIL,
            prev_free: NIL,
            next_free: NIL,
            free: false,
        });
        tlsf.insert_free(first);
        tlsf
    }

    /// Start of the region.
    #[cfg(test)]
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Bytes in free blocks.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Number of free blocks.
    pub(crate) fn free_blocks(&self) -> usize {
        self.free_blocks
    }

    /// Size of a block.
    #[inline]
    pub(crate) fn block_size(&self, block: u32) -> u64 {
        self.blocks[block as usize].size
    }

    /// Size of the largest free block: exact (scans the top size class only).
    pub(crate) fn largest_free(&self) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let mut largest = 0;
        let mut at = self.heads[fl][sl];
        while at != NIL {
            let block = &self.blocks[at as usize];
            largest = largest.max(block.size);
            at = block.next_free;
        }
        largest
    }

    /// Takes a block of `size` bytes (a non-zero multiple of [`GRANULE`]) whose address is a
    /// multiple of `align` (a power of two). Returns the block and its address, or `None` when
    /// no free block that this search looks at fits.
    ///
    /// The search is O(1): the head of the smallest class that surely holds `size`; for a
    /// larger alignment, the head of the smallest class that surely holds `size` plus the
    /// worst padding; then at most [`FALLBACK_SCAN`] blocks of `size`'s own class and of the
    /// largest class. A free block of [`guaranteed_fit`] bytes is always found.
    #[inline]
    pub(crate) fn allocate(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        debug_assert!(size % GRANULE == 0 && size > 0 && align.is_power_of_two());
        let units = size >> GRANULE_SHIFT;
        if let Some(block) = self.find_suitable(units) {
            if self.fits(block, size, align) {
                return Some(self.take(block, size, align));
            }
        }
        if align > GRANULE {
            if let Some(block) = size
                .checked_add(align - GRANULE)
                .and_then(|padded| self.find_suitable(padded >> GRANULE_SHIFT))
            {
                debug_assert!(self.fits(block, size, align));
                return Some(self.take(block, size, align));
            }
        }
        // Near the edge (a request as large as the largest free block): blocks of the
        // request's own class may still hold it.
        let (fl, sl) = mapping_insert(units);
        if fl < FL_COUNT {
            if let Some(block) = self.scan(fl, sl, size, align) {
                return Some(self.take(block, size, align));
            }
        }
        if self.fl_bitmap != 0 {
            let top_fl = 63 - self.fl_bitmap.leading_zeros() as usize;
            let top_sl = 31 - self.sl_bitmap[top_fl].leading_zeros() as usize;
            if (top_fl, top_sl) != (fl, sl) {
                if let Some(block) = self.scan(top_fl, top_sl, size, align) {
                    return Some(self.take(block, size, align));
                }
            }
        }
        None
    }

    /// Returns a block taken by [`allocate`](Self::allocate) and merges it with free
    /// neighbours.
    #[inline]
    pub(crate) fn free(&mut self, block: u32) {
        debug_assert!(!self.blocks[block as usize].free);
        debug_assert!(self.blocks[block as usize].addr - self.base < self.size);
        let mut block = block;
        let prev = self.blocks[block as usize].prev_phys;
        if prev != NIL && self.blocks[prev as usize].free {
            self.remove_free(prev);
            self.absorb_next(prev);
            block = prev;
        }
        let next = self.blocks[block as usize].next_phys;
        if next != NIL && self.blocks[next as usize].free {
            self.remove_free(next);
            self.absorb_next(block);
        }
        self.insert_free(block);
    }

    /// Whether `block` can hold `size` bytes at `align`.
    #[inline(always)]
    fn fits(&self, block: u32, size: u64, align: u64) -> bool {
        let b = &self.blocks[block as usize];
        let start = align_up(b.addr, align);
        start - b.addr <= b.size && b.size - (start - b.addr) >= size
    }

    /// Looks at up to [`FALLBACK_SCAN`] blocks of one class.
    fn scan(&self, fl: usize, sl: usize, size: u64, align: u64) -> Option<u32> {
        let mut at = self.heads[fl][sl];
        for _ in 0..FALLBACK_SCAN {
            if at == NIL {
                return None;
            }
            if self.fits(at, size, align) {
                return Some(at);
            }
            at = self.blocks[at as usize].next_free;
        }
        None
    }

    /// Head of the smallest non-empty class whose blocks all hold `units` granules.
    #[inline(always)]
    fn find_suitable(&self, units: u64) -> Option<u32> {
        let (mut fl, mut sl) = mapping_search(units);
        if fl >= FL_COUNT {
            return None;
        }
        let mut sl_map = self.sl_bitmap[fl] & (u32::MAX << sl);
        if sl_map == 0 {
            let fl_map = if fl + 1 >= 64 {
                0
            } else {
                self.fl_bitmap & (u64::MAX << (fl + 1))
            };
            if fl_map == 0 {
                return None;
            }
            fl = fl_map.trailing_zeros() as usize;
            sl_map = self.sl_bitmap[fl];
        }
        sl = sl_map.trailing_zeros() as usize;
        Some(self.heads[fl][sl])
    }

    /// Takes a free block for `size` bytes at `align`: free space in front (alignment) and
    /// behind goes back to the free lists as blocks of their own.
    #[inline(always)]
    fn take(&mut self, block: u32, size: u64, align: u64) -> (u32, u64) {
        self.remove_free(block);
        let mut block = block;
        let addr = self.blocks[block as usize].addr;
        let start = align_up(addr, align);
        if start > addr {
            let front = block;
            block = self.split(front, start - addr);
            // The front's physical predecessor is used (free blocks never touch), so the front
            // needs no merge.
            self.insert_free(front);
        }
        if self.blocks[block as usize].size > size {
            let tail = self.split(block, size);
            self.insert_free(tail);
        }
        self.blocks[block as usize].free = false;
        (block, start)
    }

    /// Splits `block` after `at` bytes; returns the new right-hand block (not in any list).
    #[inline(always)]
    fn split(&mut self, block: u32, at: u64) -> u32 {
        let b = self.blocks[block as usize];
        debug_assert!(at > 0 && at < b.size);
        let right = self.new_block(Block {
            addr: b.addr + at,
            size: b.size - at,
            prev_phys: block,
            next_phys: b.next_phys,
            prev_free: NIL,
            next_free: NIL,
            free: false,
        });
        if b.next_phys != NIL {
            self.blocks[b.next_phys as usize].prev_phys = right;
        }
        let left = &mut self.blocks[block as usize];
        left.size = at;
        left.next_phys = right;
        right
    }

    /// Merges `block`'s physical successor (already out of the free lists) into `block`.
    #[inline(always)]
    fn absorb_next(&mut self, block: u32) {
        let next = self.blocks[block as usize].next_phys;
        let n = self.blocks[next as usize];
        let b = &mut self.blocks[block as usize];
        b.size += n.size;
        b.next_phys = n.next_phys;
        if n.next_phys != NIL {
            self.blocks[n.next_phys as usize].prev_phys = block;
        }
        self.spare.push(next);
    }

    #[inline(always)]
    fn new_block(&mut self, block: Block) -> u32 {
        if let Some(slot) = self.spare.pop() {
            self.blocks[slot as usize] = block;
            slot
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as u32
        }
    }

    #[inline(always)]
    fn insert_free(&mut self, block: u32) {
        let size = self.blocks[block as usize].size;
        let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
        let head = self.heads[fl][sl];
        {
            let b = &mut self.blocks[block as usize];
            b.free = true;
            b.prev_free = NIL;
            b.next_free = head;
        }
        if head != NIL {
            self.blocks[head as usize].prev_free = block;
        }
        self.heads[fl][sl] = block;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl] |= 1 << sl;
        self.free_bytes += size;
        self.free_blocks += 1;
    }

    #[inline(always)]
    fn remove_free(&mut self, block: u32) {
        let b = self.blocks[block as usize];
        debug_assert!(b.free);
        let (fl, sl) = mapping_insert(b.size >> GRANULE_SHIFT);
        if b.prev_free != NIL {
            self.blocks[b.prev_free as usize].next_free = b.next_free;
        } else {
            self.heads[fl][sl] = b.next_free;
            // Clear the class's bit when the list became empty, and the first level's bit when
            // its last class did: without branches, as emptiness is random.
            let emptied = (b.next_free == NIL) as u32;
            self.sl_bitmap[fl] &= !(emptied << sl);
            self.fl_bitmap &= !(((self.sl_bitmap[fl] == 0) as u64) << fl);
        }
        if b.next_free != NIL {
            self.blocks[b.next_free as usize].prev_free = b.prev_free;
        }
        self.blocks[block as usize].free = false;
        self.free_bytes -= b.size;
        self.free_blocks -= 1;
    }

    /// Walks the physical chain and the free lists and checks every invariant; the test suite
    /// calls it after every step.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        use alloc::vec;
        // Physical chain: contiguous, covers the region, no two adjacent free blocks.
        let mut in_chain = vec![false; self.blocks.len()];
        let mut spare = vec![false; self.blocks.len()];
        for slot in &self.spare {
            spare[*slot as usize] = true;
        }
        let mut at = (0..self.blocks.len())
            .find(|&i| {
                !spare[i] && self.blocks[i].addr == self.base && self.blocks[i].prev_phys == NIL
            })
            .expect("a first block") as u32;
        let mut expect_addr = self.base;
        let mut prev = NIL;
        let mut prev_free = false;
        let (mut free_bytes, mut free_blocks) = (0, 0);
        loop {
            let b = &self.blocks[at as usize];
            in_chain[at as usize] = true;
            assert_eq!(b.addr, expect_addr, "blocks are contiguous");
            assert_eq!(b.prev_phys, prev);
            assert!(b.size > 0 && b.size % GRANULE == 0);
            assert!(
                !(prev_free && b.free),
                "two adjacent free blocks at {:#x}",
                b.addr
            );
            if b.free {
                free_bytes += b.size;
                free_blocks += 1;
            }
            prev_free = b.free;
            expect_addr += b.size;
            prev = at;
            if b.next_phys == NIL {
                break;
            }
            at = b.next_phys;
        }
        assert_eq!(
            expect_addr,
            self.base + self.size,
            "the chain covers the region"
        );
        assert_eq!(
            (free_bytes, free_blocks),
            (self.free_bytes, self.free_blocks)
        );
        for (slot, in_chain) in in_chain.iter().enumerate() {
            assert_ne!(
                *in_chain, spare[slot],
                "slot {slot} is either in the chain or spare"
            );
        }
        // Free lists: every listed block is free, in the right class, and the bitmaps agree.
        let mut listed = 0;
        for fl in 0..FL_COUNT {
            for sl in 0..SL_COUNT {
                let head = self.heads[fl][sl];
                let bit = self.sl_bitmap[fl] & (1 << sl) != 0;
                assert_eq!(bit, head != NIL, "bitmap of class ({fl}, {sl})");
                let mut at = head;
                let mut prev = NIL;
                while at != NIL {
                    let b = &self.blocks[at as usize];
                    assert!(b.free && in_chain[at as usize]);
                    assert_eq!(mapping_insert(b.size >> GRANULE_SHIFT), (fl, sl));
                    assert_eq!(b.prev_free, prev);
                    listed += 1;
                    prev = at;
                    at = b.next_free;
                }
            }
            assert_eq!(self.fl_bitmap & (1 << fl) != 0, self.sl_bitmap[fl] != 0);
        }
        assert_eq!(listed, self.free_blocks);
    }
}

#[inline]
fn align_up(addr: u64, align: u64) -> u64 {
    (addr + align - 1) & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_rounds_as_documented() {
        for units in 1..5000u64 {
            let (fl, sl) = mapping_insert(units);
            let (sfl, ssl) = mapping_search(units);
            assert!((sfl, ssl) >= (fl, sl));
            // Every size in the search class is at least `units`.
            let class_min = if sfl == 0 {
                ssl as u64
            } else {
                let log2 = sfl as u32 + SL_SHIFT - 1;
                (1u64 << log2) + ((ssl as u64) << (log2 - SL_SHIFT))
            };
            assert!(
                class_min >= units,
                "{units} -> ({sfl},{ssl}) min {class_min}"
            );
            assert_eq!(mapping_insert(class_min), (sfl, ssl));
        }
        assert_eq!(mapping_insert(u64::MAX >> GRANULE_SHIFT).0, FL_COUNT - 1);
    }

    #[test]
    fn whole_region_and_exact_fits() {
        let mut t = Tlsf::new(1 << 20, 1000 * GRANULE);
        // A request of the whole region at the largest alignment (the region starts 1 MiB
        // aligned) is found by the fallback even though the padded size does not fit.
        let (b, addr) = t.allocate(1000 * GRANULE, 4096).unwrap();
        assert_eq!(addr, 1 << 20);
        assert_eq!(t.free_bytes(), 0);
        assert_eq!(t.largest_free(), 0);
        assert!(t.allocate(GRANULE, GRANULE).is_none());
        t.free(b);
        t.check();
        assert_eq!(t.largest_free(), 1000 * GRANULE);
    }

    #[test]
    fn alignment_padding_returns_to_the_free_lists() {
        let mut t = Tlsf::new(0, 64 * 4096);
        let (small, a) = t.allocate(GRANULE, GRANULE).unwrap();
        assert_eq!(a, 0);
        let (big, b) = t.allocate(4096, 4096).unwrap();
        assert_eq!(b, 4096);
        t.check();
        // The padding between them is one free block of 4096 - 256 bytes.
        assert_eq!(t.free_blocks(), 2);
        let (pad, c) = t.allocate(4096 - GRANULE, GRANULE).unwrap();
        assert_eq!(c, GRANULE);
        t.check();
        for block in [big, small, pad] {
            t.free(block);
            t.check();
        }
        assert_eq!((t.free_blocks(), t.largest_free()), (1, 64 * 4096));
    }

    #[test]
    fn regions_beyond_four_gib() {
        // One TiB of address space: no memory behind it, the index never touches it.
        let base = 0x7f00_0000_0000;
        let mut t = Tlsf::new(base, 1 << 40);
        let (a, addr_a) = t.allocate(5 << 30, 4096).unwrap();
        let (b, addr_b) = t.allocate(300 << 30, 4096).unwrap();
        let (c, addr_c) = t.allocate(GRANULE, 4096).unwrap();
        assert_eq!(addr_a, base);
        assert_eq!(addr_b, base + (5 << 30));
        assert_eq!(addr_c, base + (305 << 30));
        assert_eq!(t.free_bytes(), (1 << 40) - (305 << 30) - GRANULE);
        t.free(b);
        t.check();
        assert_eq!(t.largest_free(), (1 << 40) - (305 << 30) - GRANULE);
        t.free(a);
        t.free(c);
        t.check();
        assert_eq!(t.largest_free(), 1 << 40);
        assert_eq!(t.base(), base);
    }

    #[test]
    fn guaranteed_fit_is_found() {
        // Fragment a region so that free blocks of many sizes exist, then check that every
        // request whose guaranteed fit is at most the largest free block succeeds.
        let mut t = Tlsf::new(0, 1 << 26);
        let mut live = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let units = 1 + (x % 300);
            let align = 1 << (8 + (x >> 40) % 5);
            if let Some((blk, _)) = t.allocate(units * GRANULE, align) {
                live.push(blk);
            }
            if x % 3 == 0 && !live.is_empty() {
                let victim = live.swap_remove((x >> 20) as usize % live.len());
                t.free(victim);
            }
        }
        t.check();
        let largest = t.largest_free();
        for units in 1..400u64 {
            for align in [256u64, 512, 1024, 2048, 4096] {
                let size = units * GRANULE;
                if guaranteed_fit(size, align).unwrap() <= largest {
                    let (blk, addr) = t.allocate(size, align).expect("guaranteed fit");
                    assert_eq!(addr % align, 0);
                    t.free(blk);
                }
            }
        }
        t.check();
    }
}

//! Address → block: a table with one entry per granule of the region.
//!
//! Every block starts on a [`GRANULE`] boundary, so `(addr − base) / 256` indexes a table
//! directly: a lookup is a subtraction, two shifts and two loads, with no hashing or probing
//! and no branch whose outcome depends on the addresses. Each entry holds the index of the
//! block whose live allocation starts at that granule, or `0` (the TLSF index's "no block":
//! slot 0 is its sentinel) where none does. The pool sets an entry when it hands out an
//! allocation and clears it when the allocation is freed, so a non-zero entry is exactly a
//! live allocation's start: a foreign address (outside the region, off a granule, inside a
//! block) or one freed already finds `0`.
//!
//! The table has two levels so that its host memory follows what the region has used, not
//! what it could hold: leaves of [`LEAF`] entries (64 KiB, covering 4 MiB of the region) are
//! allocated, zeroed, the first time an allocation starts inside them, and kept. The top level
//! is one pointer per 4 MiB of the region (16 KiB for a 64 GiB pool). A pool whose
//! allocations have started everywhere holds 64 KiB of leaves per 4 MiB, 1/64 of its
//! capacity; a 64 GiB pool serving allocations of a few MiB in a few GiB holds a few MiB.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use super::tlsf::{GRANULE, GRANULE_SHIFT};

/// log2 of the entries per leaf.
const LEAF_SHIFT: u32 = 14;
/// Entries per leaf: 16,384 granules, 4 MiB of the region, 64 KiB of host memory.
pub(crate) const LEAF: usize = 1 << LEAF_SHIFT;

type Leaf = Box<[u32; LEAF]>;

/// The table of one region.
#[derive(Debug)]
pub(crate) struct AddrTable {
    base: u64,
    leaves: Vec<Option<Leaf>>,
}

/// Where an address's entry lives: its leaf and its index in the leaf.
#[derive(Debug, Clone, Copy)]
struct Place {
    leaf: usize,
    index: usize,
}

impl AddrTable {
    /// A table for the region `base..base + capacity` (both multiples of [`GRANULE`]), all
    /// entries empty, no leaf allocated.
    pub(crate) fn new(base: u64, capacity: u64) -> Self {
        let granules = capacity >> GRANULE_SHIFT;
        let leaves = granules.div_ceil(LEAF as u64);
        let mut table = Vec::new();
        table.resize_with(
            usize::try_from(leaves).expect("one pointer per 4 MiB of the region fits in usize"),
            || None,
        );
        AddrTable {
            base,
            leaves: table,
        }
    }

    /// The place of `addr`'s entry; `None` when `addr` is not on a granule of the table.
    #[inline(always)]
    fn place(&self, addr: u64) -> Option<Place> {
        let offset = addr.wrapping_sub(self.base);
        if offset & (GRANULE - 1) != 0 {
            return None;
        }
        let granule = offset >> GRANULE_SHIFT;
        // Compared as u64: below the region the subtraction wraps to a huge offset, which
        // fails here too.
        let leaf = granule >> LEAF_SHIFT;
        if leaf >= self.leaves.len() as u64 {
            return None;
        }
        Some(Place {
            leaf: leaf as usize,
            index: granule as usize & (LEAF - 1),
        })
    }

    /// The block of the live allocation that starts at `addr`, if there is one.
    #[inline(always)]
    pub(crate) fn get(&self, addr: u64) -> Option<u32> {
        let place = self.place(addr)?;
        let block = self.leaves[place.leaf].as_ref()?[place.index];
        (block != 0).then_some(block)
    }

    /// The entry of the live allocation that starts at `addr` (non-zero), to read and then
    /// clear with one lookup.
    #[inline(always)]
    pub(crate) fn entry(&mut self, addr: u64) -> Option<&mut u32> {
        let place = self.place(addr)?;
        let entry = &mut self.leaves[place.leaf].as_mut()?[place.index];
        if *entry == 0 {
            return None;
        }
        Some(entry)
    }

    /// Clears the entry of the live allocation at `addr`; returns its block.
    pub(crate) fn remove(&mut self, addr: u64) -> Option<u32> {
        self.entry(addr).map(core::mem::take)
    }

    /// Records `block` (non-zero) as the live allocation at `addr`, which must lie on a
    /// granule inside the region and have no entry.
    #[inline(always)]
    pub(crate) fn insert(&mut self, addr: u64, block: u32) {
        debug_assert!(block != 0);
        let Some(place) = self.place(addr) else {
            unreachable!("block address {addr:#x} is inside the region, on a granule");
        };
        let leaf = match &mut self.leaves[place.leaf] {
            Some(leaf) => leaf,
            slot => new_leaf(slot),
        };
        debug_assert_eq!(leaf[place.index], 0, "{addr:#x} has an entry already");
        leaf[place.index] = block;
    }

    /// Host memory the leaves hold, in bytes.
    #[cfg(test)]
    pub(crate) fn leaf_bytes(&self) -> usize {
        self.leaves.iter().flatten().count() * LEAF * core::mem::size_of::<u32>()
    }
}

/// Allocates a zeroed leaf into an empty slot of the top level.
#[cold]
#[inline(never)]
fn new_leaf(slot: &mut Option<Leaf>) -> &mut Leaf {
    // Zeroed by the allocator (`calloc` for the system allocator), never on the stack.
    let leaf: Leaf = vec![0u32; LEAF]
        .into_boxed_slice()
        .try_into()
        .expect("a vector of LEAF entries");
    slot.insert(leaf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exactly_the_entries_that_were_set() {
        let base = 0x7f00_0000_0000;
        // 20 MiB: five leaves, the last one partly outside the region.
        let capacity = 20 << 20;
        let mut table = AddrTable::new(base, capacity);
        assert_eq!(table.leaf_bytes(), 0);
        let at = |g: u64| base + g * GRANULE;
        for (g, block) in [(0, 1), (1, 2), (16_383, 3), (16_384, 4), (81_919, 5)] {
            table.insert(at(g), block);
            assert_eq!(table.get(at(g)), Some(block));
        }
        // Three leaves touched: granules 0..16384, 16384.., and the last one.
        assert_eq!(table.leaf_bytes(), 3 * LEAF * 4);
        for addr in [
            base + 1,
            base + 255,
            at(2),
            at(16_385),
            at(81_918),
            // Past the region, off it below, unallocated leaves, the ends of u64.
            base + capacity,
            base + (24 << 20),
            base - GRANULE,
            at(40_000),
            0,
            u64::MAX,
            !(GRANULE - 1),
        ] {
            assert_eq!(table.get(addr), None, "{addr:#x}");
        }
        let entry = table.entry(at(16_384)).unwrap();
        assert_eq!(*entry, 4);
        *entry = 0;
        assert_eq!(table.remove(at(0)), Some(1));
        assert_eq!(table.remove(at(0)), None);
        assert_eq!(table.get(at(16_384)), None);
        assert!(table.entry(at(16_384)).is_none());
        assert!(table.entry(at(3)).is_none());
        table.insert(at(16_384), 6);
        assert_eq!(table.get(at(16_384)), Some(6));
    }

    #[test]
    fn a_region_at_the_top_of_the_address_space() {
        let base = u64::MAX - (8 << 20) + 1;
        let mut table = AddrTable::new(base, 8 << 20);
        table.insert(u64::MAX - 255, 7);
        assert_eq!(table.get(u64::MAX - 255), Some(7));
        assert_eq!(table.get(base), None);
        assert_eq!(table.get(0), None);
    }
}

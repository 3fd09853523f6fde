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

use crate::plan::{CUDA_ALIGN, align_up_u64};

mod cache;
mod span;

use cache::Cache;
pub(crate) use span::Piece;

/// log2 of [`GRANULE`].
pub(crate) const GRANULE_SHIFT: u32 = CUDA_ALIGN.trailing_zeros();
/// The unit of placement: every block starts at a multiple of it and spans a multiple of it
/// (256 bytes, what `cudaMalloc` guarantees).
pub(crate) const GRANULE: u64 = 1 << GRANULE_SHIFT;
/// log2 of the number of second-level classes per power of two.
const SL_SHIFT: u32 = 5;
const SL_COUNT: usize = 1 << SL_SHIFT;
/// First-level classes: sizes in granules below 2^56 (every `u64` byte count).
const FL_COUNT: usize = (64 - GRANULE_SHIFT - SL_SHIFT + 1) as usize;
/// Rows of the first-level arrays: a power of two above every first level, so that an index
/// masked to it needs no bounds check.
const FL_ROWS: usize = 64;
/// No block: slot 0 of the block array, a sentinel that is never free and in no list, chain
/// or spare list. A link update may write to it instead of testing for `NIL` first (a branch
/// that random sizes make unpredictable), and `blocks[NIL].free` is false.
const NIL: u32 = 0;
/// How many blocks the fallback looks at in one size class before giving up.
const FALLBACK_SCAN: usize = 8;

#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    prev_phys: u32,
    next_phys: u32,
    /// Free-list links of a free block; for a spare slot, `next_free` links the spare slots.
    prev_free: u32,
    next_free: u32,
    /// The size class of a free block (its index in `heads`), kept so that taking it out of
    /// its list needs no second mapping of its size; of a used or cached block, the class of
    /// its own size, so that caching it needs none either.
    class: u16,
    free: bool,
    /// Freed by its user but not yet merged: in a [`Cache`] list, neither used nor free.
    cached: bool,
    /// Bumped each time the block is cached: tells its current entry in the cache's ring
    /// from older ones.
    generation: u32,
}

impl Block {
    /// The sentinel, and a spare slot before its first use.
    const UNUSED: Block = Block {
        addr: 0,
        size: 0,
        prev_phys: NIL,
        next_phys: NIL,
        prev_free: NIL,
        next_free: NIL,
        class: 0,
        free: false,
        cached: false,
        generation: 0,
    };
}

/// The free-block index of one region.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(crate) struct Tlsf {
    base: u64,
    size: u64,
    blocks: Vec<Block>,
    lists: Lists,
    cache: Cache,
}

/// Everything beside the block array: the free lists, their bitmaps, the spare slots and the
/// counters. Its methods take the blocks as a slice, whose pointer and length the compiler
/// keeps in registers (through `&mut self.blocks` it reloads both after every store).
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
struct Lists {
    /// First slot of the block array that no block uses; the rest follow through
    /// `next_free`.
    spare: u32,
    /// Number of spare slots: an allocation needs up to [`SLOTS_PER_ALLOCATION`], which
    /// [`Tlsf::allocate`] makes sure of before it starts.
    spares: usize,
    fl_bitmap: u64,
    /// One bit per non-empty class of each first level (rows from `FL_COUNT` on stay 0).
    sl_bitmap: [u32; FL_ROWS],
    /// Head of each class's free list, by [`class`].
    heads: [u32; FL_ROWS * SL_COUNT],
    free_bytes: u64,
    free_blocks: usize,
}

/// The most new blocks one allocation makes: a front (alignment padding) and a tail.
const SLOTS_PER_ALLOCATION: usize = 2;

// Slot numbers are `u32`. An index's blocks tile parts of one region, so it holds at most
// `MAX_POOL_CAPACITY / GRANULE` blocks at once (the builder refuses larger capacities), and
// `add_spares` keeps at most an eighth of the array more as spare slots (plus a few): every
// slot number stays below `u32::MAX`.
const _: () =
    assert!((crate::pool::MAX_POOL_CAPACITY as u64 / GRANULE) / 8 * 9 + 64 < u32::MAX as u64);

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

/// The index of class `(fl, sl)` in the reuse cache's `heads` (masked: never out of bounds).
#[inline(always)]
fn class(fl: usize, sl: usize) -> usize {
    (fl & (FL_ROWS - 1)) << SL_SHIFT | (sl & (SL_COUNT - 1))
}

/// The class of a block of `size` bytes (a multiple of [`GRANULE`]): a used block carries it
/// ([`Block::class`]), so that freeing it into the reuse cache need not work it out again.
#[inline(always)]
fn size_class(size: u64) -> usize {
    let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
    class(fl, sl)
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

/// `bytes` (a multiple of [`GRANULE`]) rounded up to the smallest size of its class: every
/// block of a class is then one size. Below 32 granules (8 KiB) each size is a class of its
/// own; above, a class spans 1/32 of a power of two, so the rounding adds less than 1/32.
/// `None` on overflow.
#[inline(always)]
pub(crate) fn class_size(bytes: u64) -> Option<u64> {
    let units = bytes >> GRANULE_SHIFT;
    let log2 = 63 - (units | SL_COUNT as u64).leading_zeros();
    let step = (1u64 << (log2 - SL_SHIFT)) - 1;
    let rounded = units.checked_add(step)? & !step;
    rounded.checked_mul(GRANULE)
}

/// A request of `bytes` bytes at most `max` (the largest class size a request may have, see
/// [`largest_request`]): its [`class_size`] (of `bytes` rounded up to a [`GRANULE`], at least
/// one) and that class's index, what [`Tlsf::allocate_in_class`] takes; `None` above `max`.
/// One computation for both, without overflow checks: every figure stays at most `max`.
#[inline(always)]
pub(crate) fn request_class(bytes: u64, max: u64) -> Option<(u64, usize)> {
    if bytes > max {
        return None;
    }
    let units = (bytes.max(1) + (GRANULE - 1)) >> GRANULE_SHIFT;
    let shift = 63 - (units | SL_COUNT as u64).leading_zeros() - SL_SHIFT;
    let step = (1u64 << shift) - 1;
    let rounded = (units + step) & !step;
    // `(fl << SL_SHIFT) + sl` of `rounded`: where the rounding carried into the next power of
    // two, `rounded >> shift` is `2 * SL_COUNT`, the next first level's first class.
    let class = ((shift as usize) << SL_SHIFT) + (rounded >> shift) as usize;
    debug_assert_eq!(
        rounded << GRANULE_SHIFT,
        class_size(units << GRANULE_SHIFT).unwrap()
    );
    debug_assert_eq!(class, size_class(rounded << GRANULE_SHIFT));
    Some((rounded << GRANULE_SHIFT, class))
}

/// The largest class size of at most `capacity` bytes (at least a [`GRANULE`]): the largest
/// request of a region of `capacity` bytes, for [`request_class`].
pub(crate) fn largest_request(capacity: u64) -> u64 {
    // Class sizes grow with the size they are of: the largest size whose class size fits.
    let (mut fits, mut over) = (0u64, capacity.saturating_add(1));
    while over - fits > 1 {
        let mid = fits + (over - fits) / 2;
        match mid.checked_next_multiple_of(GRANULE).and_then(class_size) {
            Some(size) if size <= capacity => fits = mid,
            _ => over = mid,
        }
    }
    fits
}

impl Tlsf {
    /// One free block spanning `base..base + size`. `base` and `size` must be multiples of
    /// [`GRANULE`] and `size` non-zero. Freed blocks wait unmerged in a cache of at most
    /// `cache_blocks` (rounded up to a power of two; 0 for none) blocks and `cache_bytes`
    /// bytes.
    pub(crate) fn new(base: u64, size: u64, cache_blocks: usize, cache_bytes: u64) -> Self {
        let mut tlsf = Tlsf::empty(base, size, cache_blocks, cache_bytes);
        tlsf.add_span(base, size);
        tlsf
    }

    /// An index with no block yet over parts of the region `base..base + size` (multiples of
    /// [`GRANULE`], `size` non-zero): a thread's heap, whose blocks come in spans
    /// ([`add_span`](Self::add_span)). The cache as for [`new`](Self::new).
    pub(crate) fn empty(base: u64, size: u64, cache_blocks: usize, cache_bytes: u64) -> Self {
        debug_assert!(base % GRANULE == 0 && size % GRANULE == 0 && size > 0);
        // No ring, no bytes: every release merges at once.
        let (ring, cache_bytes) = match cache_blocks {
            0 => (Vec::new(), 0),
            n => (alloc::vec![(NIL, 0); n.next_power_of_two()], cache_bytes),
        };
        let mut tlsf = Tlsf {
            cache: Cache {
                heads: [NIL; FL_ROWS * SL_COUNT],
                ring,
                pos: 0,
                stale: 0,
                bytes: 0,
                blocks: 0,
                byte_limit: cache_bytes,
                hits: 0,
            },
            base,
            size,
            blocks: Vec::with_capacity(256),
            lists: Lists {
                spare: NIL,
                spares: 0,
                fl_bitmap: 0,
                sl_bitmap: [0; FL_ROWS],
                heads: [NIL; FL_ROWS * SL_COUNT],
                free_bytes: 0,
                free_blocks: 0,
            },
        };
        tlsf.blocks.push(Block::UNUSED);
        tlsf
    }

    /// Start of the region.
    #[cfg(test)]
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Bytes in free and cached blocks: everything no allocation uses.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.lists.free_bytes + self.cache.bytes
    }

    /// Bytes and blocks in the cache.
    pub(crate) fn cached(&self) -> (u64, usize) {
        (self.cache.bytes, self.cache.blocks)
    }

    /// Blocks taken whole from the cache so far.
    pub(crate) fn reused(&self) -> u64 {
        self.cache.hits
    }

    /// Sets [`reused`](Self::reused) back to `hits` (a block taken whole went back unused).
    pub(crate) fn forget_reused(&mut self, hits: u64) {
        self.cache.hits = hits;
    }

    /// [`reused`](Self::reused), counting from 0 again.
    pub(crate) fn take_reused(&mut self) -> u64 {
        core::mem::take(&mut self.cache.hits)
    }

    /// Number of free blocks (cached blocks not counted: [`flush`](Self::flush) first).
    #[cfg(test)]
    pub(crate) fn free_blocks(&self) -> usize {
        self.lists.free_blocks
    }

    /// Every free block, `(address, bytes)`, in no particular order (cached blocks not
    /// counted: [`flush`](Self::flush) first). No two of them touch.
    pub(crate) fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.blocks
            .iter()
            .filter(|b| b.free)
            .map(|b| (b.addr, b.size))
    }

    /// Every block no allocation uses, free or cached, `(address, bytes)`, in no particular
    /// order: what [`free_ranges`](Self::free_ranges) gives after a [`flush`](Self::flush),
    /// before the merges (cached blocks may touch each other and free blocks).
    pub(crate) fn unused_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.blocks
            .iter()
            .filter(|b| b.free | b.cached)
            .map(|b| (b.addr, b.size))
    }

    /// Size of a block.
    #[inline]
    pub(crate) fn block_size(&self, block: u32) -> u64 {
        self.blocks[block as usize].size
    }

    /// Size of the largest free block (cached blocks not counted: [`flush`](Self::flush)
    /// first): exact (scans the top size class only).
    pub(crate) fn largest_free(&self) -> u64 {
        let lists = &self.lists;
        if lists.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - lists.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - lists.sl_bitmap[fl].leading_zeros() as usize;
        let mut largest = 0;
        let mut at = lists.heads[class(fl, sl)];
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
    ///
    /// A cached block of `size`'s class at a suitable address is taken first, whole. `size`
    /// should be a [`class_size`] for that to happen.
    #[inline(always)]
    pub(crate) fn allocate(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        debug_assert!(size % GRANULE == 0 && size > 0 && align.is_power_of_two());
        // A cached block already carries its size's class.
        if let Some(taken) = self.take_cached(size, align) {
            return Some(taken);
        }
        self.allocate_from_lists(size, align)
    }

    /// As [`allocate`](Self::allocate), `size` a [`class_size`] whose class's index
    /// [`request_class`] gave: the class is not worked out again.
    #[inline(always)]
    pub(crate) fn allocate_in_class(
        &mut self,
        size: u64,
        class: usize,
        align: u64,
    ) -> Option<(u32, u64)> {
        debug_assert!(size % GRANULE == 0 && size > 0 && align.is_power_of_two());
        if let Some(taken) = self.take_cached_in(class, size, align) {
            return Some(taken);
        }
        self.allocate_from_lists(size, align)
    }

    /// [`allocate`](Self::allocate) from the free lists; the block taken carries its size's
    /// class.
    #[inline(never)]
    fn allocate_from_lists(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        let taken = self.search_lists(size, align)?;
        self.blocks[taken.0 as usize].class = size_class(size) as u16;
        Some(taken)
    }

    /// The search of [`allocate_from_lists`](Self::allocate_from_lists).
    #[inline(always)]
    fn search_lists(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        if self.lists.spares < SLOTS_PER_ALLOCATION {
            self.add_spares();
        }
        let (blocks, lists) = (&mut Slots(&mut self.blocks), &mut self.lists);
        if let Some((class, block)) = lists.find_suitable(size >> GRANULE_SHIFT) {
            // Every block starts on a granule, so at the granule's alignment the head of a
            // class that holds `size` fits as it is: no address to look at, no front to split.
            if align <= GRANULE {
                return Some(lists.take_head(blocks, class, block, size));
            }
            if fits(blocks, block, size, align) {
                return Some(lists.take(blocks, block, size, align));
            }
        }
        self.allocate_slow(size, align)
    }

    /// The rest of [`allocate`](Self::allocate)'s search: for an alignment above the
    /// granule, and near the edge.
    #[inline(never)]
    fn allocate_slow(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        let (blocks, lists) = (&mut Slots(&mut self.blocks), &mut self.lists);
        if align > GRANULE {
            if let Some((_, block)) = size
                .checked_add(align - GRANULE)
                .and_then(|padded| lists.find_suitable(padded >> GRANULE_SHIFT))
            {
                debug_assert!(fits(blocks, block, size, align));
                return Some(lists.take(blocks, block, size, align));
            }
        }
        // Near the edge (a request as large as the largest free block): blocks of the
        // request's own class may still hold it.
        let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
        if fl < FL_COUNT {
            if let Some(block) = lists.scan(blocks, fl, sl, size, align) {
                return Some(lists.take(blocks, block, size, align));
            }
        }
        if lists.fl_bitmap != 0 {
            let top_fl = 63 - lists.fl_bitmap.leading_zeros() as usize;
            let top_sl = 31 - lists.sl_bitmap[top_fl].leading_zeros() as usize;
            if (top_fl, top_sl) != (fl, sl) {
                if let Some(block) = lists.scan(blocks, top_fl, top_sl, size, align) {
                    return Some(lists.take(blocks, block, size, align));
                }
            }
        }
        None
    }

    /// Takes a block of `size` bytes (a non-zero multiple of [`GRANULE`]) at the lowest
    /// address that `place` offers inside some free block, looking at every free block (cached
    /// blocks not: [`flush`](Self::flush) first). `place(addr, bytes)` answers for the free
    /// block `addr..addr + bytes` with a start inside it, a multiple of [`GRANULE`], that has
    /// `size` bytes of the block from there, or `None`. A slow search, O(blocks), for a
    /// caller that needs more than a size: a growable region out of device memory looks for
    /// free memory that is mapped.
    #[cold]
    #[inline(never)]
    pub(crate) fn allocate_where(
        &mut self,
        size: u64,
        mut place: impl FnMut(u64, u64) -> Option<u64>,
    ) -> Option<(u32, u64)> {
        debug_assert!(size % GRANULE == 0 && size > 0);
        let (block, start) = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.free && b.size >= size)
            .filter_map(|(slot, b)| {
                let start = place(b.addr, b.size)?;
                // What `take_at` relies on, checked here rather than trusted.
                let inside = start >= b.addr
                    && start % GRANULE == 0
                    && (start - b.addr)
                        .checked_add(size)
                        .is_some_and(|end| end <= b.size);
                inside.then_some((slot as u32, start))
            })
            .min_by_key(|&(_, start)| start)?;
        if self.lists.spares < SLOTS_PER_ALLOCATION {
            self.add_spares();
        }
        let (blocks, lists) = (&mut Slots(&mut self.blocks), &mut self.lists);
        let taken = lists.take_at(blocks, block, size, start);
        self.blocks[taken.0 as usize].class = size_class(size) as u16;
        Some(taken)
    }

    /// Returns a block taken by [`allocate`](Self::allocate) and merges it with free
    /// neighbours; returns the block's size.
    ///
    /// # Panics
    ///
    /// When `block` is not a slot of the block array (no block [`allocate`](Self::allocate)
    /// returned is out of it).
    #[inline(always)]
    pub(crate) fn free(&mut self, block: u32) -> u64 {
        // The one index that enters the list operations from outside: checked here.
        assert!(
            (block as usize) < self.blocks.len(),
            "block {block} out of range"
        );
        debug_assert!(block != NIL && self.blocks[block as usize].addr - self.base < self.size);
        self.lists.free(&mut Slots(&mut self.blocks), block)
    }

    /// Puts new slots on the spare list, so that the next allocation need not grow the block
    /// array while it works on a slice of it.
    #[cold]
    fn add_spares(&mut self) {
        let count = SLOTS_PER_ALLOCATION.max(self.blocks.len() / 8);
        debug_assert!(
            self.blocks.len() + count < u32::MAX as usize,
            "see MAX_POOL_CAPACITY"
        );
        for _ in 0..count {
            let slot = self.blocks.len() as u32;
            self.blocks.push(Block::UNUSED);
            self.lists.release_slot(&mut Slots(&mut self.blocks), slot);
        }
    }
}

/// The block array inside the list operations, indexed by slot without a bounds check.
///
/// The invariant that makes this sound: every slot index the index stores (the list heads,
/// the spare list, the four links of every slot, whether the slot is used, free or spare) is
/// below the array's length. Slots are only ever appended, never removed; a new slot's links
/// are [`NIL`]; every link written is an index read from one of those places or a slot just
/// appended. The one index that comes from outside, the block [`Tlsf::free`] is given, is
/// checked when it enters. The operations below use no other indices.
struct Slots<'a>(&'a mut [Block]);

impl Slots<'_> {
    #[inline(always)]
    fn at(&self, slot: u32) -> &Block {
        debug_assert!(
            (slot as usize) < self.0.len(),
            "slot {slot} of {}",
            self.0.len()
        );
        // SAFETY: `slot` is an index the TLSF stored or checked, so it is below the length of
        // the array (the invariant on `Slots`).
        unsafe { self.0.get_unchecked(slot as usize) }
    }

    #[inline(always)]
    fn at_mut(&mut self, slot: u32) -> &mut Block {
        debug_assert!(
            (slot as usize) < self.0.len(),
            "slot {slot} of {}",
            self.0.len()
        );
        // SAFETY: as in `at`.
        unsafe { self.0.get_unchecked_mut(slot as usize) }
    }
}

/// Whether `block` can hold `size` bytes at `align`.
#[inline(always)]
fn fits(blocks: &Slots<'_>, block: u32, size: u64, align: u64) -> bool {
    let b = blocks.at(block);
    // Blocks lie inside the region, whose end was checked not to overflow; past it, no fit.
    let Some(start) = align_up_u64(b.addr, align) else {
        return false;
    };
    start - b.addr <= b.size && b.size - (start - b.addr) >= size
}

impl Lists {
    /// Looks at up to [`FALLBACK_SCAN`] blocks of one class.
    fn scan(&self, blocks: &Slots<'_>, fl: usize, sl: usize, size: u64, align: u64) -> Option<u32> {
        let mut at = self.heads[class(fl, sl)];
        for _ in 0..FALLBACK_SCAN {
            if at == NIL {
                return None;
            }
            if fits(blocks, at, size, align) {
                return Some(at);
            }
            at = blocks.at(at).next_free;
        }
        None
    }

    /// The smallest non-empty class whose blocks all hold `units` granules, and its head.
    #[inline(always)]
    fn find_suitable(&self, units: u64) -> Option<(usize, u32)> {
        let (mut fl, sl) = mapping_search(units);
        if fl >= FL_COUNT {
            return None;
        }
        let sl_map = self.sl_bitmap[fl] & (u32::MAX << sl);
        // The first non-empty first level above `fl`, looked up whether it is needed or not:
        // choosing between the two without a branch saves a misprediction on about a third of
        // the calls. (`fl + 1 <= FL_COUNT < 64`: the shift does not overflow; with no level
        // above, `trailing_zeros` is 64, masked to a valid row, and not used.)
        let fl_map = self.fl_bitmap & (u64::MAX << (fl + 1));
        if (sl_map as u64 | fl_map) == 0 {
            return None;
        }
        let next_fl = fl_map.trailing_zeros() as usize & (FL_ROWS - 1);
        let next_map = self.sl_bitmap[next_fl];
        // All ones when `fl` itself has a class that fits. A mask, not an `if`: the compiler
        // turns a select whose operand is a load back into a branch.
        let here = ((sl_map != 0) as usize).wrapping_neg();
        fl = (fl & here) | (next_fl & !here);
        let map = (sl_map & here as u32) | (next_map & !here as u32);
        let class = class(fl, map.trailing_zeros() as usize);
        Some((class, self.heads[class]))
    }

    /// Takes `block`, the head of `class`, for `size` bytes at the granule's alignment: what
    /// lies behind goes back to the free lists.
    #[inline(always)]
    fn take_head(
        &mut self,
        blocks: &mut Slots<'_>,
        class: usize,
        block: u32,
        size: u64,
    ) -> (u32, u64) {
        let b = blocks.at_mut(block);
        debug_assert!(b.free && b.prev_free == NIL && b.class as usize == class);
        b.free = false;
        let (addr, next_free, rest) = (b.addr, b.next_free, b.size - size);
        self.heads[class & (FL_ROWS * SL_COUNT - 1)] = next_free;
        blocks.at_mut(next_free).prev_free = NIL;
        self.clear_class_bit_if(class, next_free == NIL);
        self.free_blocks -= 1;
        self.free_bytes -= size;
        if rest > 0 {
            self.split_tail(blocks, block, addr, size, rest);
        }
        (block, addr)
    }

    /// Takes a free block for `size` bytes at `align`: free space in front (alignment) and
    /// behind goes back to the free lists as blocks of their own.
    fn take(&mut self, blocks: &mut Slots<'_>, block: u32, size: u64, align: u64) -> (u32, u64) {
        let addr = blocks.at(block).addr;
        // `fits` checked that the aligned start lies inside the block.
        let start = align_up_u64(addr, align).unwrap_or(addr);
        self.take_at(blocks, block, size, start)
    }

    /// [`take`](Self::take) at `start`: a granule inside the free `block` with `size` bytes of
    /// it from there.
    #[inline(always)]
    fn take_at(&mut self, blocks: &mut Slots<'_>, block: u32, size: u64, start: u64) -> (u32, u64) {
        self.remove_free(blocks, block);
        self.free_bytes -= size;
        let mut block = block;
        let b = blocks.at(block);
        let (addr, total, next) = (b.addr, b.size, b.next_phys);
        debug_assert!(start >= addr && start - addr + size <= total && start % GRANULE == 0);
        let pad = start - addr;
        if pad > 0 {
            // The front goes back to the free lists; its physical predecessor is used (free
            // blocks never touch), so it needs no merge.
            let front = block;
            block = self.pop_spare(blocks);
            *blocks.at_mut(block) = Block {
                addr: start,
                size: total - pad,
                prev_phys: front,
                next_phys: next,
                ..Block::UNUSED
            };
            blocks.at_mut(next).prev_phys = block;
            let f = blocks.at_mut(front);
            f.size = pad;
            f.next_phys = block;
            self.insert_free(blocks, front);
        }
        let rest = total - pad - size;
        if rest > 0 {
            self.split_tail(blocks, block, start, size, rest);
        }
        (block, start)
    }

    /// Cuts `block` (at `addr`, `size + rest` bytes, used) after `size` bytes; the `rest`
    /// becomes a free block of its own (its physical successor is used: free blocks never
    /// touch).
    #[inline(always)]
    fn split_tail(&mut self, blocks: &mut Slots<'_>, block: u32, addr: u64, size: u64, rest: u64) {
        debug_assert!(size > 0 && rest > 0);
        let next = blocks.at(block).next_phys;
        let (fl, sl) = mapping_insert(rest >> GRANULE_SHIFT);
        let class = class(fl, sl);
        let head = self.heads[class];
        let tail = self.pop_spare(blocks);
        *blocks.at_mut(tail) = Block {
            addr: addr + size,
            size: rest,
            prev_phys: block,
            next_phys: next,
            prev_free: NIL,
            next_free: head,
            class: class as u16,
            free: true,
            cached: false,
            generation: 0,
        };
        let b = blocks.at_mut(block);
        b.size = size;
        b.next_phys = tail;
        blocks.at_mut(next).prev_phys = tail;
        self.link(blocks, tail, fl, sl, class, head);
    }

    /// Returns a used block to the free lists, merged with its free physical neighbours;
    /// returns the block's own size.
    ///
    /// A missing neighbour is the sentinel, which is never free. (Whether a neighbour is free
    /// is a coin flip under random sizes, but merging without branches, every step done and
    /// its effect masked, costs more than the mispredictions it saves: measured with the pool
    /// benchmark.)
    #[inline(always)]
    fn free(&mut self, blocks: &mut Slots<'_>, block: u32) -> u64 {
        let b = blocks.at(block);
        debug_assert!(!b.free);
        let (own, prev, mut next) = (b.size, b.prev_phys, b.next_phys);
        self.free_bytes += own;
        let mut size = own;
        let mut merged = block;
        if blocks.at(prev).free {
            size += blocks.at(prev).size;
            self.remove_free(blocks, prev);
            self.release_slot(blocks, block);
            merged = prev;
        }
        let n = blocks.at(next);
        if n.free {
            size += n.size;
            let after = n.next_phys;
            self.remove_free(blocks, next);
            self.release_slot(blocks, next);
            next = after;
        }
        blocks.at_mut(next).prev_phys = merged;
        // One write-back of the merged block, which goes to the head of its class.
        let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
        let class = class(fl, sl);
        let head = self.heads[class];
        let m = blocks.at_mut(merged);
        m.size = size;
        m.next_phys = next;
        m.free = true;
        m.class = class as u16;
        m.prev_free = NIL;
        m.next_free = head;
        self.link(blocks, merged, fl, sl, class, head);
        own
    }

    /// A spare slot ([`Tlsf::allocate`] made sure there is one).
    #[inline(always)]
    fn pop_spare(&mut self, blocks: &Slots<'_>) -> u32 {
        let slot = self.spare;
        self.spare = blocks.at(slot).next_free;
        self.spares -= 1;
        slot
    }

    /// Puts a slot that no block uses any more on the spare list.
    #[inline(always)]
    fn release_slot(&mut self, blocks: &mut Slots<'_>, slot: u32) {
        // Its `free` flag is already clear: it was a used block or came out of a free list.
        blocks.at_mut(slot).next_free = self.spare;
        self.spare = slot;
        self.spares += 1;
    }

    /// Puts `block` (its size set) at the head of its class's free list.
    fn insert_free(&mut self, blocks: &mut Slots<'_>, block: u32) {
        let (fl, sl) = mapping_insert(blocks.at(block).size >> GRANULE_SHIFT);
        let class = class(fl, sl);
        let head = self.heads[class];
        let b = blocks.at_mut(block);
        b.free = true;
        b.class = class as u16;
        b.prev_free = NIL;
        b.next_free = head;
        self.link(blocks, block, fl, sl, class, head);
    }

    /// Makes `block`, whose own fields already say free, class `class` = `(fl, sl)` and next
    /// `head`, the head of that class's list.
    #[inline(always)]
    fn link(
        &mut self,
        blocks: &mut Slots<'_>,
        block: u32,
        fl: usize,
        sl: usize,
        class: usize,
        head: u32,
    ) {
        blocks.at_mut(head).prev_free = block;
        self.heads[class & (FL_ROWS * SL_COUNT - 1)] = block;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl & (FL_ROWS - 1)] |= 1 << sl;
        self.free_blocks += 1;
    }

    /// Takes a free block out of its list (its `free` flag cleared: the caller either uses it
    /// or merges it away).
    #[inline(always)]
    fn remove_free(&mut self, blocks: &mut Slots<'_>, block: u32) {
        let b = blocks.at_mut(block);
        debug_assert!(b.free);
        b.free = false;
        let (prev, next, class) = (b.prev_free, b.next_free, b.class as usize);
        if prev != NIL {
            blocks.at_mut(prev).next_free = next;
        } else {
            self.heads[class & (FL_ROWS * SL_COUNT - 1)] = next;
            self.clear_class_bit_if(class, next == NIL);
        }
        blocks.at_mut(next).prev_free = prev;
        self.free_blocks -= 1;
    }

    /// When `emptied` (the list of `class` became empty), clears the class's bit, and its
    /// first level's bit when it was that level's last class. Without branches: emptiness is
    /// random.
    #[inline(always)]
    fn clear_class_bit_if(&mut self, class: usize, emptied: bool) {
        let (fl, sl) = (class >> SL_SHIFT & (FL_ROWS - 1), class & (SL_COUNT - 1));
        let row = &mut self.sl_bitmap[fl];
        *row &= !((emptied as u32) << sl);
        self.fl_bitmap &= !(((*row == 0) as u64) << fl);
    }
}

#[cfg(test)]
mod check;
#[cfg(test)]
mod tests;

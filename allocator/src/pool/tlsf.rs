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
    /// its list needs no second mapping of its size.
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
pub(crate) struct Tlsf {
    base: u64,
    size: u64,
    blocks: Vec<Block>,
    lists: Lists,
    cache: Cache,
}

/// Blocks freed by their users and kept whole, unmerged, for the next request of the same size
/// class (deferred coalescing).
///
/// Every used block spans a whole size class ([`class_size`]), so a cached block of a request's
/// class fits it exactly: taking it is a list pop, no search and no split; caching one is a
/// list push, no merge. A ring of the last [`Cache::ring`]`.len()` blocks cached bounds how many
/// stay: caching a block overwrites the oldest entry, and the block there, if it is still
/// cached by that entry (same generation), is merged into the free lists. Each cached block has
/// its entry in the ring, written when it was cached, which only a later push can overwrite. A
/// byte limit bounds how much memory waits: a block that would pass it is merged at once.
#[derive(Debug)]
struct Cache {
    /// Head of each class's list of cached blocks (linked through `prev_free`/`next_free`).
    heads: [u32; FL_ROWS * SL_COUNT],
    /// The last blocks cached with their generations, oldest at `pos` ([`NIL`] where none was
    /// yet); a power of two long (0: no cache).
    ring: Vec<(u32, u32)>,
    pos: usize,
    /// Bytes and blocks cached now.
    bytes: u64,
    blocks: usize,
    /// The most bytes cached at once (0 when there is no ring).
    byte_limit: u64,
    /// Blocks taken from the cache so far.
    hits: u64,
}

/// Everything beside the block array: the free lists, their bitmaps, the spare slots and the
/// counters. Its methods take the blocks as a slice, whose pointer and length the compiler
/// keeps in registers (through `&mut self.blocks` it reloads both after every store).
#[derive(Debug)]
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

/// The index of class `(fl, sl)` in [`Tlsf::heads`] (masked: never out of bounds).
#[inline(always)]
fn class(fl: usize, sl: usize) -> usize {
    (fl & (FL_ROWS - 1)) << SL_SHIFT | (sl & (SL_COUNT - 1))
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

impl Tlsf {
    /// One free block spanning `base..base + size`. `base` and `size` must be multiples of
    /// [`GRANULE`] and `size` non-zero. Freed blocks wait unmerged in a cache of at most
    /// `cache_blocks` (rounded up to a power of two; 0 for none) blocks and `cache_bytes`
    /// bytes.
    pub(crate) fn new(base: u64, size: u64, cache_blocks: usize, cache_bytes: u64) -> Self {
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
                free_bytes: size,
                free_blocks: 0,
            },
        };
        tlsf.blocks.push(Block::UNUSED);
        tlsf.blocks.push(Block {
            addr: base,
            size,
            ..Block::UNUSED
        });
        tlsf.lists.insert_free(&mut Slots(&mut tlsf.blocks), 1);
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

    /// Number of free blocks (cached blocks not counted: [`flush`](Self::flush) first).
    pub(crate) fn free_blocks(&self) -> usize {
        self.lists.free_blocks
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
        if let Some(taken) = self.take_cached(size, align) {
            return Some(taken);
        }
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

    /// The head of the cache list of `size`'s class, when it is `size` bytes at `align`.
    #[inline(always)]
    fn take_cached(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
        let class = class(fl, sl);
        let block = self.cache.heads[class];
        if block == NIL {
            return None;
        }
        let blocks = &mut Slots(&mut self.blocks);
        let b = blocks.at_mut(block);
        debug_assert!(b.cached && !b.free && b.prev_free == NIL);
        // Every cached block of this class has the class's size when `size` is a class size;
        // the check keeps other sizes correct.
        if b.size != size || b.addr & (align - 1) != 0 {
            return None;
        }
        b.cached = false;
        let (addr, next) = (b.addr, b.next_free);
        self.cache.heads[class] = next;
        blocks.at_mut(next).prev_free = NIL;
        self.cache.bytes -= size;
        self.cache.blocks -= 1;
        self.cache.hits += 1;
        Some((block, addr))
    }

    /// Returns a block taken by [`allocate`](Self::allocate) to the cache, to be taken whole by
    /// a request of its size or merged later; merges it at once when the cache is off or full
    /// in bytes. Returns the block's size.
    ///
    /// # Panics
    ///
    /// As [`free`](Self::free).
    #[inline(always)]
    pub(crate) fn release(&mut self, block: u32) -> u64 {
        assert!(
            (block as usize) < self.blocks.len(),
            "block {block} out of range"
        );
        let size = self.blocks[block as usize].size;
        let cache = &mut self.cache;
        // (Without a ring the limit is 0.)
        if cache.bytes + size > cache.byte_limit {
            return self.lists.free(&mut Slots(&mut self.blocks), block);
        }
        let blocks = &mut Slots(&mut self.blocks);
        let b = blocks.at_mut(block);
        debug_assert!(!b.free && !b.cached && b.addr - self.base < self.size);
        let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
        let class = class(fl, sl);
        let head = cache.heads[class];
        b.cached = true;
        b.generation = b.generation.wrapping_add(1);
        let generation = b.generation;
        b.class = class as u16;
        b.prev_free = NIL;
        b.next_free = head;
        blocks.at_mut(head).prev_free = block;
        cache.heads[class] = block;
        cache.bytes += size;
        cache.blocks += 1;
        // The ring's oldest entry gives way; its block, if still cached since that entry was
        // written, is merged.
        let mask = cache.ring.len() - 1;
        let (oldest, then) =
            core::mem::replace(&mut cache.ring[cache.pos & mask], (block, generation));
        cache.pos = cache.pos.wrapping_add(1);
        // `oldest` is a slot index the ring stored (below the length: slots are never
        // removed), or NIL.
        let o = blocks.at(oldest);
        // One branch, not two (`&`, not `&&`): whether the oldest block is still cached is a
        // coin flip, whether it must go is mostly "no".
        if o.cached & (o.generation == then) {
            self.evict(oldest);
        }
        size
    }

    /// Takes a cached block out of the cache and merges it into the free lists.
    #[inline(never)]
    fn evict(&mut self, block: u32) {
        let blocks = &mut Slots(&mut self.blocks);
        let b = blocks.at_mut(block);
        debug_assert!(b.cached);
        b.cached = false;
        let (prev, next, class, size) = (b.prev_free, b.next_free, b.class as usize, b.size);
        if prev != NIL {
            blocks.at_mut(prev).next_free = next;
        } else {
            self.cache.heads[class & (FL_ROWS * SL_COUNT - 1)] = next;
        }
        blocks.at_mut(next).prev_free = prev;
        self.cache.bytes -= size;
        self.cache.blocks -= 1;
        self.lists.free(blocks, block);
    }

    /// Merges every cached block into the free lists: afterwards the free lists alone describe
    /// all free memory (no two free blocks touch). At most the ring's length of merges.
    pub(crate) fn flush(&mut self) {
        if self.cache.blocks == 0 {
            return;
        }
        for i in 0..self.cache.ring.len() {
            let (block, generation) = core::mem::replace(&mut self.cache.ring[i], (NIL, 0));
            let b = &self.blocks[block as usize];
            if b.cached && b.generation == generation {
                self.evict(block);
            }
        }
        debug_assert_eq!((self.cache.blocks, self.cache.bytes), (0, 0));
    }

    /// Puts new slots on the spare list, so that the next allocation need not grow the block
    /// array while it works on a slice of it.
    #[cold]
    fn add_spares(&mut self) {
        let count = SLOTS_PER_ALLOCATION.max(self.blocks.len() / 8);
        for _ in 0..count {
            let slot = self.blocks.len() as u32;
            self.blocks.push(Block::UNUSED);
            self.lists.release_slot(&mut Slots(&mut self.blocks), slot);
        }
    }

    /// Walks the physical chain and the free lists and checks every invariant; the test suite
    /// calls it after every step.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        use alloc::vec;
        // Physical chain: contiguous, covers the region, no two adjacent free blocks.
        let sentinel = &self.blocks[NIL as usize];
        assert!(!sentinel.free, "the sentinel is never free");
        let mut in_chain = vec![false; self.blocks.len()];
        let mut spare = vec![false; self.blocks.len()];
        let lists = &self.lists;
        let mut slot = lists.spare;
        let mut spares = 0;
        while slot != NIL {
            assert!(!spare[slot as usize], "the spare list has no cycle");
            spare[slot as usize] = true;
            spares += 1;
            slot = self.blocks[slot as usize].next_free;
        }
        assert_eq!(spares, lists.spares, "spare slots are counted");
        let mut at = (1..self.blocks.len())
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
            (lists.free_bytes, lists.free_blocks)
        );
        for (slot, in_chain) in in_chain.iter().enumerate().skip(1) {
            assert_ne!(
                *in_chain, spare[slot],
                "slot {slot} is either in the chain or spare"
            );
        }
        // Free lists: every listed block is free, in the right class, and the bitmaps agree.
        let mut listed = 0;
        for fl in 0..FL_COUNT {
            for sl in 0..SL_COUNT {
                let head = lists.heads[class(fl, sl)];
                let bit = lists.sl_bitmap[fl] & (1 << sl) != 0;
                assert_eq!(bit, head != NIL, "bitmap of class ({fl}, {sl})");
                let mut at = head;
                let mut prev = NIL;
                while at != NIL {
                    let b = &self.blocks[at as usize];
                    assert!(b.free && in_chain[at as usize]);
                    assert_eq!(mapping_insert(b.size >> GRANULE_SHIFT), (fl, sl));
                    assert_eq!(b.class as usize, class(fl, sl));
                    assert_eq!(b.prev_free, prev);
                    listed += 1;
                    prev = at;
                    at = b.next_free;
                }
            }
            assert_eq!(lists.fl_bitmap & (1 << fl) != 0, lists.sl_bitmap[fl] != 0);
        }
        assert!(lists.sl_bitmap[FL_COUNT..].iter().all(|&row| row == 0));
        assert_eq!(lists.fl_bitmap >> FL_COUNT, 0);
        assert_eq!(listed, lists.free_blocks);
        // Cache: every cached block is in the chain, in its class's list, not free, and has an
        // entry in the ring; the counts agree.
        let cache = &self.cache;
        let (mut cached_bytes, mut cached_blocks) = (0, 0);
        for (class_index, &head) in cache.heads.iter().enumerate() {
            let mut at = head;
            let mut prev = NIL;
            while at != NIL {
                let b = &self.blocks[at as usize];
                assert!(b.cached && !b.free && in_chain[at as usize]);
                let (fl, sl) = mapping_insert(b.size >> GRANULE_SHIFT);
                assert_eq!(class(fl, sl), class_index);
                assert_eq!(b.class as usize, class_index);
                assert_eq!(b.prev_free, prev);
                assert!(
                    cache.ring.contains(&(at, b.generation)),
                    "cached block {at} is in the ring"
                );
                cached_bytes += b.size;
                cached_blocks += 1;
                prev = at;
                at = b.next_free;
            }
        }
        let flagged = self.blocks.iter().filter(|b| b.cached).count();
        assert_eq!(flagged, cached_blocks, "every cached block is listed");
        assert_eq!((cache.bytes, cache.blocks), (cached_bytes, cached_blocks));
        assert!(cache.bytes <= cache.byte_limit);
        assert!(cache.byte_limit == 0 || !cache.ring.is_empty());
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
    let start = align_up(b.addr, align);
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
        self.remove_free(blocks, block);
        self.free_bytes -= size;
        let mut block = block;
        let b = blocks.at(block);
        let (addr, total, next) = (b.addr, b.size, b.next_phys);
        let start = align_up(addr, align);
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
        let mut t = Tlsf::new(1 << 20, 1000 * GRANULE, 0, 0);
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
        let mut t = Tlsf::new(0, 64 * 4096, 0, 0);
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
        let mut t = Tlsf::new(base, 1 << 40, 0, 0);
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
        let mut t = Tlsf::new(0, 1 << 26, 0, 0);
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

    #[test]
    fn random_sequences_keep_every_invariant() {
        random_sequences(0, 0, 11);
    }

    #[test]
    fn random_sequences_with_the_cache_keep_every_invariant() {
        // A small ring and a byte limit that binds now and then: blocks are taken from the
        // cache, evicted by the ring, merged at once past the byte limit, and flushed.
        random_sequences(64, 4 << 20, 12);
    }

    /// Random requests at every alignment (the head-of-class path at 256, the front split
    /// above it), frees that merge with either neighbour or both, and now and then a request
    /// for most of what is free (the fallback scans). After every step: the index's own
    /// invariants, and against a reference of the live ranges, no overlap, alignment, and exact
    /// free bytes. With a cache, sizes are class sizes (so that cached blocks are reused),
    /// frees go through the cache, and a failed request flushes it and tries again, as the pool
    /// does.
    fn random_sequences(cache_blocks: usize, cache_bytes: u64, seed: u64) {
        use alloc::collections::BTreeMap;
        let region = 1u64 << 24;
        let base = 0x7f00_0000_0000;
        let cached = cache_blocks > 0;
        let mut t = Tlsf::new(base, region, cache_blocks, cache_bytes);
        let mut live: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ seed;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut fast, mut aligned, mut edge, mut reused, mut flushes) = (0, 0, 0, 0, 0);
        for _ in 0..20_000 {
            let r = next();
            if r % 5 < 3 || live.is_empty() {
                let align = 1u64 << (8 + (r >> 8) % 5);
                let mut size = if r % 97 == 0 {
                    // Near the edge: as large as what is free, rounded down to a granule.
                    edge += 1;
                    (t.largest_free() & !(GRANULE - 1)).max(GRANULE)
                } else {
                    // Log-uniform-ish in granules: 1 .. 2^12.
                    let bits = 1 + (r >> 16) % 12;
                    GRANULE * (1 + (r >> 24) % (1 << bits))
                };
                if cached && r % 97 != 0 {
                    size = class_size(size).unwrap();
                    assert!(size % GRANULE == 0);
                }
                let free_before = t.free_bytes();
                let cached_before = t.cached().1;
                let mut taken = t.allocate(size, align);
                if taken.is_none() && t.cached().1 > 0 {
                    t.flush();
                    t.check();
                    flushes += 1;
                    taken = t.allocate(size, align);
                }
                if let Some((block, addr)) = taken {
                    if t.cached().1 < cached_before {
                        reused += 1;
                    } else if align == GRANULE {
                        fast += 1;
                    } else {
                        aligned += 1;
                    }
                    assert_eq!(addr % align, 0);
                    assert!(addr >= base && addr + size <= base + region);
                    assert_eq!(t.block_size(block), size);
                    if let Some((&a, &(_, s))) = live.range(..addr).next_back() {
                        assert!(a + s <= addr, "overlaps the block below");
                    }
                    if let Some((&a, _)) = live.range(addr..).next() {
                        assert!(addr + size <= a, "overlaps the block above");
                    }
                    live.insert(addr, (block, size));
                    assert_eq!(t.free_bytes(), free_before - size);
                } else {
                    assert!(
                        guaranteed_fit(size, align).unwrap() > t.largest_free(),
                        "a guaranteed fit of {size} at {align} failed"
                    );
                    assert_eq!(t.free_bytes(), free_before);
                }
            } else {
                let nth = (r >> 32) as usize % live.len();
                let addr = *live.keys().nth(nth).unwrap();
                let (block, size) = live.remove(&addr).unwrap();
                let released = if cached {
                    t.release(block)
                } else {
                    t.free(block)
                };
                assert_eq!(released, size);
            }
            t.check();
            let used: u64 = live.values().map(|&(_, s)| s).sum();
            assert_eq!(t.free_bytes(), region - used);
        }
        assert!(
            fast > 1000 && aligned > 1000 && edge > 50,
            "{fast} {aligned} {edge}"
        );
        if cached {
            assert!(reused > 300 && flushes > 0, "{reused} {flushes}");
        }
        for (_, (block, _)) in core::mem::take(&mut live) {
            t.release(block);
        }
        t.flush();
        t.check();
        assert_eq!((t.free_blocks(), t.largest_free()), (1, region));
        assert_eq!(t.free_bytes(), region);
    }

    #[test]
    fn class_sizes_round_up_by_less_than_a_thirty_second() {
        assert_eq!(class_size(GRANULE), Some(GRANULE));
        assert_eq!(class_size(31 * GRANULE), Some(31 * GRANULE));
        assert_eq!(class_size(33 * GRANULE), Some(33 * GRANULE));
        assert_eq!(class_size(65 * GRANULE), Some(66 * GRANULE));
        assert_eq!(class_size((1 << 20) + GRANULE), Some((1 << 20) + (1 << 15)));
        assert_eq!(class_size(!(GRANULE - 1)), None);
        for units in 1..20_000u64 {
            let size = class_size(units * GRANULE).unwrap();
            assert!(size >= units * GRANULE && (size - units * GRANULE) * 32 < units * GRANULE);
            // A class size is the smallest size of the first class whose every block holds
            // the request: one granule less is another class.
            let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
            assert_eq!(mapping_search(units), (fl, sl));
            assert_ne!(mapping_insert((size >> GRANULE_SHIFT) - 1), (fl, sl));
            assert_eq!(class_size(size), Some(size));
        }
    }

    #[test]
    fn the_cache_hands_back_whole_blocks_and_merges_what_it_evicts() {
        let mut t = Tlsf::new(0, 1 << 20, 4, 1 << 20);
        let size = class_size(3000).unwrap();
        let (a, addr_a) = t.allocate(size, GRANULE).unwrap();
        let (b, _) = t.allocate(size, GRANULE).unwrap();
        t.release(a);
        t.check();
        assert_eq!(t.cached(), (size, 1));
        // Same class: the cached block, whole, at its address.
        assert_eq!(t.allocate(size, GRANULE), Some((a, addr_a)));
        assert_eq!(t.cached(), (0, 0));
        // Another class, or an alignment the cached block does not have: the free lists.
        t.release(a);
        let (c, addr_c) = t.allocate(size + GRANULE * 8, GRANULE).unwrap();
        assert_ne!(c, a);
        assert_ne!(addr_c, addr_a);
        if addr_a % 4096 != 0 {
            let (d, _) = t.allocate(size, 4096).unwrap();
            assert_ne!(d, a);
            t.free(d);
        }
        assert_eq!(t.cached().1, 1);
        // Four more releases push `a` out of the ring of four: it is merged.
        let more: Vec<_> = (0..4)
            .map(|_| t.allocate(GRANULE, GRANULE).unwrap().0)
            .collect();
        for block in more {
            t.release(block);
            t.check();
        }
        assert!(!t.blocks[a as usize].cached);
        assert_eq!(t.cached().1, 4);
        t.release(b);
        t.release(c);
        t.flush();
        t.check();
        assert_eq!(
            (t.free_blocks(), t.largest_free(), t.cached()),
            (1, 1 << 20, (0, 0))
        );
    }

    #[test]
    fn the_byte_limit_merges_at_once() {
        let mut t = Tlsf::new(0, 1 << 20, 16, 4096);
        let (a, _) = t.allocate(4096, GRANULE).unwrap();
        let (b, _) = t.allocate(GRANULE, GRANULE).unwrap();
        t.release(a);
        assert_eq!(t.cached(), (4096, 1));
        // One granule more would pass the limit: merged, not cached.
        t.release(b);
        t.check();
        assert_eq!(t.cached(), (4096, 1));
        assert_eq!(t.free_blocks(), 1);
        t.flush();
        assert_eq!((t.free_blocks(), t.largest_free()), (1, 1 << 20));
    }
}

//! The reuse cache of the TLSF index (deferred coalescing).

use alloc::vec::Vec;

use super::{FL_ROWS, GRANULE_SHIFT, NIL, SL_COUNT, Slots, Tlsf, class, mapping_insert};

/// Blocks freed by their users and kept whole, unmerged, for the next request of the same size
/// class (deferred coalescing).
///
/// Every used block spans a whole size class ([`class_size`](super::class_size)), so a cached block of a request's
/// class fits it exactly: taking it is a list pop, no search and no split; caching one is a
/// list push, no merge. A ring of the last [`Cache::ring`]`.len()` blocks cached bounds how many
/// stay: caching a block overwrites the oldest entry, and the block there, if it is still
/// cached by that entry (same generation), is merged into the free lists. Each cached block has
/// its entry in the ring, written when it was cached, which only a later push can overwrite. A
/// byte limit bounds how much memory waits: a block that would pass it is merged at once.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(super) struct Cache {
    /// Head of each class's list of cached blocks (linked through `prev_free`/`next_free`).
    pub(super) heads: [u32; FL_ROWS * SL_COUNT],
    // (In this order: the fields a take or a release of a block updates together, `bytes`,
    // `blocks` and `hits` or `pos`, are not neighbours, which the compiler packed into vector
    // operations of 5 instructions for 2.)
    /// Bytes cached now.
    pub(super) bytes: u64,
    /// The most bytes cached at once (0 when there is no ring).
    pub(super) byte_limit: u64,
    /// Blocks cached now.
    pub(super) blocks: usize,
    /// The last blocks cached with their generations, oldest at `pos` ([`NIL`] where none was
    /// yet); a power of two long (0: no cache).
    pub(super) ring: Vec<(u32, u32)>,
    pub(super) pos: usize,
    /// How many entries from `pos` on (the oldest) are known to name no cached block: each
    /// is `(NIL, 0)`, cleared by [`Tlsf::evict_oldest`] or [`Tlsf::flush`], so that merging
    /// the oldest blocks again starts past them. Without it, a heap short of memory merged
    /// half its cache at a time and scanned the ring from its oldest entry each time, over
    /// the entries earlier merges had emptied (a ring of 2,048: about 13% of the time of
    /// eight threads near a pool's capacity in the pool benchmark).
    pub(super) stale: usize,
    /// Blocks taken from the cache so far.
    pub(super) hits: u64,
}

impl Tlsf {
    /// The head of the cache list of `size`'s class, when it is `size` bytes at `align`.
    #[inline(always)]
    pub(super) fn take_cached(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
        self.take_cached_in(class(fl, sl), size, align)
    }

    /// [`take_cached`](Self::take_cached) from class `class` (`size`'s, masked as by `class`).
    #[inline(always)]
    pub(super) fn take_cached_in(
        &mut self,
        class: usize,
        size: u64,
        align: u64,
    ) -> Option<(u32, u64)> {
        let class = class & (FL_ROWS * SL_COUNT - 1);
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
        // A used block carries its size's class (see `allocate` and `carve`).
        let class = b.class as usize & (FL_ROWS * SL_COUNT - 1);
        debug_assert_eq!(class, {
            let (fl, sl) = mapping_insert(size >> GRANULE_SHIFT);
            super::class(fl, sl)
        });
        let head = cache.heads[class];
        b.cached = true;
        b.generation = b.generation.wrapping_add(1);
        let generation = b.generation;
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
        // The entry written was the oldest: the known-empty run (if any) now starts one on.
        cache.stale = cache.stale.saturating_sub(1);
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

    /// The free blocks as [`flush`](Self::flush) would leave them, without merging anything:
    /// `(bytes, largest, blocks)`, where touching free and cached blocks count as one. Free
    /// blocks never touch each other, so only runs with a cached block in them differ from
    /// the free lists: they are walked, each once, from their first block. O(cached blocks
    /// and the blocks of their runs), plus one pass over the class heads.
    pub(crate) fn merged_unused(&self) -> (u64, u64, usize) {
        let blocks = &self.blocks;
        let unused = |slot: u32| {
            let b = &blocks[slot as usize];
            b.free | b.cached
        };
        // Every pair of touching unused blocks joins two into one: counted once, at its
        // right-hand block when that is cached, else at the cached block on its left. The
        // first block of every run with a cached block in it: that block, or a free block
        // just before it (free blocks do not touch each other).
        let mut joints = 0;
        let mut starts = Vec::new();
        for &head in self.cache.heads.iter() {
            let mut at = head;
            while at != NIL {
                let b = &blocks[at as usize];
                let prev = &blocks[b.prev_phys as usize];
                if !(prev.free | prev.cached) {
                    starts.push(at);
                } else {
                    joints += 1;
                    if prev.free && !unused(prev.prev_phys) {
                        starts.push(b.prev_phys);
                    }
                }
                if blocks[b.next_phys as usize].free {
                    joints += 1;
                }
                at = b.next_free;
            }
        }
        starts.sort_unstable();
        starts.dedup();
        // A run without a cached block is one free block: the largest of those is the free
        // lists' largest (or smaller than some run's).
        let mut largest = self.largest_free();
        for start in starts {
            let mut run = 0;
            let mut at = start;
            while at != NIL && unused(at) {
                run += blocks[at as usize].size;
                at = blocks[at as usize].next_phys;
            }
            largest = largest.max(run);
        }
        let count = self.lists.free_blocks + self.cache.blocks - joints;
        (self.free_bytes(), largest, count)
    }

    /// Merges cached blocks, oldest first, until `bytes` have been merged or none waits;
    /// returns the bytes merged. The entries it passes are cleared and skipped by the next
    /// call ([`Cache::stale`]): repeated calls scan the ring once in all, not once each.
    pub(crate) fn evict_oldest(&mut self, bytes: u64) -> u64 {
        let len = self.cache.ring.len();
        let mut merged = 0;
        let mut scanned = self.cache.stale;
        while merged < bytes && self.cache.blocks > 0 && scanned < len {
            let at = self.cache.pos.wrapping_add(scanned) & (len - 1);
            scanned += 1;
            let (block, generation) = core::mem::replace(&mut self.cache.ring[at], (NIL, 0));
            let b = &self.blocks[block as usize];
            if b.cached && b.generation == generation {
                merged += b.size;
                self.evict(block);
            }
        }
        // Every entry passed is cleared now (its block merged, or no longer cached by it).
        self.cache.stale = scanned;
        merged
    }

    /// Sets the most bytes that may wait (no cache: stays 0); the oldest blocks past it merge.
    pub(crate) fn set_cache_limit(&mut self, bytes: u64) {
        if !self.cache.ring.is_empty() {
            self.cache.byte_limit = bytes;
            if self.cache.bytes > bytes {
                self.evict_oldest(self.cache.bytes - bytes);
                // Stale ring entries can hide the last few: merge those too.
                if self.cache.bytes > bytes {
                    self.flush();
                }
            }
        }
    }

    /// Merges every cached block into the free lists: afterwards the free lists alone describe
    /// all free memory (no two free blocks touch). At most the ring's length of merges.
    pub(crate) fn flush(&mut self) {
        if self.cache.blocks == 0 {
            return;
        }
        // Newest first: the ring's oldest entries are mostly stale, and the scan stops at the
        // last cached block.
        let len = self.cache.ring.len();
        for i in 1..=len {
            if self.cache.blocks == 0 {
                break;
            }
            let at = self.cache.pos.wrapping_sub(i) & (len - 1);
            let (block, generation) = core::mem::replace(&mut self.cache.ring[at], (NIL, 0));
            let b = &self.blocks[block as usize];
            if b.cached && b.generation == generation {
                self.evict(block);
            }
        }
        // No block is cached: no entry names one (those not cleared here are stale).
        self.cache.stale = 0;
        debug_assert_eq!((self.cache.blocks, self.cache.bytes), (0, 0));
    }
}

//! The index's invariants, checked by the tests after every step.

use super::*;

impl Tlsf {
    /// Walks the physical chain and the free lists and checks every invariant; the test suite
    /// calls it after every step.
    pub(crate) fn check(&self) {
        self.check_spans(&[(self.base, self.size)]);
    }

    /// [`check`](Self::check) for an index whose blocks cover `spans` (address, size) and
    /// nothing else.
    pub(crate) fn check_spans(&self, spans: &[(u64, u64)]) {
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
        let (mut free_bytes, mut free_blocks) = (0, 0);
        for &(span, span_size) in spans {
            let mut at = (1..self.blocks.len())
                .find(|&i| {
                    !spare[i] && self.blocks[i].addr == span && self.blocks[i].prev_phys == NIL
                })
                .expect("a first block") as u32;
            let mut expect_addr = span;
            let mut prev = NIL;
            let mut prev_free = false;
            loop {
                let b = &self.blocks[at as usize];
                assert!(!in_chain[at as usize], "slot {at} is in one chain, once");
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
                } else {
                    // Released into the cache by this class, without mapping its size again.
                    assert_eq!(
                        b.class as usize,
                        size_class(b.size),
                        "a used block at {:#x} carries its size's class",
                        b.addr
                    );
                }
                prev_free = b.free;
                expect_addr += b.size;
                prev = at;
                if b.next_phys == NIL {
                    break;
                }
                at = b.next_phys;
            }
            assert_eq!(expect_addr, span + span_size, "the chain covers the span");
        }
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
        // The oldest `stale` entries are cleared.
        assert!(cache.stale <= cache.ring.len());
        for i in 0..cache.stale {
            let at = cache.pos.wrapping_add(i) & (cache.ring.len() - 1);
            assert_eq!(cache.ring[at], (NIL, 0), "ring entry {at} is cleared");
        }
    }
}

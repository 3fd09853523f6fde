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
    for _ in 0..crate::test_iterations(2000) {
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
    let (mut described, mut with_runs) = (0, 0);
    for _ in 0..crate::test_iterations(20_000) {
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
        if r % 31 == 0 {
            // The free blocks as a flush would leave them, described without one.
            let mut flushed = t.clone();
            flushed.flush();
            let truth = (
                flushed.free_bytes(),
                flushed.largest_free(),
                flushed.free_blocks(),
            );
            assert_eq!(t.merged_unused(), truth, "cached {:?}", t.cached());
            described += 1;
            with_runs += usize::from(t.cached().1 > 0 && truth.2 < t.free_blocks() + t.cached().1);
        }
    }
    // (Which paths ran: too few steps under Miri to say.)
    assert!(
        cfg!(miri) || (fast > 1000 && aligned > 1000 && edge > 50),
        "{fast} {aligned} {edge}"
    );
    if cached && !cfg!(miri) {
        assert!(reused > 300 && flushes > 0, "{reused} {flushes}");
        // Descriptions where cached blocks touched others, so that runs were merged.
        assert!(
            described > 300 && with_runs > 100,
            "{described} {with_runs}"
        );
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

#[test]
fn spans_move_between_indices_whole_or_in_pieces() {
    // A thread's heap takes spans from the pool's index, allocates and frees inside them
    // (with its own cache), and hands them back whole when they are free, or cut into the
    // pieces they hold. Live blocks of a handed-back span carry on in the pool's index, at
    // the same addresses, and are freed there. Both indices keep every invariant, and the
    // bytes add up, after every step.
    use alloc::collections::BTreeMap;
    let region = 1u64 << 26;
    let base = 0x7f00_0000_0000;
    let mut pool = Tlsf::new(base, region, 64, 8 << 20);
    let mut heap = Tlsf::empty(base, region, 32, 1 << 20);
    // Spans in the heap: address -> (size, first block in the heap, block in the pool).
    let mut spans: BTreeMap<u64, (u64, u32, u32)> = BTreeMap::new();
    // Live blocks: address -> (size, block, in the heap?).
    let mut live: BTreeMap<u64, (u64, u32, bool)> = BTreeMap::new();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut whole, mut cut, mut carried) = (0, 0, 0);
    let mut pieces = Vec::new();
    let mut carved = Vec::new();
    for step in 0..crate::test_iterations(6000) {
        let r = next();
        match r % 10 {
            0..=4 => {
                let size = class_size(GRANULE * (1 + (r >> 8) % 2000)).unwrap();
                let align = 1u64 << (8 + (r >> 24) % 5);
                let mut taken = heap.allocate(size, align);
                if taken.is_none() {
                    heap.flush();
                    taken = heap.allocate(size, align);
                }
                if taken.is_none() {
                    // A new span, large enough for the request.
                    let span = (guaranteed_fit(size, align).unwrap()).max(1 << 21);
                    let Some((g, addr)) = pool.allocate(span, GRANULE) else {
                        continue;
                    };
                    let first = heap.add_span(addr, span);
                    spans.insert(addr, (span, first, g));
                    taken = heap.allocate(size, align);
                    assert!(taken.is_some(), "a span of the guaranteed fit serves");
                }
                let (block, addr) = taken.unwrap();
                assert_eq!(addr % align, 0);
                if let Some((&a, &(s, _, _))) = live.range(..addr).next_back() {
                    assert!(a + s <= addr);
                }
                if let Some((&a, _)) = live.range(addr..).next() {
                    assert!(addr + size <= a);
                }
                live.insert(addr, (size, block, true));
            }
            5..=8 if !live.is_empty() => {
                let nth = (r >> 32) as usize % live.len();
                let addr = *live.keys().nth(nth).unwrap();
                let (size, block, in_heap) = live.remove(&addr).unwrap();
                let freed = if in_heap {
                    heap.release(block)
                } else {
                    pool.release(block)
                };
                assert_eq!(freed, size);
            }
            _ if !spans.is_empty() => {
                // Hand one span back: whole if it is free, else in pieces.
                heap.flush();
                let nth = (r >> 32) as usize % spans.len();
                let addr = *spans.keys().nth(nth).unwrap();
                let (size, first, g) = spans.remove(&addr).unwrap();
                if heap.take_span(first) {
                    pool.release(g);
                    whole += 1;
                } else {
                    pieces.clear();
                    heap.export_span(first, &mut pieces);
                    assert_eq!(pieces.iter().map(|p| p.size).sum::<u64>(), size);
                    pool.carve(g, &pieces, &mut carved);
                    for (p, &slot) in pieces.iter().zip(&carved) {
                        if p.free {
                            assert_eq!(slot, NIL);
                            continue;
                        }
                        let entry = live.get_mut(&p.addr).expect("a used piece is live");
                        assert_eq!((entry.0, entry.1, entry.2), (p.size, p.block, true));
                        *entry = (p.size, slot, false);
                        assert_eq!(pool.block_size(slot), p.size);
                        carried += 1;
                    }
                    cut += 1;
                }
            }
            _ => {}
        }
        if step % 7 == 0 {
            pool.check();
            let list: Vec<(u64, u64)> = spans.iter().map(|(&a, &(s, _, _))| (a, s)).collect();
            heap.check_spans(&list);
        }
        let in_heap: u64 = spans.values().map(|&(s, _, _)| s).sum();
        let used_heap: u64 = live.values().filter(|v| v.2).map(|v| v.0).sum();
        let used_pool: u64 = live.values().filter(|v| !v.2).map(|v| v.0).sum();
        assert_eq!(heap.free_bytes(), in_heap - used_heap);
        assert_eq!(pool.free_bytes(), region - in_heap - used_pool);
    }
    assert!(
        cfg!(miri) || (whole > 0 && cut > 50 && carried > 200),
        "{whole} {cut} {carried}"
    );
    // Everything back: the pool's index is one free block again.
    heap.flush();
    for (_, (_, first, g)) in core::mem::take(&mut spans) {
        pieces.clear();
        heap.export_span(first, &mut pieces);
        pool.carve(g, &pieces, &mut carved);
        for (p, &slot) in pieces.iter().zip(&carved) {
            if !p.free {
                live.insert(p.addr, (p.size, slot, false));
            }
        }
    }
    heap.check_spans(&[]);
    for (_, (_, block, in_heap)) in live {
        assert!(!in_heap);
        pool.release(block);
    }
    pool.flush();
    pool.check();
    assert_eq!((pool.free_blocks(), pool.largest_free()), (1, region));
}

#[test]
fn a_lower_cache_limit_merges_the_oldest_and_evicting_stops_at_its_bytes() {
    let mut t = Tlsf::new(0, 1 << 20, 64, 1 << 20);
    let blocks: Vec<u32> = (0..8)
        .map(|_| t.allocate(4096, GRANULE).unwrap().0)
        .collect();
    for &b in &blocks {
        t.release(b);
    }
    assert_eq!(t.cached(), (8 * 4096, 8));
    // The oldest first, and no more than asked (rounded up to whole blocks).
    assert_eq!(t.evict_oldest(4096 + 1), 2 * 4096);
    assert!(!t.blocks[blocks[0] as usize].cached && !t.blocks[blocks[1] as usize].cached);
    assert!(t.blocks[blocks[2] as usize].cached);
    t.check();
    t.set_cache_limit(3 * 4096);
    assert_eq!(t.cached(), (3 * 4096, 3));
    assert!(t.blocks[blocks[7] as usize].cached && !t.blocks[blocks[4] as usize].cached);
    t.check();
    t.flush();
    assert_eq!((t.free_blocks(), t.largest_free()), (1, 1 << 20));
}

#[test]
fn merging_the_oldest_again_and_again_goes_on_where_the_last_merge_stopped() {
    // Against a model: the cached blocks in the order they were cached. Between merges of
    // the oldest, blocks are cached (which overwrites the ring's oldest entries), taken from
    // the cache (which leaves their entries stale) and merged; each merge takes the oldest
    // cached blocks, whole, until it has the bytes asked for, wherever the last one stopped.
    let mut t = Tlsf::new(0, 1 << 24, 16, 1 << 24);
    let mut cached: std::collections::VecDeque<u32> = Default::default();
    let mut live = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut merges, mut skipped) = (0, 0);
    // (4,000 steps; 400 under Miri.)
    let steps = crate::test_iterations(40_000).min(4000);
    for step in 0..steps {
        match next() % 8 {
            // A release: cached, and the ring's oldest entry, if its block is still cached
            // by it, is merged.
            0..=3 if !live.is_empty() => {
                let i = (next() % live.len() as u64) as usize;
                let block = live.swap_remove(i);
                t.release(block);
                cached.push_back(block);
            }
            // A merge of the oldest, up to 1 to 3 blocks' worth.
            6 => {
                let want = (GRANULE << 3) * (1 + next() % 3);
                let stale = t.cache.stale;
                // (Sizes read before: a merged block's slot describes what it merged into.)
                let sizes: Vec<u64> = cached.iter().map(|&b| t.blocks[b as usize].size).collect();
                let merged = t.evict_oldest(want);
                merges += 1;
                skipped += usize::from(stale > 0);
                let mut expected = 0;
                for size in sizes {
                    if expected >= want {
                        break;
                    }
                    let block = cached.pop_front().unwrap();
                    assert!(
                        !t.blocks[block as usize].cached,
                        "step {step}: the oldest merged"
                    );
                    expected += size;
                }
                assert_eq!(merged, expected, "step {step}");
                assert!(cached.iter().all(|&b| t.blocks[b as usize].cached));
            }
            // A request, of a class some cached block may have: taken from the cache.
            _ => live.push(t.allocate(GRANULE << (next() % 4), GRANULE).unwrap().0),
        }
        // (What the step took from the cache, or merged as the ring's oldest: out of it.)
        cached.retain(|&b| t.blocks[b as usize].cached);
        assert_eq!(t.cached().1, cached.len(), "step {step}");
        if step % 997 == 0 {
            t.flush();
            cached.clear();
        }
        t.check();
    }
    // Merges did start past entries an earlier one had cleared.
    assert!(
        merges > steps / 16 && skipped > merges / 4,
        "{merges} merges, {skipped} skipped"
    );
}

#[test]
fn allocate_where_takes_the_lowest_start_offered_and_checks_it() {
    let base = 1u64 << 20;
    let mut t = Tlsf::new(base, 64 * GRANULE, 0, 0);
    // Free blocks: 0..8, 12..40, 44..64 (in granules), with used blocks between.
    let (a, _) = t.allocate(8 * GRANULE, GRANULE).unwrap();
    let (b, _) = t.allocate(4 * GRANULE, GRANULE).unwrap();
    let (c, _) = t.allocate(28 * GRANULE, GRANULE).unwrap();
    let (d, _) = t.allocate(4 * GRANULE, GRANULE).unwrap();
    t.free(a);
    t.free(c);
    t.check();
    let g = |n: u64| base + n * GRANULE;
    // Starts offered in the middle of each free block: the lowest wins, the block is cut in
    // three, and the pieces around it stay free.
    let (x, addr) = t
        .allocate_where(3 * GRANULE, |at, bytes| {
            (bytes >= 8 * GRANULE).then_some(at + 2 * GRANULE)
        })
        .unwrap();
    assert_eq!(addr, g(2));
    assert_eq!(t.block_size(x), 3 * GRANULE);
    t.check();
    assert_eq!(t.free_bytes(), (64 - 8 - 3) * GRANULE);
    // Starts that are not inside the block, not on a granule, or leave too little are
    // ignored, whatever `place` says; blocks too small are not asked about.
    let mut asked = Vec::new();
    let none = t.allocate_where(16 * GRANULE, |at, bytes| {
        asked.push((at, bytes));
        Some(match at {
            a if a == g(12) => a + 13 * GRANULE,
            a if a == g(44) => a + 1,
            a => a - GRANULE,
        })
    });
    assert!(none.is_none());
    asked.sort();
    assert_eq!(asked, [(g(12), 28 * GRANULE), (g(44), 20 * GRANULE)]);
    t.check();
    let (y, addr) = t
        .allocate_where(16 * GRANULE, |at, _| Some(at + 4 * GRANULE))
        .unwrap();
    assert_eq!(addr, g(16));
    t.check();
    for block in [x, y, b, d] {
        t.free(block);
    }
    t.check();
    assert_eq!(t.largest_free(), 64 * GRANULE);
}

/// `request_class` within `largest_request` of a capacity is `reserved_bytes` within that
/// capacity, with the class's index: sizes around every class boundary, for capacities small
/// and large.
#[test]
fn request_class_is_reserved_bytes_within_the_capacity() {
    let capacities = [
        256u64,
        511,
        4096,
        (1 << 20) + 3 * 256,
        (64 << 30) - 1,
        1 << 40,
        u64::MAX,
    ];
    for capacity in capacities {
        let max = largest_request(capacity);
        let mut sizes = alloc::vec![0u64, 1, 255, 256, 257, max, max.saturating_add(1), capacity];
        for log2 in 8..63 {
            for sl in 0..SL_COUNT as u64 {
                let edge = (1u64 << log2) + (1u64 << log2) / SL_COUNT as u64 * sl;
                sizes.extend([edge - 1, edge, edge + 1]);
            }
        }
        for size in sizes {
            let expected = crate::pool::reserved_bytes(size as usize)
                .map(|r| r as u64)
                .filter(|&r| r <= capacity);
            let got = request_class(size, max);
            assert_eq!(
                got.map(|(r, _)| r),
                expected,
                "size {size}, capacity {capacity}"
            );
            if let Some((reserved, class)) = got {
                assert_eq!(class, size_class(reserved), "size {size}");
            }
        }
    }
}

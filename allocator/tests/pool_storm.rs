//! Storms of threads on one pool, across its settings: thread heaps eager or not, exact or
//! leased peaks, classic or growable regions, and heaps for streams of their own. Threads
//! allocate and free random sizes and alignments as three clients (two with quotas), free
//! blocks other threads allocated, hold typed slices, start short-lived threads that exit with
//! blocks live in their heaps, while statistics, client statistics, leak reports and trims run
//! and tracking and an event sink are switched on and off. Every allocation is checked against
//! a model of the live blocks (no overlap) and the quotas; after the threads are joined the
//! pool's counts must be exact, its free memory one block of the whole capacity, and every
//! quota fillable to the byte. `STORM_SEEDS` and `STORM_OPS` make a run longer.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier, Mutex};

use devarena::pool::{PoolSlice, Tracking, reserved_bytes};
use devarena::{Error, Pool, PoolClient};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn size(&mut self, max: usize) -> usize {
        let bits = 1 + self.below(max.ilog2() as u64) as u32;
        1 + (self.next() as usize) % (1usize << bits).min(max)
    }
    fn align(&mut self) -> usize {
        match self.below(6) {
            0 => 0,
            k => 128 << k,
        }
    }
}

/// The bytes an allocation of `size` holds (its size class).
fn class_rounded(size: usize) -> usize {
    reserved_bytes(size).expect("a size within the capacity")
}

/// The largest request whose size class fits in `bytes`.
fn fit_down(bytes: usize) -> usize {
    let mut size = bytes;
    while class_rounded(size) > bytes {
        size -= 256;
    }
    size
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mem {
    Classic,
    Growable,
}

fn storm(seed: u64, eager: bool, exact: bool, mem: Mem, threads: usize, ops: usize) {
    let capacity = 16 << 20;
    let builder = Pool::builder(capacity)
        .eager_thread_heaps(eager)
        .exact_peaks(exact)
        .thread_heaps(if seed % 2 == 0 { 1 << 20 } else { 8 << 20 })
        .log_leaks_on_drop(false);
    let pool = match mem {
        Mem::Classic => builder.build_host().unwrap(),
        Mem::Growable => builder
            .build_mapped(devarena::backend::HostVirtualMemory::new(64 << 10).unwrap())
            .unwrap(),
    };
    let quota_a = 3 << 20;
    let qa = pool.client("qa", quota_a);
    let qb = pool.client("qb", 5 << 20);
    let clients: Vec<PoolClient> = vec![pool.own_client().clone(), qa.clone(), qb.clone()];
    let quotas = [usize::MAX, quota_a, 5 << 20];
    let model: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
    let mailbox: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::new());
    let allocs = std::sync::atomic::AtomicU64::new(0);
    let frees = std::sync::atomic::AtomicU64::new(0);
    let start = Barrier::new(threads + 1);
    let running = std::sync::atomic::AtomicUsize::new(threads);
    let insert = |addr: u64, size: usize| {
        let end = addr + class_rounded(size) as u64;
        let mut m = model.lock().unwrap();
        if let Some((&p, &pe)) = m.range(..=addr).next_back() {
            assert!(pe <= addr, "{addr:#x} overlaps {p:#x}..{pe:#x}");
        }
        if let Some((&n, _)) = m.range(addr..).next() {
            assert!(end <= n, "{addr:#x}..{end:#x} overlaps {n:#x}");
        }
        m.insert(addr, end);
    };
    let remove = |addr: u64| {
        assert!(model.lock().unwrap().remove(&addr).is_some());
    };
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for t in 0..threads {
            let (pool, clients, insert, remove, mailbox, allocs, frees, start, running) = (
                &pool, &clients, &insert, &remove, &mailbox, &allocs, &frees, &start, &running,
            );
            hs.push(s.spawn(move || {
                let mut rng = Rng(seed.wrapping_mul(7919) ^ ((t as u64 + 1) * 0x9E37_79B9));
                start.wait();
                let mut live: Vec<(u64, usize)> = Vec::new();
                let mut slices: Vec<PoolSlice<u8>> = Vec::new();
                let mut op = 0;
                while op < ops {
                    // Now and then a short-lived thread: allocates, hands some blocks to the
                    // mailbox, frees some, exits with the rest live in its heap (handed too).
                    if rng.below(2000) == 0 {
                        let sub_seed = rng.next();
                        let handed: Vec<(u64, usize)> = std::thread::scope(|s2| {
                            s2.spawn(move || {
                                let mut r = Rng(sub_seed | 1);
                                let mut mine = Vec::new();
                                for _ in 0..200 {
                                    let c = r.below(3) as usize;
                                    let size = r.size(128 << 10);
                                    if let Ok(a) = clients[c].allocate(size, r.align()) {
                                        insert(a, size);
                                        allocs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                        mine.push((a, c));
                                    }
                                    if mine.len() > 20 {
                                        let (a, c) =
                                            mine.swap_remove(r.below(mine.len() as u64) as usize);
                                        remove(a);
                                        clients[c].deallocate(a).unwrap();
                                        frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    }
                                }
                                mine
                            })
                            .join()
                            .unwrap()
                        });
                        mailbox.lock().unwrap().extend(handed);
                    }
                    op += 1;
                    let r = rng.below(1000);
                    if r < 470 && live.len() < 200 {
                        let c = rng.below(3) as usize;
                        let size = rng.size(256 << 10);
                        let align = rng.align();
                        match clients[c].allocate(size, align) {
                            Ok(a) => {
                                assert_eq!(a % align.max(256) as u64, 0);
                                insert(a, size);
                                allocs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                live.push((a, c));
                            }
                            Err(Error::PoolExhausted { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    } else if r < 490 && slices.len() < 10 {
                        if let Ok(sl) =
                            clients[rng.below(3) as usize].alloc_slice::<u8>(rng.size(16 << 10))
                        {
                            insert(sl.addr(), sl.len());
                            allocs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            slices.push(sl);
                        }
                    } else if r < 500 && !slices.is_empty() {
                        let sl = slices.swap_remove(rng.below(slices.len() as u64) as usize);
                        remove(sl.addr());
                        drop(sl);
                        frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    } else if r < 530 && !live.is_empty() {
                        let b = live.swap_remove(rng.below(live.len() as u64) as usize);
                        mailbox.lock().unwrap().push(b);
                    } else if r < 560 {
                        let theirs: Vec<_> = std::mem::take(&mut *mailbox.lock().unwrap());
                        for (a, c) in theirs {
                            remove(a);
                            clients[c].deallocate(a).unwrap();
                            frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    } else if r < 562 {
                        let s = pool.stats();
                        assert_eq!(
                            s.free + s.in_use + s.pending + s.quarantined,
                            capacity,
                            "{s:?}"
                        );
                        assert!(s.in_use <= capacity && s.peak <= capacity, "{s:?}");
                        if exact {
                            assert!(s.in_use <= s.peak);
                        }
                        assert_eq!(s.live, s.allocations - s.frees);
                        for (c, cs) in pool.client_stats().iter().enumerate() {
                            assert!(cs.in_use <= quotas[c], "{cs:?}");
                            assert!(cs.in_use <= cs.peak, "{cs:?}");
                        }
                    } else if r < 563 && mem == Mem::Growable {
                        let _ = pool.trim().unwrap();
                    } else if r < 564 {
                        let rep = pool.leak_report();
                        let _ = rep.leaks.len();
                    } else if r < 566 && t == 0 && seed % 3 == 1 {
                        // Toggle tracking and a sink while the others work.
                        match rng.below(4) {
                            0 => pool.set_tracking(Tracking::Tags),
                            1 => pool.set_tracking(Tracking::Off),
                            2 => pool.set_events(Some(Arc::new(
                                |_e: &devarena::pool::PoolEvent<'_>| {},
                            ))),
                            _ => pool.set_events(None),
                        }
                    } else if !live.is_empty() {
                        let (a, c) = live.swap_remove(rng.below(live.len() as u64) as usize);
                        remove(a);
                        clients[c].deallocate(a).unwrap();
                        frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                for (a, c) in live {
                    remove(a);
                    clients[c].deallocate(a).unwrap();
                    frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                for sl in slices {
                    remove(sl.addr());
                    drop(sl);
                    frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }));
        }
        start.wait();
        for h in hs {
            h.join().unwrap();
        }
    });
    for (a, c) in std::mem::take(&mut *mailbox.lock().unwrap()) {
        remove(a);
        clients[c].deallocate(a).unwrap();
        frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    assert!(model.lock().unwrap().is_empty());
    let s = pool.stats();
    let a = allocs.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (s.allocations, s.frees),
        (a, frees.load(std::sync::atomic::Ordering::Relaxed)),
        "{s:?}"
    );
    assert_eq!(
        (s.in_use, s.requested, s.live, s.pending),
        (0, 0, 0, 0),
        "{s:?}"
    );
    assert_eq!(
        (s.free, s.free_blocks, s.largest_free),
        (capacity, 1, capacity),
        "{s:?}"
    );
    assert_eq!(pool.thread_heaps(), 0);
    for cs in pool.client_stats() {
        assert_eq!((cs.in_use, cs.requested, cs.live), (0, 0, 0), "{cs:?}");
        assert_eq!(cs.allocations, cs.frees, "{cs:?}");
    }
    // The whole capacity in one request.
    let big = pool.allocate(capacity, 0).unwrap();
    pool.deallocate(big).unwrap();
    // A full quota.
    let q = qa.allocate(fit_down(quota_a), 0).unwrap();
    assert!(qa.allocate(1, 0).is_err());
    qa.deallocate(q).unwrap();
}

#[test]
fn storm_matrix() {
    let seeds: u64 = std::env::var("STORM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let ops: usize = std::env::var("STORM_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    for seed in 0..seeds {
        for (eager, exact, mem) in [
            (true, true, Mem::Classic),
            (false, true, Mem::Classic),
            (true, false, Mem::Classic),
            (true, true, Mem::Growable),
            (false, false, Mem::Growable),
        ] {
            eprintln!("seed {seed} eager {eager} exact {exact} {mem:?}");
            storm(seed, eager, exact, mem, 5, ops);
        }
    }
}

fn stream_storm(seed: u64, eager: bool, exact: bool, threads: usize, ops: usize) {
    use devarena::pool::{ManualStreams, StreamId};
    let capacity = 16 << 20;
    let streams = Arc::new(ManualStreams::new());
    let home = StreamId(1);
    let pool = Pool::builder(capacity)
        .eager_thread_heaps(eager)
        .exact_peaks(exact)
        .streams(streams.clone(), home)
        .thread_heaps(if seed % 2 == 0 { 1 << 20 } else { 8 << 20 })
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let qa = pool.client("qa", 3 << 20);
    let clients: Vec<PoolClient> = vec![pool.own_client().clone(), qa.clone()];
    let model: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
    let mailbox: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::new());
    let insert = |addr: u64, size: usize| {
        let end = addr + class_rounded(size) as u64;
        let mut m = model.lock().unwrap();
        if let Some((&p, &pe)) = m.range(..=addr).next_back() {
            assert!(pe <= addr, "{addr:#x} overlaps {p:#x}..{pe:#x}");
        }
        if let Some((&n, _)) = m.range(addr..).next() {
            assert!(end <= n, "{addr:#x}..{end:#x} overlaps {n:#x}");
        }
        m.insert(addr, end);
    };
    let remove = |addr: u64| {
        assert!(model.lock().unwrap().remove(&addr).is_some());
    };
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for t in 0..threads {
            let (pool, clients, insert, remove, mailbox, streams) =
                (&pool, &clients, &insert, &remove, &mailbox, &streams);
            hs.push(s.spawn(move || {
                let mut rng = Rng(seed.wrapping_mul(7919) ^ ((t as u64 + 1) * 0x9E37_79B9));
                let mine = [home, StreamId(10 + t as u64), StreamId(99)];
                let mut live: Vec<(u64, usize)> = Vec::new();
                for _ in 0..ops {
                    if rng.below(3000) == 0 {
                        let sub_seed = rng.next();
                        let handed: Vec<(u64, usize)> = std::thread::scope(|s2| {
                            s2.spawn(move || {
                                let mut r = Rng(sub_seed | 1);
                                let sub = [home, StreamId(50 + t as u64), StreamId(99)];
                                let mut out = Vec::new();
                                for _ in 0..100 {
                                    let c = r.below(2) as usize;
                                    let st = sub[r.below(3) as usize];
                                    if let Ok(a) =
                                        clients[c].allocate_on(r.size(64 << 10), r.align(), st)
                                    {
                                        insert(a, 0); // placeholder; fixed below
                                        remove(a);
                                        out.push((a, c));
                                    }
                                    if out.len() > 10 {
                                        let (a, c) = out.swap_remove(0);
                                        clients[c]
                                            .deallocate_on(a, sub[r.below(3) as usize])
                                            .unwrap();
                                    }
                                }
                                out
                            })
                            .join()
                            .unwrap()
                        });
                        for &(a, _) in &handed {
                            insert(a, 256);
                        }
                        mailbox.lock().unwrap().extend(handed);
                    }
                    let r = rng.below(1000);
                    if r < 480 && live.len() < 150 {
                        let c = rng.below(2) as usize;
                        let size = rng.size(256 << 10);
                        let st = mine[rng.below(3) as usize];
                        match clients[c].allocate_on(size, rng.align(), st) {
                            Ok(a) => {
                                insert(a, size);
                                live.push((a, c));
                            }
                            Err(Error::PoolExhausted { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    } else if r < 500 && !live.is_empty() {
                        let b = live.swap_remove(rng.below(live.len() as u64) as usize);
                        mailbox.lock().unwrap().push(b);
                    } else if r < 530 {
                        let theirs: Vec<_> = std::mem::take(&mut *mailbox.lock().unwrap());
                        for (a, c) in theirs {
                            remove(a);
                            clients[c]
                                .deallocate_on(a, mine[rng.below(3) as usize])
                                .unwrap();
                        }
                    } else if r < 540 {
                        streams.complete(mine[rng.below(3) as usize]);
                        if rng.below(2) == 0 {
                            let _ = pool.reclaim().unwrap();
                        }
                    } else if r < 542 {
                        let s = pool.stats();
                        assert_eq!(
                            s.free + s.in_use + s.pending + s.quarantined,
                            capacity,
                            "{s:?}"
                        );
                        assert_eq!(s.live, s.allocations - s.frees);
                        assert!(s.peak <= capacity);
                    } else if !live.is_empty() {
                        let (a, c) = live.swap_remove(rng.below(live.len() as u64) as usize);
                        remove(a);
                        clients[c]
                            .deallocate_on(a, mine[rng.below(3) as usize])
                            .unwrap();
                    }
                }
                for (a, c) in live {
                    remove(a);
                    clients[c].deallocate(a).unwrap();
                }
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
    });
    for (a, c) in std::mem::take(&mut *mailbox.lock().unwrap()) {
        remove(a);
        clients[c].deallocate(a).unwrap();
    }
    streams.complete_all();
    pool.reclaim().unwrap();
    let s = pool.stats();
    eprintln!(
        "allocs {} failures {} reused {}",
        s.allocations, s.failures, s.reused
    );
    assert_eq!(
        (s.in_use, s.requested, s.live, s.pending, s.quarantined),
        (0, 0, 0, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.allocations, s.frees);
    assert_eq!(pool.thread_heaps(), 0);
    assert_eq!(
        (s.free, s.free_blocks, s.largest_free),
        (capacity, 1, capacity),
        "{s:?}"
    );
    let big = pool.allocate(capacity, 0).unwrap();
    pool.deallocate(big).unwrap();
}

#[test]
fn stream_storm_matrix() {
    let seeds: u64 = std::env::var("STORM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let ops: usize = std::env::var("STORM_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    for seed in 0..seeds {
        for (eager, exact) in [(true, true), (false, true), (true, false)] {
            eprintln!("seed {seed} eager {eager} exact {exact}");
            stream_storm(seed, eager, exact, 4, ops);
        }
    }
}

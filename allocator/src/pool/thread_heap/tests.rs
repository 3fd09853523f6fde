use super::*;
use crate::pool::{AllocRequest, Pool};

impl Shared {
    /// Every invariant of the pool's index, the heaps' indices and the spans between them,
    /// with everything locked.
    fn check_heaps(&self) {
        let mut state = self.lock_wait("a test");
        self.with_heaps(&mut state, |state, heaps| {
            state.tlsf.check();
            let mut spans = 0;
            let mut leased = 0;
            for h in heaps.iter() {
                let h = &*h.state;
                h.check();
                leased += h.lease.cap;
                assert!(h.lease.used <= h.lease.cap);
                for span in &h.spans {
                    // One used block of the pool's index, listed under its address.
                    assert_eq!(state.tlsf.block_size(span.block), span.size);
                    assert_eq!(state.spans.get(&span.addr).map(|s| s.0), Some(span.size));
                    assert!(state.live.get(span.addr).is_none());
                    spans += 1;
                }
                let used: usize = h
                    .live
                    .iter()
                    .map(|(_, b)| h.tlsf.block_size(b) as usize)
                    .sum();
                assert_eq!(used, h.lease.used);
                for (c, share) in h.clients.iter().enumerate() {
                    assert!(share.lease.used <= share.lease.cap, "client {c}");
                }
            }
            assert_eq!(spans, state.spans.len());
            assert_eq!(leased + self.spare.bytes(), state.counts.leased);
            assert!(state.counts.leased <= state.counts.in_use);
            assert!(state.counts.in_use <= state.counts.peak);
            for (c, client) in state.clients.iter().enumerate() {
                let leased: usize = heaps
                    .iter()
                    .filter_map(|h| h.state.clients.get(c))
                    .map(|s| s.lease.cap)
                    .sum();
                let leased = leased + client.spare.bytes();
                assert_eq!(leased, client.counts.leased, "client {c}");
                let listed = heaps
                    .iter()
                    .filter(|h| h.state.clients.get(c).is_some_and(|s| s.spare.is_some()))
                    .count();
                assert_eq!(listed, client.heaps, "client {c}");
                let counts = &client.counts;
                assert!(counts.leased <= counts.in_use);
                assert!(counts.in_use <= counts.peak.min(client.quota));
            }
        });
    }
}

#[test]
fn heaps_and_the_pool_agree_while_threads_run() {
    let pool = Pool::builder(16 << 20)
        .eager_thread_heaps(true)
        .thread_heaps(1 << 20);
    agree_while_threads_run(pool, 3, false);
}

#[test]
fn heaps_and_the_pool_agree_while_threads_run_with_peaks_that_count_leases() {
    let pool = Pool::builder(16 << 20)
        .eager_thread_heaps(true)
        .thread_heaps(1 << 20)
        .exact_peaks(false);
    agree_while_threads_run(pool, 3, false);
}

#[test]
fn heaps_that_step_aside_near_the_capacity_agree_with_the_pool_while_threads_run() {
    // A pool of 4 MiB that the threads' blocks (up to 50 each, up to 512 KiB) would overfill:
    // the heaps' spans often find no room in the pool's index, and the heaps (two) step aside.
    agree_while_threads_run(Pool::builder(4 << 20), 2, true);
}

#[test]
fn more_heaps_near_the_capacity_step_aside_too() {
    // The same with four threads (more than `FEW_HEAPS`): their blocks take more than half
    // the capacity (the peak passes it), and they step aside too.
    agree_while_threads_run(Pool::builder(4 << 20), 4, true);
}

#[test]
fn heaps_that_step_aside_agree_with_the_pool_with_peaks_that_count_leases() {
    agree_while_threads_run(Pool::builder(4 << 20).exact_peaks(false), 2, true);
}

#[test]
fn heaps_that_step_aside_on_a_growable_region_agree_with_the_pool() {
    let vm = crate::backend::HostVirtualMemory::new(64 << 10).unwrap();
    let pool = Pool::builder(4 << 20)
        .log_leaks_on_drop(false)
        .build_mapped(vm)
        .unwrap();
    agree_with(pool, 2, true);
}

fn agree_while_threads_run(builder: crate::pool::PoolBuilder, threads: u64, step_aside: bool) {
    let pool = builder.log_leaks_on_drop(false).build_host().unwrap();
    agree_with(pool, threads, step_aside);
}

/// `step_aside`: whether the heaps must have stepped aside at least once (else never).
fn agree_with(pool: Pool, threads: u64, step_aside: bool) {
    // Threads with heaps allocate and free (sizes that make spans come and go, a
    // client under a quota, frees of each other's blocks); the main thread checks every
    // invariant between the indices, the spans and the leases as they run, and gives the
    // heaps back now and then.
    let quota = pool.client("quota", 3 << 20);
    let shared = pool.shared().clone();
    let mailbox: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
    let running = core::sync::atomic::AtomicUsize::new(threads as usize);
    let started = std::sync::Barrier::new(threads as usize);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pool, quota, mailbox, running) = (&pool, &quota, &mailbox, &running);
            let started = &started;
            s.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                let mut live = Vec::new();
                // A heap for the thread now, as for one that found the pool's lock taken;
                // every thread has one before any goes on.
                live.push((allocate_contended(pool.shared(), 1024), false));
                started.wait();
                for _ in 0..crate::test_iterations(20_000) {
                    let size = next_size(&mut x);
                    if live.len() < 50 && x % 3 != 0 {
                        let client = if x % 5 == 0 { quota } else { pool.own_client() };
                        if let Ok(addr) = client.allocate(size, 256 << ((x >> 60) % 5)) {
                            live.push((addr, x % 5 == 0));
                        }
                    } else if x % 7 == 0 {
                        let theirs: Vec<u64> = core::mem::take(&mut *mailbox.lock().unwrap());
                        for addr in theirs {
                            pool.deallocate(addr).unwrap();
                        }
                    } else if let Some((addr, _)) = live.pop() {
                        if x % 11 == 0 {
                            mailbox.lock().unwrap().push(addr);
                        } else {
                            pool.deallocate(addr).unwrap();
                        }
                    }
                }
                for (addr, _) in live {
                    pool.deallocate(addr).unwrap();
                }
                running.fetch_sub(1, Ordering::SeqCst);
            });
        }
        let mut rounds = 0;
        while running.load(Ordering::SeqCst) > 0 {
            shared.check_heaps();
            rounds += 1;
            if rounds % 10 == 0 {
                let _ = pool.stats();
            }
            std::thread::yield_now();
        }
    });
    for addr in core::mem::take(&mut *mailbox.lock().unwrap()) {
        pool.deallocate(addr).unwrap();
    }
    shared.check_heaps();
    let s = pool.stats();
    assert_eq!((s.in_use, s.live, s.free_blocks), (0, 0, 1));
    assert_eq!(s.allocations, s.frees);
    let bars = shared.lock_wait("a test").heap_bar.len;
    if step_aside {
        assert!(bars > 0, "no heap stepped aside");
    } else {
        assert_eq!(bars, 0, "a heap stepped aside");
    }
}

/// The next step of a thread's xorshift sequence `x`, and a size for it: 1 byte to 512 KiB,
/// small ones far more often.
fn next_size(x: &mut u64) -> usize {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    1 + (*x % (1 << (8 + *x % 12))) as usize
}

/// The high-water mark of this thread's home-stream heap of `pool`.
fn high_water(pool: &Pool) -> u64 {
    let shared = pool.shared();
    let heap = shared.thread_heap(shared.home).expect("a heap");
    let h = heap.state.lock_wait();
    h.high_water
}

#[test]
fn a_refused_request_does_not_raise_a_heaps_high_water() {
    // On a growable region a heap's reuse cache follows the most the heap has had in use: a
    // request refused (over its client's quota, or over the capacity) was never in use, and
    // must not leave the heap caching as if it had been.
    let vm = crate::backend::HostVirtualMemory::new(64 << 10).unwrap();
    let pool = Pool::builder(64 << 20)
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_mapped(vm)
        .unwrap();
    let quota = pool.client("quota", 1 << 20);
    let a = quota.allocate(4096, 0).unwrap();
    quota.deallocate(a).unwrap();
    let before = high_water(&pool);
    assert!((4096..64 << 10).contains(&before), "{before}");
    assert!(quota.allocate(8 << 20, 0).is_err());
    assert_eq!(high_water(&pool), before, "after a request over the quota");
    let held = pool.allocate(40 << 20, 0).unwrap();
    let after_held = high_water(&pool);
    assert!(pool.allocate(32 << 20, 0).is_err());
    assert_eq!(
        high_water(&pool),
        after_held,
        "after a request over the capacity"
    );
    pool.deallocate(held).unwrap();
    // What was in use does count.
    let b = pool.allocate(1 << 20, 0).unwrap();
    assert!(high_water(&pool) >= after_held.max(1 << 20));
    pool.deallocate(b).unwrap();
}

/// An event whose destructor allocates on its pool and keeps what it got.
#[derive(Debug)]
struct AllocatingEvent {
    pool: alloc::sync::Arc<Pool>,
    got: alloc::sync::Arc<std::sync::Mutex<Option<Result<u64, crate::error::Error>>>>,
}

impl crate::pool::stream::StreamEvent for AllocatingEvent {
    fn is_complete(&self) -> Result<bool, crate::error::Error> {
        Ok(true)
    }
}

impl Drop for AllocatingEvent {
    fn drop(&mut self) {
        *self.got.lock().unwrap() = Some(self.pool.allocate(256, 0));
    }
}

#[test]
fn an_event_dropped_under_the_lock_does_not_reach_the_threads_heap() {
    // A held event's destructor runs as a callback of the pool's lock: a call on the pool from
    // it fails, also where this thread's heap was the one looked up last (its fast path would
    // serve the call while the pool's lock is held further up the stack).
    let pool = alloc::sync::Arc::new(
        Pool::builder(1 << 20)
            .eager_thread_heaps(true)
            .log_leaks_on_drop(false)
            .build_host()
            .unwrap(),
    );
    let a = pool.allocate(256, 0).unwrap();
    pool.deallocate(a).unwrap();
    let got = alloc::sync::Arc::default();
    let shared = pool.shared().clone();
    let event = crate::pool::stream::HeldEvent::boxed(
        alloc::boxed::Box::new(AllocatingEvent {
            pool: pool.clone(),
            got: alloc::sync::Arc::clone(&got),
        }),
        shared.state.id(),
    );
    {
        let _state = shared.lock_wait("a test");
        drop(event);
    }
    let got = got.lock().unwrap().take();
    assert!(matches!(got, Some(Err(_))), "{got:?}");
    assert_eq!(pool.stats().live, 0);
}

#[test]
fn a_heap_at_its_bound_merges_its_cache_without_the_pools_lock() {
    // One heap, bound 4 MiB, spans of 2 MiB: 64 blocks of 64 KiB fill two spans; the first
    // span's blocks are freed into the reuse cache, a quarter of the second's merge at once
    // (the cache is full). A request of 2 MiB then finds no block until the cache is merged:
    // the heap is at its bound (3 MiB free), so it merges rather than take a span, and it
    // does so while another thread holds the pool's lock.
    let pool = Pool::builder(64 << 20)
        .eager_thread_heaps(true)
        .thread_heaps(4 << 20)
        .reuse(1024, 2 << 20)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let shared = pool.shared().clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let pool = &pool;
        s.spawn(move || {
            let blocks: Vec<u64> = (0..64)
                .map(|_| pool.allocate(64 << 10, 0).unwrap())
                .collect();
            for &addr in &blocks[..48] {
                pool.deallocate(addr).unwrap();
            }
            {
                // The setup the test needs: at the bound, a full cache, room in the leases
                // (from the spare headroom: exact peaks, the default).
                let shared = pool.shared();
                let heap = shared.thread_heap(shared.home).expect("a heap");
                let h = heap.state.lock_wait();
                assert_eq!(h.spans.len(), 2);
                assert_eq!(h.tlsf.cached(), (2 << 20, 32));
                assert_eq!(h.tlsf.free_bytes(), 3 << 20);
                assert_eq!(shared.heap_bound(), 4 << 20);
            }
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            let got = pool.allocate(2 << 20, 0);
            done_tx.send(got).unwrap();
            for &addr in &blocks[48..] {
                pool.deallocate(addr).unwrap();
            }
        });
        ready_rx.recv().unwrap();
        let got = {
            let _state = shared.lock_wait("a test");
            go_tx.send(()).unwrap();
            // A path that needed the pool's lock would wait until this scope ends.
            done_rx.recv_timeout(std::time::Duration::from_secs(60))
        };
        let got = got.expect("the allocation waited for the pool's lock");
        let addr = got.unwrap();
        pool.deallocate(addr).unwrap();
    });
    shared.check_heaps();
}

/// A host pool of 64 MiB on which every thread gets a heap from its first allocation.
fn eager_heaps_pool() -> Pool {
    Pool::builder(64 << 20)
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap()
}

/// A thread that allocates on its heap and waits, alive (its heap with it), until told to
/// finish: the blocks it allocated (address, client 0 or 1), for other threads to free.
fn allocate_and_wait<'scope>(
    clients: &[crate::pool::PoolClient],
    blocks: usize,
    s: &'scope std::thread::Scope<'scope, '_>,
) -> (Vec<(u64, usize)>, std::sync::mpsc::Sender<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
    let clients = clients.to_vec();
    s.spawn(move || {
        let got: Vec<(u64, usize)> = (0..blocks)
            .map(|i| {
                let c = i % clients.len();
                (clients[c].allocate(1024 + 256 * i, 0).unwrap(), c)
            })
            .collect();
        tx.send(got).unwrap();
        // Alive until told: an exiting thread gives its heap back.
        let _ = finish_rx.recv();
    });
    (rx.recv().unwrap(), finish_tx)
}

#[test]
fn another_threads_frees_of_a_heaps_blocks_take_no_pool_lock() {
    let pool = eager_heaps_pool();
    let shared = pool.shared().clone();
    let clients = [pool.client("a", usize::MAX), pool.client("b", usize::MAX)];
    let before = pool.stats();
    std::thread::scope(|s| {
        let (blocks, finish) = allocate_and_wait(&clients, 64, s);
        assert_eq!(pool.thread_heaps(), 1);
        // The heap took a span: the span directory is out of date (and empty) until a free
        // of a heap's block reaches the pool's lock, which rebuilds it.
        let (addr, c) = blocks[0];
        assert!(!shared.deallocate_remote(None, addr, shared.home, false));
        clients[c].deallocate(addr).unwrap();
        assert!(!shared.span_dir.stale.load(Ordering::Relaxed));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let freed = {
            let _state = shared.lock_wait("a test");
            let clients = &clients;
            let shared = shared.clone();
            s.spawn(move || {
                // Half through the clients, half through the pool.
                for &(addr, c) in &blocks[1..32] {
                    clients[c].deallocate(addr).unwrap();
                }
                for &(addr, _) in &blocks[32..] {
                    shared
                        .deallocate(None, crate::pool::FreeRequest::new(addr), false)
                        .unwrap();
                }
                done_tx.send(blocks).unwrap();
            });
            // A free that needed the pool's lock would wait until this scope ends.
            done_rx.recv_timeout(std::time::Duration::from_secs(60))
        };
        let blocks = freed.expect("a free of another thread's heap waited for the pool's lock");
        // A second free of the same address finds the heap without it, and is refused by the
        // pool's lock, which names the address.
        let err = clients[0].deallocate(blocks[0].0).unwrap_err();
        let err = alloc::string::ToString::to_string(&err);
        assert!(err.contains(&alloc::format!("{:#x}", blocks[0].0)), "{err}");
        // Exact counts: every byte and every free, per client as well.
        let stats = pool.stats();
        assert_eq!(stats.live, 0);
        assert_eq!(stats.in_use, before.in_use);
        assert_eq!(stats.frees, before.frees + 64);
        for client in &clients {
            let c = client.stats();
            assert_eq!((c.live, c.in_use, c.frees), (0, 0, 32), "{}", c.name);
        }
        // A second free of the same address is refused, counting nothing.
        assert!(clients[0].deallocate(blocks[1].0).is_err());
        assert_eq!(pool.stats().frees, before.frees + 64);
        finish.send(()).unwrap();
    });
    pool.shared().check_heaps();
}

#[test]
fn another_threads_free_through_the_wrong_client_is_refused_and_changes_nothing() {
    let pool = eager_heaps_pool();
    let clients = [
        pool.client("owner", usize::MAX),
        pool.client("other", usize::MAX),
    ];
    std::thread::scope(|s| {
        let (blocks, finish) = allocate_and_wait(&clients[..1], 4, s);
        let addr = blocks[0].0;
        let err = clients[1].deallocate(addr).unwrap_err();
        let err = alloc::string::ToString::to_string(&err);
        assert!(err.contains("owner") && err.contains("other"), "{err}");
        assert_eq!(clients[0].stats().live, 4);
        // Its own client frees it, from this thread too.
        for &(addr, _) in &blocks {
            clients[0].deallocate(addr).unwrap();
        }
        assert_eq!(clients[0].stats().live, 0);
        finish.send(()).unwrap();
    });
    pool.shared().check_heaps();
}

#[test]
fn a_span_directory_that_names_the_wrong_heap_frees_nothing_there() {
    // The directory is a hint: here it says that a block of one thread's heap lies in another
    // thread's heap. That heap, locked, holds no allocation there, so the free changes nothing
    // and goes on to the pool's lock.
    let pool = eager_heaps_pool();
    let shared = pool.shared().clone();
    let client = [pool.client("c", usize::MAX)];
    let before = pool.stats();
    std::thread::scope(|s| {
        let (a, finish_a) = allocate_and_wait(&client, 2, s);
        let (b, finish_b) = allocate_and_wait(&client, 2, s);
        let (heap_a, heap_b) = {
            let state = shared.lock_wait("a test");
            let a = Shared::span_owner(&state, a[0].0).expect("a's heap");
            let b = Shared::span_owner(&state, b[0].0).expect("b's heap");
            (a, b)
        };
        assert!(!Arc::ptr_eq(&heap_a, &heap_b));
        let addr = b[0].0;
        shared
            .span_dir
            .publish(alloc::vec![(addr, addr + 256, heap_a.clone())].into());
        assert!(!shared.deallocate_remote(None, addr, shared.home, false));
        assert_eq!(heap_a.state.lock_wait().live.len(), 2, "a's heap unchanged");
        assert_eq!(heap_b.state.lock_wait().live.len(), 2, "b's heap unchanged");
        // Through the pool's lock, which finds the block in b's heap.
        pool.deallocate(addr).unwrap();
        assert_eq!(heap_b.state.lock_wait().live.len(), 1);
        // With the directory up to date, without it.
        shared.publish_spans(&shared.lock_wait("a test"));
        assert!(shared.deallocate_remote(None, b[1].0, shared.home, false));
        assert!(shared.deallocate_remote(None, a[0].0, shared.home, false));
        assert_eq!(heap_b.state.lock_wait().live.len(), 0);
        pool.deallocate(a[1].0).unwrap();
        assert_eq!(pool.stats().live, before.live);
        assert_eq!(pool.stats().frees, before.frees + 4);
        finish_a.send(()).unwrap();
        finish_b.send(()).unwrap();
    });
    shared.check_heaps();
}

#[test]
fn a_free_of_its_own_heaps_block_through_the_pools_lock_clears_the_hint_and_rebuilds_nothing() {
    // The span directory serves frees of other threads' blocks: a thread whose free of its
    // own heap's block reaches the pool's lock (it asked the directory first, which was out
    // of date) goes back to its own heap first, and the directory stays as it is.
    let pool = eager_heaps_pool();
    let shared = pool.shared().clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let (pool, shared) = (&pool, &shared);
        s.spawn(move || {
            let mine: Vec<u64> = (0..3).map(|_| pool.allocate(4096, 0).unwrap()).collect();
            let heap = shared.thread_heap(shared.home).expect("a heap");
            // The heap took a span; the thread's last free was (say) of another heap's block.
            assert!(shared.span_dir.stale.load(Ordering::Relaxed));
            heap.frees_elsewhere.set(true);
            pool.deallocate(mine[0]).unwrap();
            assert!(!heap.frees_elsewhere.get());
            assert!(shared.span_dir.stale.load(Ordering::Relaxed));
            ready_tx.send(()).unwrap();
            // Its own heap again, without the pool's lock (held by the test meanwhile).
            go_rx.recv().unwrap();
            done_tx.send(pool.deallocate(mine[1])).unwrap();
            pool.deallocate(mine[2]).unwrap();
        });
        ready_rx.recv().unwrap();
        let done = {
            let _state = shared.lock_wait("a test");
            go_tx.send(()).unwrap();
            done_rx.recv_timeout(std::time::Duration::from_secs(60))
        };
        done.expect("the free waited for the pool's lock").unwrap();
    });
    assert_eq!(pool.stats().live, 0);
    shared.check_heaps();
}

#[test]
fn a_thread_that_frees_another_heaps_blocks_asks_the_directory_first_until_it_frees_its_own() {
    let pool = eager_heaps_pool();
    let shared = pool.shared().clone();
    let client = [pool.client("c", usize::MAX)];
    let before = pool.stats();
    std::thread::scope(|s| {
        let (theirs, finish) = allocate_and_wait(&client, 4, s);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let (pool, shared_b, given) = (&pool, shared.clone(), theirs.clone());
        s.spawn(move || {
            let theirs = given;
            let mine: Vec<u64> = (0..4).map(|_| pool.allocate(4096, 0).unwrap()).collect();
            let heap = shared_b.thread_heap(shared_b.home).expect("a heap");
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            let mut hints = Vec::new();
            // Another heap's block: the hint is set.
            pool.deallocate(theirs[0].0).unwrap();
            hints.push(heap.frees_elsewhere.get());
            pool.deallocate(theirs[1].0).unwrap();
            hints.push(heap.frees_elsewhere.get());
            // Its own block, found through the directory: the hint is cleared.
            pool.deallocate(mine[0]).unwrap();
            hints.push(heap.frees_elsewhere.get());
            // And its own heap first again.
            pool.deallocate(mine[1]).unwrap();
            hints.push(heap.frees_elsewhere.get());
            done_tx.send((hints, mine)).unwrap();
        });
        ready_rx.recv().unwrap();
        // Both heaps took their spans: the directory is rebuilt, as the first free of a heap's
        // block through the pool's lock would.
        shared.refresh_span_directory(&shared.lock_wait("a test"));
        let done = {
            let _state = shared.lock_wait("a test");
            go_tx.send(()).unwrap();
            // Every free above is made without the pool's lock.
            done_rx.recv_timeout(std::time::Duration::from_secs(60))
        };
        let (hints, mine) = done.expect("a free waited for the pool's lock");
        assert_eq!(hints, [true, true, false, false]);
        for addr in [theirs[2].0, theirs[3].0, mine[2], mine[3]] {
            pool.deallocate(addr).unwrap();
        }
        let stats = pool.stats();
        assert_eq!((stats.live, stats.frees), (before.live, before.frees + 8));
        finish.send(()).unwrap();
    });
    shared.check_heaps();
}

#[test]
fn slices_and_blocks_freed_by_another_thread_with_peaks_exact_or_leased() {
    for exact_peaks in [true, false] {
        let pool = Pool::builder(64 << 20)
            .eager_thread_heaps(true)
            .exact_peaks(exact_peaks)
            .log_leaks_on_drop(false)
            .build_host()
            .unwrap();
        let shared = pool.shared().clone();
        let before = pool.stats();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (made_tx, made_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let pool = &pool;
            s.spawn(move || {
                let blocks: Vec<u64> = (0..16)
                    .map(|i| pool.allocate(512 << (i % 8), 0).unwrap())
                    .collect();
                let slices: Vec<_> = (0..16)
                    .map(|i| pool.alloc_slice::<u32>(100 + 1000 * i).unwrap())
                    .collect();
                // A slice's memory is the slice's to free: refused through its address, from
                // another thread as from this one (the pool's lock refuses it).
                let addr = slices[0].addr();
                let refused = std::thread::scope(|t| t.spawn(|| pool.deallocate(addr)).join());
                assert!(refused.unwrap().is_err());
                made_tx.send((blocks, slices)).unwrap();
                // Alive (its heap with it) until the other thread is done.
                let _ = go_rx.recv();
            });
            let (blocks, slices) = made_rx.recv().unwrap();
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let done = {
                let _state = shared.lock_wait("a test");
                s.spawn(move || {
                    drop(slices);
                    for addr in blocks {
                        pool.deallocate(addr).unwrap();
                    }
                    done_tx.send(()).unwrap();
                });
                done_rx.recv_timeout(std::time::Duration::from_secs(60))
            };
            // (Sent first, so that the allocating thread ends and the scope with it.)
            go_tx.send(()).unwrap();
            assert!(
                done.is_ok(),
                "a free waited for the pool's lock (exact peaks: {exact_peaks})"
            );
            let stats = pool.stats();
            assert_eq!(
                (stats.live, stats.in_use, stats.frees),
                (0, before.in_use, before.frees + 32),
                "exact {exact_peaks}"
            );
        });
        shared.check_heaps();
    }
}

#[test]
fn a_directory_naming_a_heap_given_back_frees_nothing_there() {
    let pool = eager_heaps_pool();
    let shared = pool.shared().clone();
    let (blocks, heap) = std::thread::scope(|s| {
        s.spawn(|| {
            let blocks: Vec<u64> = (0..4).map(|_| pool.allocate(4096, 0).unwrap()).collect();
            let heap = shared.thread_heap(shared.home).expect("a heap");
            (blocks, heap)
        })
        .join()
        .unwrap()
    });
    // The thread exited: its heap was given back, its blocks are in the pool's index, and the
    // directory no longer names its spans. Named again by hand, the heap frees nothing.
    assert!(heap.state.lock_wait().retired);
    shared
        .span_dir
        .publish(alloc::vec![(blocks[0], blocks[0] + 4096, heap.clone())].into());
    assert!(!shared.deallocate_remote(None, blocks[0], shared.home, false));
    for &addr in &blocks {
        pool.deallocate(addr).unwrap();
    }
    assert_eq!(pool.stats().live, 0);
    assert!(pool.deallocate(blocks[0]).is_err());
    shared.check_heaps();
}

#[test]
fn with_pause_set_a_heaps_own_paths_let_go_of_its_lock_and_the_pools_lock_serves() {
    // `PAUSE` is a hint to a heap's own paths, set while another thread takes every heap's
    // lock: they let go of the heap's lock, and the call completes under the pool's lock,
    // counted as any other. Nothing fails, nothing is lost.
    use crate::pool::engine::PAUSE;
    let pool = eager_heaps_pool();
    let shared = pool.shared().clone();
    let client = pool.client("c", usize::MAX);
    let a = client.allocate(4096, 0).unwrap();
    let heap = shared.thread_heap(shared.home).expect("this thread's heap");
    let before = pool.stats();
    shared.flags.fetch_or(PAUSE, Ordering::Relaxed);
    let ask = Ask {
        client: client.id(),
        size: 4096,
        align: 256,
        stream: shared.home,
    };
    assert_eq!(shared.heap_allocate_fast(&heap, &ask, false), None);
    {
        let mut guard = heap.state.try_guard().expect("the heap's lock was let go");
        assert_eq!(
            shared.heap_free_locked(&mut guard, Some(client.id()), a, false),
            None
        );
        assert_eq!(guard.live.len(), 1, "the free was not made");
    }
    // Through the pool's lock: allocations (one in the heap's cache's class, one larger) and
    // frees, the heap's own block among them.
    let b = client.allocate(4096, 0).unwrap();
    let c = client.allocate(100_000, 0).unwrap();
    let large = client.allocate(8 << 20, 0).unwrap();
    client.deallocate(a).unwrap();
    client.deallocate(b).unwrap();
    // The large block's lease is headroom the heap no longer uses: given back as the heap's
    // own free would, though the free took the pool's lock.
    client.deallocate(large).unwrap();
    {
        let h = heap.state.lock_wait();
        assert!(!h.lease.hoards(), "{:?}", h.lease);
        assert!(!h.clients[client.id() as usize].lease.hoards());
    }
    let paused = pool.stats();
    assert_eq!(
        (paused.allocations, paused.frees, paused.live),
        (before.allocations + 3, before.frees + 3, before.live)
    );
    assert_eq!(pool.thread_heaps(), 1);
    shared.flags.fetch_and(!PAUSE, Ordering::Relaxed);
    client.deallocate(c).unwrap();
    // The heap's own paths again: a block freed there is taken whole from its cache.
    let d = client.allocate(8192, 0).unwrap();
    client.deallocate(d).unwrap();
    let reused = pool.stats().reused;
    assert_eq!(client.allocate(8192, 0).unwrap(), d);
    assert_eq!(pool.stats().reused, reused + 1);
    client.deallocate(d).unwrap();
    shared.check_heaps();
    let s = pool.stats();
    assert_eq!((s.live, s.in_use), (0, 0));
}

/// A request of `size` bytes on the calling thread, made as by a thread that found the pool's
/// lock taken (where a thread without a heap gets one).
fn allocate_contended(shared: &Shared, size: usize) -> u64 {
    let ask = Ask {
        client: 0,
        size,
        align: 256,
        stream: shared.home,
    };
    shared
        .allocate_contended(&AllocRequest::new(size, 256), &ask, false)
        .unwrap()
}

/// A host pool of 8 MiB with the default settings: heaps only for threads that find the lock
/// taken, spans of 512 KiB.
fn pool_of_8_mib() -> Pool {
    Pool::builder(8 << 20)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap()
}

#[test]
fn near_the_capacity_home_heaps_step_aside_and_come_back_after_the_bar() {
    // A pool of 8 MiB whose heap takes spans of 512 KiB (a sixteenth). The thread's heap
    // fills 15 spans with 64 KiB blocks, then asks for 768 KiB, for which it needs a span
    // the pool's index (one span's room left) cannot give: the heap steps aside (given back
    // for good, its blocks kept live at their addresses) and the index serves the request.
    let pool = pool_of_8_mib();
    let shared = pool.shared().clone();
    let mut blocks = alloc::vec![allocate_contended(&shared, 64 << 10)];
    assert_eq!(
        pool.thread_heaps(),
        1,
        "a request that found the lock taken made a heap"
    );
    blocks.extend((1..120).map(|_| pool.allocate(64 << 10, 0).unwrap()));
    {
        let heap = shared.thread_heap(shared.home).expect("the thread's heap");
        let h = heap.state.lock_wait();
        assert_eq!((h.spans.len(), h.live.len()), (15, 120));
    }
    // The last span's blocks, freed: into the heap's reuse cache, 512 KiB free beside the
    // index's last 512 KiB.
    for addr in blocks.drain(112..) {
        pool.deallocate(addr).unwrap();
    }
    shared.check_heaps();
    let big = pool.allocate(768 << 10, 0).unwrap();
    assert_eq!(pool.thread_heaps(), 0, "the heap stepped aside");
    {
        let state = shared.lock_wait("a test");
        assert!(state.heap_bar.on(state.next_serial));
        assert_eq!(state.heap_bar.len, BAR_MIN);
        // Every block is the pool's own now, at its address.
        assert_eq!(state.live.len(), 113);
        assert!(state.spans.is_empty());
    }
    let retired = shared
        .thread_heap(shared.home)
        .expect("the thread keeps it, retired");
    assert!(retired.state.lock_wait().retired);
    shared.check_heaps();
    let stats = pool.stats();
    assert_eq!((stats.allocations, stats.frees, stats.live), (121, 8, 113));
    assert_eq!(stats.in_use, 112 * (64 << 10) + (768 << 10));
    // While the bar lasts, a request that finds the lock taken gets no heap.
    let first = allocate_contended(&shared, 4 << 10);
    assert_eq!(pool.thread_heaps(), 0);
    pool.deallocate(first).unwrap();
    pool.deallocate(big).unwrap();
    for addr in blocks.drain(60..) {
        pool.deallocate(addr).unwrap();
    }
    for _ in 0..BAR_MIN {
        let a = pool.allocate(4 << 10, 0).unwrap();
        pool.deallocate(a).unwrap();
    }
    // The bar is over: the next such request gets a heap again.
    let after = allocate_contended(&shared, 4 << 10);
    assert_eq!(pool.thread_heaps(), 1);
    let heap = shared.thread_heap(shared.home).expect("a new heap");
    assert!(!Arc::ptr_eq(&heap, &retired) && !heap.state.lock_wait().retired);
    assert_eq!(heap.state.lock_wait().live.len(), 1);
    {
        let state = shared.lock_wait("a test");
        assert!(!state.heap_bar.on(state.next_serial));
    }
    pool.deallocate(after).unwrap();
    for addr in blocks {
        pool.deallocate(addr).unwrap();
    }
    shared.check_heaps();
    let stats = pool.stats();
    assert_eq!(
        (stats.allocations, stats.frees, stats.in_use, stats.live),
        (121 + 2 + BAR_MIN, 121 + 2 + BAR_MIN, 0, 0)
    );
    assert_eq!(stats.largest_free, 8 << 20);
}

#[test]
fn many_heaps_stay_near_the_capacity_while_the_peak_is_below_half_of_it() {
    // Three helper threads, one after the other, each take four spans of 512 KiB for 2 MiB
    // of 64 KiB blocks and free them: their heaps keep the spans, free. This thread's heap
    // then holds 1.5 MiB in three spans, and the pool's index has 512 KiB left, no room for
    // a span of 768 KiB. Four home-stream heaps (more than `FEW_HEAPS`) and a peak of 2 MiB
    // (a quarter of the capacity): the heap does not step aside. The request gives every
    // heap back instead, as any request that finds no room does, and the index serves it;
    // the heaps stay with their threads and no bar is set.
    let pool = pool_of_8_mib();
    let shared = pool.shared().clone();
    let turn = std::sync::Mutex::new(());
    let ready = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        // The helpers keep their heaps until these are dropped: at the end, or by a failed
        // assertion.
        let mut release = Vec::new();
        for _ in 0..3 {
            let (pool, shared, turn, ready) = (&pool, &shared, &turn, &ready);
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            release.push(tx);
            s.spawn(move || {
                {
                    let _turn = turn.lock().unwrap();
                    let mut blocks = alloc::vec![allocate_contended(shared, 64 << 10)];
                    blocks.extend((1..32).map(|_| pool.allocate(64 << 10, 0).unwrap()));
                    for addr in blocks {
                        pool.deallocate(addr).unwrap();
                    }
                }
                ready.wait();
                let _ = rx.recv();
            });
        }
        ready.wait();
        assert_eq!(pool.thread_heaps(), 3);
        let mut kept = alloc::vec![allocate_contended(&shared, 64 << 10)];
        kept.extend((1..24).map(|_| pool.allocate(64 << 10, 0).unwrap()));
        assert_eq!(pool.thread_heaps(), 4);
        let heap = shared.thread_heap(shared.home).expect("this thread's heap");
        assert_eq!(heap.state.lock_wait().spans.len(), 3);
        {
            let state = shared.lock_wait("a test");
            assert!(state.heap_bar.most > FEW_HEAPS);
            assert!(state.counts.peak <= (8 << 20) / 2);
            assert!(
                state.tlsf.largest_free() < 768 << 10,
                "no room for the span"
            );
        }
        let big = pool.allocate(768 << 10, 0).unwrap();
        {
            let state = shared.lock_wait("a test");
            assert_eq!(state.heap_bar.len, 0, "no bar");
        }
        assert!(!heap.state.lock_wait().retired, "the heap stayed");
        assert_eq!(pool.thread_heaps(), 4);
        shared.check_heaps();
        let stats = pool.stats();
        assert_eq!(stats.live, 25);
        assert_eq!(stats.in_use, 24 * (64 << 10) + (768 << 10));
        // The heap serves its thread again.
        let next = pool.allocate(64 << 10, 0).unwrap();
        assert!(heap.state.lock_wait().live.len() >= 1);
        for addr in kept.into_iter().chain([big, next]) {
            pool.deallocate(addr).unwrap();
        }
    });
    shared.check_heaps();
    let stats = pool.stats();
    assert_eq!(
        (stats.in_use, stats.live, stats.largest_free),
        (0, 0, 8 << 20)
    );
}

#[test]
fn a_second_bar_soon_after_the_first_is_twice_as_long() {
    let pool = pool_of_8_mib();
    let shared = pool.shared().clone();
    let mut state = shared.lock_wait("a test");
    shared.step_aside(&mut state);
    assert_eq!(state.heap_bar.len, BAR_MIN);
    let first = state.heap_bar.until;
    shared.step_aside(&mut state);
    assert_eq!(state.heap_bar.len, 2 * BAR_MIN);
    assert_eq!(state.heap_bar.until, first + BAR_MIN);
    for _ in 0..30 {
        shared.step_aside(&mut state);
    }
    assert_eq!(state.heap_bar.len, BAR_MAX);
    // Heaps that ran a while without one start from the shortest again.
    state.heap_bar.ended = Some(std::time::Instant::now() - 2 * BAR_QUIET);
    shared.step_aside(&mut state);
    assert_eq!(state.heap_bar.len, BAR_MIN);
}

#[test]
fn a_pool_with_room_in_pieces_smaller_than_a_span_keeps_its_heaps() {
    // Half of 8 MiB free, in holes of 256 KiB (half a span): fragmented, not full. A heap
    // then takes a span just large enough for its request and stays.
    let pool = pool_of_8_mib();
    let shared = pool.shared().clone();
    let blocks: Vec<u64> = (0..32)
        .map(|_| pool.allocate(256 << 10, 0).unwrap())
        .collect();
    for &addr in blocks.iter().step_by(2) {
        pool.deallocate(addr).unwrap();
    }
    assert_eq!(pool.stats().in_use, 4 << 20);
    let small = allocate_contended(&shared, 4 << 10);
    assert_eq!(pool.thread_heaps(), 1);
    assert_eq!(shared.lock_wait("a test").heap_bar.len, 0, "no step aside");
    pool.deallocate(small).unwrap();
    for &addr in blocks.iter().skip(1).step_by(2) {
        pool.deallocate(addr).unwrap();
    }
    shared.check_heaps();
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn home_heaps_step_aside_while_a_heap_of_another_stream_stays() {
    // A heap of another stream on the main thread keeps `HEAPS` set through every step
    // aside: the home-stream threads' retired heaps are then looked up, and left, on their
    // calls. Two threads crowd a pool of 4 MiB on the home stream.
    let streams = Arc::new(crate::pool::ManualStreams::new());
    let pool = Pool::builder(4 << 20)
        .streams(streams.clone(), StreamId(1))
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let other = pool.allocate_on(4096, 0, StreamId(7)).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    let shared = pool.shared().clone();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (pool, shared) = (&pool, &shared);
            s.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                let mut live = alloc::vec![allocate_contended(shared, 1024)];
                for _ in 0..crate::test_iterations(20_000) {
                    let size = next_size(&mut x);
                    if live.len() < 50 && x % 3 != 0 {
                        if let Ok(addr) = pool.allocate(size, 0) {
                            live.push(addr);
                        }
                    } else if let Some(addr) = live.pop() {
                        pool.deallocate(addr).unwrap();
                    }
                }
                for addr in live {
                    pool.deallocate(addr).unwrap();
                }
            });
        }
    });
    shared.check_heaps();
    assert!(shared.lock_wait("a test").heap_bar.len > 0, "no step aside");
    pool.deallocate_on(other, StreamId(7)).unwrap();
    streams.complete_all();
    shared.check_heaps();
    let stats = pool.stats();
    assert_eq!((stats.in_use, stats.live), (0, 0));
    assert_eq!(stats.allocations, stats.frees);
}

//! Graph reservations on the host, with `ManualStreams` standing in for CUDA: a graph's blocks
//! are held while it lives and never handed out to other work, allocations for a capturing
//! stream ask nothing of that stream, the release parks the blocks until the graph's replays
//! (and any third stream's work) are done; a random model of it all against the pool.

mod within;
use within::within;

use std::collections::BTreeMap;
use std::sync::Arc;

use devarena::pool::{
    AllocRequest, GraphReservation, GraphStats, ManualStreams, StreamId, Tracking,
};
use devarena::{Error, Pool};
use proptest::prelude::*;

const HOME: StreamId = StreamId(1);
const GRAPH: StreamId = StreamId(7);
const THIRD: StreamId = StreamId(9);

fn stream_pool(name: &str, capacity: usize) -> (Pool, Arc<ManualStreams>) {
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(capacity)
        .name(name)
        .streams(streams.clone(), HOME)
        .build_host()
        .unwrap();
    (pool, streams)
}

fn overlaps((a, a_len): (u64, u64), (b, b_len): (u64, u64)) -> bool {
    a < b + b_len && b < a + a_len
}

/// Allocates 256-byte blocks on the home stream until the pool is exhausted; the addresses.
fn fill(pool: &Pool) -> Vec<u64> {
    let mut taken = Vec::new();
    while let Ok(addr) = pool.allocate(256, 0) {
        taken.push(addr);
    }
    taken
}

#[test]
fn a_block_freed_while_its_graph_lives_is_held_and_never_handed_out() {
    let (pool, streams) = stream_pool("held", 16 << 10);
    let graph = pool.graph_reservation(GRAPH).unwrap();
    assert_eq!(graph.stream(), GRAPH);
    streams.begin_capture(GRAPH);
    let t1 = graph.allocate(4096, 0).unwrap();
    let t2 = graph.allocate(4096, 0).unwrap();
    // The capturing code frees its temporaries on the capturing stream.
    pool.deallocate_on(t1, GRAPH).unwrap();
    pool.deallocate_on(t2, GRAPH).unwrap();
    assert_eq!(
        graph.stats(),
        GraphStats {
            allocations: 2,
            live: 0,
            held: 2,
            held_bytes: 8192
        }
    );
    let s = pool.stats();
    assert_eq!((s.live, s.in_use, s.pending, s.frees), (0, 0, 8192, 2));
    // Nothing was asked of the capturing stream: no event, no wait.
    assert!(streams.refused().is_empty(), "{:?}", streams.refused());
    assert_eq!(streams.pending(GRAPH), 0);
    assert!(
        streams
            .waits()
            .iter()
            .all(|&(w, p)| w != GRAPH && p != GRAPH)
    );

    // Other code takes everything the pool has: never the graph's bytes.
    let other = fill(&pool);
    assert_eq!(other.len(), (16 << 10) / 256 - 32);
    for &addr in &other {
        for held in [t1, t2] {
            assert!(
                !overlaps((addr, 256), (held, 4096)),
                "{addr:#x} in {held:#x}"
            );
        }
    }
    let err = pool.allocate(256, 0).unwrap_err();
    assert!(
        matches!(err, Error::PoolExhausted { pending: 8192, .. }),
        "{err}"
    );
    // Nor the graph's own later allocations.
    assert!(graph.allocate(256, 0).is_err());
    streams.end_capture(GRAPH);

    // Released: an event on the graph's stream; the bytes stay away until it completes.
    graph.release().unwrap();
    assert_eq!(streams.pending(GRAPH), 1);
    assert_eq!(pool.reclaim().unwrap(), 0);
    assert!(pool.allocate(256, 0).is_err());
    streams.complete(GRAPH);
    assert_eq!(pool.reclaim().unwrap(), 8192);
    let back = pool.allocate(8192, 0).unwrap();
    assert_eq!(back, t1.min(t2));
    assert_eq!(pool.stats().pending, 0);
}

#[test]
fn graph_allocations_wait_for_the_home_stream_on_the_host_instead_of_ordering_the_capturing_stream()
{
    let (pool, streams) = stream_pool("drained", 1 << 20);
    // Work queued on the home stream used a block, then freed it there.
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate(a).unwrap();
    let graph = pool.graph_reservation(GRAPH).unwrap();
    streams.begin_capture(GRAPH);
    let g1 = graph.allocate(4096, 0).unwrap();
    assert_eq!(
        g1, a,
        "the block freed on the home stream, once the home stream is idle"
    );
    assert_eq!(
        streams.synchronized(),
        vec![HOME],
        "the host waited for the home stream"
    );
    assert!(
        streams.waits().is_empty(),
        "the capturing stream was not made to wait"
    );
    // No home free since: no wait.
    let g2 = graph.allocate(4096, 0).unwrap();
    assert_eq!(streams.synchronized(), vec![HOME]);
    // A home free again: one more wait.
    let b = pool.allocate(256, 0).unwrap();
    pool.deallocate(b).unwrap();
    let _g3 = graph.allocate(256, 0).unwrap();
    assert_eq!(streams.synchronized(), vec![HOME, HOME]);
    assert!(streams.refused().is_empty(), "{:?}", streams.refused());

    // An ordinary allocation for the capturing stream after a home free would make it wait:
    // refused by the stream runtime, and the pool is as it was.
    let c = pool.allocate(256, 0).unwrap();
    pool.deallocate(c).unwrap();
    let before = pool.stats();
    let err = pool.allocate_on(256, 0, GRAPH).unwrap_err();
    assert!(err.to_string().contains("capturing"), "{err}");
    assert_eq!(streams.refused(), vec![("order_after", GRAPH)]);
    let after = pool.stats();
    assert_eq!((after.live, after.in_use), (before.live, before.in_use));
    assert_eq!(after.failures, before.failures + 1);
    // ...while `allocate_for_capture` waits on the host instead.
    let d = pool
        .allocate_for_capture(AllocRequest::new(256, 0).on(GRAPH))
        .unwrap();
    assert_eq!(streams.synchronized(), vec![HOME, HOME, HOME]);
    streams.end_capture(GRAPH);
    for addr in [g1, g2, d] {
        pool.deallocate_on(addr, GRAPH).unwrap();
    }
    drop(graph);
}

#[test]
fn a_graph_on_the_home_stream_needs_no_wait() {
    let (pool, streams) = stream_pool("home-graph", 1 << 20);
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate(a).unwrap();
    let graph = pool.graph_reservation(HOME).unwrap();
    streams.begin_capture(HOME);
    let g = graph.allocate(4096, 0).unwrap();
    assert_eq!(
        g, a,
        "stream order on the home stream covers the earlier free"
    );
    pool.deallocate(g).unwrap();
    assert!(streams.synchronized().is_empty());
    assert!(streams.refused().is_empty());
    assert_eq!(graph.stats().held, 1);
    // Held for the graph even on the home stream, where frees are otherwise reusable at once.
    assert_ne!(pool.allocate(4096, 0).unwrap(), g);
    streams.end_capture(HOME);
    drop(graph);
    streams.complete(HOME);
    assert_eq!(pool.reclaim().unwrap(), 4096);
}

#[test]
fn a_graph_block_still_live_at_release_waits_for_the_release_event_when_freed() {
    let (pool, streams) = stream_pool("live-at-release", 8192);
    let graph = pool.graph_reservation(GRAPH).unwrap();
    let kept = graph.allocate(8192, 0).unwrap();
    graph.release().unwrap();
    assert_eq!(streams.pending(GRAPH), 1, "the release event");
    // Freed on the home stream after the graph went: its replays may still run.
    pool.deallocate(kept).unwrap();
    assert_eq!(pool.stats().pending, 8192);
    assert!(pool.allocate(256, 0).is_err());
    streams.complete(GRAPH);
    assert_eq!(pool.allocate(8192, 0).unwrap(), kept);
}

#[test]
fn a_graph_block_freed_on_a_third_stream_waits_for_both_streams() {
    let (pool, streams) = stream_pool("third", 4096);
    let graph = pool.graph_reservation(GRAPH).unwrap();
    let t = graph.allocate(4096, 0).unwrap();
    // Used on a third stream between replays, freed there: its own event is recorded.
    pool.deallocate_on(t, THIRD).unwrap();
    assert_eq!(streams.pending(THIRD), 1);
    drop(graph);
    streams.complete(GRAPH);
    assert_eq!(pool.reclaim().unwrap(), 0, "the third stream still uses it");
    streams.complete(THIRD);
    assert_eq!(pool.reclaim().unwrap(), 4096);
    assert_eq!(pool.allocate(4096, 0).unwrap(), t);
}

#[test]
fn a_release_that_can_neither_record_nor_wait_sets_the_blocks_aside() {
    let (pool, streams) = stream_pool("release-fails", 8192);
    let graph = pool.graph_reservation(GRAPH).unwrap();
    let held = graph.allocate(4096, 0).unwrap();
    let live = graph.allocate(4096, 0).unwrap();
    pool.deallocate_on(held, GRAPH).unwrap();
    streams.fail_with(Some(Error::InvalidArgument {
        what: "the device fell off the bus".into(),
    }));
    let err = graph.release().unwrap_err();
    assert!(err.to_string().contains("set aside for good"), "{err}");
    streams.fail_with(None);
    let s = pool.stats();
    assert_eq!((s.pending, s.quarantined), (0, 4096));
    // The live block of the failed graph is set aside at its free too.
    pool.deallocate(live).unwrap();
    let s = pool.stats();
    assert_eq!((s.live, s.pending, s.quarantined, s.free), (0, 0, 8192, 0));
}

#[test]
fn a_host_pool_without_streams_gets_the_blocks_back_at_release() {
    let pool = Pool::builder(1 << 20).name("plain").build_host().unwrap();
    let graph = pool.graph_reservation(StreamId::DEFAULT).unwrap();
    let mut temp = graph.alloc_slice::<u32>(1000).unwrap();
    temp.as_mut_slice().unwrap().fill(7);
    let addr = temp.addr();
    drop(temp);
    assert_eq!(graph.stats().held, 1);
    assert_eq!(pool.stats().pending, 4096);
    let other = pool.alloc_slice::<u32>(1000).unwrap();
    assert_ne!(other.addr(), addr);
    drop(graph);
    let s = pool.stats();
    assert_eq!((s.pending, s.live), (0, 1));
    drop(other);
    assert_eq!(pool.stats().largest_free, 1 << 20);
}

#[test]
fn a_reservation_allocates_for_its_own_stream_only_and_under_its_clients_quota() {
    let (pool, _streams) = stream_pool("quota", 1 << 20);
    let client = pool.client("graphs", 8192);
    let graph = client.graph_reservation(GRAPH).unwrap();
    let err = graph
        .allocate_with(AllocRequest::new(256, 0).on(THIRD))
        .unwrap_err();
    assert!(
        err.to_string().contains("cannot allocate for stream"),
        "{err}"
    );
    let a = graph.allocate_with(AllocRequest::new(4096, 0)).unwrap();
    let err = graph.allocate(8192, 0).unwrap_err();
    assert!(
        matches!(err, Error::PoolExhausted { limit: "quota", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("graphs"));
    assert_eq!(graph.client().name(), "graphs");
    client.deallocate_on(a, GRAPH).unwrap();
    assert_eq!(client.stats().in_use, 0, "held bytes leave the quota");
    let debug = format!("{graph:?}");
    assert!(debug.contains("held: 1"), "{debug}");
}

#[test]
fn a_stream_the_runtime_refuses_cannot_have_a_reservation() {
    #[derive(Debug)]
    struct OnlyHome(ManualStreams);
    impl devarena::pool::StreamSync for OnlyHome {
        fn record(&self, stream: StreamId) -> Result<Box<dyn devarena::pool::StreamEvent>, Error> {
            self.0.record(stream)
        }
        fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
            self.0.order_after(waiter, producer)
        }
        fn validate(&self, stream: StreamId) -> Result<(), Error> {
            match stream {
                HOME => Ok(()),
                other => Err(Error::InvalidArgument {
                    what: format!("stream {other} is unknown"),
                }),
            }
        }
    }
    let pool = Pool::builder(1 << 20)
        .streams(Arc::new(OnlyHome(ManualStreams::new())), HOME)
        .build_host()
        .unwrap();
    let err = pool.graph_reservation(GRAPH).unwrap_err();
    assert!(err.to_string().contains("unknown"), "{err}");
    pool.graph_reservation(HOME).unwrap();
}

#[test]
fn tracking_and_the_event_log_see_graph_blocks_like_any_other() {
    let (pool, streams) = stream_pool("tracked", 1 << 20);
    pool.set_tracking(Tracking::Tags);
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = log.clone();
    pool.set_events(Some(Arc::new(move |e: &devarena::pool::PoolEvent<'_>| {
        sink.lock().unwrap().push((e.action, e.addr, e.stream));
    })));
    let graph = pool.graph_reservation(GRAPH).unwrap();
    let a = graph
        .allocate_with(AllocRequest::new(1000, 0).tag("activations"))
        .unwrap();
    let leaks = pool.leak_report().leaks;
    assert_eq!(leaks.len(), 1);
    assert_eq!(leaks[0].tag.as_deref(), Some("activations"));
    assert_eq!(leaks[0].stream, GRAPH);
    pool.deallocate_on(a, GRAPH).unwrap();
    assert!(pool.leak_report().leaks.is_empty());
    let events = log.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1].1, a);
    assert_eq!(events[1].2, GRAPH);
    drop(graph);
    streams.complete_all();
    assert_eq!(pool.reclaim().unwrap(), 1024);
}

#[test]
fn allocate_for_capture_blocks_are_ordinary_once_freed() {
    let (pool, streams) = stream_pool("for-capture", 4096);
    streams.begin_capture(GRAPH);
    let a = pool
        .allocate_for_capture(AllocRequest::new(4096, 0).on(GRAPH))
        .unwrap();
    // Freed during the capture: the stream cannot take an event, so the free is refused and
    // the block stays allocated (the graph being captured may use it).
    let err = pool.deallocate_on(a, GRAPH).unwrap_err();
    assert!(err.to_string().contains("capturing"), "{err}");
    assert_eq!(pool.stats().live, 1);
    streams.end_capture(GRAPH);
    // After the capture (and the graph), an ordinary free on that stream.
    pool.deallocate_on(a, GRAPH).unwrap();
    assert_eq!(streams.pending(GRAPH), 1);
    streams.complete(GRAPH);
    assert_eq!(pool.allocate(4096, 0).unwrap(), a);
}

#[test]
fn a_released_reservation_allocates_nothing() {
    let (pool, _streams) = stream_pool("released", 1 << 20);
    let graph = pool.graph_reservation(GRAPH).unwrap();
    let client = graph.client().clone();
    drop(graph);
    // A new reservation is independent of the released one.
    let again: GraphReservation = client.graph_reservation(GRAPH).unwrap();
    let a = again.allocate(256, 0).unwrap();
    assert_eq!(again.stats().allocations, 1);
    pool.deallocate_on(a, GRAPH).unwrap();
}

// ---------------------------------------------------------------------------------------------
// A random model.

#[derive(Debug, Clone)]
enum Op {
    /// An ordinary allocation (size class index, on the home stream or the third).
    Alloc(u8, bool),
    /// An allocation through reservation `r`.
    GraphAlloc(u8, u8),
    /// Frees live allocation `i` (of the live list) on the home, graph or third stream.
    Free(u16, u8),
    /// Releases reservation `r` (a new one takes its place).
    Release(u8),
    /// Completes every event on stream `s` (home, graphs, third).
    Complete(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..6, any::<bool>()).prop_map(|(s, t)| Op::Alloc(s, t)),
        3 => (0u8..6, 0u8..2).prop_map(|(s, r)| Op::GraphAlloc(s, r)),
        4 => (any::<u16>(), 0u8..3).prop_map(|(i, s)| Op::Free(i, s)),
        1 => (0u8..2).prop_map(Op::Release),
        2 => (0u8..4).prop_map(Op::Complete),
    ]
}

const SIZES: [usize; 6] = [1, 256, 1000, 4096, 5000, 20000];
const GRAPH_STREAMS: [StreamId; 2] = [StreamId(7), StreamId(8)];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Whatever the order of allocations, frees, releases and event completions: no live
    /// allocation overlaps another, none overlaps a block a live graph holds, the counters add
    /// up, and once everything is freed, released and completed the pool is whole again.
    #[test]
    fn graph_blocks_are_never_handed_out_while_held(ops in proptest::collection::vec(op(), 1..120)) {
        let capacity = 256 << 10;
        let (pool, streams) = stream_pool("model", capacity);
        let mut graphs: Vec<GraphReservation> = GRAPH_STREAMS
            .iter()
            .map(|&s| pool.graph_reservation(s).unwrap())
            .collect();
        // Live allocations: address → (bytes, owning reservation slot and generation).
        let mut live: BTreeMap<u64, (u64, Option<(usize, u32)>)> = BTreeMap::new();
        // Blocks held for a live reservation: (address, bytes, slot, generation).
        let mut held: Vec<(u64, u64, usize, u32)> = Vec::new();
        let mut generation = [0u32; 2];
        for op in ops {
            match op {
                Op::Alloc(size, third) => {
                    let size = SIZES[size as usize];
                    let stream = if third { THIRD } else { HOME };
                    if let Ok(addr) = pool.allocate_on(size, 0, stream) {
                        let bytes = devarena::pool::reserved_bytes(size).unwrap() as u64;
                        for (&other, &(len, _)) in &live {
                            prop_assert!(!overlaps((addr, bytes), (other, len)));
                        }
                        for &(h, len, _, _) in &held {
                            prop_assert!(!overlaps((addr, bytes), (h, len)), "handed out a held block");
                        }
                        live.insert(addr, (bytes, None));
                    }
                }
                Op::GraphAlloc(size, r) => {
                    let size = SIZES[size as usize];
                    let r = r as usize;
                    if let Ok(addr) = graphs[r].allocate(size, 0) {
                        let bytes = devarena::pool::reserved_bytes(size).unwrap() as u64;
                        for (&other, &(len, _)) in &live {
                            prop_assert!(!overlaps((addr, bytes), (other, len)));
                        }
                        for &(h, len, _, _) in &held {
                            prop_assert!(!overlaps((addr, bytes), (h, len)), "handed out a held block");
                        }
                        live.insert(addr, (bytes, Some((r, generation[r]))));
                    }
                }
                Op::Free(i, s) => {
                    if live.is_empty() {
                        continue;
                    }
                    let addr = *live.keys().nth(i as usize % live.len()).unwrap();
                    let (bytes, owner) = live.remove(&addr).unwrap();
                    let stream = match (s, owner) {
                        (0, _) => HOME,
                        (1, Some((r, _))) => GRAPH_STREAMS[r],
                        _ => THIRD,
                    };
                    pool.deallocate_on(addr, stream).unwrap();
                    if let Some((r, g)) = owner {
                        if g == generation[r] {
                            held.push((addr, bytes, r, g));
                        }
                    }
                }
                Op::Release(r) => {
                    let r = r as usize;
                    let fresh = pool.graph_reservation(GRAPH_STREAMS[r]).unwrap();
                    std::mem::replace(&mut graphs[r], fresh).release().unwrap();
                    held.retain(|&(_, _, slot, _)| slot != r);
                    generation[r] += 1;
                }
                Op::Complete(s) => match s {
                    0 => streams.complete(HOME),
                    1 | 2 => streams.complete(GRAPH_STREAMS[s as usize - 1]),
                    _ => streams.complete(THIRD),
                },
            }
            let stats = pool.stats();
            let in_use: u64 = live.values().map(|&(len, _)| len).sum();
            prop_assert_eq!(stats.in_use as u64, in_use);
            prop_assert_eq!(stats.live, live.len() as u64);
            prop_assert_eq!(stats.free, capacity - stats.in_use - stats.pending);
            let held_bytes: u64 = held.iter().map(|&(_, len, _, _)| len).sum();
            prop_assert!(stats.pending as u64 >= held_bytes);
            for (r, graph) in graphs.iter().enumerate() {
                let model: u64 = held.iter().filter(|h| h.2 == r).map(|h| h.1).sum();
                prop_assert_eq!(graph.stats().held_bytes as u64, model);
            }
        }
        for (addr, (_, owner)) in std::mem::take(&mut live) {
            let stream = owner.map_or(HOME, |(r, _)| GRAPH_STREAMS[r]);
            pool.deallocate_on(addr, stream).unwrap();
        }
        drop(graphs);
        streams.complete_all();
        pool.reclaim().unwrap();
        let stats = pool.stats();
        prop_assert_eq!((stats.live, stats.in_use, stats.pending), (0, 0, 0));
        prop_assert_eq!(stats.largest_free, capacity);
    }
}

/// A block of a graph still live when its reservation is released, freed later on the graph's
/// own stream: work queued there after the release may still use it, so the free waits for
/// an event of its own. Before, it was parked behind the release event alone and handed to
/// another stream, not ordered after the graph's stream, once that event completed.
#[test]
fn a_released_graphs_block_freed_on_the_graphs_stream_waits_for_that_free() {
    let (home, g, other) = (StreamId(1), StreamId(2), StreamId(3));
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(4096)
        .streams(streams.clone(), home)
        .build_host()
        .unwrap();
    let graph = pool.graph_reservation(g).unwrap();
    let a = graph.allocate(4096, 0).unwrap();
    graph.release().unwrap(); // an event on `g`
    streams.complete(g); // the graph's replays are done
    // `a` outlived the graph: work queued on `g` now still uses it, then it is freed there.
    pool.deallocate_on(a, g).unwrap();
    assert_eq!(streams.pending(g), 1, "the free's own event");
    let got = pool.allocate_on(4096, 0, other);
    assert!(
        got.is_err() || streams.waits().contains(&(other, g)),
        "{a:#x} handed to stream {other} while work queued on {g} before its free may run \
         (pending events on g: {}, waits: {:?})",
        streams.pending(g),
        streams.waits()
    );
    // Once the free's event completes, the block serves any stream.
    streams.complete(g);
    let b = pool.allocate_on(4096, 0, other).unwrap();
    assert_eq!(b, a);
    pool.deallocate_on(b, other).unwrap();
}

/// A stream runtime on which no event can be recorded on the graph's stream (a driver error),
/// and whose `synchronize` of that stream first runs the host functions queued there (as
/// `cuLaunchHostFunc` work does), on another thread.
#[derive(Default)]
struct GraphStreams {
    inner: ManualStreams,
    queue: std::sync::Mutex<Vec<Box<dyn FnOnce() + Send>>>,
    synchronize_fails: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for GraphStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GraphStreams")
    }
}

impl devarena::pool::StreamSync for GraphStreams {
    fn record(&self, stream: StreamId) -> Result<Box<dyn devarena::pool::StreamEvent>, Error> {
        if stream == GRAPH {
            return Err(Error::InvalidArgument {
                what: "cuEventRecord failed (test)".into(),
            });
        }
        self.inner.record(stream)
    }
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.inner.order_after(waiter, producer)
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        if stream == GRAPH {
            let work: Vec<_> = std::mem::take(&mut *self.queue.lock().unwrap());
            if !work.is_empty() {
                std::thread::spawn(move || work.into_iter().for_each(|f| f()))
                    .join()
                    .unwrap();
            }
            if self
                .synchronize_fails
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                return Err(Error::InvalidArgument {
                    what: "cuStreamSynchronize failed (test)".into(),
                });
            }
        }
        self.inner.synchronize(stream)
    }
}

/// A release whose event cannot be recorded on the graph's stream has the host wait for that
/// stream instead, without the pool's lock: a host function queued there after the replays
/// that frees a block runs. (Before, the wait was made with the lock held: the host function
/// waited for the lock, and the release never returned.) The held block comes back once the
/// wait has returned; where the wait fails too, the graph's blocks are set aside for good,
/// those held and those freed later, and the release says why.
#[test]
fn a_release_that_waits_for_the_graphs_stream_does_so_without_the_lock() {
    for wait_fails in [false, true] {
        let r = within(10, move || {
            let rt = Arc::new(GraphStreams::default());
            rt.synchronize_fails
                .store(wait_fails, std::sync::atomic::Ordering::SeqCst);
            let pool = Arc::new(
                Pool::builder(64 << 10)
                    .streams(rt.clone(), HOME)
                    .log_leaks_on_drop(false)
                    .build_host()
                    .unwrap(),
            );
            let x = pool.allocate(4096, 0).unwrap();
            let graph = pool.graph_reservation(GRAPH).unwrap();
            let held = graph.allocate(4096, 0).unwrap();
            let live = graph.allocate(4096, 0).unwrap();
            pool.deallocate_on(held, GRAPH).unwrap();
            let p = pool.clone();
            rt.queue
                .lock()
                .unwrap()
                .push(Box::new(move || p.deallocate(x).unwrap()));
            let released = graph.release().map_err(|e| e.to_string());
            // A block of the graph freed after the release (on the home stream: on the graph's
            // own stream the free would record an event there, which cannot be done).
            pool.deallocate(live).unwrap();
            pool.reclaim().unwrap();
            (released, pool.stats())
        });
        let (released, s) = r.expect(
            "the release never returned: it waited for the graph's stream with the lock held, \
             and the host function queued there waited for the lock",
        );
        assert_eq!(s.live, 0, "wait fails: {wait_fails}");
        if wait_fails {
            let error = released.unwrap_err();
            assert!(error.contains("set aside for good"), "{error}");
            assert_eq!((s.quarantined, s.pending), (2 * 4096, 0));
        } else {
            released.unwrap();
            // Both blocks are free again: the wait has returned.
            assert_eq!((s.quarantined, s.pending), (0, 0), "{s:?}");
            assert_eq!(s.in_use, 0);
        }
    }
}

/// `ManualStreams` whose `synchronize` blocks (a busy device) until the test opens the gate,
/// and says when it has begun.
#[derive(Debug, Default)]
struct Gate {
    inner: ManualStreams,
    entered: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    open: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl devarena::pool::StreamSync for Gate {
    fn record(&self, s: StreamId) -> Result<Box<dyn devarena::pool::StreamEvent>, Error> {
        self.inner.record(s)
    }
    fn order_after(&self, w: StreamId, p: StreamId) -> Result<(), Error> {
        self.inner.order_after(w, p)
    }
    fn is_capturing(&self, s: StreamId) -> Result<bool, Error> {
        self.inner.is_capturing(s)
    }
    fn synchronize(&self, s: StreamId) -> Result<(), Error> {
        if let Some(tx) = self.entered.lock().unwrap().take() {
            tx.send(()).unwrap();
        }
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
        drop(open);
        self.inner.synchronize(s)
    }
}

/// While a graph's allocation waits for the home stream (outside the lock), a block freed on
/// the home stream waits behind an event there, so that the wait covers what the capture may
/// get; a request that would fail without it takes it back at once: on the home stream (its
/// own order covers the reuse), or on `on`, another stream that is not capturing, once that
/// stream is ordered after the home stream. (Before, a full pool refused the home stream's
/// request for the whole wait, and later still another stream's.) Runs the request made
/// during the wait on `on` and checks it.
fn a_block_freed_during_a_graphs_wait_serves(on: StreamId) {
    let rt = Arc::new(Gate::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let pool = Arc::new(
        Pool::builder(4 << 10)
            .streams(rt.clone(), HOME)
            .thread_heaps(0)
            .log_leaks_on_drop(false)
            .build_host()
            .unwrap(),
    );
    let x = pool.allocate(4 << 10, 0).unwrap();
    // A free on the home stream the graph's stream has not waited for.
    pool.deallocate(x).unwrap();
    let graph = pool.graph_reservation(StreamId(2)).unwrap();
    *rt.entered.lock().unwrap() = Some(tx);
    let waiter = std::thread::spawn(move || {
        let r = graph.allocate(256, 0).map(drop).map_err(|e| e.to_string());
        drop(graph);
        r
    });
    // The graph's allocation now waits for the home stream, without the lock.
    rx.recv().unwrap();
    let y = pool.allocate(4 << 10, 0).unwrap();
    pool.deallocate(y).unwrap();
    let waits = rt.inner.wait_count();
    let again = pool.allocate_on(4 << 10, 0, on).map_err(|e| e.to_string());
    let ordered = rt.inner.waits_since(waits);
    rt.open();
    let waited = waiter.join().unwrap();
    let again = again.expect("a block freed on the home stream is not reusable");
    assert_eq!(again, y);
    if on != HOME {
        assert!(ordered.contains(&(on, HOME)), "{ordered:?}");
    }
    // The only failure, if any, is the graph's: it found the pool full after its wait.
    assert_eq!(
        pool.stats().failures,
        u64::from(waited.is_err()),
        "{waited:?}"
    );
    pool.deallocate_on(again, on).unwrap();
}

#[test]
fn a_block_freed_on_the_home_stream_during_a_graphs_wait_serves_the_home_stream_at_once() {
    a_block_freed_during_a_graphs_wait_serves(HOME);
}

#[test]
fn a_block_freed_on_the_home_stream_during_a_graphs_wait_serves_another_stream_after_a_wait() {
    a_block_freed_during_a_graphs_wait_serves(THIRD);
}

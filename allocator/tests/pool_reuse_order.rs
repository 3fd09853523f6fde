//! A randomized checker of stream-ordered reuse. A vector-clock model of the streams (its own
//! stream runtime, so that events complete and `order_after` takes effect in the model) decides,
//! at every allocation, whether work queued on the new stream may still overlap work that used
//! the bytes before their free, and at every unmap of a growable region whether such work may
//! still run. Random operations on one thread and on several: allocations and frees on the
//! home stream, per-thread and shared streams, slices (dropped inside `record` too: deferred
//! frees), graph reservations with captures and their blocks freed on several streams,
//! completed events, `reclaim`, trims, threads that exit with live blocks, blocks freed by
//! other threads; eager, lazy and no heaps, the reuse cache on and off, classic and growable
//! regions, capacities small enough that requests are refused and heaps give their spans back.
//!
//! `ORDER_SEEDS`, `ORDER_OPS`: seeds and operations per run; `ORDER_TRACE=1` prints the recent
//! history at a violation; `ORDER_STATS=1` counts what each run did.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use devarena::backend::HostVirtualMemory;
use devarena::pool::{AllocRequest, ManualStreams, PoolSlice, StreamEvent, StreamId, StreamSync};
use devarena::{Error, Pool};

const HOME: StreamId = StreamId(1);

mod rng;
use devarena::MemoryKind;
use devarena::backend::VirtualMemory;
use rng::Rng;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Work on a stream: its position in the stream's queue.
type Use = (StreamId, u64);

#[derive(Default)]
struct Clocks {
    /// Work items queued on each stream so far.
    seq: HashMap<StreamId, u64>,
    /// For each stream, the positions of other streams that its later work waits for.
    vc: HashMap<StreamId, HashMap<StreamId, u64>>,
    /// Positions known finished.
    done: HashMap<StreamId, u64>,
}

impl Clocks {
    fn bump(&mut self, s: StreamId) -> u64 {
        let q = self.seq.entry(s).or_default();
        *q += 1;
        *q
    }
    fn seq(&self, s: StreamId) -> u64 {
        self.seq.get(&s).copied().unwrap_or(0)
    }
    fn order(&mut self, waiter: StreamId, producer: StreamId) {
        let mut from = self.vc.get(&producer).cloned().unwrap_or_default();
        from.insert(producer, self.seq(producer));
        let to = self.vc.entry(waiter).or_default();
        for (x, p) in from {
            let e = to.entry(x).or_default();
            *e = (*e).max(p);
        }
    }
    fn drain(&mut self, s: StreamId) {
        let mut from = self.vc.get(&s).cloned().unwrap_or_default();
        from.insert(s, self.seq(s));
        for (x, p) in from {
            let e = self.done.entry(x).or_default();
            *e = (*e).max(p);
        }
    }
    fn finished(&self, u: Use) -> bool {
        self.done.get(&u.0).is_some_and(|&d| d >= u.1)
    }
    fn safe_for(&self, u: Use, b: StreamId) -> bool {
        u.0 == b
            || self.finished(u)
            || self
                .vc
                .get(&b)
                .and_then(|m| m.get(&u.0))
                .is_some_and(|&p| p >= u.1)
    }
}

#[derive(Clone, Debug)]
struct Freed {
    end: u64,
    uses: Vec<Use>,
    /// Freed while its graph's reservation was open.
    held: Option<u64>,
    graph: Option<u64>,
    from: StreamId,
    what: &'static str,
}

#[derive(Default)]
struct State {
    clocks: Clocks,
    live: BTreeMap<u64, (u64, Option<u64>, StreamId)>,
    freed: BTreeMap<u64, Freed>,
    open_graphs: HashSet<u64>,
    released: HashMap<u64, Use>,
    violations: Vec<String>,
    trace: Vec<String>,
    counts: BTreeMap<String, usize>,
}

fn tr(st: &mut State, line: String) {
    let key: String = line.split([' ', '(']).take(2).collect::<Vec<_>>().join(" ");
    *st.counts.entry(key).or_default() += 1;
    if std::env::var_os("ORDER_TRACE").is_some() {
        st.trace.push(line);
    }
}

impl State {
    fn overlapping(&self, start: u64, end: u64) -> Vec<u64> {
        let first = self
            .freed
            .range(..=start)
            .next_back()
            .map_or(start, |(&a, _)| a);
        self.freed
            .range(first..end)
            .filter(|(_, f)| f.end > start)
            .map(|(&a, _)| a)
            .collect()
    }
}

/// The stream runtime: capture refusals from [`ManualStreams`], events and orders from
/// the model.
#[derive(Default)]
struct Checker {
    inner: ManualStreams,
    state: Mutex<State>,
    /// Slices to drop inside the next `record` (a deferred free).
    to_drop: Mutex<Vec<PoolSlice<u8>>>,
    deferred: AtomicUsize,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checker")
    }
}

#[derive(Debug)]
struct ModelEvent {
    checker: Arc<Checker>,
    at: Use,
}

impl StreamEvent for ModelEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        Ok(self.checker.state.lock().unwrap().clocks.finished(self.at))
    }
}

/// `Arc<Checker>` as the pool's runtime (events keep the checker).
#[derive(Debug, Clone)]
struct Runtime(Arc<Checker>);

impl StreamSync for Runtime {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        drop(self.0.inner.record(stream)?);
        let at = {
            let mut st = self.0.state.lock().unwrap();
            let at = (stream, st.clocks.seq(stream));
            tr(&mut st, format!("record {stream} at {}", at.1));
            at
        };
        let slices: Vec<_> = std::mem::take(&mut *self.0.to_drop.lock().unwrap());
        self.0.deferred.fetch_add(slices.len(), Ordering::Relaxed);
        drop(slices);
        Ok(Box::new(ModelEvent {
            checker: self.0.clone(),
            at,
        }))
    }
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.0.inner.order_after(waiter, producer)?;
        let mut st = self.0.state.lock().unwrap();
        st.clocks.order(waiter, producer);
        let p = st.clocks.seq(producer);
        tr(&mut st, format!("order_after({waiter}, {producer} at {p})"));
        Ok(())
    }
    fn is_capturing(&self, stream: StreamId) -> Result<bool, Error> {
        self.0.inner.is_capturing(stream)
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        if self.0.inner.is_capturing(stream)? {
            return self.0.inner.synchronize(stream);
        }
        let mut st = self.0.state.lock().unwrap();
        st.clocks.drain(stream);
        tr(&mut st, format!("synchronize {stream}"));
        drop(st);
        self.0.inner.synchronize(stream)
    }
}

impl Checker {
    /// The test drains `stream`: every piece of work queued on it has finished.
    fn complete(&self, stream: StreamId) {
        let mut st = self.state.lock().unwrap();
        st.clocks.drain(stream);
        tr(&mut st, format!("complete {stream}"));
    }

    fn complete_all(&self) {
        let mut st = self.state.lock().unwrap();
        let streams: Vec<_> = st.clocks.seq.keys().copied().collect();
        for s in streams {
            st.clocks.drain(s);
        }
    }

    /// `size` bytes at `addr` handed out for `stream` (for graph `graph`).
    fn handed_out(&self, addr: u64, size: usize, stream: StreamId, graph: Option<u64>, how: &str) {
        let end = addr + size.max(1) as u64;
        let mut st = self.state.lock().unwrap();
        let st = &mut *st;
        if let Some((&p, &(pe, _, _))) = st.live.range(..=addr).next_back() {
            assert!(pe <= addr, "{how}: {addr:#x} overlaps live {p:#x}..{pe:#x}");
        }
        if let Some((&n, _)) = st.live.range(addr..).next() {
            assert!(end <= n, "{how}: {addr:#x}..{end:#x} overlaps live {n:#x}");
        }
        for a in st.overlapping(addr, end) {
            let f = st.freed.remove(&a).unwrap();
            if let Some(g) = f.held {
                st.violations.push(format!(
                    "{how}: {addr:#x}..{end:#x} for stream {stream} overlaps {a:#x}..{:#x} \
                     ({}) freed while graph {g}'s reservation is open",
                    f.end, f.what
                ));
            }
            for &u in &f.uses {
                if !st.clocks.safe_for(u, stream) {
                    st.violations.push(format!(
                        "{how}: {addr:#x}..{end:#x} for stream {stream} overlaps {a:#x}..{:#x} \
                         ({}) used on stream {} at {} (done {:?}, {stream} waits for {:?})",
                        f.end,
                        f.what,
                        u.0,
                        u.1,
                        st.clocks.done.get(&u.0),
                        st.clocks.vc.get(&stream).and_then(|m| m.get(&u.0)),
                    ));
                }
            }
            if a < addr {
                st.freed.insert(
                    a,
                    Freed {
                        end: addr,
                        ..f.clone()
                    },
                );
            }
            if f.end > end {
                st.freed.insert(end, f);
            }
        }
        st.live.insert(addr, (end, graph, stream));
        tr(st, format!("{how}: {addr:#x}..{end:#x} for {stream}"));
    }

    /// The block at `addr` is about to be freed on `stream` by work queued there now.
    fn freeing(&self, addr: u64, stream: StreamId, what: &'static str) {
        let mut st = self.state.lock().unwrap();
        let (end, graph, was) = st.live.remove(&addr).expect("not live");
        if was != stream {
            // The user orders the free's stream after its work on the block's stream.
            st.clocks.order(stream, was);
            tr(&mut st, format!("user wait({stream}, {was})"));
        }
        let p = st.clocks.bump(stream);
        let mut f = Freed {
            end,
            uses: vec![(stream, p)],
            held: None,
            graph,
            from: was,
            what,
        };
        if let Some(g) = graph {
            if st.open_graphs.contains(&g) {
                f.held = Some(g);
            } else {
                f.uses.push(st.released[&g]);
            }
        }
        tr(
            &mut st,
            format!("free {what} {addr:#x}..{end:#x} on {stream} at {p}"),
        );
        st.freed.insert(addr, f);
    }

    /// A free that failed: the block stays live.
    fn free_failed(&self, addr: u64) {
        let mut st = self.state.lock().unwrap();
        let f = st.freed.remove(&addr).unwrap();
        st.live.insert(addr, (f.end, f.graph, f.from));
    }

    fn note(&self, line: String) {
        tr(&mut self.state.lock().unwrap(), line);
    }

    fn open_graph(&self, g: u64) {
        self.state.lock().unwrap().open_graphs.insert(g);
    }

    /// Graph `g` is destroyed: replays queued on `stream` until now are its last use.
    fn releasing(&self, g: u64, stream: StreamId) {
        let mut st = self.state.lock().unwrap();
        let p = st.clocks.bump(stream);
        st.open_graphs.remove(&g);
        st.released.insert(g, (stream, p));
        for f in st.freed.values_mut() {
            if f.held == Some(g) {
                f.held = None;
                f.uses.push((stream, p));
            }
        }
    }

    fn unmapping(&self, addr: u64, bytes: usize) {
        let end = addr + bytes as u64;
        let mut st = self.state.lock().unwrap();
        let st = &mut *st;
        let pending = st
            .overlapping(addr, end)
            .iter()
            .filter(|a| st.freed[a].uses.iter().any(|&u| u.0 != HOME))
            .count();
        tr(
            st,
            format!(
                "unmap {}",
                if pending > 0 {
                    "over-non-home-frees"
                } else {
                    "plain"
                }
            ),
        );
        if let Some((&p, &(pe, _, _))) = st.live.range(..end).next_back() {
            if pe > addr {
                st.violations.push(format!(
                    "unmap {addr:#x}..{end:#x} under live {p:#x}..{pe:#x}"
                ));
            }
        }
        for a in st.overlapping(addr, end) {
            let f = &st.freed[&a];
            if let Some(g) = f.held {
                st.violations.push(format!(
                    "unmap {addr:#x}..{end:#x} under {a:#x}..{:#x} held for open graph {g}",
                    f.end
                ));
            }
            for &u in &f.uses {
                if !st.clocks.finished(u) {
                    st.violations.push(format!(
                        "unmap {addr:#x}..{end:#x} under {a:#x}..{:#x} ({}) used on stream {} \
                         at {} (done {:?})",
                        f.end,
                        f.what,
                        u.0,
                        u.1,
                        st.clocks.done.get(&u.0)
                    ));
                }
            }
        }
    }

    fn violations(&self) -> Vec<String> {
        let st = self.state.lock().unwrap();
        if !st.violations.is_empty() {
            let n = st.trace.len();
            for l in &st.trace[n.saturating_sub(400)..] {
                eprintln!("  {l}");
            }
        }
        st.violations.clone()
    }
}

/// Host virtual memory that asks the checker before each unmap.
struct CheckedVm {
    vm: HostVirtualMemory,
    checker: Arc<Checker>,
}

// SAFETY: every call goes to `HostVirtualMemory`.
unsafe impl VirtualMemory for CheckedVm {
    fn name(&self) -> &'static str {
        self.vm.name()
    }
    fn memory(&self) -> MemoryKind {
        self.vm.memory()
    }
    fn granularity(&self) -> usize {
        self.vm.granularity()
    }
    fn reserve(&self, bytes: usize) -> Result<u64, Error> {
        self.vm.reserve(bytes)
    }
    unsafe fn free_reservation(&self, base: u64, bytes: usize) -> Result<(), Error> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.vm.free_reservation(base, bytes) }
    }
    unsafe fn map(&self, addr: u64, chunk: usize, count: usize) -> Result<(), Error> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.vm.map(addr, chunk, count) }
    }
    unsafe fn unmap(&self, addr: u64, chunk: usize) -> Result<(), Error> {
        self.checker.unmapping(addr, chunk);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.vm.unmap(addr, chunk) }
    }
    fn synchronize(&self) -> Result<(), Error> {
        self.vm.synchronize()
    }
}

#[derive(Clone, Copy, Debug)]
struct Config {
    pub eager: bool,
    pub heaps: bool,
    pub reuse: bool,
    pub growable: bool,
    pub threads: usize,
    pub ops: usize,
    pub graphs: bool,
}

const SHARED: StreamId = StreamId(99);

fn build(cfg: Config, checker: &Arc<Checker>, seed: u64) -> Pool {
    let capacity = if seed % 2 == 1 { 2 << 20 } else { 8 << 20 };
    let mut b = Pool::builder(capacity)
        .eager_thread_heaps(cfg.eager)
        .streams(Arc::new(Runtime(checker.clone())), HOME)
        .log_leaks_on_drop(false);
    if !cfg.heaps {
        b = b.thread_heaps(0);
    } else {
        b = b.thread_heaps(2 << 20);
    }
    if !cfg.reuse {
        b = b.reuse(0, 0);
    }
    if cfg.growable {
        b.chunk(64 << 10)
            .build_mapped(CheckedVm {
                vm: HostVirtualMemory::new(64 << 10).unwrap(),
                checker: checker.clone(),
            })
            .unwrap()
    } else {
        b.build_host().unwrap()
    }
}

enum Held {
    Block(u64, StreamId),
    Slice(PoolSlice<u8>),
}

struct Graph {
    res: devarena::pool::GraphReservation,
    id: u64,
    stream: StreamId,
    capturing: bool,
    blocks: Vec<u64>,
}

static GRAPH_IDS: AtomicUsize = AtomicUsize::new(1);

/// One thread's random operations. `graphs`: this thread may open graph reservations on
/// `own[1]` (a stream no other thread uses) or the home stream (single thread only).
fn worker(
    pool: &Pool,
    checker: &Arc<Checker>,
    cfg: Config,
    seed: u64,
    t: usize,
    stop_home_capture: bool,
    mailbox: &Mutex<Vec<(u64, StreamId)>>,
) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let own = [
        HOME,
        StreamId(10 + t as u64),
        StreamId(20 + t as u64),
        SHARED,
    ];
    let client = pool.own_client().clone();
    let mut held: Vec<Held> = Vec::new();
    let mut graph: Option<Graph> = None;
    let pick = |rng: &mut Rng, graph: &Option<Graph>| -> StreamId {
        loop {
            let s = own[rng.below(own.len() as u64) as usize];
            if graph.as_ref().is_some_and(|g| g.capturing && g.stream == s) {
                continue;
            }
            return s;
        }
    };
    let graph_left: std::cell::RefCell<HashMap<u64, StreamId>> = Default::default();
    // Ends the graph's capture if open and releases it; its blocks still live stay with this
    // thread, freed later.
    let release = |g: Graph, held: &mut Vec<Held>| {
        if g.capturing {
            checker.inner.end_capture(g.stream);
        }
        checker.releasing(g.id, g.stream);
        let _ = g.res.release();
        graph_left
            .borrow_mut()
            .extend(g.blocks.iter().map(|&a| (a, g.stream)));
        held.extend(g.blocks.into_iter().map(|a| Held::Block(a, g.stream)));
    };
    let free_block = |held: Held, on: StreamId| -> Option<Held> {
        match held {
            Held::Block(a, _) => {
                // (A block of a released graph, freed on the graph's stream too.)
                graph_left.borrow_mut().remove(&a);
                checker.freeing(a, on, "block");
                match pool.deallocate_on(a, on) {
                    Ok(()) => None,
                    Err(_) => {
                        checker.free_failed(a);
                        Some(Held::Block(a, on))
                    }
                }
            }
            Held::Slice(s) => {
                checker.freeing(s.addr(), s.stream(), "slice");
                drop(s);
                None
            }
        }
    };
    for _ in 0..cfg.ops {
        let r = rng.below(1000);
        if r < 350 && held.len() < 64 {
            let on = pick(&mut rng, &graph);
            let size = rng.size(128 << 10);
            let align = rng.align();
            if let Ok(a) = pool.allocate_on(size, align, on) {
                checker.handed_out(a, size, on, None, "allocate_on");
                held.push(Held::Block(a, on));
            }
        } else if r < 400 && held.len() < 64 {
            let on = pick(&mut rng, &graph);
            let len = rng.size(32 << 10);
            if let Ok(s) = client.alloc_slice_on::<u8>(len, on) {
                checker.handed_out(s.addr(), len, on, None, "slice");
                held.push(Held::Slice(s));
            }
        } else if r < 700 && !held.is_empty() {
            let h = held.swap_remove(rng.below(held.len() as u64) as usize);
            let on = match &h {
                Held::Block(_, s) if rng.below(4) != 0 => *s,
                _ => pick(&mut rng, &graph),
            };
            if let Some(back) = free_block(h, on) {
                held.push(back);
            }
        } else if r < 720 && !held.is_empty() {
            // A slice dropped inside the runtime (a deferred free).
            let i = rng.below(held.len() as u64) as usize;
            if matches!(held[i], Held::Slice(_)) {
                let Held::Slice(s) = held.swap_remove(i) else {
                    unreachable!()
                };
                checker.freeing(s.addr(), s.stream(), "deferred slice");
                checker.to_drop.lock().unwrap().push(s);
            }
        } else if r < 800 {
            let s = own[rng.below(own.len() as u64) as usize];
            checker.complete(s);
        } else if r < 820 {
            let _ = pool.reclaim();
        } else if r < 830 && cfg.growable {
            match rng.below(3) {
                0 => drop(pool.trim()),
                1 => drop(pool.trim_to(1 << 20)),
                _ => {
                    pool.set_release_threshold(if rng.below(2) == 0 { 0 } else { 2 << 20 });
                    drop(pool.synchronize())
                }
            }
        } else if r < 832 && cfg.threads > 1 && !held.is_empty() {
            let i = rng.below(held.len() as u64) as usize;
            if let Held::Block(a, st) = held[i] {
                // (Another thread's stream may be capturing: only shared streams travel.)
                if !graph_left.borrow().contains_key(&a) && (st == HOME || st == SHARED) {
                    held.swap_remove(i);
                    mailbox.lock().unwrap().push((a, st));
                }
            }
        } else if r < 835 && cfg.threads > 1 {
            let theirs: Vec<_> = std::mem::take(&mut *mailbox.lock().unwrap());
            for (a, st) in theirs {
                let on = if rng.below(3) == 0 {
                    pick(&mut rng, &graph)
                } else {
                    st
                };
                if graph
                    .as_ref()
                    .is_some_and(|g| g.capturing && g.stream == on)
                {
                    held.push(Held::Block(a, st));
                    continue;
                }
                if let Some(back) = free_block(Held::Block(a, st), on) {
                    held.push(back);
                }
            }
        } else if r < 836 {
            let _ = pool.stats();
        } else if r < 840 {
            // A short-lived thread: allocates, frees some, exits with the rest live.
            let sub = rng.next() | 1;
            let back: Vec<(u64, StreamId)> = std::thread::scope(|s| {
                s.spawn(|| {
                    let mut r = Rng(sub);
                    let mut mine = Vec::new();
                    for _ in 0..rng_small(&mut r) {
                        let on = own[r.below(own.len() as u64) as usize];
                        if graph
                            .as_ref()
                            .is_some_and(|g| g.capturing && g.stream == on)
                        {
                            continue;
                        }
                        let size = r.size(64 << 10);
                        if let Ok(a) = pool.allocate_on(size, 0, on) {
                            checker.handed_out(a, size, on, None, "exiting thread");
                            mine.push((a, on));
                        }
                        if mine.len() > 4 && r.below(2) == 0 {
                            let (a, on) = mine.swap_remove(0);
                            checker.freeing(a, on, "exiting thread");
                            if pool.deallocate_on(a, on).is_err() {
                                checker.free_failed(a);
                                mine.push((a, on));
                            }
                        }
                    }
                    mine
                })
                .join()
                .unwrap()
            });
            checker.note("sub-thread exited".into());
            held.extend(back.into_iter().map(|(a, s)| Held::Block(a, s)));
        } else if r < 900 && cfg.graphs {
            match graph.take() {
                None => {
                    let stream = if stop_home_capture || rng.below(4) != 0 {
                        own[1]
                    } else {
                        HOME
                    };
                    let id = GRAPH_IDS.fetch_add(1, Ordering::Relaxed) as u64;
                    checker.open_graph(id);
                    match pool.graph_reservation(stream) {
                        Ok(res) => {
                            graph = Some(Graph {
                                res,
                                id,
                                stream,
                                capturing: false,
                                blocks: Vec::new(),
                            })
                        }
                        Err(_) => checker.releasing(id, stream),
                    }
                }
                Some(mut g) => match rng.below(6) {
                    0 if !g.capturing => {
                        // The capture begins: the stream's plain work stops.
                        let mut i = 0;
                        while i < held.len() {
                            let on_g = match &held[i] {
                                Held::Block(_, s) => *s == g.stream,
                                Held::Slice(s) => s.stream() == g.stream,
                            };
                            if on_g {
                                let h = held.swap_remove(i);
                                if let Some(back) = free_block(h, g.stream) {
                                    held.push(back);
                                    i += 1;
                                }
                            } else {
                                i += 1;
                            }
                        }
                        checker.inner.begin_capture(g.stream);
                        g.capturing = true;
                        graph = Some(g);
                    }
                    1 if g.capturing => {
                        checker.inner.end_capture(g.stream);
                        g.capturing = false;
                        graph = Some(g);
                    }
                    2 if g.capturing && rng.below(3) == 0 => {
                        let size = rng.size(64 << 10);
                        let req = AllocRequest::new(size, 0).on(g.stream);
                        if let Ok(a) = pool.allocate_for_capture(req) {
                            checker.handed_out(a, size, g.stream, None, "for capture");
                            held.push(Held::Block(a, g.stream));
                        }
                        graph = Some(g);
                    }
                    2 | 3 => {
                        let size = rng.size(64 << 10);
                        if let Ok(a) = g.res.allocate(size, 0) {
                            checker.handed_out(a, size, g.stream, Some(g.id), "graph");
                            g.blocks.push(a);
                        }
                        graph = Some(g);
                    }
                    4 if !g.blocks.is_empty() => {
                        let i = rng.below(g.blocks.len() as u64) as usize;
                        let a = g.blocks.swap_remove(i);
                        let on = if rng.below(4) == 0 {
                            own[rng.below(own.len() as u64) as usize]
                        } else {
                            g.stream
                        };
                        checker.freeing(a, on, "graph block");
                        if pool.deallocate_on(a, on).is_err() {
                            checker.free_failed(a);
                            g.blocks.push(a);
                        }
                        graph = Some(g);
                    }
                    5 => release(g, &mut held),
                    _ => graph = Some(g),
                },
            }
        }
        let v = checker.violations();
        assert!(
            v.is_empty(),
            "seed {seed} thread {t} {cfg:?}:\n{}",
            v.join("\n")
        );
    }
    if let Some(g) = graph.take() {
        release(g, &mut held);
    }
    for h in held {
        let on = match &h {
            Held::Block(_, s) => *s,
            Held::Slice(s) => s.stream(),
        };
        if let Some(Held::Block(a, st)) = free_block(h, on) {
            checker.freeing(a, st, "final");
            if let Err(e) = pool.deallocate_on(a, st) {
                panic!("seed {seed} thread {t} {cfg:?}: final free of {a:#x} on {st}: {e}");
            }
        }
    }
}

fn run(cfg: Config, seed: u64) {
    let checker = Arc::new(Checker::default());
    let pool = build(cfg, &checker, seed);
    let mailbox = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let (pool, checker, mailbox) = (&pool, &checker, &mailbox);
                s.spawn(move || {
                    worker(
                        pool,
                        checker,
                        cfg,
                        seed * 31 + t as u64,
                        t,
                        cfg.threads > 1,
                        mailbox,
                    )
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    for (a, st) in std::mem::take(&mut *mailbox.lock().unwrap()) {
        checker.freeing(a, st, "mailbox");
        pool.deallocate_on(a, st).unwrap();
    }
    drop(std::mem::take(&mut *checker.to_drop.lock().unwrap()));
    checker.complete_all();
    pool.reclaim().unwrap();
    let v = checker.violations();
    assert!(v.is_empty(), "seed {seed} {cfg:?}:\n{}", v.join("\n"));
    if std::env::var_os("ORDER_STATS").is_some() {
        let c = checker
            .state
            .lock()
            .unwrap()
            .counts
            .iter()
            .filter(|(k, _)| !k.contains("0x7"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        eprintln!("{c}");
    }
    let s = pool.stats();
    if std::env::var_os("ORDER_STATS").is_some() {
        eprintln!(
            "{cfg:?} seed {seed} failures {} waits {}",
            s.failures,
            checker.inner.wait_count()
        );
    }
    assert_eq!((s.live, s.in_use, s.pending), (0, 0, 0), "{cfg:?} {s:?}");
    if cfg.growable {
        pool.trim().unwrap();
        let v = checker.violations();
        assert!(v.is_empty(), "seed {seed} {cfg:?}:\n{}", v.join("\n"));
    }
}

fn rng_small(r: &mut Rng) -> u64 {
    5 + r.below(40)
}

/// A count from the environment variable `name`, or `default`.
fn env_count<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn reuse_order_one_thread() {
    let seeds: u64 = env_count("ORDER_SEEDS", 4);
    let ops: usize = env_count("ORDER_OPS", 4000);
    for seed in 0..seeds {
        for eager in [true, false] {
            for heaps in [true, false] {
                for reuse in [true, false] {
                    for growable in [false, true] {
                        let cfg = Config {
                            eager,
                            heaps,
                            reuse,
                            growable,
                            threads: 1,
                            ops,
                            graphs: true,
                        };
                        run(cfg, seed);
                    }
                }
            }
        }
    }
}

#[test]
fn reuse_order_threads() {
    let seeds: u64 = env_count("ORDER_SEEDS", 3);
    let ops: usize = env_count("ORDER_OPS", 4000);
    for seed in 0..seeds {
        for threads in [2, 3, 4] {
            for (eager, reuse, growable) in [
                (true, true, false),
                (false, true, true),
                (true, false, true),
                (false, false, false),
            ] {
                let cfg = Config {
                    eager,
                    heaps: true,
                    reuse,
                    growable,
                    threads,
                    ops,
                    graphs: true,
                };
                run(cfg, seed);
            }
        }
    }
}

//! Fuzz target `heap_ops`: a sequence of pool operations made by several threads, on a
//! host pool whose threads get heaps of their own, checked step by step against a reference
//! model.
//!
//! The input chooses the pool (capacity, a classic or a growable region, a stream runtime or
//! none, heaps for every thread or only on contention, exact or leased peaks, the heaps'
//! bound, reuse cache settings), extra clients with quotas and up to four worker threads, then
//! operations, each made on one worker thread (or the input's own thread) and waited for
//! before the next: allocations of any size and alignment by any client, on any of three
//! streams (a thread gets a heap for each stream it allocates on), frees of live blocks by
//! their client or the pool on any stream (blocks of other threads' heaps included), frees by
//! the wrong client and of addresses that are not live, runs of allocate-and-free on one
//! thread, a worker thread that exits (its heaps go back) and a new one in its place, the
//! event sink and tracking switched on and off (heaps serve only while both are off), trims,
//! streams that finish their work, and full comparisons of the statistics; and bursts: runs of
//! allocate-and-free on two to four workers at once, which meet on the pool's lock (a pool
//! without eager heaps gives its threads heaps then, and near the capacity they step aside),
//! while the input's own thread reads the statistics (every byte of the region in exactly one
//! of their parts, the model's counts lower bounds) or trims the pool (the runs' blocks stay
//! mapped while live; with a stream runtime the trim's wait for the home stream parks the
//! blocks freed meanwhile and those of the heaps given back behind an event).
//!
//! Apart from bursts, operations never overlap, so the model knows the pool's state exactly
//! whatever the heaps do (after a burst, every count is exact again and the peaks lie in
//! bounds the model checks): which calls must succeed (a request whose guaranteed fit is at
//! most the largest gap between live blocks: the hard cap holds with blocks sitting in other
//! threads' heaps and caches), which must fail and how (an alignment, the capacity, a quota),
//! every counter of the pool and its clients, the free bytes, the largest free block and the
//! number of free blocks (as if every heap were given back), the leak report and the event
//! counts. Every block handed out is checked to be aligned, inside the region and disjoint
//! from every live block; signature bytes written into it must be intact when it is freed.
//!
//! With a stream runtime, memory freed on a stream is reused on another only in stream order:
//! every block the model records (allocations and fills; runs and bursts free theirs at once
//! and are not followed) that overlaps memory freed on another stream must have a chain of
//! waits from that stream to its own made since the free, or a stream of that chain must have
//! finished since (checked against one log of the runtime's waits and synchronizations and
//! the model's completions; for a fill, against the log at the fill's end). Bytes freed on another stream wait for
//! their events (the statistics' `pending`), so until every stream has finished and the pool
//! has reclaimed, only what they cannot change is checked exactly (the counts; free and
//! pending bytes together), and only home-stream requests are held to the hard cap.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::{Mutex, mpsc};
use std::thread::JoinHandle;

use devarena::backend::HostVirtualMemory;
use devarena::pool::{
    AllocRequest, FreeRequest, ManualStreams, StreamEvent, StreamId, StreamSync, Tracking,
    guaranteed_fit, reserved_bytes,
};
use devarena::{Error, Pool, PoolClient};

use super::input::Input;
use super::model::{
    self, ClientModel, HOME, STREAMS, SinkCounts, check_signature, effective_align, gaps,
    write_signature,
};

/// Operations per input at most (keeps one input fast).
const MAX_OPS: usize = 1000;
/// The most worker threads.
const MAX_WORKERS: usize = 4;

/// Runs one input.
pub fn run(data: &[u8]) {
    model::drive(
        data,
        MAX_OPS,
        World::new,
        World::step,
        World::check_everything,
        World::free_everything,
    );
}

type Job = Box<dyn FnOnce() + Send>;

/// A thread that runs the jobs it is sent, one at a time.
struct Worker {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn spawn() -> Worker {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::spawn(move || {
            for job in queue {
                job();
            }
        });
        Worker {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    /// Runs `f` on the worker and waits for it; a panic there panics here.
    fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        finish(self.start(f))
    }

    /// Starts `f` on the worker; [`finish`] waits for it.
    fn start<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> Pending<R> {
        let (done, result) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = done.send(catch_unwind(AssertUnwindSafe(f)));
        });
        self.jobs
            .as_ref()
            .expect("a running worker")
            .send(job)
            .expect("the worker takes jobs");
        result
    }

    /// Lets the thread end (its thread-locals, heaps among them, are dropped) and waits for it.
    fn exit(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            if let Err(payload) = thread.join() {
                resume_unwind(payload);
            }
        }
    }
}

/// A start line for a burst's workers: they spin (yielding now and then, for machines with
/// fewer cores than workers) rather than sleep, so that they start closer together and their
/// runs meet on the pool's lock more often (which gives threads of a pool without eager heaps
/// heaps of their own). Replaying the corpus of 1,047 inputs on the 2-core development
/// machine, 102 inputs gave a thread such a heap and 68 had heaps step aside, against 85 and
/// 54 with `std::sync::Barrier`.
struct SpinBarrier {
    arrived: std::sync::atomic::AtomicUsize,
    n: usize,
}

impl SpinBarrier {
    fn new(n: usize) -> Self {
        SpinBarrier {
            arrived: std::sync::atomic::AtomicUsize::new(0),
            n,
        }
    }

    fn wait(&self) {
        use std::sync::atomic::Ordering;
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let mut spins = 0u32;
        while self.arrived.load(Ordering::Acquire) < self.n {
            spins += 1;
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// What the stream runtime was asked to do, in the order it was asked, with the streams the
/// model completed: what orders a block's free on one stream before its reuse on another.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Work queued on `waiter` from then on waits for what was queued on `producer`.
    Wait {
        waiter: StreamId,
        producer: StreamId,
    },
    /// Everything queued on the stream so far has finished (completed by the model, or a
    /// synchronize by the pool).
    Done(StreamId),
}

/// What the input's own thread does while a burst's workers run.
#[derive(Debug, Clone, Copy)]
enum Observer {
    /// Reads the statistics.
    Stats,
    /// Trims the pool down to that many bytes mapped (`trim_to`; 0 is `trim`).
    Trim(usize),
}

/// [`ManualStreams`] with one log of every wait and every completion, in order.
#[derive(Debug, Default)]
struct LoggedStreams {
    inner: ManualStreams,
    log: Mutex<Vec<Order>>,
}

impl LoggedStreams {
    fn push(&self, order: Order) {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(order);
    }

    fn log_len(&self) -> usize {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Completes every event recorded so far, on every stream.
    fn complete_all(&self) {
        self.inner.complete_all();
        for stream in STREAMS {
            self.push(Order::Done(stream));
        }
    }

    /// Whether work queued on `on` from now on runs after what `freed_on` had queued when the
    /// log was `since` long: the same stream, or a chain of waits from `freed_on` to `on`
    /// made since, or a stream of such a chain that finished everything since.
    fn ordered(&self, freed_on: StreamId, since: usize, on: StreamId) -> bool {
        if freed_on == on {
            return true;
        }
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let mut reached = BTreeSet::from([freed_on]);
        for order in &log[since..] {
            match *order {
                Order::Wait { waiter, producer } if reached.contains(&producer) => {
                    reached.insert(waiter);
                }
                Order::Done(stream) if reached.contains(&stream) => return true,
                _ => {}
            }
        }
        reached.contains(&on)
    }
}

impl StreamSync for LoggedStreams {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        self.inner.record(stream)
    }

    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.inner.order_after(waiter, producer)?;
        self.push(Order::Wait { waiter, producer });
        Ok(())
    }

    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        self.inner.synchronize(stream)?;
        self.push(Order::Done(stream));
        Ok(())
    }
}

/// A request of `size` bytes at `align`, for stream `on` (`None`: as `allocate` makes it, for
/// the home stream).
fn alloc_request(size: usize, align: usize, on: Option<StreamId>) -> AllocRequest<'static> {
    match on {
        Some(stream) => AllocRequest::new(size, align).on(stream),
        None => AllocRequest::new(size, align),
    }
}

/// A job's result to come.
type Pending<R> = mpsc::Receiver<std::thread::Result<R>>;

/// Waits for a job [`Worker::start`] started; a panic there panics here.
fn finish<R>(pending: Pending<R>) -> R {
    match pending.recv().expect("the worker answers") {
        Ok(value) => value,
        Err(payload) => resume_unwind(payload),
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A live block as the model sees it.
#[derive(Debug, Clone, Copy)]
struct Block {
    reserved: usize,
    size: usize,
    client: usize,
    signature: u8,
    /// The stream it was allocated for.
    stream: StreamId,
}

/// What an allocation must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Succeed,
    /// May fail, for want of a gap.
    MayFail,
    /// Must fail: a bad alignment, more than the capacity, or the client's quota.
    Fail(&'static str),
    /// May fail for want of a gap or for the client's quota: other threads' requests run
    /// at the same time.
    Contended,
}

struct World {
    pool: Arc<Pool>,
    clients: Vec<PoolClient>,
    workers: Vec<Worker>,
    base: u64,
    capacity: usize,
    exact_peaks: bool,
    growable: bool,
    /// The host stand-in under a growable region: which chunks are mapped.
    vm: Option<Arc<HostVirtualMemory>>,
    sink: Arc<SinkCounts>,
    sink_on: bool,
    /// The stream runtime, where the pool has one.
    streams: Option<Arc<LoggedStreams>>,
    /// Whether no bytes can be pending (freed on a stream other than the home stream, or
    /// given back by a heap of one, and not reclaimed since every stream finished): then the
    /// free space is exactly what the model says, and a home-stream request that fits a gap
    /// must succeed. Otherwise only what pending bytes cannot change is checked.
    settled: bool,
    /// Freed ranges not handed out since: start -> (end, the stream of the free, the length
    /// of the stream log then).
    freed_ranges: BTreeMap<u64, (u64, StreamId, usize)>,
    expected_events: [u64; 3],
    tracking: Tracking,
    // The model.
    live: BTreeMap<u64, Block>,
    freed: Vec<u64>,
    client_models: Vec<ClientModel>,
    in_use: usize,
    requested: usize,
    peak: usize,
    allocations: u64,
    frees: u64,
    failures: u64,
    next_signature: u8,
}

impl World {
    fn new(input: &mut Input<'_>) -> Self {
        // (One byte chooses the region and a stream runtime.)
        let kind = input.u8();
        let growable = kind % 4 == 0;
        let streams = (kind / 4 % 3 == 0).then(|| Arc::new(LoggedStreams::default()));
        // Growable regions are whole chunks of 64 KiB.
        let capacity = match growable {
            true => (64 << 10) * (1 + input.below(64)),
            false => 256 * (1 + input.below(16384)),
        };
        let eager = input.u8() % 4 != 0;
        let exact_peaks = input.u8() % 4 != 0;
        let mut builder = Pool::builder(capacity)
            .name("fuzz-heaps")
            .eager_thread_heaps(eager)
            .exact_peaks(exact_peaks)
            .log_leaks_on_drop(false);
        if input.bool() {
            builder = builder.thread_heaps(input.pick(&[
                0,
                256,
                64 << 10,
                capacity / 8,
                capacity / 2,
                capacity,
                usize::MAX,
            ]));
        }
        if let Some(streams) = &streams {
            builder = builder.streams(streams.clone(), HOME);
        }
        if input.u8() % 4 == 0 {
            let blocks = input.pick(&[0, 1, 2, 7, 64, 2048]);
            let bytes = input.pick(&[0, 256, 4096, capacity / 2, usize::MAX]);
            builder = builder.reuse(blocks, bytes);
        }
        let vm =
            growable.then(|| Arc::new(HostVirtualMemory::new(64 << 10).expect("64 KiB chunks")));
        let pool = match &vm {
            Some(vm) => builder.build_mapped(vm.clone()),
            None => builder.build_host(),
        }
        .expect("a host pool of at most 4 MiB");
        assert_eq!(pool.capacity(), capacity);
        let base = pool.base();
        let (clients, client_models) = model::clients(&pool, input, 2);
        let workers = (0..1 + input.below(MAX_WORKERS))
            .map(|_| Worker::spawn())
            .collect();
        World {
            pool: Arc::new(pool),
            clients,
            workers,
            base,
            capacity,
            exact_peaks,
            growable,
            vm,
            sink: Arc::new(SinkCounts::default()),
            sink_on: false,
            streams,
            settled: true,
            freed_ranges: BTreeMap::new(),
            expected_events: [0; 3],
            tracking: Tracking::Off,
            live: BTreeMap::new(),
            freed: Vec::new(),
            client_models,
            in_use: 0,
            requested: 0,
            peak: 0,
            allocations: 0,
            frees: 0,
            failures: 0,
            next_signature: 1,
        }
    }

    /// Runs `f` on worker `w`, or on this thread where `w` is past the workers.
    fn on<R: Send + 'static>(&self, w: usize, f: impl FnOnce() -> R + Send + 'static) -> R {
        match self.workers.get(w) {
            Some(worker) => worker.run(f),
            None => f(),
        }
    }

    /// A thread for the next operation: a worker, or sometimes this thread.
    fn thread(&self, input: &mut Input<'_>) -> usize {
        input.below(self.workers.len() + 1 + self.workers.len() / 4)
    }

    /// The free gaps between live blocks: (largest, count).
    fn gaps(&self) -> (usize, usize) {
        let live = self.live.iter().map(|(&a, b)| (a, a + b.reserved as u64));
        gaps(self.base, self.capacity, live)
    }

    fn event(&mut self, i: usize) {
        if self.sink_on {
            self.expected_events[i] += 1;
        }
    }

    fn signature(&mut self) -> u8 {
        model::next_signature(&mut self.next_signature)
    }

    /// A stream for a request or a free: the home stream without a stream runtime.
    fn stream(&self, input: &mut Input<'_>) -> StreamId {
        match self.streams {
            Some(_) => input.pick(&STREAMS),
            None => HOME,
        }
    }

    /// The length of the stream log (0 without a stream runtime).
    fn log_len(&self) -> usize {
        self.streams.as_ref().map_or(0, |s| s.log_len())
    }

    /// Nothing may be pending any more: every stream finishes, and the pool reclaims.
    fn settle(&mut self) {
        if let Some(streams) = &self.streams {
            streams.complete_all();
            self.pool.reclaim().expect("a reclaim");
            self.settled = true;
        }
    }

    fn verdict(&self, client: usize, size: usize, align: usize, stream: StreamId) -> Verdict {
        let Some(align) = effective_align(align) else {
            return Verdict::Fail("align");
        };
        let reserved = match reserved_bytes(size) {
            Some(r) if r <= self.capacity => r,
            _ => return Verdict::Fail("capacity"),
        };
        let c = &self.client_models[client];
        if reserved > c.quota - c.in_use.min(c.quota) {
            return Verdict::Fail("quota");
        }
        // With a stream runtime, only a home-stream request while nothing is pending: a
        // request on another stream may find the free memory it needs in another stream's
        // heap, which gives it back behind an event on that stream.
        let sure = self.settled && stream == HOME;
        match guaranteed_fit(size, align) {
            Some(fit) if fit <= self.gaps().0 && sure => Verdict::Succeed,
            _ => Verdict::MayFail,
        }
    }

    /// Checks a failed allocation against the verdict and counts it.
    fn failed(&mut self, verdict: Verdict, client: usize, size: usize, error: &Error) {
        match (verdict, error) {
            (Verdict::Succeed, e) => panic!(
                "allocation of {size} bytes must succeed (largest gap {}, {} thread heaps): {e}",
                self.gaps().0,
                self.pool.thread_heaps()
            ),
            (Verdict::Fail("align"), Error::InvalidArgument { what }) => {
                assert!(what.contains("alignment"), "{what}")
            }
            (Verdict::Fail(limit), Error::PoolExhausted { limit: l, .. }) => {
                assert_eq!(limit, *l, "{error}")
            }
            (
                Verdict::MayFail | Verdict::Contended,
                Error::PoolExhausted {
                    limit: "capacity", ..
                },
            ) => {}
            (Verdict::Contended, Error::PoolExhausted { limit: "quota", .. }) => {}
            (verdict, e) => panic!("expected {verdict:?}, got {e:?}"),
        }
        self.failures += 1;
        self.client_models[client].failures += 1;
        self.event(2);
    }

    /// Counts an allocation of `reserved` bytes for `client` (its block is checked and
    /// recorded by the caller, or already freed in a run).
    fn count_allocation(&mut self, client: usize, size: usize, reserved: usize) {
        self.allocations += 1;
        self.in_use += reserved;
        self.requested += size;
        self.peak = self.peak.max(self.in_use);
        let c = &mut self.client_models[client];
        c.in_use += reserved;
        c.requested += size;
        c.peak = c.peak.max(c.in_use);
        c.allocations += 1;
        self.event(0);
    }

    fn count_free(&mut self, client: usize, size: usize, reserved: usize) {
        self.in_use -= reserved;
        self.requested -= size;
        self.frees += 1;
        let c = &mut self.client_models[client];
        c.in_use -= reserved;
        c.requested -= size;
        c.frees += 1;
        self.event(1);
    }

    /// Checks a block the pool just handed out and records it.
    fn take(
        &mut self,
        addr: u64,
        align: usize,
        (client, size, stream): (usize, usize, StreamId),
    ) -> usize {
        let reserved = self.check_placement(addr, align, size);
        self.check_order(addr, reserved, stream);
        self.count_allocation(client, size, reserved);
        let signature = self.signature();
        // SAFETY: the pool just handed out `addr` for `size` bytes of its host region (its
        // placement checked above), and no other thread runs between operations.
        unsafe { write_signature(addr, size, signature) };
        self.live.insert(
            addr,
            Block {
                reserved,
                size,
                client,
                signature,
                stream,
            },
        );
        self.freed.retain(|&a| a != addr);
        reserved
    }

    /// Checks that a block the pool handed out is aligned, inside the region and clear of
    /// every live block; its reserved bytes.
    fn check_placement(&self, addr: u64, align: usize, size: usize) -> usize {
        let reserved = reserved_bytes(size).expect("a block that was handed out");
        let end = self.base + self.capacity as u64;
        assert_eq!(
            addr % align.max(256) as u64,
            0,
            "{addr:#x} breaks align {align}"
        );
        assert!(
            addr >= self.base && addr + reserved as u64 <= end,
            "block {addr:#x}+{reserved} outside the region {:#x}+{}",
            self.base,
            self.capacity
        );
        let before = self.live.range(..addr).next_back();
        let after = self.live.range(addr..).next();
        if let Some((&a, b)) = before {
            assert!(a + b.reserved as u64 <= addr, "{addr:#x} overlaps {a:#x}");
        }
        if let Some((&a, _)) = after {
            assert!(
                addr + reserved as u64 <= a,
                "{addr:#x}+{reserved} overlaps {a:#x}"
            );
        }
        reserved
    }

    /// Checks that a block handed out for `stream` reuses memory only in stream order: every
    /// range it overlaps that was freed on another stream was ordered before `stream` since
    /// (see [`LoggedStreams::ordered`]). Forgets those ranges.
    fn check_order(&mut self, addr: u64, reserved: usize, stream: StreamId) {
        let end = addr + reserved as u64;
        let first = match self.freed_ranges.range(..=addr).next_back() {
            Some((&a, &(e, _, _))) if e > addr => a,
            _ => addr,
        };
        let overlapping: Vec<(u64, (u64, StreamId, usize))> = self
            .freed_ranges
            .range(first..end)
            .map(|(&a, &v)| (a, v))
            .collect();
        for (a, (e, freed_on, since)) in overlapping {
            if let Some(streams) = &self.streams {
                assert!(
                    streams.ordered(freed_on, since, stream),
                    "{addr:#x}+{reserved} handed out for stream {stream} overlaps \
                     {a:#x}..{e:#x}, freed on stream {freed_on}, with nothing ordering \
                     {stream} after that free"
                );
            }
            self.freed_ranges.remove(&a);
            if a < addr {
                self.freed_ranges.insert(a, (addr, freed_on, since));
            }
            if e > end {
                self.freed_ranges.insert(end, (e, freed_on, since));
            }
        }
    }

    /// Records a free of `block` at `addr` on `stream`, made.
    fn freed_on(&mut self, addr: u64, block: Block, stream: StreamId) {
        if self.streams.is_some() {
            if stream != HOME || block.stream != HOME {
                self.settled = false;
            }
            let since = self.log_len();
            self.freed_ranges
                .insert(addr, (addr + block.reserved as u64, stream, since));
        }
    }

    fn step(&mut self, input: &mut Input<'_>) {
        match input.u8() % 17 {
            0..=5 => self.op_allocate(input),
            6..=9 => self.op_free_live(input),
            10 => self.op_free_wrong(input),
            11 => match input.bool() {
                true => self.op_run(input),
                false => self.op_burst(input),
            },
            12 => self.op_exit(input),
            13 => self.op_switch(input),
            14 => {
                // A trim gives every heap back: nothing any statistic shows may change.
                let w = self.thread(input);
                let pool = self.pool.clone();
                let trimmed = self.on(w, move || pool.trim());
                let trimmed = trimmed.expect("a host region trims");
                if !self.growable {
                    assert_eq!(trimmed, 0, "a classic region has nothing to unmap");
                }
                // (Heaps of other streams give their free blocks back behind events.)
                self.settled &= self.streams.is_none();
                self.check_everything();
            }
            15 => {
                // With a stream runtime: one stream finishes its work, or all do and the pool
                // reclaims (nothing is pending then).
                if let Some(streams) = self.streams.clone() {
                    match input.u8() % 3 {
                        0 => {}
                        1 => {
                            let stream = input.pick(&STREAMS);
                            streams.inner.complete(stream);
                            streams.push(Order::Done(stream));
                        }
                        _ => self.settle(),
                    }
                }
                self.check_everything();
            }
            _ => self.op_fill(input),
        }
    }

    fn op_allocate(&mut self, input: &mut Input<'_>) {
        let w = self.thread(input);
        let client = input.below(self.clients.len());
        let size = input.size(self.capacity / 4);
        let align = input.align();
        let stream = self.stream(input);
        self.allocate(w, client, size, align, stream);
    }

    /// An allocation on thread `w` for `stream`, checked and recorded.
    fn allocate(&mut self, w: usize, client: usize, size: usize, align: usize, stream: StreamId) {
        let verdict = self.verdict(client, size, align, stream);
        let c = self.clients[client].clone();
        let on = self.streams.as_ref().map(|_| stream);
        let result = self.on(w, move || c.allocate_with(alloc_request(size, align, on)));
        self.allocated(verdict, (client, size, align, stream), result, false);
    }

    /// Checks an allocation's result against the verdict and counts it; records the block, or
    /// where its thread `freed` it at once, counts that free. Its reserved bytes, where it
    /// succeeded.
    fn allocated(
        &mut self,
        verdict: Verdict,
        (client, size, align, stream): (usize, usize, usize, StreamId),
        result: Result<u64, Error>,
        freed: bool,
    ) -> Option<usize> {
        if stream != HOME {
            // (Another stream's request may take other streams' heaps' memory, which then
            // waits behind their events.)
            self.settled = false;
        }
        match result {
            Ok(addr) => {
                assert!(
                    !matches!(verdict, Verdict::Fail(_)),
                    "allocation must fail ({verdict:?}) but returned {addr:#x}"
                );
                let align = effective_align(align).expect("valid");
                let reserved = match freed {
                    false => self.take(addr, align, (client, size, stream)),
                    true => {
                        let reserved = self.check_placement(addr, align, size);
                        self.count_allocation(client, size, reserved);
                        self.count_free(client, size, reserved);
                        reserved
                    }
                };
                Some(reserved)
            }
            Err(error) => {
                self.failed(verdict, client, size, &error);
                None
            }
        }
    }

    /// Allocations of one size on one thread until one fails (or 256 succeeded), in one job:
    /// the pool near its capacity, where heaps that cannot take a span step aside.
    fn op_fill(&mut self, input: &mut Input<'_>) {
        let w = self.thread(input);
        let client = input.below(self.clients.len());
        let size = input.size(self.capacity / 16);
        let align = input.align();
        let stream = self.stream(input);
        let c = self.clients[client].clone();
        let on = self.streams.as_ref().map(|_| stream);
        let results = self.on(w, move || {
            let mut results = Vec::new();
            while results.len() < 256 {
                let result = c.allocate_with(alloc_request(size, align, on));
                let failed = result.is_err();
                results.push(result);
                if failed {
                    break;
                }
            }
            results
        });
        // Nothing else ran meanwhile: each result is checked against the model as it stood
        // (the stream order against every wait of the whole fill).
        for result in results {
            let verdict = self.verdict(client, size, align, stream);
            self.allocated(verdict, (client, size, align, stream), result, false);
        }
    }

    /// Frees a live block on some thread, by its client or by the pool.
    fn op_free_live(&mut self, input: &mut Input<'_>) {
        if self.live.is_empty() {
            return self.op_allocate(input);
        }
        let i = input.below(self.live.len());
        let (&addr, &block) = self.live.iter().nth(i).expect("index below len");
        let w = self.thread(input);
        let by_pool = input.u8() % 4 == 0;
        // Without a stream runtime, or for the home stream by `deallocate`: `None`.
        let stream = match self.streams {
            Some(_) => match input.u8() % 4 {
                0 => None,
                1 => Some(block.stream),
                _ => Some(input.pick(&STREAMS)),
            },
            None => None,
        };
        // SAFETY: a live block of the model, signed when it was handed out; no other thread
        // runs between operations.
        unsafe { check_signature(addr, block.size, block.signature) };
        let request = match stream {
            Some(stream) => FreeRequest::new(addr).on(stream),
            None => FreeRequest::new(addr),
        };
        let result = match by_pool {
            true => {
                let pool = self.pool.clone();
                self.on(w, move || pool.deallocate_with(request))
            }
            false => {
                let c = self.clients[block.client].clone();
                self.on(w, move || c.deallocate_with(request))
            }
        };
        result.unwrap_or_else(|e| panic!("freeing live {addr:#x}: {e}"));
        self.freed_on(addr, block, stream.unwrap_or(HOME));
        self.live.remove(&addr);
        self.count_free(block.client, block.size, block.reserved);
        self.freed.push(addr);
        if self.freed.len() > 64 {
            self.freed.remove(0);
        }
    }

    /// A free that must fail and change nothing: by another client than the block's, or of an
    /// address that is not live (freed before, inside a block, anywhere).
    fn op_free_wrong(&mut self, input: &mut Input<'_>) {
        let w = self.thread(input);
        let live = !self.live.is_empty() && self.clients.len() > 1 && input.bool();
        if live {
            let i = input.below(self.live.len());
            let (&addr, &block) = self.live.iter().nth(i).expect("index below len");
            let other =
                (block.client + 1 + input.below(self.clients.len() - 1)) % self.clients.len();
            let c = self.clients[other].clone();
            match self.on(w, move || c.deallocate(addr)) {
                Err(Error::InvalidArgument { .. }) => {}
                other => panic!("freeing {addr:#x} by another client gave {other:?}"),
            }
            return;
        }
        let addr = match input.u8() % 3 {
            0 if !self.freed.is_empty() => self.freed[input.below(self.freed.len())],
            1 if !self.live.is_empty() => {
                let i = input.below(self.live.len());
                let (&a, b) = self.live.iter().nth(i).expect("index below len");
                a + 1 + input.below(b.reserved - 1) as u64
            }
            _ => self.base + input.below(self.capacity) as u64,
        };
        if self.live.contains_key(&addr) {
            return;
        }
        let c = self.clients[input.below(self.clients.len())].clone();
        match self.on(w, move || c.deallocate(addr)) {
            Err(Error::UnknownAddress { addr: a, .. }) => assert_eq!(a, addr),
            other => panic!("freeing {addr:#x}, not live, gave {other:?}"),
        }
    }

    /// A run of allocate-and-free of one size on one thread (what reuse caches serve).
    fn op_run(&mut self, input: &mut Input<'_>) {
        let w = self.thread(input);
        let client = input.below(self.clients.len());
        let size = input.size(self.capacity / 16);
        let align = input.pick(&[0, 256, 512, 4096]);
        let count = 1 + input.below(64);
        let verdict = self.verdict(client, size, align, HOME);
        let c = self.clients[client].clone();
        let results = self.on(w, move || {
            (0..count)
                .map(|_| {
                    let result = c.allocate(size, align);
                    if let Ok(addr) = result {
                        // SAFETY: the block just handed out to this thread alone, `size` bytes
                        // of the pool's host region, signed before it is checked.
                        unsafe {
                            write_signature(addr, size, 0xA5);
                            check_signature(addr, size, 0xA5);
                        }
                        c.deallocate(addr).map_err(|e| format!("{e}"))?;
                    }
                    Ok(result)
                })
                .collect::<Result<Vec<Result<u64, Error>>, String>>()
        });
        let results = results.unwrap_or_else(|e| panic!("freeing a block just allocated: {e}"));
        for result in results {
            self.allocated(verdict, (client, size, align, HOME), result, true);
        }
    }

    /// Runs of allocate-and-free on several workers at once, started together: they meet on
    /// the pool's lock (a pool without eager heaps gives its threads heaps then) and on the
    /// spare headroom. What each run gets cannot be foreseen (the others hold a block at a
    /// time), so only the failures that must be are checked; afterwards every count is exact
    /// again, and a peak lies between the model's with one run's block and with every run's.
    fn op_burst(&mut self, input: &mut Input<'_>) {
        if self.workers.len() < 2 {
            return self.op_run(input);
        }
        let n = 2 + input.below(self.workers.len() - 1);
        let runs: Vec<(usize, usize, usize, usize)> = (0..n)
            .map(|_| {
                let client = input.below(self.clients.len());
                let size = input.size(self.capacity / 8);
                let align = input.pick(&[0, 256, 1024, 4096]);
                let count = 1 + input.below(200);
                (client, size, align, count)
            })
            .collect();
        // What this thread does meanwhile: nothing, read the statistics, or trim the pool
        // (which gives every heap back and, on a growable region, unmaps free chunks while
        // the runs allocate; with a stream runtime it waits for the home stream, during which
        // home-stream frees and the heaps given back park their blocks behind an event).
        let observer = match input.u8() % 8 {
            0..=3 => None,
            4 | 5 => Some(Observer::Stats),
            6 => Some(Observer::Trim(0)),
            _ => Some(Observer::Trim(input.pick(&[
                0,
                self.capacity / 4,
                self.capacity / 2,
            ]))),
        };
        let looks = 1 + input.below(4);
        let start = Arc::new(SpinBarrier::new(n + observer.is_some() as usize));
        let pending: Vec<_> = runs
            .iter()
            .enumerate()
            .map(|(w, &(client, size, align, count))| {
                let c = self.clients[client].clone();
                let start = start.clone();
                let vm = self.vm.clone();
                let signature = 0x10 + w as u8;
                self.workers[w].start(move || {
                    // Mapped while live, whatever a trim meanwhile unmaps.
                    let unmapped = |addr| {
                        vm.as_ref()
                            .is_some_and(|vm| size > 0 && !vm.is_mapped(addr, size))
                    };
                    start.wait();
                    let mut results = Vec::with_capacity(count);
                    for _ in 0..count {
                        let result = c.allocate(size, align);
                        if let Ok(addr) = result {
                            if unmapped(addr) {
                                return Err(format!(
                                    "{addr:#x}+{size}, just allocated, is not mapped"
                                ));
                            }
                            // SAFETY: the block just handed out to this worker alone (the
                            // others' blocks are disjoint from it), signed before it is
                            // checked.
                            unsafe {
                                write_signature(addr, size, signature);
                                check_signature(addr, size, signature);
                            }
                            if unmapped(addr) {
                                return Err(format!("{addr:#x}+{size} was unmapped while live"));
                            }
                            if let Err(e) = c.deallocate(addr) {
                                return Err(format!("freeing {addr:#x}, just allocated: {e}"));
                            }
                        }
                        results.push(result);
                    }
                    Ok(results)
                })
            })
            .collect();
        if let Some(observer) = observer {
            start.wait();
            for _ in 0..looks {
                self.observe(observer);
            }
        }
        let outcomes: Vec<_> = pending.into_iter().map(finish).collect();
        if matches!(observer, Some(Observer::Trim(_))) {
            // (Blocks parked behind an event of the home stream during the trim's wait: only
            // a growable region waits.)
            self.settled &= self.streams.is_none() || !self.growable;
        }
        let (mut lo, mut hi) = (self.in_use, self.in_use);
        let mut client_hi: Vec<usize> = self.client_models.iter().map(|c| c.in_use).collect();
        let mut client_lo = client_hi.clone();
        for (outcome, &(client, size, align, _)) in outcomes.into_iter().zip(&runs) {
            let results = outcome.unwrap_or_else(|e| panic!("{e}"));
            // Other runs' blocks count for the capacity and the quotas too.
            let verdict = match self.verdict(client, size, align, HOME) {
                Verdict::Fail(why) => Verdict::Fail(why),
                _ => Verdict::Contended,
            };
            for result in results {
                if let Some(reserved) =
                    self.allocated(verdict, (client, size, align, HOME), result, true)
                {
                    lo = lo.max(self.in_use + reserved);
                    let c = &self.client_models[client];
                    client_lo[client] = client_lo[client].max(c.in_use + reserved);
                }
            }
            // (A run whose requests the pool could serve holds a block of at most the
            // capacity at a time.)
            if let Some(reserved) = reserved_bytes(size).filter(|&r| r <= self.capacity) {
                hi += reserved;
                client_hi[client] += reserved;
            }
        }
        // The peaks: at least one run's block over what the model holds, at most every run's.
        let stats = self.pool.stats();
        if self.exact_peaks {
            let (lo, hi) = (lo.max(self.peak), hi.max(self.peak));
            assert!(
                lo <= stats.peak && stats.peak <= hi,
                "peak {} outside {lo}..={hi}",
                stats.peak
            );
            self.peak = stats.peak;
            for (i, c) in self.pool.client_stats().into_iter().enumerate() {
                let model = &mut self.client_models[i];
                let (lo, hi) = (client_lo[i].max(model.peak), client_hi[i].max(model.peak));
                assert!(
                    lo <= c.peak && c.peak <= hi,
                    "peak of client `{}` {} outside {lo}..={hi}",
                    c.name,
                    c.peak
                );
                model.peak = c.peak;
            }
        } else {
            // Leased peaks are bounds: the model keeps what certainly was in use.
            self.peak = self.peak.max(lo);
            for (model, lo) in self.client_models.iter_mut().zip(client_lo) {
                model.peak = model.peak.max(lo);
            }
        }
        self.check_everything();
    }

    /// What this thread does while a burst runs ([`Observer`]). The model's own blocks stay
    /// live meanwhile, so its counts are lower bounds of the pool's; the statistics are one
    /// snapshot with every heap locked, so every byte of the region is in exactly one of
    /// their parts.
    fn observe(&self, observer: Observer) {
        match observer {
            Observer::Stats => {
                let s = self.pool.stats();
                assert_eq!(
                    s.in_use + s.free + s.pending + s.quarantined,
                    self.capacity,
                    "in use, free, pending and quarantined bytes during a burst: {s:?}"
                );
                assert!(s.in_use >= self.in_use, "in use during a burst: {s:?}");
                assert!(
                    s.requested >= self.requested,
                    "requested during a burst: {s:?}"
                );
                assert!(
                    s.live >= self.live.len() as u64,
                    "live during a burst: {s:?}"
                );
                assert!(
                    s.allocations >= self.allocations && s.frees >= self.frees,
                    "allocations and frees during a burst: {s:?}"
                );
                assert!(
                    s.allocations == s.frees + s.live,
                    "allocations, frees, live: {s:?}"
                );
                assert!(
                    s.largest_free <= s.free && (s.free == 0) == (s.free_blocks == 0),
                    "free blocks during a burst: {s:?}"
                );
                assert!(s.in_use <= s.peak, "peak during a burst: {s:?}");
            }
            Observer::Trim(keep) => {
                let trimmed = self.pool.trim_to(keep).expect("a host region trims");
                if !self.growable {
                    assert_eq!(trimmed, 0, "a classic region has nothing to unmap");
                }
            }
        }
    }

    /// A worker thread exits (its heaps go back) and a new one takes its place.
    fn op_exit(&mut self, input: &mut Input<'_>) {
        let w = input.below(self.workers.len());
        self.workers[w].exit();
        self.workers[w] = Worker::spawn();
        // (Its heaps of other streams give their free blocks back behind events.)
        self.settled &= self.streams.is_none();
        if input.bool() {
            self.check_everything();
        }
    }

    /// The event sink or tracking switched (heaps serve only while both are off).
    fn op_switch(&mut self, input: &mut Input<'_>) {
        if input.bool() {
            self.sink_on = !self.sink_on;
            self.pool
                .set_events(self.sink_on.then(|| SinkCounts::sink(&self.sink)));
        } else {
            self.tracking = match self.tracking {
                Tracking::Off => Tracking::Tags,
                _ => Tracking::Off,
            };
            self.pool.set_tracking(self.tracking);
        }
    }

    /// Compares every counter, the free space, the leak report and every signature with the
    /// model.
    fn check_everything(&mut self) {
        let stats = self.pool.stats();
        let (largest, gaps) = self.gaps();
        assert_eq!(stats.capacity, self.capacity);
        assert_eq!(stats.in_use, self.in_use, "in_use");
        assert_eq!(stats.requested, self.requested, "requested");
        if self.exact_peaks {
            assert_eq!(stats.peak, self.peak, "peak");
        } else {
            assert!(
                self.peak <= stats.peak && stats.peak <= self.capacity,
                "peak {} against {} in use at most",
                stats.peak,
                self.peak
            );
        }
        assert_eq!(stats.allocations, self.allocations, "allocations");
        assert_eq!(stats.frees, self.frees, "frees");
        assert_eq!(stats.failures, self.failures, "failures");
        assert_eq!(stats.live, self.live.len() as u64, "live");
        assert_eq!(stats.quarantined, 0, "quarantined");
        if self.settled {
            assert_eq!(stats.pending, 0, "pending");
            assert_eq!(stats.free, self.capacity - self.in_use, "free");
            assert_eq!(stats.largest_free, largest, "largest free block");
            assert_eq!(stats.free_blocks, gaps, "free blocks");
        } else {
            // Pending bytes are neither in use nor free.
            assert_eq!(
                stats.free + stats.pending,
                self.capacity - self.in_use,
                "free and pending"
            );
            assert!(stats.largest_free <= largest, "largest free block");
        }
        for (model, stats) in self.client_models.iter().zip(self.pool.client_stats()) {
            model.check(&stats, self.exact_peaks);
        }
        assert_eq!(self.sink.get(), self.expected_events, "events");
        let report = self.pool.leak_report();
        assert_eq!(report.leaks.len(), self.live.len());
        for (leak, (&addr, block)) in report.leaks.iter().zip(&self.live) {
            assert_eq!(leak.addr, addr);
            assert_eq!(
                (leak.size, leak.reserved),
                (block.size, block.reserved),
                "leak {addr:#x}"
            );
            assert_eq!(leak.client, self.clients[block.client].name());
        }
        for (&addr, block) in &self.live {
            // SAFETY: live blocks of the model, signed when handed out; no other thread runs.
            unsafe { check_signature(addr, block.size, block.signature) };
        }
    }

    /// Frees every block from the threads that hold none of them, lets every worker exit: the
    /// pool must end empty and whole.
    fn free_everything(mut self) {
        let addrs: Vec<u64> = self.live.keys().copied().collect();
        for (i, addr) in addrs.into_iter().enumerate() {
            let block = self.live.remove(&addr).expect("live");
            // SAFETY: still live (freed below), signed when handed out; no other thread runs.
            unsafe { check_signature(addr, block.size, block.signature) };
            let c = self.clients[block.client].clone();
            self.on(i % (self.workers.len() + 1), move || c.deallocate(addr))
                .unwrap_or_else(|e| panic!("freeing live {addr:#x}: {e}"));
            self.count_free(block.client, block.size, block.reserved);
        }
        for worker in &mut self.workers {
            worker.exit();
        }
        self.settle();
        self.check_everything();
        let stats = self.pool.stats();
        assert_eq!((stats.in_use, stats.live), (0, 0));
        assert_eq!(stats.largest_free, self.capacity, "the region merges whole");
        // Every worker's heaps went with its thread; this thread may keep one for each
        // stream.
        let streams = if self.streams.is_some() {
            STREAMS.len()
        } else {
            1
        };
        assert!(
            self.pool.thread_heaps() <= streams,
            "{} heaps",
            self.pool.thread_heaps()
        );
    }
}

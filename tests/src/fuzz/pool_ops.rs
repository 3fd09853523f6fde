//! Fuzz target `pool_ops`: a sequence of pool operations on a host pool, checked step by step
//! against a reference model.
//!
//! The input chooses the pool (capacity, tracking, reuse cache settings, a stream runtime or
//! none), extra clients with quotas, and then operations: allocations of any size and alignment
//! on any stream and client, frees by the pool or a client (of live, freed, foreign and other
//! clients' addresses), typed slices freed or dropped, completing stream events, a stream
//! runtime that starts or stops failing, event queries that start or stop failing (every
//! parked block is then set aside for good at the next reclaim), tracking switched, the event
//! sink removed and put back, `reclaim`, and full comparisons of the statistics.
//!
//! The model decides, for every call, whether it must succeed, may fail (only a request whose
//! guaranteed fit exceeds the largest free gap may fail for want of space), or must fail and
//! with which error; it predicts every counter of the pool and its clients exactly, the free
//! bytes and the largest free block, the waits the pool asks the stream runtime for, the leak
//! report, and the event counts. Every block the pool hands out is checked to be aligned,
//! inside the region and disjoint from every live, parked and set-aside block; signature bytes
//! written into every block must be intact when it is freed.

use std::collections::BTreeMap;
use std::sync::Arc;

use devarena::pool::{
    AllocRequest, ManualStreams, StreamId, Tracking, guaranteed_fit, reserved_bytes,
};
use devarena::{Error, Pool, PoolClient, PoolSlice};

use super::input::Input;
use super::model::{
    self, ClientModel, HOME, STREAMS, SinkCounts, check_signature, effective_align, gaps,
    write_signature,
};

/// Operations per input at most (keeps one input fast).
const MAX_OPS: usize = 3000;
/// The pool's largest reuse-cache block count.
const MAX_REUSE_BLOCKS: usize = devarena::pool::MAX_REUSE_BLOCKS;

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

/// Who holds a live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// An address from `allocate`: freed through `deallocate`.
    Raw,
    /// A [`PoolSlice`]: only the slice frees it (index into `World::slices`).
    Slice(usize),
}

/// A live block as the model sees it.
#[derive(Debug, Clone)]
struct Block {
    reserved: usize,
    size: usize,
    client: usize,
    holder: Holder,
    serial: u64,
    stream: StreamId,
    tag: Option<String>,
    signature: u8,
}

/// A block freed on another stream, waiting for its event.
#[derive(Debug, Clone, Copy)]
struct ParkedBlock {
    addr: u64,
    reserved: usize,
    complete: bool,
    /// Parked behind an event that could not be recorded (a slice's free while the stream
    /// runtime fails): its query fails, and a reclaim sets it aside for good.
    unrecorded: bool,
}

struct World {
    pool: Pool,
    clients: Vec<PoolClient>,
    base: u64,
    capacity: usize,
    streams: Option<Arc<ManualStreams>>,
    sink: Arc<SinkCounts>,
    sink_on: bool,
    expected_events: [u64; 3],
    failing: bool,
    /// Event queries fail: a reclaim sets every parked block aside for good.
    queries_failing: bool,
    tracking: Tracking,
    // The model.
    live: BTreeMap<u64, Block>,
    parked: Vec<(StreamId, Vec<ParkedBlock>)>,
    /// Blocks set aside for good (their events could not be queried): `(addr, reserved)`.
    quarantined: Vec<(u64, usize)>,
    client_models: Vec<ClientModel>,
    in_use: usize,
    requested: usize,
    peak: usize,
    allocations: u64,
    frees: u64,
    failures: u64,
    home_epoch: u64,
    waited: BTreeMap<StreamId, u64>,
    waits: usize,
    slices: Vec<Option<PoolSlice<u32>>>,
    freed: Vec<u64>,
    next_signature: u8,
}

fn injected() -> Error {
    Error::NoDevice {
        reason: "injected stream runtime failure".into(),
    }
}

impl World {
    fn new(input: &mut Input<'_>) -> Self {
        let capacity = 256 * (1 + input.below(4096));
        let tracking = match input.u8() % 16 {
            0..=9 => Tracking::Off,
            10..=14 => Tracking::Tags,
            _ => Tracking::Backtraces,
        };
        let streams = input.bool().then(|| Arc::new(ManualStreams::new()));
        let sink = Arc::new(SinkCounts::default());
        // The pool's own index, which the model describes block for block (with a stream
        // runtime, thread heaps would serve other streams' requests in spans of their own).
        let mut builder = Pool::builder(capacity)
            .name("fuzz")
            .thread_heaps(0)
            .tracking(tracking)
            .log_leaks_on_drop(false)
            .events(SinkCounts::sink(&sink));
        if input.bool() {
            // Block counts past `MAX_REUSE_BLOCKS` (once an overflow or a ring of terabytes,
            // see `tests/extremes.rs`) must be refused at build, naming the count; the run
            // then goes on with a count that builds.
            let mut blocks = input.pick(&[
                0,
                1,
                2,
                3,
                7,
                64,
                2048,
                1 << 16,
                1 << 17,
                MAX_REUSE_BLOCKS + 1,
                1 << 40,
                usize::MAX,
            ]);
            let bytes = input.pick(&[0, 256, 4096, capacity / 2, capacity, usize::MAX]);
            if blocks > MAX_REUSE_BLOCKS {
                match Pool::builder(capacity).reuse(blocks, bytes).build_host() {
                    Err(Error::InvalidArgument { what }) => assert!(
                        what.contains("reuse") && what.contains(&blocks.to_string()),
                        "{what}"
                    ),
                    other => panic!("reuse({blocks}, ..) built: {other:?}"),
                }
                blocks = 1 << 17;
            }
            builder = builder.reuse(blocks, bytes);
        }
        if let Some(streams) = &streams {
            builder = builder.streams(streams.clone(), HOME);
        }
        let pool = builder.build_host().expect("a host pool of at most 1 MiB");
        assert_eq!(pool.capacity(), capacity);
        let base = pool.base();
        assert_eq!(base % 256, 0, "the region starts on a block boundary");
        let (clients, client_models) = model::clients(&pool, input, 3);
        World {
            pool,
            clients,
            base,
            capacity,
            streams,
            sink,
            sink_on: true,
            expected_events: [0; 3],
            failing: false,
            queries_failing: false,
            tracking,
            live: BTreeMap::new(),
            parked: Vec::new(),
            quarantined: Vec::new(),
            client_models,
            in_use: 0,
            requested: 0,
            peak: 0,
            allocations: 0,
            frees: 0,
            failures: 0,
            home_epoch: 0,
            waited: BTreeMap::new(),
            waits: 0,
            slices: Vec::new(),
            freed: Vec::new(),
            next_signature: 1,
        }
    }

    fn is_home(&self, stream: StreamId) -> bool {
        self.streams.is_none() || stream == HOME
    }

    fn pending(&self) -> usize {
        self.parked
            .iter()
            .flat_map(|(_, q)| q.iter())
            .map(|p| p.reserved)
            .sum()
    }

    /// Returns completed parked blocks to the free space, as the pool does at the start of an
    /// allocation and in `reclaim`; the bytes.
    fn reclaim_model(&mut self) -> usize {
        if self.queries_failing {
            // Every parked block's query fails: each is set aside, none reclaimed.
            for (_, queue) in self.parked.drain(..) {
                self.quarantined
                    .extend(queue.iter().map(|p| (p.addr, p.reserved)));
            }
            return 0;
        }
        let mut bytes = 0;
        for (_, queue) in &mut self.parked {
            // In order, as the pool looks: a complete block comes back, one whose query fails
            // is set aside, the first that is neither stops the queue.
            while let Some(front) = queue.first() {
                if front.unrecorded {
                    self.quarantined.push((front.addr, front.reserved));
                } else if front.complete {
                    bytes += front.reserved;
                } else {
                    break;
                }
                queue.remove(0);
            }
        }
        self.parked.retain(|(_, q)| !q.is_empty());
        bytes
    }

    /// The occupied ranges (live and parked blocks), sorted.
    fn occupied(&self) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = self
            .live
            .iter()
            .map(|(&a, b)| (a, a + b.reserved as u64))
            .chain(
                self.parked
                    .iter()
                    .flat_map(|(_, q)| q.iter())
                    .map(|p| (p.addr, p.addr + p.reserved as u64)),
            )
            .chain(self.quarantined.iter().map(|&(a, r)| (a, a + r as u64)))
            .collect();
        ranges.sort_unstable();
        ranges
    }

    /// The free gaps between occupied ranges: (largest, count).
    fn gaps(&self) -> (usize, usize) {
        gaps(self.base, self.capacity, self.occupied())
    }

    fn event(&mut self, i: usize) {
        if self.sink_on {
            self.expected_events[i] += 1;
        }
    }

    fn signature(&mut self) -> u8 {
        model::next_signature(&mut self.next_signature)
    }

    /// Checks a block the pool just handed out and records it.
    fn take(&mut self, addr: u64, align: usize, mut block: Block) {
        let end = self.base + self.capacity as u64;
        assert_eq!(
            addr % align.max(256) as u64,
            0,
            "{addr:#x} breaks align {align}"
        );
        assert!(
            addr >= self.base && addr + block.reserved as u64 <= end,
            "block {addr:#x}+{} outside the region {:#x}+{}",
            block.reserved,
            self.base,
            self.capacity
        );
        for (start, stop) in self.occupied() {
            assert!(
                addr + block.reserved as u64 <= start || stop <= addr,
                "block {addr:#x}+{} overlaps an occupied range {start:#x}..{stop:#x}",
                block.reserved
            );
        }
        self.allocations += 1;
        block.serial = self.allocations;
        self.in_use += block.reserved;
        self.requested += block.size;
        self.peak = self.peak.max(self.in_use);
        let c = &mut self.client_models[block.client];
        c.in_use += block.reserved;
        c.requested += block.size;
        c.peak = c.peak.max(c.in_use);
        c.allocations += 1;
        self.event(0);
        if block.holder == Holder::Raw {
            block.signature = self.signature();
            // SAFETY: a raw block the host pool just handed out for `block.size` bytes (its
            // placement checked); this target runs on one thread.
            unsafe { write_signature(addr, block.size, block.signature) };
        }
        self.live.insert(addr, block);
    }

    /// Whether an allocation of `size` at `align` by `client` on `stream` must succeed, or the
    /// error it must fail with (`Err(None)`: it may fail for want of a gap); updates the model
    /// of reclaim and stream waits exactly as the pool does before it searches.
    fn predict_allocation(
        &mut self,
        client: usize,
        size: usize,
        align: usize,
        stream: StreamId,
    ) -> Result<(), Option<&'static str>> {
        let Some(align) = effective_align(align) else {
            return Err(Some("align"));
        };
        self.reclaim_model();
        let reserved = match reserved_bytes(size) {
            Some(r) if r <= self.capacity => r,
            _ => return Err(Some("capacity")),
        };
        let c = &self.client_models[client];
        if reserved > c.quota - c.in_use.min(c.quota) {
            return Err(Some("quota"));
        }
        if !self.is_home(stream) {
            let last = self.waited.get(&stream).copied().unwrap_or(0);
            if last < self.home_epoch {
                if self.failing {
                    return Err(Some("injected"));
                }
                self.waits += 1;
                self.waited.insert(stream, self.home_epoch);
            }
        }
        match guaranteed_fit(size, align) {
            Some(fit) if fit <= self.gaps().0 => Ok(()),
            _ => Err(None),
        }
    }

    /// Compares an allocation's outcome with the prediction and updates the model.
    fn allocated(
        &mut self,
        predicted: Result<(), Option<&'static str>>,
        result: Result<u64, Error>,
        align: usize,
        block: Block,
    ) -> Option<u64> {
        match (predicted, result) {
            (Err(Some(why)), Ok(addr)) => {
                panic!("allocation must fail ({why}) but returned {addr:#x}")
            }
            (Ok(()), Err(error)) => panic!(
                "allocation of {} bytes must succeed (largest gap {}): {error}",
                block.size,
                self.gaps().0
            ),
            (_, Ok(addr)) => {
                self.take(addr, align, block);
                Some(addr)
            }
            (Err(why), Err(error)) => {
                match (why, &error) {
                    (Some("align"), Error::InvalidArgument { what }) => {
                        assert!(what.contains("alignment"), "{what}")
                    }
                    (Some("injected"), e) => assert_eq!(*e, injected()),
                    (Some(limit), Error::PoolExhausted { limit: l, .. }) => assert_eq!(limit, *l),
                    (
                        None,
                        Error::PoolExhausted {
                            limit: "capacity", ..
                        },
                    ) => {}
                    (why, e) => panic!("expected a failure ({why:?}), got {e:?}"),
                }
                self.failures += 1;
                self.client_models[block.client].failures += 1;
                self.event(2);
                None
            }
        }
    }

    fn step(&mut self, input: &mut Input<'_>) {
        match input.u8() % 20 {
            0..=5 => self.op_allocate(input),
            6..=9 => self.op_free_live(input),
            10 => self.op_free_other(input),
            11 => self.op_slice(input),
            12 => self.op_slice_free(input),
            13 => {
                if let Some(streams) = &self.streams {
                    let stream = input.pick(&STREAMS);
                    streams.complete(stream);
                    for (s, queue) in &mut self.parked {
                        if *s == stream {
                            queue.iter_mut().for_each(|p| p.complete = true);
                        }
                    }
                }
            }
            14 => {
                if let Some(streams) = &self.streams {
                    self.failing = input.u8() % 4 == 0;
                    streams.fail_with(self.failing.then(injected));
                }
            }
            15 => {
                let bytes = self
                    .pool
                    .reclaim()
                    .expect("reclaim sets aside what it cannot query");
                assert_eq!(bytes, self.reclaim_model(), "bytes reclaimed");
            }
            16 => {
                self.tracking = match input.u8() % 8 {
                    0..=3 => Tracking::Off,
                    4..=6 => Tracking::Tags,
                    _ => Tracking::Backtraces,
                };
                self.pool.set_tracking(self.tracking);
                assert_eq!(self.pool.tracking(), self.tracking);
            }
            17 => {
                // The sink off and on again: events while it is off are not counted.
                self.sink_on = !self.sink_on;
                self.pool
                    .set_events(self.sink_on.then(|| SinkCounts::sink(&self.sink)));
            }
            18 => {
                if let Some(streams) = &self.streams {
                    self.queries_failing = input.u8() % 4 == 0;
                    streams.fail_queries(self.queries_failing);
                }
            }
            _ => self.check_everything(),
        }
    }

    fn op_allocate(&mut self, input: &mut Input<'_>) {
        let client = input.below(self.clients.len());
        let size = input.size(self.capacity);
        let align = input.align();
        let via = input.below(3);
        // `allocate` (no stream) is for the home stream: 0 without a stream runtime.
        let stream = match via {
            0 => self.pool.home_stream(),
            _ => input.pick(&STREAMS),
        };
        let tag = (via == 2 && input.bool()).then(|| input.string(12));
        let predicted = self.predict_allocation(client, size, align, stream);
        let c = &self.clients[client];
        let result = match via {
            0 => c.allocate(size, align),
            1 => c.allocate_on(size, align, stream),
            _ => {
                let mut request = AllocRequest::new(size, align).on(stream);
                if let Some(tag) = &tag {
                    request = request.tag(tag);
                }
                c.allocate_with(request)
            }
        };
        let block = Block {
            reserved: reserved_bytes(size).unwrap_or(0),
            size,
            client,
            holder: Holder::Raw,
            serial: 0,
            stream,
            tag: if self.tracking == Tracking::Off {
                None
            } else {
                tag
            },
            signature: 0,
        };
        if let Some(addr) = self.allocated(predicted, result, align, block) {
            self.freed.retain(|&a| a != addr);
        }
    }

    /// Frees a live raw allocation (or tries to free a slice's block through the pool).
    fn op_free_live(&mut self, input: &mut Input<'_>) {
        if self.live.is_empty() {
            return self.op_allocate(input);
        }
        let i = input.below(self.live.len());
        let addr = *self.live.keys().nth(i).expect("index below len");
        let by = match input.u8() % 4 {
            0 => None,
            _ => Some(input.below(self.clients.len())),
        };
        let stream = input.bool().then(|| input.pick(&STREAMS));
        self.free(addr, by, stream);
    }

    /// Frees an address that is not (or no longer) live: a double free, a stale address that
    /// may have been handed out again, an address inside a block, or a foreign one.
    fn op_free_other(&mut self, input: &mut Input<'_>) {
        let addr = match input.u8() % 4 {
            0 if !self.freed.is_empty() => self.freed[input.below(self.freed.len())],
            1 if !self.live.is_empty() => {
                let i = input.below(self.live.len());
                let (&a, b) = self.live.iter().nth(i).expect("index below len");
                a + 1 + input.below(b.reserved) as u64
            }
            2 => input.u64(),
            _ => self.base + input.below(self.capacity) as u64,
        };
        let by = input.bool().then(|| input.below(self.clients.len()));
        let stream = input.bool().then(|| input.pick(&STREAMS));
        self.free(addr, by, stream);
    }

    /// `deallocate` by the pool (`by` = None) or a client, on `stream` or the home stream,
    /// checked against the model's verdict.
    fn free(&mut self, addr: u64, by: Option<usize>, stream: Option<StreamId>) {
        let result = match (by, stream) {
            (None, None) => self.pool.deallocate(addr),
            (None, Some(s)) => self.pool.deallocate_on(addr, s),
            (Some(c), None) => self.clients[c].deallocate(addr),
            (Some(c), Some(s)) => self.clients[c].deallocate_on(addr, s),
        };
        let stream = stream.unwrap_or(self.pool.home_stream());
        let Some(block) = self.live.get(&addr) else {
            match result {
                Err(Error::UnknownAddress { addr: a, .. }) => assert_eq!(a, addr),
                other => panic!("freeing {addr:#x}, not live, gave {other:?}"),
            }
            return;
        };
        if block.holder != Holder::Raw || by.is_some_and(|c| c != block.client) {
            match result {
                Err(Error::InvalidArgument { .. }) => return,
                other => panic!("freeing {addr:#x} of another holder gave {other:?}"),
            }
        }
        if !self.is_home(stream) && self.failing {
            assert_eq!(result, Err(injected()), "free on a failing stream runtime");
            return;
        }
        result.unwrap_or_else(|e| panic!("freeing live {addr:#x}: {e}"));
        self.commit_free(addr, stream);
    }

    /// Updates the model for a free the pool accepted.
    fn commit_free(&mut self, addr: u64, stream: StreamId) {
        self.commit_free_parked(addr, stream, false);
    }

    /// [`commit_free`](Self::commit_free); `unrecorded`: a slice's free on another stream
    /// whose event could not be recorded, parked behind the failure.
    fn commit_free_parked(&mut self, addr: u64, stream: StreamId, unrecorded: bool) {
        let block = self.live.remove(&addr).expect("live");
        if block.holder == Holder::Raw {
            // SAFETY: a raw block signed when handed out, just freed and not handed out
            // again, in the pool's host region, which stays mapped; one thread.
            unsafe { check_signature(addr, block.size, block.signature) };
        }
        if self.is_home(stream) {
            if self.streams.is_some() {
                self.home_epoch += 1;
            }
        } else {
            let parked = ParkedBlock {
                addr,
                reserved: block.reserved,
                complete: false,
                unrecorded,
            };
            match self.parked.iter_mut().find(|(s, _)| *s == stream) {
                Some((_, q)) => q.push(parked),
                None => self.parked.push((stream, vec![parked])),
            }
        }
        self.in_use -= block.reserved;
        self.requested -= block.size;
        self.frees += 1;
        let c = &mut self.client_models[block.client];
        c.in_use -= block.reserved;
        c.requested -= block.size;
        c.frees += 1;
        self.event(1);
        self.freed.push(addr);
        if self.freed.len() > 64 {
            self.freed.remove(0);
        }
    }

    fn op_slice(&mut self, input: &mut Input<'_>) {
        let client = input.below(self.clients.len());
        let len = input.size(self.capacity / 4);
        let stream = input.bool().then(|| input.pick(&STREAMS));
        let Some(bytes) = len.checked_mul(4) else {
            let result = match stream {
                None => self.clients[client].alloc_slice::<u32>(len),
                Some(s) => self.clients[client].alloc_slice_on::<u32>(len, s),
            };
            assert!(
                matches!(result, Err(Error::InvalidArgument { .. })),
                "{result:?}"
            );
            return;
        };
        let on = stream.unwrap_or(self.pool.home_stream());
        let predicted = self.predict_allocation(client, bytes, 256, on);
        let result = match stream {
            None => self.clients[client].alloc_slice::<u32>(len),
            Some(s) => self.clients[client].alloc_slice_on::<u32>(len, s),
        };
        let (addr_result, slice) = match result {
            Ok(slice) => (Ok(slice.addr()), Some(slice)),
            Err(e) => (Err(e), None),
        };
        let block = Block {
            reserved: reserved_bytes(bytes).unwrap_or(0),
            size: bytes,
            client,
            holder: Holder::Slice(self.slices.len()),
            serial: 0,
            stream: on,
            tag: None,
            signature: 0,
        };
        if let Some(addr) = self.allocated(predicted, addr_result, 256, block) {
            let mut slice = slice.expect("a slice");
            assert_eq!((slice.len(), slice.stream()), (len, on));
            let signature = self.signature();
            fill_slice(&mut slice, signature);
            self.live.get_mut(&addr).expect("just taken").signature = signature;
            self.freed.retain(|&a| a != addr);
            self.slices.push(Some(slice));
        }
    }

    fn op_slice_free(&mut self, input: &mut Input<'_>) {
        let open: Vec<usize> = (0..self.slices.len())
            .filter(|&i| self.slices[i].is_some())
            .collect();
        if open.is_empty() {
            return self.op_slice(input);
        }
        let index = open[input.below(open.len())];
        let slice = self.slices[index].take().expect("open");
        let addr = slice.addr();
        let signature = self.live[&addr].signature;
        check_slice(&slice, signature);
        let stream = slice.stream();
        let explicit = input.bool();
        let result = if explicit {
            slice.free()
        } else {
            drop(slice);
            Ok(())
        };
        if !self.is_home(stream) && self.failing {
            // Its event could not be recorded: the free fails, but the slice is gone, so the
            // block is parked behind the failure, to be set aside at the next reclaim.
            if explicit {
                assert_eq!(result, Err(injected()));
            }
            self.commit_free_parked(addr, stream, true);
            return;
        }
        result.unwrap_or_else(|e| panic!("freeing a slice: {e}"));
        self.commit_free(addr, stream);
    }

    /// Compares every counter, the free space, the waits, the leak report and every signature
    /// with the model.
    fn check_everything(&mut self) {
        let stats = self.pool.stats();
        let pending = self.pending();
        let (largest, gaps) = self.gaps();
        assert_eq!(stats.capacity, self.capacity);
        assert_eq!(stats.in_use, self.in_use, "in_use");
        assert_eq!(stats.requested, self.requested, "requested");
        assert_eq!(stats.peak, self.peak, "peak");
        assert_eq!(stats.allocations, self.allocations, "allocations");
        assert_eq!(stats.frees, self.frees, "frees");
        assert_eq!(stats.failures, self.failures, "failures");
        assert_eq!(stats.live, self.live.len() as u64, "live");
        let quarantined: usize = self.quarantined.iter().map(|&(_, r)| r).sum();
        assert_eq!(stats.pending, pending, "pending");
        assert_eq!(stats.quarantined, quarantined, "set aside");
        assert_eq!(
            stats.free,
            self.capacity - self.in_use - pending - quarantined,
            "free"
        );
        assert_eq!(stats.largest_free, largest, "largest free block");
        assert_eq!(stats.free_blocks, gaps, "free blocks");
        for (model, stats) in self.client_models.iter().zip(self.pool.client_stats()) {
            model.check(&stats, true);
        }
        if let Some(streams) = &self.streams {
            assert_eq!(
                streams.waits().len(),
                self.waits,
                "waits on the home stream"
            );
            assert!(streams.waits().iter().all(|&(w, p)| p == HOME && w != HOME));
        }
        assert_eq!(self.sink.get(), self.expected_events, "events");
        let report = self.pool.leak_report();
        assert_eq!(report.leaks.len(), self.live.len());
        for (leak, (&addr, block)) in report.leaks.iter().zip(&self.live) {
            assert_eq!(leak.addr, addr);
            assert_eq!(
                (leak.size, leak.reserved, leak.serial, leak.stream),
                (block.size, block.reserved, block.serial, block.stream),
                "leak {addr:#x}"
            );
            assert_eq!(leak.client, self.clients[block.client].name());
            assert_eq!(leak.tag, block.tag, "tag of {addr:#x}");
        }
        for (&addr, block) in &self.live {
            match block.holder {
                // SAFETY: a live raw block, signed when handed out; one thread.
                Holder::Raw => unsafe { check_signature(addr, block.size, block.signature) },
                Holder::Slice(i) => {
                    if let Some(Some(slice)) = self.slices.get(i) {
                        check_slice(slice, block.signature);
                    }
                }
            }
        }
    }

    /// Completes every event and frees every block: the pool must end empty and whole.
    fn free_everything(mut self) {
        if let Some(streams) = &self.streams {
            streams.fail_with(None);
            self.failing = false;
            streams.fail_queries(false);
            self.queries_failing = false;
            streams.complete_all();
        }
        for queue in &mut self.parked {
            queue.1.iter_mut().for_each(|p| p.complete = true);
        }
        for i in 0..self.slices.len() {
            if let Some(slice) = self.slices[i].take() {
                let (addr, stream) = (slice.addr(), slice.stream());
                slice.free().expect("freeing a slice");
                self.commit_free(addr, stream);
            }
        }
        let raw: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, b)| b.holder == Holder::Raw)
            .map(|(&a, _)| a)
            .collect();
        for addr in raw {
            self.free(addr, None, None);
        }
        if let Some(streams) = &self.streams {
            streams.complete_all();
        }
        for queue in &mut self.parked {
            queue.1.iter_mut().for_each(|p| p.complete = true);
        }
        let bytes = self
            .pool
            .reclaim()
            .expect("reclaim sets aside what it cannot query");
        assert_eq!(bytes, self.reclaim_model());
        self.check_everything();
        // Blocks set aside are the only thing left: nothing stays live (a slice whose free
        // could not record its event has its block set aside too).
        let orphaned: usize = self.live.values().map(|b| b.reserved).sum();
        let stats = self.pool.stats();
        assert_eq!((stats.in_use, orphaned, stats.live), (0, 0, 0));
        if orphaned == 0 && self.quarantined.is_empty() {
            assert_eq!(stats.largest_free, self.capacity, "the region merges whole");
        }
        // A capacity whose size class is itself (a multiple of 256 up to 8 KiB, a class
        // boundary above) can be taken whole.
        if orphaned == 0
            && self.quarantined.is_empty()
            && reserved_bytes(self.capacity) == Some(self.capacity)
        {
            let all = self
                .pool
                .allocate(self.capacity, 0)
                .expect("the whole region");
            assert_eq!(all, self.base);
            self.pool.deallocate(all).expect("free the whole region");
        }
    }
}

fn fill_slice(slice: &mut PoolSlice<u32>, signature: u8) {
    let words = slice.as_mut_slice().expect("a host pool");
    let n = words.len();
    let word = u32::from_ne_bytes([signature; 4]);
    words[..n.min(16)].fill(word);
    words[n - n.min(16)..].fill(word);
}

fn check_slice(slice: &PoolSlice<u32>, signature: u8) {
    let words = slice.as_slice().expect("a host pool");
    let n = words.len();
    let word = u32::from_ne_bytes([signature; 4]);
    assert!(
        words[..n.min(16)].iter().all(|&w| w == word)
            && words[n - n.min(16)..].iter().all(|&w| w == word),
        "signature of the slice at {:#x} overwritten",
        slice.addr()
    );
}

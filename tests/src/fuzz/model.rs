//! What the pool targets' reference models share: the driver, per-client counts, an event sink
//! that counts, the free gaps between occupied ranges, alignments and signature bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use devarena::Pool;
use devarena::PoolClient;
use devarena::pool::{ClientStats, EventSink, PoolAction, PoolEvent, StreamId};

use super::input::Input;

/// The pool's home stream when it has a stream runtime.
pub(crate) const HOME: StreamId = StreamId(1);
/// The streams operations choose from (the home stream among them).
pub(crate) const STREAMS: [StreamId; 3] = [HOME, StreamId(2), StreamId(3)];

/// Runs one input through a target's world: `new` builds it from the front of the input,
/// then at most `max_ops` calls of `step` (one checked operation each), `check` (everything
/// the pool reports against the model) and `finish` (frees what is live; the pool must end
/// empty and whole).
pub(crate) fn drive<W>(
    data: &[u8],
    max_ops: usize,
    new: impl FnOnce(&mut Input<'_>) -> W,
    step: impl Fn(&mut W, &mut Input<'_>),
    check: impl FnOnce(&mut W),
    finish: impl FnOnce(W),
) {
    let mut input = Input::new(data);
    let mut world = new(&mut input);
    let mut ops = 0;
    while !input.is_empty() && ops < max_ops {
        step(&mut world, &mut input);
        ops += 1;
    }
    check(&mut world);
    finish(world);
}

/// The pool's own client (no quota) and up to `most` more with quotas from the input, with
/// their models.
pub(crate) fn clients(
    pool: &Pool,
    input: &mut Input<'_>,
    most: usize,
) -> (Vec<PoolClient>, Vec<ClientModel>) {
    let capacity = pool.capacity();
    let mut clients = vec![pool.own_client().clone()];
    let mut models = vec![ClientModel {
        quota: usize::MAX,
        ..Default::default()
    }];
    for i in 0..input.below(most + 1) {
        let quota = input.size(capacity * 2);
        clients.push(pool.client(&format!("client{i}"), quota));
        models.push(ClientModel {
            quota,
            ..Default::default()
        });
    }
    (clients, models)
}

/// The next signature byte after `last` (never 0).
pub(crate) fn next_signature(last: &mut u8) -> u8 {
    *last = last.wrapping_add(1).max(1);
    *last
}

/// A client as a model sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientModel {
    pub(crate) quota: usize,
    pub(crate) in_use: usize,
    pub(crate) requested: usize,
    pub(crate) peak: usize,
    pub(crate) allocations: u64,
    pub(crate) frees: u64,
    pub(crate) failures: u64,
}

impl ClientModel {
    /// Compares the pool's statistics of the client with the model; `exact_peak`: whether the
    /// peak must equal the model's (else it may only be higher).
    pub(crate) fn check(&self, stats: &ClientStats, exact_peak: bool) {
        let name = &stats.name;
        assert_eq!(stats.quota, self.quota, "quota of client `{name}`");
        assert_eq!(
            (stats.in_use, stats.requested),
            (self.in_use, self.requested),
            "client `{name}`"
        );
        match exact_peak {
            true => assert_eq!(stats.peak, self.peak, "peak of client `{name}`"),
            false => assert!(self.peak <= stats.peak, "peak of client `{name}`"),
        }
        assert_eq!(
            (stats.allocations, stats.frees, stats.failures),
            (self.allocations, self.frees, self.failures),
            "client `{name}`"
        );
        assert_eq!(stats.live, self.allocations - self.frees, "client `{name}`");
    }
}

/// Event counts seen by a sink: allocate, free, failure.
#[derive(Debug, Default)]
pub(crate) struct SinkCounts([AtomicU64; 3]);

impl SinkCounts {
    pub(crate) fn get(&self) -> [u64; 3] {
        [0, 1, 2].map(|i| self.0[i].load(Ordering::Relaxed))
    }

    /// A sink that counts every event into `counts`.
    pub(crate) fn sink(counts: &Arc<SinkCounts>) -> Arc<dyn EventSink> {
        let counts = counts.clone();
        Arc::new(move |e: &PoolEvent<'_>| {
            let i = match e.action {
                PoolAction::Allocate => 0,
                PoolAction::Free => 1,
                PoolAction::AllocateFailure => 2,
            };
            counts.0[i].fetch_add(1, Ordering::Relaxed);
        })
    }
}

/// The free gaps of the region `base..base + capacity` between `occupied` ranges `(start,
/// end)`, sorted and disjoint: (the largest, how many).
pub(crate) fn gaps(
    base: u64,
    capacity: usize,
    occupied: impl IntoIterator<Item = (u64, u64)>,
) -> (usize, usize) {
    let mut at = base;
    let (mut largest, mut count) = (0u64, 0usize);
    let end = base + capacity as u64;
    for (start, stop) in occupied.into_iter().chain([(end, end)]) {
        assert!(start >= at, "occupied ranges overlap at {start:#x}");
        if start > at {
            largest = largest.max(start - at);
            count += 1;
        }
        at = stop;
    }
    (largest as usize, count)
}

/// The alignment a request gets, as the pool documents it: `0` is 256, a power of two up to
/// 4096 is itself, anything else is invalid.
pub(crate) fn effective_align(align: usize) -> Option<usize> {
    match align {
        0 => Some(256),
        a if a.is_power_of_two() && a <= devarena::pool::MAX_POOL_ALIGN => Some(a),
        _ => None,
    }
}

/// Bytes of signature written at each end of a block.
const SIGNATURE_BYTES: usize = 64;

/// Writes `signature` into the first and last bytes of a host block of `size` bytes.
///
/// # Safety
///
/// `addr` is a live allocation of at least `size` bytes in a pool on host memory, and no
/// other thread reads or writes it while this runs.
pub(crate) unsafe fn write_signature(addr: u64, size: usize, signature: u8) {
    for (offset, len) in signature_spans(size) {
        // SAFETY: by the caller's promise the block at `addr` is live host memory of at least
        // `size` bytes, held by the caller alone; `offset + len <= size`.
        unsafe {
            std::ptr::write_bytes((addr as usize + offset) as *mut u8, signature, len);
        }
    }
}

/// Checks the bytes [`write_signature`] wrote.
///
/// # Safety
///
/// `addr..addr + size` lies in a host pool's region that stays mapped while this runs (a
/// live block, or one just freed and not handed out again), [`write_signature`] wrote there,
/// and no other thread writes those bytes meanwhile.
pub(crate) unsafe fn check_signature(addr: u64, size: usize, signature: u8) {
    for (offset, len) in signature_spans(size) {
        // SAFETY: by the caller's promise, `len` bytes of mapped host memory that
        // `write_signature` initialised and no other thread writes; `offset + len <= size`.
        let bytes =
            unsafe { std::slice::from_raw_parts((addr as usize + offset) as *const u8, len) };
        assert!(
            bytes.iter().all(|&b| b == signature),
            "signature of the block at {addr:#x} ({size} bytes) overwritten at +{offset}"
        );
    }
}

/// Where the signature goes: the first and the last [`SIGNATURE_BYTES`] of the block.
fn signature_spans(size: usize) -> [(usize, usize); 2] {
    let head = size.min(SIGNATURE_BYTES);
    let tail = (size - head).min(SIGNATURE_BYTES);
    [(0, head), (size - tail, tail)]
}

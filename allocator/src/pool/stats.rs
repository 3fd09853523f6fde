//! Statistics, tracking and the leak report.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use std::time::Duration;

use super::stream::StreamId;

/// A snapshot of a pool's counters. All byte counts are exact (`peak` too, unless the pool
/// was built with [`exact_peaks(false)`](super::PoolBuilder::exact_peaks), see there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Bytes the pool manages: its hard cap.
    pub capacity: usize,
    /// Bytes held by live allocations, each rounded up to its size class ("reserved": see
    /// [`reserved_bytes`](super::reserved_bytes)).
    pub in_use: usize,
    /// Bytes the live allocations asked for (before rounding).
    pub requested: usize,
    /// The most `in_use` has ever been. (With thread heaps and
    /// [`exact_peaks(false)`](super::PoolBuilder::exact_peaks), at least that and above it by
    /// at most the headroom the heaps held unused; never above the capacity.)
    pub peak: usize,
    /// Successful allocations so far.
    pub allocations: u64,
    /// Frees so far.
    pub frees: u64,
    /// Failed allocations so far (over quota or capacity, bad arguments).
    pub failures: u64,
    /// Live allocations.
    pub live: u64,
    /// Bytes in free blocks, ready to be handed out: free in the pool's index, waiting whole in
    /// a reuse cache, or free in a thread heap's spans. (A heap of a stream other than the
    /// home stream hands its free blocks out on its stream at once; a request on the home
    /// stream that needs them has the home stream wait for that stream first, where it can:
    /// not while that stream captures a graph.)
    pub free: usize,
    /// Bytes freed on another stream whose event has not completed yet, and free bytes a
    /// thread heap of another stream gave back that wait for that stream likewise (neither in
    /// use nor free).
    pub pending: usize,
    /// Bytes freed on another stream (or given back by a thread heap of another stream) whose
    /// event could not be queried (a driver error) or recorded (a slice freed on a stream that
    /// was capturing a graph, a stream that failed three records in a row; a graph's blocks
    /// whose stream could neither record an event nor be waited for): set aside for good,
    /// since nothing says the stream is done with them. Normally 0.
    pub quarantined: usize,
    /// The largest free block (blocks that wait in a reuse cache or a thread heap count as
    /// merged with the free blocks they touch, as they are before a request would fail).
    pub largest_free: usize,
    /// Number of free blocks, counted as for `largest_free` (1 for an empty pool; more means
    /// fragmentation).
    pub free_blocks: usize,
    /// Allocations served whole by a block freed earlier and kept for reuse (see
    /// [`PoolBuilder::reuse`](super::PoolBuilder::reuse)), so far.
    pub reused: u64,
    /// Bytes of the region backed by memory now: what the pool holds of the device. A growable
    /// region maps chunks as allocations reach them and unmaps them on
    /// [`Pool::trim`](super::Pool::trim); a classic region holds its whole capacity.
    pub mapped: usize,
    /// The most `mapped` has ever been.
    pub peak_mapped: usize,
    /// Bytes per chunk, the unit of mapping (a classic region: the capacity, its one chunk).
    pub chunk: usize,
    /// Chunks mapped so far (0 for a classic region).
    pub maps: u64,
    /// Chunks unmapped so far: by trims, and when a failed map is undone.
    pub unmaps: u64,
}

impl PoolStats {
    /// `1 − largest_free / free`: 0 when all free memory is one block (or none is free),
    /// approaching 1 when it is scattered in small pieces.
    pub fn fragmentation(&self) -> f64 {
        if self.free == 0 {
            0.0
        } else {
            1.0 - self.largest_free as f64 / self.free as f64
        }
    }

    /// Reserved bytes beyond what was asked for: rounding to 256 bytes and to size classes.
    pub fn rounding_overhead(&self) -> usize {
        self.in_use - self.requested
    }
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} bytes in use ({} requested) in {} allocations, peak {}; {} free in {} \
             blocks (largest {}, fragmentation {:.3}), {} pending; {} allocations, {} frees, \
             {} failures so far; {} bytes mapped (peak {}) in chunks of {}, {} maps, {} unmaps",
            self.in_use,
            self.capacity,
            self.requested,
            self.live,
            self.peak,
            self.free,
            self.free_blocks,
            self.largest_free,
            self.fragmentation(),
            self.pending,
            self.allocations,
            self.frees,
            self.failures,
            self.mapped,
            self.peak_mapped,
            self.chunk,
            self.maps,
            self.unmaps
        )
    }
}

/// One client's share of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientStats {
    /// The client's name.
    pub name: String,
    /// Its quota in bytes (reserved bytes, like `in_use`).
    pub quota: usize,
    /// Bytes its live allocations hold (each rounded up to its size class).
    pub in_use: usize,
    /// Bytes its live allocations asked for.
    pub requested: usize,
    /// The most `in_use` has ever been. (With thread heaps and
    /// [`exact_peaks(false)`](super::PoolBuilder::exact_peaks), at least that and above it by
    /// at most the headroom the heaps held unused; never above the capacity.)
    pub peak: usize,
    /// Its successful allocations so far.
    pub allocations: u64,
    /// Its frees so far.
    pub frees: u64,
    /// Its failed allocations so far.
    pub failures: u64,
    /// Its live allocations.
    pub live: u64,
}

/// What the pool records about each live allocation beyond its size and client.
///
/// Switch it at run time with [`Pool::set_tracking`](super::Pool::set_tracking); allocations
/// made before the switch keep what was recorded for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Tracking {
    /// Address, size, client, stream and sequence number only (always recorded, free of cost).
    #[default]
    Off = 0,
    /// Also the user's tag ([`AllocRequest::tag`](super::AllocRequest::tag)) and the time of
    /// the allocation.
    Tags = 1,
    /// Also a backtrace of the allocating call (`std::backtrace::Backtrace`, captured only in
    /// this mode: slow, for hunting a leak).
    Backtraces = 2,
}

/// One live allocation in a [`LeakReport`].
#[derive(Debug, Clone)]
pub struct Leak {
    /// Its address.
    pub addr: u64,
    /// Bytes asked for.
    pub size: usize,
    /// Bytes it holds (rounded up to its size class).
    pub reserved: usize,
    /// The client that made it.
    pub client: String,
    /// Its serial number, unique in the pool. Without thread heaps, the pool's `n`-th
    /// successful allocation (from 1); a thread heap takes its numbers in batches, so with
    /// heaps they have gaps and do not follow the order of allocations across heaps.
    pub serial: u64,
    /// The stream it was made for.
    pub stream: StreamId,
    /// The user's tag (tracking on).
    pub tag: Option<String>,
    /// How long it had been live when the report was made (tracking on).
    pub age: Option<Duration>,
    /// Where it was made ([`Tracking::Backtraces`]).
    pub backtrace: Option<String>,
}

/// Every live allocation of a pool, by address: on demand
/// ([`Pool::leak_report`](super::Pool::leak_report)) and logged at `warn` when a pool with live
/// allocations is dropped.
#[derive(Debug, Clone)]
pub struct LeakReport {
    /// The pool's name.
    pub pool: String,
    /// The pool's capacity.
    pub capacity: usize,
    /// The live allocations, by address.
    pub leaks: Vec<Leak>,
}

impl LeakReport {
    /// No live allocation.
    pub fn is_empty(&self) -> bool {
        self.leaks.is_empty()
    }

    /// Bytes the live allocations hold.
    pub fn reserved_bytes(&self) -> usize {
        self.leaks.iter().map(|l| l.reserved).sum()
    }

    /// Bytes the live allocations asked for.
    pub fn requested_bytes(&self) -> usize {
        self.leaks.iter().map(|l| l.size).sum()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "pool `{}`: {} live allocation(s), {} bytes reserved ({} requested) of {}",
            self.pool,
            self.leaks.len(),
            self.reserved_bytes(),
            self.requested_bytes(),
            self.capacity
        )?;
        if self.leaks.is_empty() {
            return Ok(());
        }
        let client_width = self
            .leaks
            .iter()
            .map(|l| l.client.len())
            .max()
            .unwrap_or(0)
            .max(6);
        writeln!(
            f,
            "  {:>18}  {:>12}  {:>12}  {:>8}  {:<client_width$}  {:>10}  tag",
            "address", "size", "reserved", "serial", "client", "age"
        )?;
        for leak in &self.leaks {
            let age = match leak.age {
                Some(age) => alloc::format!("{:.3}s", age.as_secs_f64()),
                None => String::from("-"),
            };
            writeln!(
                f,
                "  {:>#18x}  {:>12}  {:>12}  {:>8}  {:<client_width$}  {:>10}  {}",
                leak.addr,
                leak.size,
                leak.reserved,
                leak.serial,
                leak.client,
                age,
                leak.tag.as_deref().unwrap_or("-")
            )?;
            if let Some(backtrace) = &leak.backtrace {
                for line in backtrace.lines() {
                    writeln!(f, "      {line}")?;
                }
            }
        }
        Ok(())
    }
}

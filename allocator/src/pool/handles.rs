//! The handles users hold: [`Pool`] and [`PoolClient`].

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use super::engine::Shared;
use super::{
    AllocRequest, ClientStats, EventSink, FreeRequest, GraphReservation, LeakReport, PoolBuilder,
    PoolSlice, PoolStats, RegionKind, StreamId, StreamSync, Tracking,
};
use crate::backend::{Backend, MemoryKind};
use crate::error::Error;

/// One region, sub-allocated: see the [module docs](super).
///
/// `Pool` is `Send + Sync`; [`Pool::client`] hands out cloneable handles that share it. The
/// region is freed when the pool and every client and slice made from it are gone; live
/// allocations at that point are logged as leaks. A growable region ([`RegionKind`]) maps
/// memory as allocations reach it; [`Pool::trim`] and [`Pool::synchronize`] give it back.
pub struct Pool {
    own: PoolClient,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.own.shared;
        f.debug_struct("Pool")
            .field("name", &s.name)
            .field("backend", &s.backend)
            .field("base", &format_args!("{:#x}", s.base))
            .field("capacity", &s.capacity)
            .field("growable", &s.growable)
            .field("home", &s.home)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// The pool's state (tests).
    #[cfg(test)]
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.own.shared
    }

    pub(super) fn from_shared(shared: Arc<Shared>) -> Pool {
        Pool {
            own: PoolClient { shared, id: 0 },
        }
    }

    /// A pool of `capacity` bytes of host memory (rounded down to a multiple of 256).
    pub fn host(capacity: usize) -> Result<Pool, Error> {
        PoolBuilder::new(capacity).build_host()
    }

    /// A pool of `capacity` bytes reserved on `backend` with default settings.
    pub fn new_in<B: Backend + Send + Sync + 'static>(
        backend: B,
        capacity: usize,
    ) -> Result<Pool, Error> {
        PoolBuilder::new(capacity).build_in(backend)
    }

    /// A builder for the other settings.
    pub fn builder(capacity: usize) -> PoolBuilder {
        PoolBuilder::new(capacity)
    }

    /// A handle that allocates from this pool as client `name`, under `quota` bytes (counted
    /// as reserved bytes, like [`PoolStats::in_use`]; `usize::MAX` for none). Clones share the
    /// client. Quotas may add up to more than the capacity; the capacity stays the hard cap.
    ///
    /// Each call makes a new client, which the pool keeps with its counters for as long as it
    /// lives ([`client_stats`](Self::client_stats) reports a client after its handles are
    /// gone, which is how a finished tenant's use is read): make a client once per tenant (an
    /// engine, a model, a request queue) and clone it, not one per request.
    pub fn client(&self, name: &str, quota: usize) -> PoolClient {
        let id = self.own.shared.add_client(name, quota);
        PoolClient {
            shared: self.own.shared.clone(),
            id,
        }
    }

    /// The pool's own client (named after the pool, no quota: only the capacity limits it):
    /// what the pool's `allocate` uses.
    pub fn own_client(&self) -> &PoolClient {
        &self.own
    }

    /// Allocates `size` bytes at `align` (0 = 256) for the home stream; returns the address.
    /// (On a host pool, what is written there must leave the bytes initialized: see the
    /// [module documentation](super#backends-and-devices).)
    #[inline]
    pub fn allocate(&self, size: usize, align: usize) -> Result<u64, Error> {
        self.own.allocate(size, align)
    }

    /// Allocates for use on `stream`.
    pub fn allocate_on(&self, size: usize, align: usize, stream: StreamId) -> Result<u64, Error> {
        self.own.allocate_on(size, align, stream)
    }

    /// Allocates with every option ([`AllocRequest`]).
    pub fn allocate_with(&self, request: AllocRequest<'_>) -> Result<u64, Error> {
        self.own.allocate_with(request)
    }

    /// A reservation for the blocks of a CUDA graph captured on (and replayed on) `stream`,
    /// allocated as the pool's own client: see [`GraphReservation`] and the
    /// [`graph`](super::graph) module for what holds.
    pub fn graph_reservation(&self, stream: StreamId) -> Result<GraphReservation, Error> {
        self.own.graph_reservation(stream)
    }

    /// Allocates for a stream that is capturing a CUDA graph whose owner keeps the block
    /// allocated for the graph's whole life and frees it only once no replay can run (as
    /// PyTorch's graph pools do); see [`PoolClient::allocate_for_capture`].
    pub fn allocate_for_capture(&self, request: AllocRequest<'_>) -> Result<u64, Error> {
        self.own.allocate_for_capture(request)
    }

    /// Frees any client's allocation at `addr`, on the home stream. An address the pool did not
    /// hand out, or already freed, is an [`Error::UnknownAddress`], and one that a
    /// [`PoolSlice`] owns (dropping the slice frees it) an [`Error::InvalidArgument`]; either
    /// changes nothing.
    #[inline]
    pub fn deallocate(&self, addr: u64) -> Result<(), Error> {
        self.own
            .shared
            .deallocate(None, FreeRequest::new(addr), false)
    }

    /// Frees any client's allocation at `addr` on `stream` (see [`StreamSync`] for when the
    /// block is reused).
    pub fn deallocate_on(&self, addr: u64, stream: StreamId) -> Result<(), Error> {
        self.own
            .shared
            .deallocate(None, FreeRequest::new(addr).on(stream), false)
    }

    /// Frees with every option ([`FreeRequest`]: a size check, a stream).
    pub fn deallocate_with(&self, request: FreeRequest) -> Result<(), Error> {
        self.own.shared.deallocate(None, request, false)
    }

    /// A typed slice of `len` elements from the pool's own client, freed on drop.
    pub fn alloc_slice<T: crate::Element>(&self, len: usize) -> Result<PoolSlice<T>, Error> {
        self.own.alloc_slice(len)
    }

    /// Returns blocks freed on other streams whose events have completed to the free lists
    /// now (allocation does this too), and the free blocks that thread heaps of other streams
    /// gave back once those streams are done with them; the bytes reclaimed.
    pub fn reclaim(&self) -> Result<usize, Error> {
        self.own.shared.reclaim()
    }

    /// Gives back the memory of every chunk of a growable region that holds no live byte;
    /// returns the bytes unmapped (always 0 for a classic region, which holds its capacity
    /// until the pool goes). Addresses do not move: the region is mapped again where
    /// allocations reach it later.
    ///
    /// Stream order holds: blocks freed on the home stream may still be in use by work queued
    /// there, so `trim` first waits for the home stream ([`StreamSync::synchronize`]; it
    /// blocks the calling thread, without the pool's lock held); blocks freed on other streams
    /// count as free only once their events have completed. Blocks waiting in the reuse cache
    /// are merged first. While the trim waits, other threads keep allocating and freeing, and
    /// work queued on the home stream may call into the pool: a block freed on the home stream
    /// meanwhile waits behind an event recorded there (and is reclaimed, not unmapped, once it
    /// completes); where thread heaps give free blocks back during each of a few waits, the
    /// trim gives up and returns 0 rather than wait with the pool's lock held. An error from
    /// the stream runtime or the driver stops the trim; what was unmapped before stays
    /// unmapped and the pool keeps serving.
    ///
    /// ```
    /// use devarena::backend::HostVirtualMemory;
    /// use devarena::Pool;
    ///
    /// let pool = Pool::builder(16 << 20).build_mapped(HostVirtualMemory::new(1 << 20)?)?;
    /// let a = pool.allocate(3 << 20, 0)?; // chunks 0..3
    /// let b = pool.allocate(1 << 20, 0)?; // chunk 3
    /// pool.deallocate(a)?;
    /// assert_eq!(pool.stats().mapped, 4 << 20);
    /// assert_eq!(pool.trim()?, 3 << 20); // `b`'s chunk stays
    /// assert_eq!(pool.stats().mapped, 1 << 20);
    /// # pool.deallocate(b)?;
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn trim(&self) -> Result<usize, Error> {
        self.own.shared.trim_to(0)
    }

    /// As [`trim`](Self::trim), but stops once at most `keep` bytes stay mapped (free chunks at
    /// the highest addresses go first).
    pub fn trim_to(&self, keep: usize) -> Result<usize, Error> {
        self.own.shared.trim_to(keep)
    }

    /// Waits for the home stream's work, takes back blocks freed on other streams whose events
    /// have completed, and applies the release threshold: free chunks are unmapped until at
    /// most [`release_threshold`](Self::release_threshold) bytes stay mapped. Returns the
    /// bytes unmapped. Blocks the calling thread (see [`trim`](Self::trim)).
    ///
    /// ```
    /// use devarena::backend::HostVirtualMemory;
    /// use devarena::Pool;
    ///
    /// let pool = Pool::builder(16 << 20)
    ///     .release_threshold(2 << 20)
    ///     .build_mapped(HostVirtualMemory::new(1 << 20)?)?;
    /// let a = pool.allocate(6 << 20, 0)?;
    /// pool.deallocate(a)?;
    /// assert_eq!(pool.synchronize()?, 4 << 20); // 2 MiB stay mapped for what comes next
    /// assert_eq!(pool.stats().mapped, 2 << 20);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn synchronize(&self) -> Result<usize, Error> {
        self.own.shared.synchronize()
    }

    /// Bytes of free memory [`synchronize`](Self::synchronize) keeps mapped (see
    /// [`PoolBuilder::release_threshold`]).
    pub fn release_threshold(&self) -> usize {
        self.own.shared.release_threshold()
    }

    /// Changes the release threshold (see [`PoolBuilder::release_threshold`]).
    pub fn set_release_threshold(&self, bytes: usize) {
        self.own.shared.set_release_threshold(bytes);
    }

    /// How the region holds its memory.
    pub fn region_kind(&self) -> RegionKind {
        if self.own.shared.growable {
            RegionKind::Growable
        } else {
            RegionKind::Classic
        }
    }

    /// A snapshot of the counters, exact when it is taken: every thread heap is locked for a
    /// moment and added in. Nothing is given back or merged: blocks that wait in a reuse
    /// cache or in a heap's spans are described as they would be merged before a request
    /// needed them (`free`, `largest_free`, `free_blocks` count touching ones as one block),
    /// so a thread that reads the statistics while others allocate leaves their heaps and
    /// caches as they are.
    pub fn stats(&self) -> PoolStats {
        self.own.shared.stats()
    }

    /// How many thread heaps this pool has now (see [`PoolBuilder::thread_heaps`]): one for
    /// each thread and stream it allocates on, made for threads that met another on the
    /// pool's lock, or allocated while another thread had a heap, or allocated on a stream
    /// other than the home stream (or made an allocation at all, with
    /// [`PoolBuilder::eager_thread_heaps`]), and have not exited. A thread gives
    /// its heaps back in its thread-local destructors, which run after its closure returns:
    /// `JoinHandle::join` waits for them, the end of a `std::thread::scope` may not.
    pub fn thread_heaps(&self) -> usize {
        self.own.shared.thread_heaps()
    }

    /// Every client's counters, the pool's own client first.
    pub fn client_stats(&self) -> Vec<ClientStats> {
        self.own.shared.all_client_stats()
    }

    /// Every live allocation, by address.
    pub fn leak_report(&self) -> LeakReport {
        self.own.shared.leak_report()
    }

    /// Changes what is recorded for allocations made from now on.
    pub fn set_tracking(&self, tracking: Tracking) {
        self.own.shared.set_tracking(tracking);
    }

    /// What is recorded for new allocations.
    pub fn tracking(&self) -> Tracking {
        self.own.shared.tracking()
    }

    /// Replaces the event sink (`None` stops the event log).
    pub fn set_events(&self, sink: Option<Arc<dyn EventSink>>) {
        self.own.shared.set_sink(sink);
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.own.shared.name
    }

    /// Bytes the pool manages (its hard cap).
    pub fn capacity(&self) -> usize {
        self.own.shared.capacity
    }

    /// Start address of the region (host address or `CUdeviceptr`).
    pub fn base(&self) -> u64 {
        self.own.shared.base
    }

    /// Whether `addr` lies inside the region (not whether it is live).
    pub fn contains(&self, addr: u64) -> bool {
        let s = &self.own.shared;
        addr >= s.base && addr - s.base < s.capacity as u64
    }

    /// The backend's name ("host", "cuda", ...).
    pub fn backend_name(&self) -> &'static str {
        self.own.shared.backend
    }

    /// Whether the region is host memory that [`PoolSlice`] may hand out as `&mut [T]`.
    pub fn is_host(&self) -> bool {
        self.own.shared.memory == MemoryKind::Host
    }

    /// The kind of memory the region is.
    pub fn memory(&self) -> MemoryKind {
        self.own.shared.memory
    }

    /// The pool's stream runtime, if it has one ([`PoolBuilder::streams`]).
    pub fn stream_runtime(&self) -> Option<&Arc<dyn StreamSync>> {
        self.own.shared.streams.as_ref()
    }

    /// The stream the pool belongs to ([`StreamId::DEFAULT`] without a stream runtime).
    pub fn home_stream(&self) -> StreamId {
        self.own.shared.home
    }
}

/// A handle on a [`Pool`] for one client: a name and a quota. Cloneable, `Send + Sync`; keeps
/// the pool's region alive.
#[derive(Clone)]
pub struct PoolClient {
    shared: Arc<Shared>,
    id: u32,
}

impl fmt::Debug for PoolClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.shared.client_stats(self.id);
        f.debug_struct("PoolClient")
            .field("pool", &self.shared.name)
            .field("name", &c.name)
            .field("quota", &c.quota)
            .field("in_use", &c.in_use)
            .finish()
    }
}

impl PoolClient {
    /// Allocates `size` bytes at `align` (0 = 256) for the home stream; returns the address.
    /// (On a host pool, what is written there must leave the bytes initialized: see the
    /// [module documentation](super#backends-and-devices).)
    #[inline]
    pub fn allocate(&self, size: usize, align: usize) -> Result<u64, Error> {
        self.shared
            .allocate(self.id, AllocRequest::new(size, align), false)
    }

    /// Allocates for use on `stream`.
    pub fn allocate_on(&self, size: usize, align: usize, stream: StreamId) -> Result<u64, Error> {
        self.shared
            .allocate(self.id, AllocRequest::new(size, align).on(stream), false)
    }

    /// Allocates with every option ([`AllocRequest`]).
    pub fn allocate_with(&self, request: AllocRequest<'_>) -> Result<u64, Error> {
        self.shared.allocate(self.id, request, false)
    }

    /// A reservation for the blocks of a CUDA graph captured on (and replayed on) `stream`,
    /// allocated as this client (under its quota): see [`GraphReservation`].
    pub fn graph_reservation(&self, stream: StreamId) -> Result<GraphReservation, Error> {
        GraphReservation::open(self.clone(), stream)
    }

    /// Allocates for a stream that is capturing a CUDA graph, for an owner that keeps the
    /// block allocated for the graph's whole life and frees it only once no replay of the
    /// graph can run any more (PyTorch's graph pools do: they free their segments after the
    /// graph is destroyed).
    ///
    /// Unlike [`allocate_with`](Self::allocate_with) for another stream, it records no event
    /// on the request's stream and makes it wait for nothing: a capture would record either,
    /// or refuse it and invalidate itself. Instead the calling thread waits for the home
    /// stream when the home stream freed anything since the last such wait, so that no block
    /// still used by work queued there is handed out (see the [`graph`](super::graph) module).
    /// The block is an ordinary allocation: to have the pool hold blocks that are freed while
    /// the graph lives, use a [`GraphReservation`] instead.
    pub fn allocate_for_capture(&self, request: AllocRequest<'_>) -> Result<u64, Error> {
        self.shared
            .allocate_for_graph(self.id, request, false, None)
    }

    /// Frees this client's allocation at `addr` on the home stream. An address that is not a
    /// live allocation is an [`Error::UnknownAddress`]; another client's allocation, or one
    /// that a [`PoolSlice`] owns (dropping the slice frees it), is an
    /// [`Error::InvalidArgument`]; either changes nothing.
    #[inline]
    pub fn deallocate(&self, addr: u64) -> Result<(), Error> {
        self.shared
            .deallocate(Some(self.id), FreeRequest::new(addr), false)
    }

    /// Frees this client's allocation at `addr` on `stream`.
    pub fn deallocate_on(&self, addr: u64, stream: StreamId) -> Result<(), Error> {
        self.shared
            .deallocate(Some(self.id), FreeRequest::new(addr).on(stream), false)
    }

    /// Frees this client's allocation with every option ([`FreeRequest`]: a size check, a
    /// stream).
    pub fn deallocate_with(&self, request: FreeRequest) -> Result<(), Error> {
        self.shared.deallocate(Some(self.id), request, false)
    }

    /// A typed slice of `len` elements for the home stream, aligned to at least 256 bytes and
    /// to `T`, freed on drop.
    pub fn alloc_slice<T: crate::Element>(&self, len: usize) -> Result<PoolSlice<T>, Error> {
        PoolSlice::new_in(self, len, None)
    }

    /// A typed slice of `len` elements for use on `stream`, freed on `stream` on drop.
    pub fn alloc_slice_on<T: crate::Element>(
        &self,
        len: usize,
        stream: StreamId,
    ) -> Result<PoolSlice<T>, Error> {
        PoolSlice::new_in(self, len, Some(stream))
    }

    /// The client's name.
    pub fn name(&self) -> String {
        self.shared.client_name(self.id)
    }

    /// The client's counters.
    pub fn stats(&self) -> ClientStats {
        self.shared.client_stats(self.id)
    }

    /// The whole pool's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.shared.stats()
    }

    /// Whether the pool's region is host memory.
    pub fn is_host(&self) -> bool {
        self.shared.memory == MemoryKind::Host
    }

    /// The kind of memory the pool's region is.
    pub fn memory(&self) -> MemoryKind {
        self.shared.memory
    }

    /// The pool's backend ("host", "cuda", ...).
    pub fn backend_name(&self) -> &'static str {
        self.shared.backend
    }

    pub(crate) fn allocate_owned(
        &self,
        size: usize,
        align: usize,
        stream: Option<StreamId>,
    ) -> Result<u64, Error> {
        let request = AllocRequest {
            size,
            align,
            stream,
            tag: None,
        };
        self.shared.allocate(self.id, request, true)
    }

    pub(crate) fn free_owned(&self, addr: u64, stream: StreamId) -> Result<(), Error> {
        self.shared
            .deallocate(Some(self.id), FreeRequest::new(addr).on(stream), true)
    }

    pub(crate) fn home_stream(&self) -> StreamId {
        self.shared.home
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(super) fn id(&self) -> u32 {
        self.id
    }
}

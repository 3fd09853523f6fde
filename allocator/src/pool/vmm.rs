//! Which parts of a pool's region are backed by memory: mapping on demand, trimming, and the
//! counters of both.
//!
//! A growable region reserves addresses for the whole capacity on a [`VirtualMemory`] and maps
//! physical memory in chunks of one size (a power of two, a multiple of the granularity) as
//! allocations reach into unmapped space; one bit per chunk says whether it is mapped
//! ([`ChunkMap`]). The engine asks [`ChunkMap::covers`] after every block a TLSF index hands
//! out (a shift, a mask and a load on the fast path), and [`Mapping::ensure`] maps what is
//! missing. [`Mapping::trim`] unmaps chunks that lie entirely inside free blocks; the engine
//! makes sure no queued work can still touch them first (see `Shared::trim_to`).
//!
//! The bits are read without the pool's lock, by thread heaps, and written only under it: a
//! bit is set after its chunk was mapped, and cleared by a trim, which gives every thread heap
//! back first and unmaps only chunks inside free blocks of the pool's index, or by
//! [`Mapping::undo_last`], which unmaps what a refused request of a heap just mapped, under
//! that heap's lock, in chunks no other block touches. A chunk under another block of a span
//! a heap holds is therefore never unmapped while the heap holds it, so a heap that sees the
//! bits of its block set may use the block (the bits are read with `Acquire`
//! and set with `Release`: what mapping did is visible to the reader).
//!
//! A classic region (one backend allocation) is a mapping whose one chunk is the whole region,
//! mapped from the start: the same check answers yes at once, and there is nothing to trim.

use alloc::boxed::Box;
use alloc::format;
use alloc::sync::Arc;
use alloc::vec::Vec;
#[cfg(not(all(loom, test)))]
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering;
// The model check of the chunk bits' publication (`RUSTFLAGS="--cfg loom"`, see `loom_tests`).
#[cfg(all(loom, test))]
use loom::sync::atomic::AtomicU64;

use super::BLOCK_GRANULE;
use crate::backend::{MemoryKind, VirtualMemory};
use crate::error::Error;
use crate::plan::align_up;
use crate::pool::engine::CalledBack;
use crate::pool::lock::{LockId, caught, logged, logged_unlocked, panic_message};

/// What a pool's statistics say about its mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MappingStats {
    pub(super) mapped: usize,
    pub(super) peak_mapped: usize,
    pub(super) chunk: usize,
    pub(super) maps: u64,
    pub(super) unmaps: u64,
}

/// Which chunks of a region are mapped, one bit each; clones share the bits. Written only
/// by the [`Mapping`] (under the pool's lock), read by anyone (see the module docs).
#[derive(Clone)]
pub(super) struct ChunkMap {
    base: u64,
    /// log2 of the chunk size (63 for a classic region: every offset is in chunk 0).
    shift: u32,
    /// One bit per chunk: mapped.
    words: Arc<[AtomicU64]>,
}

impl ChunkMap {
    /// `chunks` chunks of `1 << shift` bytes from `base`, none mapped.
    fn new(base: u64, shift: u32, chunks: usize) -> ChunkMap {
        let words = (0..chunks.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        ChunkMap { base, shift, words }
    }

    #[inline(always)]
    fn bit(&self, chunk: usize) -> bool {
        self.words[chunk >> 6].load(Ordering::Acquire) >> (chunk & 63) & 1 == 1
    }

    /// Sets or clears a chunk's bit (the pool's lock held: the only writer).
    fn set_bit(&self, chunk: usize, on: bool) {
        let word = &self.words[chunk >> 6];
        let bit = 1u64 << (chunk & 63);
        if on {
            word.fetch_or(bit, Ordering::Release);
        } else {
            word.fetch_and(!bit, Ordering::Release);
        }
    }

    /// The first and last chunk that `addr..addr + bytes` (inside the region, `bytes > 0`)
    /// touches.
    #[inline(always)]
    fn chunks_of(&self, addr: u64, bytes: u64) -> (u64, u64) {
        let offset = addr.wrapping_sub(self.base);
        (offset >> self.shift, (offset + bytes - 1) >> self.shift)
    }

    /// Whether every chunk that `addr..addr + bytes` (a block a TLSF index handed out)
    /// touches is mapped: what the allocation paths ask of every block, so a shift, a mask and
    /// one load when the block lies in one 64-chunk word (always, for a classic region).
    #[inline(always)]
    pub(super) fn covers(&self, addr: u64, bytes: u64) -> bool {
        let (first, last) = self.chunks_of(addr, bytes);
        let word = (first >> 6) as usize;
        if word != (last >> 6) as usize {
            return self.covers_long(first as usize, last as usize);
        }
        let Some(bits) = self.words.get(word) else {
            return false;
        };
        // `last - first` < 64 and `first % 64 + (last - first)` = `last % 64` < 64.
        let mask = (u64::MAX >> (63 - (last - first))) << (first & 63);
        bits.load(Ordering::Acquire) & mask == mask
    }

    #[cold]
    #[inline(never)]
    fn covers_long(&self, first: usize, last: usize) -> bool {
        last < self.words.len() * 64 && (first..=last).all(|c| self.bit(c))
    }
}

/// The mapped chunks of a region (behind the pool's lock).
pub(super) struct Mapping {
    /// `None` for a classic region, mapped whole from the start.
    vm: Option<Box<dyn VirtualMemory>>,
    /// The bits, and where the region starts and how large a chunk is.
    map: ChunkMap,
    /// Bytes the pool hands out.
    capacity: usize,
    /// Bytes reserved: the capacity rounded up to a chunk (a classic region: the capacity).
    reserved: usize,
    /// Chunks mapped now, and the most ever.
    mapped: usize,
    peak: usize,
    /// Chunks mapped and unmapped so far.
    maps: u64,
    unmaps: u64,
    /// Bytes [`Shared::synchronize`](super::engine::Shared::synchronize) leaves mapped.
    pub(super) release_threshold: usize,
    /// What the last [`ensure`](Self::ensure) did: the block's chunks `first..=last`, those
    /// of them it mapped, and the peak before it; what [`undo_last`](Self::undo_last) may take
    /// back.
    last: Option<LastMap>,
    /// The pool's name and the backend's, for errors (the backend's asked once, when the
    /// region is reserved: an error path calls no more user code than it must).
    pool: Box<str>,
    backend: &'static str,
}

/// See [`Mapping::last`].
struct LastMap {
    first: usize,
    last: usize,
    fresh: Vec<usize>,
    peak: usize,
}

impl Mapping {
    /// A classic region of `capacity` bytes at `base`: one chunk, mapped.
    pub(super) fn whole(base: u64, capacity: usize) -> Mapping {
        Mapping {
            vm: None,
            map: {
                let map = ChunkMap::new(base, 63, 1);
                map.set_bit(0, true);
                map
            },
            capacity,
            reserved: capacity,
            mapped: 1,
            peak: 1,
            maps: 0,
            unmaps: 0,
            release_threshold: usize::MAX,
            last: None,
            pool: Box::from(""),
            backend: "",
        }
    }

    /// Reserves addresses for `capacity` bytes (a non-zero multiple of [`BLOCK_GRANULE`]) on
    /// `vm`, to be mapped in chunks of `chunk` bytes (the implementation's recommendation when
    /// `None`); nothing is mapped yet.
    /// Also the memory the backend maps, and its name, both asked once, here.
    pub(super) fn reserve(
        pool: &str,
        vm: Box<dyn VirtualMemory>,
        capacity: usize,
        chunk: Option<usize>,
    ) -> Result<(Mapping, MemoryKind, &'static str), Error> {
        // (Asked through `vm_call`, as every call into the backend: a panic is an error.)
        let name = vm_call(&*vm, pool, "?", "name", |vm| Ok(vm.name()))?;
        let memory = vm_call(&*vm, pool, name, "memory", |vm| Ok(vm.memory()))?;
        let granularity = vm_call(&*vm, pool, name, "granularity", |vm| Ok(vm.granularity()))?;
        if !granularity.is_power_of_two() || granularity < BLOCK_GRANULE {
            return Err(Error::invalid(format!(
                "pool `{pool}`: `{name}` maps in units of {granularity} bytes, not a power of \
                 two of at least {BLOCK_GRANULE}"
            )));
        }
        let chunk = match chunk {
            Some(chunk) => chunk,
            None => vm_call(&*vm, pool, name, "recommended_chunk", |vm| {
                Ok(vm.recommended_chunk())
            })?,
        };
        if !chunk.is_power_of_two() || chunk < granularity {
            return Err(Error::invalid(format!(
                "pool `{pool}`: a chunk of {chunk} bytes is not a power of two of at least \
                 `{name}`'s granularity, {granularity} bytes"
            )));
        }
        let reserved = align_up(capacity, chunk).ok_or_else(|| {
            Error::invalid(format!(
                "pool `{pool}`: a capacity of {capacity} bytes rounded up to {chunk}-byte \
                 chunks overflows usize"
            ))
        })?;
        // The map of chunks first (one bit a chunk, on the host): a region too large for it is
        // an error before anything is reserved.
        let chunks = reserved / chunk;
        let words = chunks.div_ceil(64);
        // (A probe: the map is then collected straight into its `Arc`, one allocation.)
        let mut probe: Vec<AtomicU64> = Vec::new();
        if probe.try_reserve_exact(words).is_err() {
            return Err(Error::invalid(format!(
                "pool `{pool}`: a region of {capacity} bytes in chunks of {chunk} bytes needs \
                 {} bytes of host memory to note which chunks are mapped, which could not be \
                 allocated; use larger chunks",
                words.saturating_mul(8)
            )));
        }
        drop(probe);
        let bits: Arc<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let base = vm_call(&*vm, pool, name, "reserve", |vm| vm.reserve(reserved))
            .map_err(|error| super::region::reserving(pool, capacity, error))?;
        let mapping = Mapping {
            vm: Some(vm),
            map: ChunkMap {
                base,
                shift: chunk.trailing_zeros(),
                words: bits,
            },
            capacity,
            reserved,
            mapped: 0,
            peak: 0,
            maps: 0,
            unmaps: 0,
            release_threshold: usize::MAX,
            last: None,
            pool: Box::from(pool),
            backend: name,
        };
        Ok((mapping, memory, name))
    }

    /// The region's start.
    pub(super) fn base(&self) -> u64 {
        self.map.base
    }

    /// The bits, for readers without the pool's lock.
    pub(super) fn chunk_map(&self) -> ChunkMap {
        self.map.clone()
    }

    /// Whether memory is mapped on demand (`false` for a classic region).
    pub(super) fn is_growable(&self) -> bool {
        self.vm.is_some()
    }

    /// Bytes per chunk (a classic region: the whole region).
    fn chunk(&self) -> usize {
        match self.vm {
            Some(_) => 1 << self.map.shift,
            None => self.reserved,
        }
    }

    /// Bytes mapped now.
    pub(super) fn mapped_bytes(&self) -> usize {
        self.mapped * self.chunk()
    }

    pub(super) fn stats(&self) -> MappingStats {
        MappingStats {
            mapped: self.mapped_bytes(),
            peak_mapped: self.peak * self.chunk(),
            chunk: self.chunk(),
            maps: self.maps,
            unmaps: self.unmaps,
        }
    }

    #[inline(always)]
    fn bit(&self, chunk: usize) -> bool {
        self.map.bit(chunk)
    }

    fn addr_of(&self, chunk: usize) -> u64 {
        self.map.base + ((chunk as u64) << self.map.shift)
    }

    /// The lowest start in the free block `addr..addr + bytes` (inside the region), a multiple
    /// of `align` (a power of two), from which `size` bytes lie in the block and in mapped
    /// chunks; `None` when there is none. It looks at each chunk the block touches: for a
    /// region out of device memory, which looks for mapped free memory before it fails.
    #[cold]
    pub(super) fn mapped_start(&self, addr: u64, bytes: u64, size: u64, align: u64) -> Option<u64> {
        debug_assert!(align.is_power_of_two() && size > 0);
        let end = addr.checked_add(bytes)?;
        let fit = |lo: u64, hi: u64| {
            let start = lo.checked_add(align - 1)? & !(align - 1);
            (start <= hi && hi - start >= size).then_some(start)
        };
        if self.vm.is_none() {
            return fit(addr, end);
        }
        let (first, last) = self.map.chunks_of(addr, bytes);
        let (mut c, last) = (first as usize, last as usize);
        while c <= last {
            if !self.bit(c) {
                c += 1;
                continue;
            }
            let run = c;
            while c <= last && self.bit(c) {
                c += 1;
            }
            // The run of mapped chunks `run..c`, within the block.
            let found = fit(self.addr_of(run).max(addr), self.addr_of(c).min(end));
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// Whether every chunk that `addr..addr + bytes` touches is mapped (see
    /// [`ChunkMap::covers`]).
    #[inline(always)]
    pub(super) fn covers(&self, addr: u64, bytes: u64) -> bool {
        self.map.covers(addr, bytes)
    }

    /// Maps every chunk of `addr..addr + bytes` (a block inside the region, `bytes > 0`) that is
    /// not mapped yet, in runs of consecutive chunks. On an error every chunk this call mapped
    /// is unmapped again and the mapping is as it was.
    #[cold]
    #[inline(never)]
    pub(super) fn ensure(&mut self, addr: u64, bytes: u64) -> Result<(), Error> {
        self.last = None;
        if self.vm.is_none() {
            return Ok(());
        }
        let (first, last) = self.map.chunks_of(addr, bytes);
        let (first, last) = (first as usize, last as usize);
        let chunk = self.chunk();
        let mut c = first;
        while c <= last {
            if self.bit(c) {
                c += 1;
                continue;
            }
            let start = c;
            while c <= last && !self.bit(c) {
                c += 1;
            }
            let count = c - start;
            let at = self.addr_of(start);
            let Some(vm) = &self.vm else { break };
            // SAFETY: the run lies inside the reservation (the block is inside the capacity,
            // which the reservation covers), starts at a chunk boundary (a multiple of the
            // granularity from the granularity-aligned base), and no chunk of it is mapped
            // (their bits are clear: a chunk's bit is set exactly while it is mapped).
            let mapped = vm_call(&**vm, &self.pool, self.backend, "map", |vm| unsafe {
                vm.map(at, chunk, count)
            });
            if let Err(error) = mapped {
                // SAFETY: the chunks of `first..start` with clear bits are the runs this call
                // mapped before this one failed (every chunk of the block whose bit was set is
                // skipped, and mapped ones are not marked until every run has mapped), for the
                // block being allocated, which the error gives back.
                unsafe { self.undo(first, start) };
                return Err(error);
            }
            self.maps += count as u64;
            logged(|| {
                log::trace!(
                    target: "devarena::pool",
                    "mapped {count} chunk(s) of {chunk} bytes at {at:#x}"
                )
            });
        }
        let (mut fresh, peak) = (Vec::new(), self.peak);
        for c in first..=last {
            if !self.bit(c) {
                self.map.set_bit(c, true);
                self.mapped += 1;
                fresh.push(c);
            }
        }
        self.peak = self.peak.max(self.mapped);
        self.last = Some(LastMap {
            first,
            last,
            fresh,
            peak,
        });
        Ok(())
    }

    /// Unmaps again the chunks that the last [`ensure`](Self::ensure) mapped for the block at
    /// `addr` (`bytes` long) and that lie wholly inside `within` (`(address, bytes)`; a range
    /// that ends at the capacity's end reaches to the reservation's, see [`reach`](Self::reach)), for a
    /// request refused after its memory was mapped. The chunks were unmapped before that
    /// `ensure`, so no live byte was in them then; where nothing else was allocated in
    /// `within` since, only the block at `addr` can touch them. A chunk that will not unmap
    /// stays mapped. Returns the chunks unmapped.
    ///
    /// # Safety
    ///
    /// The block at `addr` is given back, and since the `ensure` that mapped for it, no other
    /// block in `within` has been handed out, nor can be until the caller releases the pool's
    /// lock (and, for a thread heap's span, the heap's): then no live block touches a chunk
    /// this unmaps.
    #[cold]
    pub(super) unsafe fn undo_last(&mut self, addr: u64, bytes: u64, within: (u64, u64)) -> usize {
        let Some(LastMap {
            first,
            last,
            fresh,
            peak,
        }) = self.last.take()
        else {
            return 0;
        };
        let (f, l) = self.map.chunks_of(addr, bytes);
        if (f as usize, l as usize) != (first, last) {
            return 0;
        }
        let chunk = self.chunk() as u64;
        let end = self.map.base + self.reach(within.0 + within.1 - self.map.base);
        let mut undone = 0;
        for c in fresh {
            let at = self.addr_of(c);
            if at < within.0 || at + chunk > end || !self.bit(c) {
                continue;
            }
            // SAFETY: mapped (its bit is set) by the last `ensure`, for the block at `addr`,
            // which is given back, so no block was live in it then; the chunk lies inside
            // `within`, where nothing else was handed out since nor can be until the caller's
            // locks are released (the contract), or past the capacity, where no block lies.
            match unsafe { self.unmap_chunk(c) } {
                Ok(()) => undone += 1,
                Err(error) => logged(|| {
                    log::warn!(
                        target: "devarena::pool",
                        "taking back a chunk mapped for a refused request at {at:#x} failed: \
                         {error}; it stays mapped"
                    )
                }),
            }
        }
        // The most ever mapped, as it was where every chunk the call mapped is unmapped.
        self.peak = peak.max(self.mapped);
        undone
    }

    /// Unmaps chunk `c` (of a growable region) and counts it unmapped; an error (or a panic of
    /// the backend) leaves it mapped and counted so.
    ///
    /// # Safety
    ///
    /// The chunk is mapped (its bit is set), and nothing uses its memory any more, on the
    /// host or queued on a device.
    unsafe fn unmap_chunk(&mut self, c: usize) -> Result<(), Error> {
        let (at, chunk) = (self.addr_of(c), self.chunk());
        let Some(vm) = &self.vm else { return Ok(()) };
        // SAFETY: the caller's guarantee: one mapped chunk that nothing uses.
        vm_call(&**vm, &self.pool, self.backend, "unmap", |vm| unsafe {
            vm.unmap(at, chunk)
        })?;
        self.map.set_bit(c, false);
        self.mapped -= 1;
        self.unmaps += 1;
        Ok(())
    }

    /// Unmaps the chunks of `first..upto` that [`ensure`](Self::ensure) mapped before a later run
    /// failed (their bits are still clear). A chunk that will not unmap stays mapped, and is
    /// counted so.
    ///
    /// # Safety
    ///
    /// Every chunk of `first..upto` whose bit is clear was mapped by the `ensure` call that
    /// makes this one, for a block that it then gives back: nothing else uses it.
    #[cold]
    unsafe fn undo(&mut self, first: usize, upto: usize) {
        let chunk = self.chunk();
        for c in first..upto {
            if self.bit(c) {
                continue;
            }
            let at = self.addr_of(c);
            let Some(vm) = &self.vm else { return };
            // SAFETY: mapped by the calling `ensure` a moment ago (this function's contract);
            // no block that anyone uses lies in it (the block being allocated is given back).
            match vm_call(&**vm, &self.pool, self.backend, "unmap", |vm| unsafe {
                vm.unmap(at, chunk)
            }) {
                Ok(()) => self.unmaps += 1,
                Err(error) => {
                    logged(|| {
                        log::error!(
                            target: "devarena::pool",
                            "undoing a failed map, unmapping the chunk at {at:#x} failed: {error}; \
                             it stays mapped"
                        )
                    });
                    self.map.set_bit(c, true);
                    self.mapped += 1;
                    self.peak = self.peak.max(self.mapped);
                }
            }
        }
    }

    /// Where a range of the region that ends at offset `end` reaches: past the capacity the
    /// reservation is never handed out, so a range that ends at the capacity holds the last
    /// chunk's tail too (the reservation's end).
    fn reach(&self, end: u64) -> u64 {
        if end == self.capacity as u64 {
            self.reserved as u64
        } else {
            end
        }
    }

    /// Calls `f` with each mapped chunk that lies entirely inside the `free` blocks
    /// (`(address, bytes)`, inside the region) while it returns `true`; whether it always did.
    fn free_chunks(
        &self,
        free: impl Iterator<Item = (u64, u64)>,
        mut f: impl FnMut(usize) -> bool,
    ) -> bool {
        let chunk = self.chunk() as u64;
        for (addr, bytes) in free {
            let start = addr - self.map.base;
            let end = self.reach(start + bytes);
            let (first, stop) = (start.div_ceil(chunk) as usize, (end / chunk) as usize);
            if !(first..stop).filter(|&c| self.bit(c)).all(&mut f) {
                return false;
            }
        }
        true
    }

    /// Whether a [`trim`](Self::trim) of these `free` blocks would unmap anything: a mapped
    /// chunk of a growable region lies entirely inside one.
    pub(super) fn holds_free_chunks(&self, free: impl Iterator<Item = (u64, u64)>) -> bool {
        self.vm.is_some() && !self.free_chunks(free, |_| false)
    }

    /// Unmaps mapped chunks that lie entirely inside the `free` blocks (`(address, bytes)`,
    /// every free block of the region, none of them touching another), highest address
    /// first, until at most `keep` bytes stay mapped; returns the bytes unmapped.
    ///
    /// An unmap that fails stops the trim: the chunk stays mapped, the error is returned, what
    /// was unmapped before stays unmapped.
    ///
    /// # Safety
    ///
    /// Nothing, on the host or queued on a device, uses the `free` blocks any more, nor can
    /// until this returns.
    pub(super) unsafe fn trim(
        &mut self,
        free: impl Iterator<Item = (u64, u64)>,
        keep: usize,
    ) -> Result<usize, Error> {
        if self.vm.is_none() || self.mapped_bytes() <= keep {
            return Ok(0);
        }
        let chunk = self.chunk() as u64;
        let mut candidates = Vec::new();
        self.free_chunks(free, |c| {
            candidates.push(c);
            true
        });
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let mut released = 0;
        for c in candidates {
            if self.mapped_bytes() <= keep {
                break;
            }
            // SAFETY: a mapped chunk (its bit is set) inside a free block, which nothing uses
            // any more (this function's contract).
            unsafe { self.unmap_chunk(c) }?;
            released += chunk as usize;
        }
        if released > 0 {
            logged(|| {
                log::debug!(
                    target: "devarena::pool",
                    "unmapped {released} bytes in chunks of {chunk} bytes; {} bytes stay mapped",
                    self.mapped_bytes()
                )
            });
        }
        Ok(released)
    }
}

/// Runs `f`, a call into the virtual-memory backend `vm` (user code, made while this thread
/// may hold the pool's lock and a heap's), named `what` in errors: a call back into a pool
/// from it that would wait for a lock fails instead of waiting for ever (allocations and
/// frees return an error; statistics, reports and settings unwind, see `Shared::lock_wait`),
/// and that unwind or a panic of the backend becomes the call's error, before it could leave
/// the pool's state half-changed. The panic's payload is dropped inside the callback's frame
/// too: its destructor is user code, run while this thread still holds the locks, and a call
/// back into the pool from it must fail as the backend's own would.
fn vm_call<R>(
    vm: &dyn VirtualMemory,
    pool: &str,
    backend: &str,
    what: &str,
    f: impl FnOnce(&dyn VirtualMemory) -> Result<R, Error>,
) -> Result<R, Error> {
    LockId::ANY.callback(|| {
        caught(|| f(vm))
            .unwrap_or_else(|payload| Err(vm_unwound(pool, backend, what, payload.payload())))
    })
}

/// The error of a virtual-memory call that unwound: a call back into the pool that it must
/// not make ([`CalledBack`]), or its own panic, with the panic's message.
#[cold]
#[inline(never)]
fn vm_unwound(
    pool: &str,
    backend: &str,
    what: &str,
    payload: &(dyn core::any::Any + Send),
) -> Error {
    if let Some(CalledBack(message)) = payload.downcast_ref::<CalledBack>() {
        return Error::invalid(message.clone());
    }
    Error::invalid(match panic_message(payload) {
        Some(message) => format!(
            "pool `{pool}`: the virtual-memory backend `{backend}` panicked in `{what}`: \
             {message}"
        ),
        None => {
            format!("pool `{pool}`: the virtual-memory backend `{backend}` panicked in `{what}`")
        }
    })
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let chunk = self.chunk();
        let Some(vm) = self.vm.take() else { return };
        // The last handle to the pool is gone, but work queued on the device may still use
        // the memory: wait for it, as freeing a classic region does. Where the wait fails,
        // such work may still reach the chunks, which must not be unmapped under it: they
        // stay mapped, with the reservation, for good (a failed context is torn down with
        // its memory).
        if self.mapped > 0 {
            if let Err(error) = vm_call(&*vm, &self.pool, self.backend, "synchronize", |vm| {
                vm.synchronize()
            }) {
                logged_unlocked(|| {
                    log::error!(
                        target: "devarena::pool",
                        "tearing down a region of `{}` at {:#x}: waiting for the device failed \
                         ({error}); leaving its {} mapped chunk(s) and its reservation of {} \
                         bytes as they are",
                        self.backend,
                        self.map.base,
                        self.mapped,
                        self.reserved
                    )
                });
                return;
            }
        }
        let mut stuck = 0;
        for c in 0..self.reserved >> self.map.shift {
            if !self.bit(c) {
                continue;
            }
            let at = self.addr_of(c);
            // SAFETY: a mapped chunk; the pool is gone, and with it every handle, slice and
            // view that reached the chunk from the host, and work queued on the device was
            // waited for above (where nothing is mapped, there is nothing to wait for).
            if let Err(error) = vm_call(&*vm, &self.pool, self.backend, "unmap", |vm| unsafe {
                vm.unmap(at, chunk)
            }) {
                stuck += 1;
                logged_unlocked(|| {
                    log::error!(
                        target: "devarena::pool",
                        "tearing down a region of `{}`: unmapping the chunk at {at:#x} failed: \
                         {error}",
                        self.backend
                    )
                });
            }
        }
        if stuck > 0 {
            // The reservation cannot be freed under a mapping: it stays, with those chunks.
            return;
        }
        let (base, reserved) = (self.map.base, self.reserved);
        // SAFETY: the reservation came from `reserve` with this size, and nothing in it is
        // mapped any more.
        let freed = vm_call(
            &*vm,
            &self.pool,
            self.backend,
            "free_reservation",
            |vm| unsafe { vm.free_reservation(base, reserved) },
        );
        if let Err(error) = freed {
            logged_unlocked(|| {
                log::error!(
                    target: "devarena::pool",
                    "tearing down a region of `{}`: freeing the reservation of {} bytes at \
                     {:#x} failed: {error}",
                    self.backend,
                    self.reserved,
                    self.map.base
                )
            });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

/// Model checks of the chunk bits under every interleaving loom explores (run with
/// `RUSTFLAGS="--cfg loom" cargo test -p devarena --lib loom --release`).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// The pool maps a chunk (here: writes what stands for its page tables) and then sets its
    /// bit; a heap that checks the bit without the pool's lock and finds it set uses the
    /// memory. Loom reports a data race if the heap could see the bit without seeing the
    /// mapping that came before it (it does with a relaxed load in `covers`).
    #[test]
    fn loom_a_heap_that_sees_a_chunk_bit_sees_the_mapping() {
        loom::model(|| {
            const CHUNK: u32 = 21;
            let map = ChunkMap::new(1 << 40, CHUNK, 2);
            let memory = Arc::new([UnsafeCell::new(0u64), UnsafeCell::new(0u64)]);
            let pool = {
                let (map, memory) = (map.clone(), memory.clone());
                loom::thread::spawn(move || {
                    for chunk in 0..2 {
                        // SAFETY: no one reads a chunk's cell before its bit is set.
                        memory[chunk].with_mut(|m| unsafe { *m = 0xC0DE + chunk as u64 });
                        map.set_bit(chunk, true);
                    }
                })
            };
            // A block over both chunks, then one in the second chunk only.
            let (base, chunk) = (1u64 << 40, 1u64 << CHUNK);
            for (addr, bytes, chunks) in [(base, 2 * chunk, 0..2), (base + chunk, 256, 1..2)] {
                if map.covers(addr, bytes) {
                    for c in chunks {
                        // SAFETY: the bit was set after the cell was written (Release/Acquire).
                        let v = memory[c].with(|m| unsafe { *m });
                        assert_eq!(v, 0xC0DE + c as u64);
                    }
                }
            }
            pool.join().unwrap();
            assert!(map.covers(base, 2 * chunk));
        });
    }
}

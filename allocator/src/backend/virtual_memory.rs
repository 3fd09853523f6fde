//! Virtual memory: a range of addresses reserved once, with physical memory mapped under it in
//! chunks as it is needed and unmapped when it is not. What a growable pool region needs from a
//! device (CUDA's `cuMemAddressReserve` / `cuMemCreate` / `cuMemMap` / `cuMemUnmap`, in
//! `backend::cuda` as `CudaVirtualMemory`), and a host stand-in for tests,
//! [`HostVirtualMemory`].

use crate::backend::MemoryKind;
use crate::error::Error;

/// Address space reserved up front and backed by physical memory on demand, one chunk at a
/// time: what lets a pool's addresses never move while its footprint follows its use.
///
/// The user of a `VirtualMemory` (the pool's region) reserves a range once, maps runs of
/// chunks inside it before it hands out addresses there, unmaps chunks that hold nothing, and
/// frees the reservation last. It keeps the bookkeeping (which chunk is mapped); the
/// implementation only does what it is asked and says when it cannot.
///
/// A pool calls it while it holds its lock (and may hold a thread heap's): a call from an
/// implementation into a pool that would wait for a lock, that pool's or any other's (another
/// pool's could be waiting for this one), fails instead of waiting (an allocation or free
/// returns an error; statistics, reports and settings abandon the call, and the pool call that
/// made it returns the error), and a panic of the implementation becomes the pool call's
/// error (`reserve`: the build's), with the pool as it was before the call. The pool abandons
/// such a call by unwinding through the implementation, as a panic would: a [`map`](Self::map)
/// that calls its pool after it has mapped must catch that unwind and return, or unmap what
/// it mapped before it lets it go on (see below: a `map` that panics has mapped nothing).
///
/// # Safety
///
/// Code above a `VirtualMemory` hands out memory inside the reservation as `&mut [T]` when it
/// is [`MemoryKind::Host`], so the implementation must tell the truth:
///
/// * [`granularity`](Self::granularity) is a power of two, the same on every call.
/// * [`reserve`](Self::reserve)`(bytes)` returns an address aligned to the granularity such
///   that `addr..addr + bytes` overlaps no other live reservation or allocation until it is
///   passed to [`free_reservation`](Self::free_reservation).
/// * After [`map`](Self::map) returns `Ok`, every chunk of the run is memory of kind
///   [`memory`](Self::memory), readable and writable (by the device, for device memory), and
///   stays so until that chunk is passed to [`unmap`](Self::unmap). On `Err`, or when it
///   panics, nothing of the run is mapped.
/// * When [`unmap`](Self::unmap) returns `Err` or panics, the chunk stays mapped as it was
///   (the pool goes on counting it mapped and may hand out addresses in it).
/// * Memory of kind [`MemoryKind::Host`] is initialized when it is mapped (zeroed, or filled
///   as [`HostVirtualMemory`] does): it is read as `&[T]` before anything is written there.
pub unsafe trait VirtualMemory: Send + Sync {
    /// A short name for messages and reports (`"cuda-vmm"`, `"host-vm"`).
    fn name(&self) -> &'static str;

    /// The kind of memory a mapped chunk is.
    fn memory(&self) -> MemoryKind;

    /// The smallest unit of mapping, a power of two: every mapped chunk starts at a multiple of
    /// it (from the reservation's start) and spans a multiple of it.
    fn granularity(&self) -> usize;

    /// The chunk size the implementation recommends: a power of two and a multiple of the
    /// granularity (the granularity itself by default).
    fn recommended_chunk(&self) -> usize {
        self.granularity()
    }

    /// Reserves `bytes` (a non-zero multiple of the granularity) of address space, with nothing
    /// mapped; returns its start, aligned to the granularity.
    fn reserve(&self, bytes: usize) -> Result<u64, Error>;

    /// Frees a reservation.
    ///
    /// # Safety
    ///
    /// `base` and `bytes` must be a reservation [`reserve`](Self::reserve) returned, not freed
    /// yet, with no chunk of it mapped any more.
    unsafe fn free_reservation(&self, base: u64, bytes: usize) -> Result<(), Error>;

    /// Backs `count` chunks of `chunk` bytes each, from `addr` on, with fresh memory, each chunk
    /// a mapping of its own (so that each can be unmapped alone). All or nothing: on an error
    /// no chunk of the run is left mapped.
    ///
    /// # Safety
    ///
    /// `chunk` must be a non-zero multiple of the granularity, `addr` a multiple of it, the run
    /// must lie inside one live reservation, and no chunk of it may be mapped.
    unsafe fn map(&self, addr: u64, chunk: usize, count: usize) -> Result<(), Error>;

    /// Unmaps one chunk that [`map`](Self::map) mapped; its memory goes back to where it came
    /// from.
    ///
    /// # Safety
    ///
    /// `addr` and `chunk` must be one chunk of an earlier successful `map` call, still mapped,
    /// and nothing may use its memory afterwards, including work already queued on a device.
    unsafe fn unmap(&self, addr: u64, chunk: usize) -> Result<(), Error>;

    /// Waits until nothing queued on the device can still use mapped memory (for CUDA: the
    /// context synchronizes). Called once before a region with mapped chunks is torn down; an
    /// error leaves those chunks mapped and the reservation in place for good (work queued on
    /// the device may still reach them). Nothing to wait for by default.
    fn synchronize(&self) -> Result<(), Error> {
        Ok(())
    }
}

// SAFETY: every promise is the shared implementation's own.
unsafe impl<V: VirtualMemory + ?Sized> VirtualMemory for alloc::sync::Arc<V> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn memory(&self) -> MemoryKind {
        (**self).memory()
    }
    fn granularity(&self) -> usize {
        (**self).granularity()
    }
    fn recommended_chunk(&self) -> usize {
        (**self).recommended_chunk()
    }
    fn reserve(&self, bytes: usize) -> Result<u64, Error> {
        (**self).reserve(bytes)
    }
    unsafe fn free_reservation(&self, base: u64, bytes: usize) -> Result<(), Error> {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).free_reservation(base, bytes) }
    }
    unsafe fn map(&self, addr: u64, chunk: usize, count: usize) -> Result<(), Error> {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).map(addr, chunk, count) }
    }
    unsafe fn unmap(&self, addr: u64, chunk: usize) -> Result<(), Error> {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).unmap(addr, chunk) }
    }
    fn synchronize(&self) -> Result<(), Error> {
        (**self).synchronize()
    }
}

#[cfg(feature = "std")]
pub use host_stand_in::{HostVirtualMemory, VmCall};

#[cfg(feature = "std")]
mod host_stand_in {
    use alloc::alloc::{Layout, alloc_zeroed, dealloc};
    use alloc::collections::BTreeMap;
    use alloc::format;
    use alloc::vec::Vec;
    use std::sync::{Mutex, MutexGuard};

    use super::VirtualMemory;
    use crate::backend::MemoryKind;
    use crate::error::Error;
    use crate::plan::align_up_u64;

    /// What a [`HostVirtualMemory`] was asked to do, in order.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum VmCall {
        /// A reservation of `bytes` at `base`.
        Reserve {
            /// Its start.
            base: u64,
            /// Its size.
            bytes: usize,
        },
        /// `count` chunks of `chunk` bytes mapped from `addr` on.
        Map {
            /// The first chunk's address.
            addr: u64,
            /// Bytes per chunk.
            chunk: usize,
            /// Chunks mapped.
            count: usize,
        },
        /// A map refused on purpose ([`HostVirtualMemory::fail_maps`]): nothing mapped.
        MapFailed {
            /// The first chunk's address.
            addr: u64,
            /// Bytes per chunk.
            chunk: usize,
            /// Chunks asked for.
            count: usize,
        },
        /// One chunk unmapped.
        Unmap {
            /// Its address.
            addr: u64,
            /// Its size.
            bytes: usize,
        },
        /// [`VirtualMemory::synchronize`] was called.
        Synchronize,
        /// The reservation at `base` freed.
        FreeReservation {
            /// Its start.
            base: u64,
            /// Its size.
            bytes: usize,
        },
    }

    /// One reservation: host memory taken up front, and the address handed out inside it.
    struct Reservation {
        base: u64,
        bytes: usize,
        raw: usize,
        layout: Layout,
    }

    #[derive(Default)]
    struct Inner {
        reservations: Vec<Reservation>,
        /// Mapped chunks: address → bytes.
        mapped: BTreeMap<u64, usize>,
        calls: Vec<VmCall>,
        /// Map calls to let through before failing, and how many to fail then.
        fail: (usize, usize),
        /// The most bytes mapped at once (all reservations together), as a device's memory.
        limit: Option<usize>,
        /// Whether `synchronize` fails (as a device whose context has failed does).
        fail_synchronize: bool,
    }

    /// A host stand-in for a device's virtual memory API: it reserves real host memory up
    /// front (from the global allocator, zeroed) and only *records* mapping, so that the
    /// logic above it (which chunk is mapped when, what is unmapped, what happens when mapping
    /// fails) can be tested without a GPU.
    ///
    /// It checks the rules a device's API enforces: a map inside a reservation, at the
    /// granularity, over chunks not yet mapped; an unmap of exactly one mapped chunk; no
    /// reservation freed while a chunk of it is mapped. Breaking one is an
    /// [`Error::InvalidArgument`] naming the addresses. A mapped chunk is filled with
    /// [`MAPPED_FILL`](Self::MAPPED_FILL) bytes (fresh device memory holds no promised value), an
    /// unmapped one with [`UNMAPPED_FILL`](Self::UNMAPPED_FILL) bytes, so a test can see what was
    /// given back. The memory stays readable either way: this is a stand-in, not an MMU.
    ///
    /// ```
    /// use devarena::backend::{HostVirtualMemory, VirtualMemory, VmCall};
    ///
    /// let vm = HostVirtualMemory::new(4096)?;
    /// let base = vm.reserve(64 << 10)?;
    /// // SAFETY: two chunks inside the reservation, not mapped yet.
    /// unsafe { vm.map(base, 4096, 2)? };
    /// assert_eq!(vm.mapped_bytes(), 8192);
    /// // A map told to fail maps nothing.
    /// vm.fail_maps(0, 1);
    /// // SAFETY: a chunk inside the reservation, not mapped yet.
    /// assert!(unsafe { vm.map(base + 8192, 4096, 1) }.is_err());
    /// assert_eq!(vm.mapped_bytes(), 8192);
    /// // SAFETY: chunks mapped above; nothing uses them.
    /// unsafe {
    ///     vm.unmap(base, 4096)?;
    ///     vm.unmap(base + 4096, 4096)?;
    ///     vm.free_reservation(base, 64 << 10)?;
    /// }
    /// assert_eq!(vm.calls()[1], VmCall::Map { addr: base, chunk: 4096, count: 2 });
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub struct HostVirtualMemory {
        granularity: usize,
        inner: Mutex<Inner>,
    }

    impl core::fmt::Debug for HostVirtualMemory {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            let inner = self.lock();
            f.debug_struct("HostVirtualMemory")
                .field("granularity", &self.granularity)
                .field("reservations", &inner.reservations.len())
                .field("mapped_chunks", &inner.mapped.len())
                .field("calls", &inner.calls.len())
                .finish()
        }
    }

    impl HostVirtualMemory {
        /// The byte a chunk is filled with when it is mapped.
        pub const MAPPED_FILL: u8 = 0xA5;
        /// The byte a chunk is filled with when it is unmapped.
        pub const UNMAPPED_FILL: u8 = 0xDE;

        /// A stand-in that maps in units of `granularity` bytes (a power of two from 256 to
        /// 1 GiB).
        pub fn new(granularity: usize) -> Result<Self, Error> {
            if !granularity.is_power_of_two() || !(256..=1 << 30).contains(&granularity) {
                return Err(Error::invalid(format!(
                    "host virtual memory: a granularity of {granularity} bytes is not a power of \
                     two from 256 to 1 GiB"
                )));
            }
            Ok(HostVirtualMemory {
                granularity,
                inner: Mutex::new(Inner::default()),
            })
        }

        fn lock(&self) -> MutexGuard<'_, Inner> {
            self.inner.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Lets the next `skip` map calls through, then fails `count` of them (each with
        /// [`Error::OutOfMemory`], nothing mapped), then lets every call through again.
        pub fn fail_maps(&self, skip: usize, count: usize) {
            self.lock().fail = (skip, count);
        }

        /// Makes every later [`synchronize`](VirtualMemory::synchronize) fail with an
        /// [`Error::Driver`] (`true`), as on a device whose context has failed, or succeed
        /// again (`false`). The call is recorded either way.
        pub fn fail_synchronize(&self, fail: bool) {
            self.lock().fail_synchronize = fail;
        }

        /// Makes a map that would take the bytes mapped (in every reservation together) past
        /// `bytes` fail with [`Error::OutOfMemory`], nothing mapped, as a device whose memory is
        /// full does; `None` (the default): no limit. Chunks mapped already stay mapped.
        pub fn set_memory_limit(&self, bytes: Option<usize>) {
            self.lock().limit = bytes;
        }

        /// Every call so far, in order.
        pub fn calls(&self) -> Vec<VmCall> {
            self.lock().calls.clone()
        }

        /// Bytes mapped now.
        pub fn mapped_bytes(&self) -> usize {
            self.lock().mapped.values().sum()
        }

        /// The chunks mapped now, `(address, bytes)`, by address.
        pub fn mapped_chunks(&self) -> Vec<(u64, usize)> {
            self.lock().mapped.iter().map(|(&a, &b)| (a, b)).collect()
        }

        /// Whether every byte of `addr..addr + bytes` lies in a mapped chunk.
        pub fn is_mapped(&self, addr: u64, bytes: usize) -> bool {
            let inner = self.lock();
            // A range past the end of the address space lies in no chunk.
            let Some(end) = addr.checked_add(bytes as u64) else {
                return false;
            };
            let mut at = addr;
            while at < end {
                match inner.mapped.range(..=at).next_back() {
                    Some((&start, &len)) if at < start + len as u64 => at = start + len as u64,
                    _ => return false,
                }
            }
            true
        }
    }

    impl Inner {
        fn reservation(&self, addr: u64, bytes: u64) -> Option<&Reservation> {
            self.reservations
                .iter()
                .find(|r| addr >= r.base && addr.saturating_add(bytes) <= r.base + r.bytes as u64)
        }
    }

    impl Drop for HostVirtualMemory {
        fn drop(&mut self) {
            let inner = self.lock();
            for r in &inner.reservations {
                // SAFETY: `raw` came from `alloc_zeroed(layout)` in `reserve` and is freed once:
                // here, or in `free_reservation`, which removes it from the list.
                unsafe { dealloc(r.raw as *mut u8, r.layout) };
            }
        }
    }

    /// Fills `bytes` bytes at `addr` with `value`.
    ///
    /// # Safety
    ///
    /// The range must lie inside a live reservation, in chunks that no allocation uses.
    unsafe fn fill(addr: u64, bytes: usize, value: u8) {
        // SAFETY: the caller's contract: the bytes belong to this stand-in's host memory and
        // nothing holds a reference to them.
        unsafe { core::ptr::write_bytes(addr as usize as *mut u8, value, bytes) }
    }

    // SAFETY: `reserve` hands out a fresh block of the global allocator, aligned to the
    // granularity, live until `free_reservation` (or the stand-in's drop); it is host memory,
    // readable and writable whether "mapped" or not, so every promise about mapped chunks
    // holds.
    unsafe impl VirtualMemory for HostVirtualMemory {
        fn name(&self) -> &'static str {
            "host-vm"
        }

        fn memory(&self) -> MemoryKind {
            MemoryKind::Host
        }

        fn granularity(&self) -> usize {
            self.granularity
        }

        fn reserve(&self, bytes: usize) -> Result<u64, Error> {
            let g = self.granularity;
            if bytes == 0 || bytes % g != 0 {
                return Err(Error::invalid(format!(
                    "host virtual memory: a reservation of {bytes} bytes is not a non-zero \
                     multiple of the granularity, {g} bytes"
                )));
            }
            // A granule more at a small alignment: the global allocator then takes large
            // blocks from `calloc`, whose pages stay untouched until used.
            let layout = bytes
                .checked_add(g)
                .and_then(|total| Layout::from_size_align(total, 16).ok())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "host virtual memory: a reservation of {bytes} bytes is too large"
                    ))
                })?;
            // SAFETY: the layout has a non-zero size.
            let raw = unsafe { alloc_zeroed(layout) };
            if raw.is_null() {
                return Err(Error::OutOfMemory {
                    backend: "host-vm",
                    requested: bytes,
                    free: None,
                    detail: None,
                });
            }
            // `raw + g` lies inside the block, so rounding up cannot overflow.
            let base = align_up_u64(raw as u64, g as u64).unwrap_or(raw as u64);
            let mut inner = self.lock();
            inner.reservations.push(Reservation {
                base,
                bytes,
                raw: raw as usize,
                layout,
            });
            inner.calls.push(VmCall::Reserve { base, bytes });
            Ok(base)
        }

        unsafe fn free_reservation(&self, base: u64, bytes: usize) -> Result<(), Error> {
            let mut inner = self.lock();
            let Some(at) = inner
                .reservations
                .iter()
                .position(|r| r.base == base && r.bytes == bytes)
            else {
                return Err(Error::invalid(format!(
                    "host virtual memory: no reservation of {bytes} bytes at {base:#x} to free"
                )));
            };
            let end = base + bytes as u64;
            if let Some((&addr, _)) = inner.mapped.range(base..end).next() {
                return Err(Error::invalid(format!(
                    "host virtual memory: the reservation at {base:#x} still has the chunk at \
                     {addr:#x} mapped"
                )));
            }
            let r = inner.reservations.swap_remove(at);
            inner.calls.push(VmCall::FreeReservation { base, bytes });
            // SAFETY: `raw` came from `alloc_zeroed(layout)` and leaves the list here, so it
            // is freed once.
            unsafe { dealloc(r.raw as *mut u8, r.layout) };
            Ok(())
        }

        unsafe fn map(&self, addr: u64, chunk: usize, count: usize) -> Result<(), Error> {
            let g = self.granularity;
            let mut inner = self.lock();
            let bytes = chunk.saturating_mul(count);
            if chunk == 0 || chunk % g != 0 || addr % g as u64 != 0 || count == 0 {
                return Err(Error::invalid(format!(
                    "host virtual memory: {count} chunks of {chunk} bytes at {addr:#x} are not \
                     at the granularity, {g} bytes"
                )));
            }
            if inner.reservation(addr, bytes as u64).is_none() {
                return Err(Error::invalid(format!(
                    "host virtual memory: {bytes} bytes at {addr:#x} lie outside every \
                     reservation"
                )));
            }
            let end = addr + bytes as u64;
            let overlap = inner.mapped.range(..end).next_back();
            if let Some((&at, &len)) = overlap.filter(|&(&a, &l)| a + l as u64 > addr) {
                return Err(Error::invalid(format!(
                    "host virtual memory: {bytes} bytes at {addr:#x} overlap the chunk of {len} \
                     bytes mapped at {at:#x}: mapped twice"
                )));
            }
            // Over the memory limit, or a failure asked for (the limit uses up no count).
            let over = inner.limit.is_some_and(|limit| {
                inner.mapped.values().sum::<usize>().saturating_add(bytes) > limit
            });
            let failed = over
                || match inner.fail {
                    (0, 0) => false,
                    (0, _) => {
                        inner.fail.1 -= 1;
                        true
                    }
                    _ => {
                        inner.fail.0 -= 1;
                        false
                    }
                };
            if failed {
                inner.calls.push(VmCall::MapFailed { addr, chunk, count });
                return Err(Error::OutOfMemory {
                    backend: "host-vm",
                    requested: bytes,
                    free: None,
                    detail: Some("simulated out of memory"),
                });
            }
            for i in 0..count as u64 {
                inner.mapped.insert(addr + i * chunk as u64, chunk);
            }
            inner.calls.push(VmCall::Map { addr, chunk, count });
            // SAFETY: inside a live reservation (checked), in chunks that were not mapped, so
            // no allocation uses them (the caller's contract).
            unsafe { fill(addr, bytes, Self::MAPPED_FILL) };
            Ok(())
        }

        unsafe fn unmap(&self, addr: u64, chunk: usize) -> Result<(), Error> {
            let mut inner = self.lock();
            match inner.mapped.get(&addr) {
                Some(&len) if len == chunk => {}
                Some(&len) => {
                    return Err(Error::invalid(format!(
                        "host virtual memory: an unmap of {chunk} bytes at {addr:#x}, but the \
                         chunk mapped there has {len} bytes (a mapping is unmapped whole)"
                    )));
                }
                None => {
                    return Err(Error::invalid(format!(
                        "host virtual memory: no chunk is mapped at {addr:#x}"
                    )));
                }
            }
            inner.mapped.remove(&addr);
            inner.calls.push(VmCall::Unmap { addr, bytes: chunk });
            // SAFETY: a chunk this stand-in mapped inside a live reservation (a reservation is
            // not freed while a chunk of it is mapped), which nothing uses any more (the
            // caller's contract).
            unsafe { fill(addr, chunk, Self::UNMAPPED_FILL) };
            Ok(())
        }

        fn synchronize(&self) -> Result<(), Error> {
            let mut inner = self.lock();
            inner.calls.push(VmCall::Synchronize);
            if inner.fail_synchronize {
                return Err(Error::Driver {
                    call: "synchronize",
                    name: "CUDA_ERROR_LAUNCH_FAILED".into(),
                    text: "failed on purpose (HostVirtualMemory::fail_synchronize)".into(),
                    code: 719,
                });
            }
            Ok(())
        }
    }
}

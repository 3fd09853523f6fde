//! The region a pool sub-allocates: reserved once, freed once when the last handle to the pool
//! goes. Either one backend allocation of the whole capacity (classic) or addresses reserved on
//! a [`VirtualMemory`] and mapped in chunks on demand (growable, see [`super::vmm`]).

use alloc::boxed::Box;
use alloc::format;

use super::BLOCK_GRANULE;
use super::lock::logged_unlocked;
use super::vmm::Mapping;
use crate::backend::{Allocation, Backend, MemoryKind, VirtualMemory};
use crate::error::Error;
use crate::plan::align_up_u64;

/// How a pool's region holds its memory.
///
/// Both kinds keep what the pool promises: addresses that never move, the capacity as a hard
/// cap, O(1) allocation and free. They differ in when memory is taken from the device:
///
/// * [`Growable`](Self::Growable) reserves *addresses* for the whole capacity (free of physical
///   cost) and maps memory under them in chunks when allocations first reach there; `trim()`
///   and the release threshold give chunks with no live byte back. The footprint follows the
///   use, so the capacity can be as large as the device. The default of device pools
///   (`Pool::cuda`, `PoolBuilder::build_cuda`).
/// * [`Classic`](Self::Classic) takes the whole capacity in one backend allocation when the pool
///   is made and holds it until the pool goes: what memory that must be one contiguous classic
///   allocation needs (registered for RDMA, shared through CUDA IPC), and what host pools and
///   [`PoolBuilder::build_in`](super::PoolBuilder::build_in) do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// One backend allocation of the whole capacity, made up front.
    Classic,
    /// Addresses reserved up front, memory mapped in chunks on demand.
    Growable,
}

/// The alignment the pool asks its backend for (it aligns the region itself).
const REGION_ALIGN: usize = 16;

/// Owns the region a pool reserved; frees it on drop. Erases the backend's type so that
/// [`Pool`](super::Pool) is not generic.
pub(super) trait RegionOwner: Send + Sync {}

struct OwnedRegion<B: Backend> {
    backend: B,
    allocation: Allocation,
}

impl<B: Backend + Send + Sync> RegionOwner for OwnedRegion<B> {}

impl<B: Backend> Drop for OwnedRegion<B> {
    fn drop(&mut self) {
        // SAFETY: the allocation came from this backend's `allocate` and is freed once, here:
        // the owner is dropped only when the last handle to the pool goes, so no address the
        // pool handed out can be used through the pool afterwards.
        if let Err(error) = unsafe { self.backend.deallocate(&self.allocation) } {
            logged_unlocked(|| {
                log::error!(
                    target: "devarena::pool",
                    "freeing a pool's region of {} bytes at {:#x} failed: {error}",
                    self.allocation.bytes,
                    self.allocation.addr
                )
            });
        }
    }
}

/// A backend's refusal of a pool's region, as an [`Error::InvalidArgument`] that names the
/// pool and its capacity (the backend's message names only the bytes it was asked for); other
/// errors (out of memory, a driver's) keep their kind and figures.
pub(super) fn reserving(pool: &str, capacity: usize, error: Error) -> Error {
    match error {
        Error::InvalidArgument { what } => Error::invalid(format!(
            "pool `{pool}`: a region of {capacity} bytes cannot be reserved: {what}"
        )),
        error => error,
    }
}

/// A reserved region: `capacity` bytes from `base`, both multiples of [`BLOCK_GRANULE`].
pub(super) struct Region {
    pub(super) base: u64,
    pub(super) capacity: usize,
    pub(super) memory: MemoryKind,
    pub(super) backend: &'static str,
    /// The classic region's one allocation (`None` for a growable region, whose mapping owns
    /// its reservation).
    pub(super) owner: Option<Box<dyn RegionOwner>>,
    pub(super) mapping: Mapping,
}

impl Region {
    /// Reserves `capacity` bytes (a non-zero multiple of [`BLOCK_GRANULE`]) on `backend` for
    /// the pool `pool`.
    pub(super) fn reserve<B: Backend + Send + Sync + 'static>(
        pool: &str,
        backend: B,
        capacity: usize,
    ) -> Result<Region, Error> {
        let name = backend.name();
        // One granule more than the capacity at a small alignment, and the pool uses the
        // 256-aligned `capacity` bytes inside: a host backend then gets the memory from
        // `calloc`, whose large blocks are untouched zero pages until used, instead of an
        // aligned allocation that is zeroed byte by byte up front.
        let bytes = capacity.checked_add(BLOCK_GRANULE).ok_or_else(|| {
            Error::invalid(format!(
                "pool `{pool}`: a capacity of {capacity} bytes overflows usize"
            ))
        })?;
        let allocation = backend
            .allocate(bytes, REGION_ALIGN)
            .map_err(|error| reserving(pool, capacity, error))?;
        let memory = backend.memory();
        let owner = Box::new(OwnedRegion {
            backend,
            allocation,
        });
        let base = align_up_u64(allocation.addr, BLOCK_GRANULE as u64)
            .filter(|base| base.checked_add(capacity as u64).is_some())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "pool `{pool}`: backend `{name}` returned a region at {:#x} whose {bytes} \
                     bytes overflow the address space",
                    allocation.addr
                ))
            })?;
        Ok(Region {
            base,
            capacity,
            memory,
            backend: name,
            owner: Some(owner),
            mapping: Mapping::whole(base, capacity),
        })
    }

    /// Reserves addresses for `capacity` bytes (a non-zero multiple of [`BLOCK_GRANULE`]) on
    /// `vm`, mapped in chunks of `chunk` bytes on demand, for the pool `pool`.
    pub(super) fn reserve_mapped<V: VirtualMemory + 'static>(
        pool: &str,
        vm: V,
        capacity: usize,
        chunk: Option<usize>,
    ) -> Result<Region, Error> {
        let (mapping, memory, backend) = Mapping::reserve(pool, Box::new(vm), capacity, chunk)?;
        Ok(Region {
            base: mapping.base(),
            capacity,
            memory,
            backend,
            owner: None,
            mapping,
        })
    }
}

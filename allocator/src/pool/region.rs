//! The region a pool sub-allocates: reserved once on a backend, freed once when the last handle
//! to the pool goes.

use alloc::boxed::Box;
use alloc::format;

use super::BLOCK_GRANULE;
use crate::backend::{Allocation, Backend, MemoryKind};
use crate::error::Error;
use crate::plan::align_up_u64;

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
            log::error!(
                target: "devarena::pool",
                "freeing a pool's region of {} bytes at {:#x} failed: {error}",
                self.allocation.bytes,
                self.allocation.addr
            );
        }
    }
}

/// A reserved region: `capacity` bytes from `base`, both multiples of [`BLOCK_GRANULE`].
pub(super) struct Region {
    pub(super) base: u64,
    pub(super) capacity: usize,
    pub(super) memory: MemoryKind,
    pub(super) backend: &'static str,
    pub(super) owner: Box<dyn RegionOwner>,
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
        let allocation = backend.allocate(bytes, REGION_ALIGN)?;
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
            owner,
        })
    }
}

//! [`PoolSlice`]: a typed allocation that frees itself.

use core::fmt;
use core::marker::PhantomData;
use core::mem::{align_of, size_of};

use alloc::format;

use super::lock::logged_unlocked;
use super::stream::StreamId;
use super::{DEFAULT_POOL_ALIGN, PoolClient};
use crate::error::Error;
use crate::layout::Element;

/// `len` elements of `T` in a pool, freed (on its stream) when dropped. (Dropped inside one of
/// its pool's own callbacks, where the pool is locked, it is freed by the first later call
/// that needs the memory or the counts: see [`StreamSync`](super::StreamSync).)
///
/// The block is aligned to at least 256 bytes and to `T`. Only the slice can free it: passing
/// its address to [`Pool::deallocate`](super::Pool::deallocate) is an error, so safe code can
/// never free memory a slice still hands out.
///
/// On a host pool, [`as_slice`](Self::as_slice) and [`as_mut_slice`](Self::as_mut_slice) give
/// the elements as `&[T]` / `&mut [T]` (the memory is always initialized: the host region
/// starts initialized, zeroed by the crate's host backends, and `T` accepts every bit pattern,
/// so a reused block reads as the values last written there). On a device pool they return an error naming the backend; the CUDA backend
/// adds the device view conversion (`device_view(&stream)` / `device_view_mut(&stream)` in
/// `backend/cuda.rs`: a view of [`addr`](Self::addr) and [`len`](Self::len) that implements
/// cudarc's `DeviceSlice` / `DevicePtr` / `DevicePtrMut` and `PushKernelArg`, borrowed from the
/// slice and ordered on the slice's stream).
///
/// ```
/// use devarena::Pool;
///
/// let pool = Pool::host(1 << 20)?;
/// let mut a = pool.alloc_slice::<u32>(1000)?;
/// a.as_mut_slice()?.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32);
/// assert_eq!(a.as_slice()?[999], 999);
/// assert_eq!(a.addr() % 256, 0);
/// assert!(pool.deallocate(a.addr()).is_err()); // only the slice frees it
/// drop(a);
/// assert_eq!(pool.stats().live, 0);
/// # Ok::<(), devarena::Error>(())
/// ```
pub struct PoolSlice<T: Element> {
    client: PoolClient,
    addr: u64,
    len: usize,
    stream: StreamId,
    _elements: PhantomData<T>,
}

impl<T: Element> PoolSlice<T> {
    pub(super) fn new_in(
        client: &PoolClient,
        len: usize,
        stream: Option<StreamId>,
    ) -> Result<Self, Error> {
        Self::new_with(client, len, stream, |bytes, align| {
            client.allocate_owned(bytes, align, stream)
        })
    }

    /// A slice whose block `allocate(bytes, align)` takes (as an owned allocation of `client`
    /// for `stream`).
    pub(super) fn new_with(
        client: &PoolClient,
        len: usize,
        stream: Option<StreamId>,
        allocate: impl FnOnce(usize, usize) -> Result<u64, Error>,
    ) -> Result<Self, Error> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            Error::invalid(format!(
                "a pool slice of {len} elements of {} ({} bytes each) overflows usize",
                core::any::type_name::<T>(),
                size_of::<T>()
            ))
        })?;
        if let Some(stream) = stream {
            // A slice may move to another thread and be dropped there, its free recorded on
            // the stream its handle names there: another stream, for a per-thread handle.
            if client.shared().per_thread_stream(stream)? {
                return Err(Error::invalid(format!(
                    "pool `{}`: stream {stream} names a different stream on each thread (CUDA's \
                     per-thread default stream); a pool slice, which may move to another \
                     thread, is freed on its stream there, out of the order of the work queued \
                     on it here: allocate slices for a stream of your own",
                    client.shared().name
                )));
            }
        }
        let align = align_of::<T>().max(DEFAULT_POOL_ALIGN);
        let addr = allocate(bytes, align)?;
        Ok(PoolSlice {
            client: client.clone(),
            addr,
            len,
            stream: stream.unwrap_or_else(|| client.home_stream()),
            _elements: PhantomData,
        })
    }

    /// Start address (host address or `CUdeviceptr`).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice has no elements (it still holds one 256-byte block).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the elements.
    pub fn num_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The stream it was allocated for (and is freed on).
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The client it belongs to.
    pub fn client(&self) -> &PoolClient {
        &self.client
    }

    fn host_ptr(&self) -> Result<*mut T, Error> {
        if self.client.is_host() {
            Ok(self.addr as usize as *mut T)
        } else {
            Err(Error::invalid(format!(
                "pool slice at {:#x} is `{}` memory, not host memory: use a device view",
                self.addr,
                self.client.backend_name()
            )))
        }
    }

    /// The elements, on a host pool.
    pub fn as_slice(&self) -> Result<&[T], Error> {
        let ptr = self.host_ptr()?;
        // SAFETY: a host pool's region is host memory that lives while `self.client` does; the
        // block holds `len` elements, aligned for `T`, and belongs to this slice alone (only
        // the slice can free it, and live blocks never overlap). Its bytes are initialized
        // (host memory comes initialized from its `Backend` or `VirtualMemory`, whose unsafe
        // contracts say so; slices write only `T: Element` values there, and unsafe code that
        // writes through a raw address of a host pool must leave its bytes initialized, as
        // the module documentation requires) and `T: Element` accepts every bit pattern.
        Ok(unsafe { core::slice::from_raw_parts(ptr, self.len) })
    }

    /// The elements, writable, on a host pool.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T], Error> {
        let ptr = self.host_ptr()?;
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference.
        Ok(unsafe { core::slice::from_raw_parts_mut(ptr, self.len) })
    }

    /// Frees the slice now and reports a failure (dropping it only logs one). A slice on a
    /// stream other than the pool's home stream is freed with an event recorded there; where
    /// none can be (a driver error, or the stream captures a graph: a graph captured with work
    /// on the block may replay it at any time later), the error comes back and the block is
    /// set aside for good, since nothing says the stream is done with it (counted in
    /// [`PoolStats::quarantined`](super::PoolStats::quarantined)). A slice a graph uses is
    /// allocated through a [`GraphReservation`](super::GraphReservation), which keeps it.
    pub fn free(self) -> Result<(), Error> {
        let this = core::mem::ManuallyDrop::new(self);
        let result = this.client.free_owned(this.addr, this.stream);
        // SAFETY: the client is moved out once and `this` is never dropped or used again.
        drop(unsafe { core::ptr::read(&this.client) });
        result
    }
}

impl<T: Element> Drop for PoolSlice<T> {
    fn drop(&mut self) {
        if let Err(error) = self.client.free_owned(self.addr, self.stream) {
            logged_unlocked(
                || log::error!(target: "devarena::pool", "dropping a pool slice: {error}"),
            );
        }
    }
}

impl<T: Element> fmt::Debug for PoolSlice<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolSlice")
            .field("type", &core::any::type_name::<T>())
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("stream", &self.stream)
            .finish()
    }
}

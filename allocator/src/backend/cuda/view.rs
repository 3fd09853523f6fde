//! Device views: devarena's own view types, which implement cudarc's traits so that they go
//! wherever cudarc's views go, and the view kinds an arena slices its region with.

use alloc::format;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::marker::PhantomData;
use core::ops::{Bound, RangeBounds};

use cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop,
    result, sys,
};

use super::driver::{bind, drv};
use crate::error::Error;
use crate::layout::{Element, ViewKind};

/// A read-only view of `len` elements of device memory, tied to its arena's borrow and stream.
///
/// Implements cudarc's [`DeviceSlice`] and [`DevicePtr`], and `&DeviceView` is a kernel
/// argument (`launch_builder(..).arg(&view)`).
pub struct DeviceView<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _marker: PhantomData<&'a [T]>,
}

/// A mutable view of `len` elements of device memory, tied to its arena's borrow and stream.
///
/// Implements cudarc's [`DeviceSlice`], [`DevicePtr`] and [`DevicePtrMut`], and both `&view`
/// and `&mut view` are kernel arguments.
pub struct DeviceViewMut<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _marker: PhantomData<&'a mut [T]>,
}

impl<T> Clone for DeviceView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceView<'_, T> {}

impl<T> core::fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceView")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("type", &core::any::type_name::<T>())
            .finish()
    }
}

impl<T> core::fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceViewMut")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("type", &core::any::type_name::<T>())
            .finish()
    }
}

fn range_of(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize), Error> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::invalid(format!(
            "range {start}..{end} is outside a view of {len} elements"
        )));
    }
    Ok((start, end))
}

fn check_len(what: &str, view: usize, host: usize) -> Result<(), Error> {
    if view != host {
        return Err(Error::invalid(format!(
            "{what}: the view holds {view} elements, the host slice {host}"
        )));
    }
    Ok(())
}

macro_rules! common_view_methods {
    () => {
        /// Number of elements.
        pub fn len(&self) -> usize {
            self.len
        }

        /// Whether the view holds no elements.
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// Bytes of the view.
        pub fn num_bytes(&self) -> usize {
            self.len * core::mem::size_of::<T>()
        }

        /// The device address (`CUdeviceptr`).
        pub fn device_addr(&self) -> u64 {
            self.ptr
        }

        /// The stream the view is ordered on, where its copies and fills are queued: the
        /// arena's stream (or the pool slice's), or the one it was made for
        /// (`views_mut_on`, `stage_mut_on`, a capture's own stream).
        pub fn stream(&self) -> &Arc<CudaStream> {
            self.stream
        }

        /// A read-only view of `range`.
        pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>, Error> {
            let (start, end) = range_of(range, self.len)?;
            Ok(DeviceView {
                ptr: self.ptr + (start * core::mem::size_of::<T>()) as u64,
                len: end - start,
                stream: self.stream,
                _marker: PhantomData,
            })
        }

        /// Copies the view into `dst` (same length) and waits for the copy.
        pub fn download(&self, dst: &mut [T]) -> Result<(), Error>
        where
            T: Element,
        {
            check_len("download", self.len, dst.len())?;
            if self.len == 0 {
                return Ok(());
            }
            bind(self.stream)?;
            // SAFETY: `dst` holds exactly `len` elements and the view addresses `len` live
            // elements of device memory; the copy completes before `synchronize` returns.
            unsafe { result::memcpy_dtoh_async(dst, self.ptr, self.stream.cu_stream()) }
                .map_err(drv("cuMemcpyDtoHAsync"))?;
            // The driver's own wait: cudarc's would first return an error recorded earlier in
            // the context object, before waiting, with the copy into `dst` still running.
            super::driver::synchronize_stream(self.stream)
        }

        /// Copies the view into a new `Vec`.
        pub fn to_vec(&self) -> Result<Vec<T>, Error>
        where
            T: Element,
        {
            let mut v = Vec::with_capacity(self.len);
            // SAFETY: every bit pattern is a valid `T` (`Element`), and zeroing first keeps
            // the vector initialised even if the copy fails.
            unsafe {
                core::ptr::write_bytes(v.as_mut_ptr(), 0, self.len);
                v.set_len(self.len);
            }
            self.download(&mut v)?;
            Ok(v)
        }
    };
}

impl<'a, T> DeviceView<'a, T> {
    common_view_methods!();
}

impl<'a, T> DeviceViewMut<'a, T> {
    common_view_methods!();

    /// A read-only view of the whole view, borrowed.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView {
            ptr: self.ptr,
            len: self.len,
            stream: self.stream,
            _marker: PhantomData,
        }
    }

    /// A mutable view of `range`, borrowed.
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<DeviceViewMut<'_, T>, Error> {
        let (start, end) = range_of(range, self.len)?;
        Ok(DeviceViewMut {
            ptr: self.ptr + (start * core::mem::size_of::<T>()) as u64,
            len: end - start,
            stream: self.stream,
            _marker: PhantomData,
        })
    }

    /// Splits into two disjoint mutable views at `mid`, keeping the arena's lifetime.
    pub fn split_at(self, mid: usize) -> Result<(Self, Self), Error> {
        if mid > self.len {
            return Err(Error::invalid(format!(
                "split at {mid} is outside a view of {} elements",
                self.len
            )));
        }
        let right = DeviceViewMut {
            ptr: self.ptr + (mid * core::mem::size_of::<T>()) as u64,
            len: self.len - mid,
            stream: self.stream,
            _marker: PhantomData,
        };
        Ok((DeviceViewMut { len: mid, ..self }, right))
    }

    /// Copies `src` (same length) into the view and waits for the copy, so `src` may be
    /// changed as soon as this returns (also when it is pinned memory).
    pub fn upload(&mut self, src: &[T]) -> Result<(), Error>
    where
        T: Element,
    {
        check_len("upload", self.len, src.len())?;
        if self.len == 0 {
            return Ok(());
        }
        bind(self.stream)?;
        // SAFETY: `src` holds exactly `len` elements and the view addresses `len` live,
        // exclusively borrowed elements; `synchronize` keeps `src` borrowed until the copy ends.
        unsafe { result::memcpy_htod_async(self.ptr, src, self.stream.cu_stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        // (The driver's own wait, as in `download`.)
        super::driver::synchronize_stream(self.stream)
    }

    /// Sets every byte of the view to `byte`, queued on the view's stream
    /// ([`stream`](Self::stream)).
    pub fn fill_bytes(&mut self, byte: u8) -> Result<(), Error> {
        if self.len == 0 {
            return Ok(());
        }
        bind(self.stream)?;
        // SAFETY: the view addresses `num_bytes` live, exclusively borrowed bytes.
        unsafe {
            result::memset_d8_async(self.ptr, byte, self.num_bytes(), self.stream.cu_stream())
        }
        .map_err(drv("cuMemsetD8Async"))
    }
}

impl<T> DeviceSlice<T> for DeviceView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DeviceSlice<T> for DeviceViewMut<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

/// Orders `stream` after the view's own stream when they differ, and returns a guard that
/// waits for `stream` when it drops, so that the work queued there with the view's address
/// ends before the view's borrow does. (The guard is cudarc's `SyncOnDrop`, whose wait goes
/// through cudarc: it is skipped where cudarc holds an error recorded in the context object,
/// which cudarc then reports.)
fn order_after<'s>(own: &Arc<CudaStream>, stream: &'s CudaStream) -> SyncOnDrop<'s> {
    if super::event::same_stream(own, stream) {
        return SyncOnDrop::Sync(None);
    }
    // With the driver's calls (`order_streams`), not cudarc's `join`: cudarc's would fail for
    // an error recorded earlier in the context object, and a failure recorded here would make
    // the guard's wait below fail in turn, without waiting. Where the driver refuses the
    // event, `own` is waited for here instead: `stream`'s next work runs after its all the
    // same.
    // (Where the wait fails too, the context is broken: the guard's own wait then fails and
    // cudarc records its error.)
    if super::event::order_streams(stream, own).is_err() {
        let _ = super::driver::synchronize_stream(own);
    }
    SyncOnDrop::sync_stream(stream)
}

impl<T> DevicePtr<T> for DeviceView<'_, T> {
    fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'s>) {
        (self.ptr, order_after(self.stream, stream))
    }
}

impl<T> DevicePtr<T> for DeviceViewMut<'_, T> {
    fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'s>) {
        (self.ptr, order_after(self.stream, stream))
    }
}

impl<T> DevicePtrMut<T> for DeviceViewMut<'_, T> {
    fn device_ptr_mut<'s>(
        &'s mut self,
        stream: &'s CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'s>) {
        (self.ptr, order_after(self.stream, stream))
    }
}

// SAFETY: pushes a pointer to the view's stored device address, which lives as long as the
// borrow of the view ('b), which outlives the launch arguments ('a).
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b DeviceView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceView<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as above; a shared borrow of a mutable view gives the kernel read access.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b DeviceViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as above; the exclusive borrow keeps every other use of the view out while the
// launch arguments live.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut DeviceViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

/// A device buffer whose [`DevicePtr`] (and, where it has one, [`DevicePtrMut`]) tells the
/// truth: what code that launches kernels from safe functions may trust with an address and a
/// length (the launch wrappers of `devarena-kernels` take only these).
///
/// cudarc's [`DeviceSlice`], [`DevicePtr`] and [`DevicePtrMut`] are safe traits: any type may
/// implement them and return any address and any length, so a safe function that launches a
/// kernel on what they return would let safe code choose the memory the kernel writes.
/// Implemented for devarena's views and for cudarc's `CudaSlice`, `CudaView` and
/// `CudaViewMut`.
///
/// # Safety
///
/// For as long as the value is borrowed, `device_ptr` and `device_ptr_mut` must return the
/// address of [`len`](DeviceSlice::len) live elements of `T`, aligned for `T`, in the context of
/// [`stream`](DeviceSlice::stream), that the value owns or borrows (exclusively, for
/// `device_ptr_mut`), whose allocation and free are ordered on [`stream`](DeviceSlice::stream)
/// (or the free waits for it on the host). A launch on another
/// stream orders itself with that stream both ways (the `devarena-kernels` wrappers do): the
/// guard's own ordering is not relied on, since cudarc's event tracking orders nothing between
/// two `CudaContext` objects of one context.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a device buffer whose address and length a safe kernel launch may trust",
    label = "not a `TrustedDevicePtr<{T}>`",
    note = "pass a devarena view (an arena's or a pool slice's `DeviceView`/`DeviceViewMut`) or cudarc's `CudaSlice`/`CudaView`/`CudaViewMut`",
    note = "for a buffer type of your own, `unsafe impl TrustedDevicePtr<{T}>` promises what its `# Safety` says"
)]
pub unsafe trait TrustedDevicePtr<T>: DevicePtr<T> {}

// SAFETY: a view addresses `len` live elements of its arena's (or pool slice's) allocation,
// borrowed for its lifetime, and orders the stream it is asked for after its own.
unsafe impl<T> TrustedDevicePtr<T> for DeviceView<'_, T> {}
// SAFETY: as above; a mutable view borrows its elements exclusively.
unsafe impl<T> TrustedDevicePtr<T> for DeviceViewMut<'_, T> {}
// SAFETY: cudarc's own buffers: a `CudaSlice` owns its `len` elements, allocated on its
// stream and freed there (`cuMemFreeAsync`), and its views borrow them from one. (Its event
// tracking is not relied on: see the trait's contract. On a device without stream-ordered
// allocation cudarc frees with `cuMemFree` after a synchronize of the stream through cudarc,
// which an error cudarc recorded earlier in the context object skips: the order then rests
// on `cuMemFree`'s own wait for the device.)
unsafe impl<T> TrustedDevicePtr<T> for cudarc::driver::CudaSlice<T> {}
// SAFETY: as above.
unsafe impl<T> TrustedDevicePtr<T> for cudarc::driver::CudaView<'_, T> {}
// SAFETY: as above.
unsafe impl<T> TrustedDevicePtr<T> for cudarc::driver::CudaViewMut<'_, T> {}

impl<'a, T> DeviceView<'a, T> {
    /// A read-only view of `len` elements at device address `ptr`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `ptr` must address `len` live, initialised elements of `T` in `stream`'s context,
    /// aligned for `T`, that nothing writes while `'a` lasts.
    pub unsafe fn from_raw(ptr: u64, len: usize, stream: &'a Arc<CudaStream>) -> Self {
        DeviceView {
            ptr,
            len,
            stream,
            _marker: PhantomData,
        }
    }
}

impl<'a, T> DeviceViewMut<'a, T> {
    /// A mutable view of `len` elements at device address `ptr`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// As [`DeviceView::from_raw`], and no other view or code may reach the elements while
    /// `'a` lasts.
    pub unsafe fn from_raw(ptr: u64, len: usize, stream: &'a Arc<CudaStream>) -> Self {
        DeviceViewMut {
            ptr,
            len,
            stream,
            _marker: PhantomData,
        }
    }
}

/// The start of a device region and the stream its views are ordered on.
#[derive(Debug, Clone, Copy)]
pub struct CudaBase<'a> {
    ptr: u64,
    stream: &'a Arc<CudaStream>,
}

impl<'a> CudaBase<'a> {
    /// The base of a region at device address `ptr`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `ptr` must address live device memory of `stream`'s context that stays valid, and
    /// borrowed as the views cut from it require, for `'a`.
    pub unsafe fn new(ptr: u64, stream: &'a Arc<CudaStream>) -> Self {
        CudaBase { ptr, stream }
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// The stream views cut from this base are ordered on.
    pub fn stream(&self) -> &'a Arc<CudaStream> {
        self.stream
    }
}

/// Device views you can write: [`DeviceViewMut`] per field.
#[derive(Debug, Clone, Copy)]
pub enum CudaMut {}

/// Device views you can read: [`DeviceView`] per field.
#[derive(Debug, Clone, Copy)]
pub enum CudaRef {}

// SAFETY: `slice` makes a view of exactly `len` elements at `offset` bytes from the base.
unsafe impl ViewKind for CudaMut {
    type Base<'a> = CudaBase<'a>;
    type Slice<'a, T: Element> = DeviceViewMut<'a, T>;

    unsafe fn offset<'a>(base: Self::Base<'a>, offset: usize) -> Self::Base<'a> {
        CudaBase {
            ptr: base.ptr + offset as u64,
            stream: base.stream,
        }
    }

    unsafe fn slice<'a, T: Element>(
        base: Self::Base<'a>,
        offset: usize,
        len: usize,
    ) -> Self::Slice<'a, T> {
        DeviceViewMut {
            ptr: base.ptr + offset as u64,
            len,
            stream: base.stream,
            _marker: PhantomData,
        }
    }
}

// SAFETY: `slice` makes a view of exactly `len` elements at `offset` bytes from the base.
unsafe impl ViewKind for CudaRef {
    type Base<'a> = CudaBase<'a>;
    type Slice<'a, T: Element> = DeviceView<'a, T>;

    unsafe fn offset<'a>(base: Self::Base<'a>, offset: usize) -> Self::Base<'a> {
        CudaBase {
            ptr: base.ptr + offset as u64,
            stream: base.stream,
        }
    }

    unsafe fn slice<'a, T: Element>(
        base: Self::Base<'a>,
        offset: usize,
        len: usize,
    ) -> Self::Slice<'a, T> {
        DeviceView {
            ptr: base.ptr + offset as u64,
            len,
            stream: base.stream,
            _marker: PhantomData,
        }
    }
}

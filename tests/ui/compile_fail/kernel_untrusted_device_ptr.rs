// The pipeline's safe launch wrappers take only buffers whose address and length the kernels
// may trust (`TrustedDevicePtr`, an unsafe trait: devarena's views, cudarc's slices and views).
// cudarc's `DeviceSlice` / `DevicePtr` / `DevicePtrMut` are safe traits: a type of the caller's
// that implements them says any address and any length, and a safe call must not launch a
// kernel there.
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys};
use devarena_kernels::pipeline::ImageSize;
use devarena_kernels::pipeline::cuda::PipelineKernels;

struct MadeUp {
    addr: u64,
    stream: Arc<CudaStream>,
}

impl DeviceSlice<f32> for MadeUp {
    fn len(&self) -> usize {
        64 * 64
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl DevicePtr<f32> for MadeUp {
    fn device_ptr<'a>(&'a self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.addr, SyncOnDrop::Sync(None))
    }
}

impl DevicePtrMut<f32> for MadeUp {
    fn device_ptr_mut<'a>(&'a mut self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.addr, SyncOnDrop::Sync(None))
    }
}

fn launch(kernels: &PipelineKernels, stream: &Arc<CudaStream>) {
    let size = ImageSize::new(64, 64);
    let src = MadeUp { addr: 0x7000_0000, stream: stream.clone() };
    let mut dst = MadeUp { addr: 0xdead_0000, stream: stream.clone() };
    let _ = kernels.blur_rows(stream, size, &src, &mut dst);
}

fn main() {}

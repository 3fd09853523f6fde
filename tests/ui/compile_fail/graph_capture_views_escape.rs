// The views a capture hands out live only as long as the capture: they cannot be kept past it
// (where work queued with them would run instead of being recorded).
use devarena::backend::cuda::{CudaBackend, DeviceViewMut, cuda_stream};
use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Frame {
    input: [f32; 1024],
}

fn main() {
    let stream = cuda_stream(0).unwrap();
    let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream)).unwrap();
    let mut kept: Option<DeviceViewMut<'_, f32>> = None;
    // SAFETY: the work reaches the arena alone.
    let _graph = unsafe { arena
        .capture(|c| {
            kept = Some(c.views_mut().input);
            Ok(())
        }) }
        .unwrap();
    kept.unwrap().fill_bytes(1).unwrap();
}

// The views `views_mut_on` lends for another stream live only inside its closure: the arena's
// stream waits for that stream when the closure returns, so work queued with views kept past
// it would not be ordered before the arena's later work (its host views, its free).
use devarena::backend::cuda::{CudaBackend, DeviceViewMut, cuda_stream};
use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Frame {
    input: [f32; 1024],
}

fn main() {
    let stream = cuda_stream(0).unwrap();
    let other = stream.context().new_stream().unwrap();
    let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream)).unwrap();
    let mut kept: Option<DeviceViewMut<'_, f32>> = None;
    arena
        .views_mut_on(&other, |v| {
            kept = Some(v.input);
            Ok(())
        })
        .unwrap();
    kept.unwrap().fill_bytes(1).unwrap();
}

// Nor can the closure of `views_mut_on` return the views it was lent for another stream: its
// result outlives the call, the views must not.
use devarena::backend::cuda::{CudaBackend, cuda_stream};
use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Frame {
    input: [f32; 1024],
}

fn main() {
    let stream = cuda_stream(0).unwrap();
    let other = stream.context().new_stream().unwrap();
    let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream)).unwrap();
    let mut input = arena.views_mut_on(&other, |v| Ok(v.input)).unwrap();
    input.fill_bytes(1).unwrap();
}

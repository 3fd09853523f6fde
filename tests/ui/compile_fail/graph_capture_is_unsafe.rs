// A graph replays the addresses its captured work reached, and keeps alive only the arena (or,
// for a pool, the graph's own blocks). Safe calls during a capture can reach other memory
// (another arena's views on the same stream), which could then be freed before a replay: the
// capture is `unsafe`, its contract says what to keep.
use devarena::backend::cuda::{CudaBackend, cuda_stream};
use devarena::{Arena, DeviceLayout, Pool};

#[derive(DeviceLayout)]
struct Frame {
    output: [f32; 1024],
}

fn main() {
    let stream = cuda_stream(0).unwrap();
    let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
    let mut other = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
    let _graph = arena.capture(|_| other.views_mut().output.fill_bytes(1));
    let _own = arena.capture_on_own_stream(|_| other.views_mut().output.fill_bytes(1));
    let pool = Pool::cuda(stream.clone(), 1 << 20).unwrap();
    let _pool_graph = pool.capture(&stream, |_| Ok(()));
}

// A graph records the arena's device addresses and replays them: while it lives, the arena can
// neither be dropped (its memory freed) nor be reached around the graph.
use devarena::backend::cuda::{CudaBackend, cuda_stream};
use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Frame {
    input: [f32; 1024],
    output: [f32; 1024],
}

fn main() {
    let stream = cuda_stream(0).unwrap();
    let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream)).unwrap();
    // SAFETY: the work reaches the arena alone.
    let mut graph = unsafe { arena
        .capture(|c| c.views_mut().output.fill_bytes(0)) }
        .unwrap();
    let mut views = arena.views_mut();
    drop(arena);
    graph.launch().unwrap();
    views.input.fill_bytes(1).unwrap();
}

// A managed arena's host views, reached through its graph, keep the graph borrowed: no replay
// can be launched while the host holds them.
use devarena::backend::cuda::{ManagedBackend, cuda_stream};
use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Frame {
    input: [f32; 1024],
    output: [f32; 1024],
}

fn main() {
    let stream = cuda_stream(0).unwrap();
    let mut arena = Arena::<Frame, _>::new_in(ManagedBackend::new(stream)).unwrap();
    // SAFETY: the work reaches the arena alone.
    let mut graph = unsafe { arena
        .capture(|c| c.views_mut().output.fill_bytes(0)) }
        .unwrap();
    let host = graph.arena().host_views().unwrap();
    graph.launch().unwrap();
    assert_eq!(host.output[0], 0.0);
}

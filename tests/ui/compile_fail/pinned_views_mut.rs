// Pinned host memory may still be in use by queued copies: its host views come only through
// `try_views_mut`, which waits for the stream and reports a failed wait.
use devarena::backend::cuda::{PinnedBackend, cuda_stream};
use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Staging {
    input: [u32; 1024],
}

fn main() {
    let stream = cuda_stream(0).unwrap();
    let mut arena = Arena::<Staging, _>::new_in(PinnedBackend::new(stream)).unwrap();
    arena.views_mut().input[0] = 1;
}

// The verifier's kernels write the regions they check. Raw regions (caller-chosen addresses)
// go only through `unsafe fn`s, and the safe entry point borrows the arena mutably, so it
// cannot run while views of the arena are alive.
use devarena::backend::cuda::CudaBackend;
use devarena::{Arena, DeviceLayout};
use devarena_kernels::verify::{Region, Verifier, regions};

#[derive(DeviceLayout)]
struct Frame {
    gray: [f32; 1024],
}

fn raw(verifier: &Verifier, regions: &[Region]) {
    let _ = verifier.disjoint(regions);
    let _ = verifier.alignment(regions);
}

fn while_viewed(arena: &mut Arena<Frame, CudaBackend>) {
    let views = arena.views();
    let _ = devarena_kernels::verify(arena);
    let _ = views.gray;
    let _ = regions(arena);
}

fn main() {}

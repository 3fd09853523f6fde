// The safe verifier takes device memory only: a host arena's addresses are not the device's.
use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Frame {
    gray: [f32; 1024],
}

fn main() {
    let mut arena = Arena::<Frame>::new().unwrap();
    let _ = devarena_kernels::verify(&mut arena);
}

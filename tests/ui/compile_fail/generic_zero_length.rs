use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame<const PIXELS: usize> {
    gray: [f32; PIXELS],
}

fn main() {
    // Fine at a real size...
    let _ = Frame::<16>::SIZE;
    // ...a compile error at zero.
    let _ = Frame::<0>::SIZE;
}

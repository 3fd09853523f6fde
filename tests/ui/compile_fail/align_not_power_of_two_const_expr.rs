// An alignment given as a const expression is checked by the compiler, not the macro.
use devarena::DeviceLayout;

const ALIGN: usize = 3 * 64;

#[derive(DeviceLayout)]
struct Frame {
    rgb: [u8; 64],
    #[layout(align = ALIGN)]
    gray: [f32; 16],
}

#[derive(DeviceLayout)]
#[layout(align = ALIGN + 1)]
struct Other {
    a: [u8; 64],
    b: [u8; 64],
}

fn main() {}

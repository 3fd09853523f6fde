// Zero is not "no request": an alignment of 0 given as a const expression is an error.
use devarena::DeviceLayout;

const NONE: usize = 0;

#[derive(DeviceLayout)]
struct Frame {
    #[layout(align = NONE)]
    gray: [f32; 16],
}

#[derive(DeviceLayout)]
#[layout(align = NONE)]
struct Other {
    a: [u8; 64],
}

fn main() {}

use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(align = 100)]
struct Frame {
    rgb: [u8; 64],
    gray: [f32; 16],
}

fn main() {}

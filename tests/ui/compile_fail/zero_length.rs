use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    rgb: [u8; 64],
    empty: [f32; 0],
}

fn main() {}

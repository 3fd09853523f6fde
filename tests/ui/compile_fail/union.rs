use devarena::DeviceLayout;

#[derive(DeviceLayout)]
union Frame {
    rgb: [u8; 64],
    gray: [f32; 16],
}

fn main() {}

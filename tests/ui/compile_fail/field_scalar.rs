use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    rgb: [u8; 64],
    count: u32,
}

fn main() {}

use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    rgb: [u8; 64],
    mask: [bool; 4],
}

fn main() {}

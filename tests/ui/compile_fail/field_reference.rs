use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    rgb: &'static [u8; 64],
}

fn main() {}

use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    rgb: Vec<u8>,
}

fn main() {}

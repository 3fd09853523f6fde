use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    #[layout(offset = 128)]
    rgb: [u8; 64],
}

fn main() {}

use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(alignment = 256)]
struct Frame {
    rgb: [u8; 64],
}

fn main() {}

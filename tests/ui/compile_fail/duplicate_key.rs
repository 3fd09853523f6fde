use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(align = 256)]
#[layout(align = 512)]
struct Frame {
    #[layout(align = 16, align = 32)]
    rgb: [u8; 64],
}

fn main() {}

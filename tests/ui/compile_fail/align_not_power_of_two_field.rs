use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    rgb: [u8; 64],
    #[layout(align = 48)]
    gray: [f32; 16],
}

fn main() {}

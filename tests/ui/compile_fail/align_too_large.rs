use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    #[layout(align = 2147483648)]
    gray: [f32; 16],
}

fn main() {}

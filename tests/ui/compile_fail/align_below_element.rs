use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    a: [u8; 3],
    #[layout(align = 2)]
    b: [u32; 4],
}

fn main() {}

use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(max_bytes = 1 << 20)]
struct Frame {
    rgb: [u8; 640 * 480 * 3],
    gray: [f32; 640 * 480],
}

fn main() {}

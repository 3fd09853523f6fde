// Every problem of one struct is reported at once.
use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(align = 3, color = 1)]
struct Frame {
    #[layout(align = 6)]
    rgb: [u8; 64],
    count: u32,
    name: &'static str,
    #[layout(size = 4)]
    gray: [f32; 16],
}

fn main() {}

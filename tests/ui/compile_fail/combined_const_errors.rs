// Errors the compiler finds while evaluating the plan are reported per field, all at once.
use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    empty: [u8; 0],
    #[layout(align = 1)]
    gray: [f32; 16],
    huge: [u64; usize::MAX / 4],
}

fn main() {}

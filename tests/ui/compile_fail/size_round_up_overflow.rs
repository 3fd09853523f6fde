use devarena::DeviceLayout;

// The fields end one byte short of usize::MAX + 1; rounding SIZE up to 256 overflows.
#[derive(DeviceLayout)]
#[layout(align = 1)]
struct Huge {
    first: [u8; usize::MAX / 2 + 1],
    #[layout(align = 256)]
    second: [u8; usize::MAX / 2],
}

fn main() {}

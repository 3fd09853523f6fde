use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Huge {
    small: [u8; 16],
    big: [u64; usize::MAX / 4],
}

fn main() {}

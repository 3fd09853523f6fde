use devarena::DeviceLayout;

// Each field fits in usize on its own; the second one's end does not.
#[derive(DeviceLayout)]
struct Huge {
    first: [u8; usize::MAX / 2 + 1],
    second: [u8; usize::MAX / 2 + 1],
}

fn main() {}

// A layout with stages whose declaration-order plan fits in `usize` (2^64 - 2^30 bytes) while
// one greedy ordering (largest first) overflows when it places the rest: the derive plans it
// with the orderings that fit, as `LayoutBuilder` does.
use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(align = 1, stages = 1)]
struct Huge {
    #[layout(align = 1073741824)]
    b1: [u8; 1],
    #[layout(align = 1073741824)]
    b2: [u8; 1],
    #[layout(align = 1)]
    a: [u8; usize::MAX - (1 << 31) - 4],
}

fn main() {
    assert!(Huge::SIZE <= Huge::UNALIASED_SIZE);
}

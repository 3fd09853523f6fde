use devarena::Element;

#[derive(Clone, Copy, Element)]
#[repr(C)]
struct Flags {
    on: bool,
    level: u8,
}

fn main() {}

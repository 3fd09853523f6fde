use devarena::Element;

#[derive(Clone, Copy, Element)]
#[repr(C)]
struct Padded {
    tag: u8,
    value: u32, // three padding bytes before it
}

fn main() {}

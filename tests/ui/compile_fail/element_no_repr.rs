use devarena::Element;

#[derive(Clone, Copy, Element)]
struct Loose {
    a: u32,
    b: u32,
}

fn main() {}

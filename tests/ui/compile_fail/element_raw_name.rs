// A raw identifier is named as Rust shows it: `Pixel`, not `r#Pixel`.
use devarena::Element;

#[derive(Clone, Copy, Element)]
struct r#Pixel {
    v: u8,
}

fn main() {}

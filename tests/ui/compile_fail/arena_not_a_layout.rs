// The most common first mistake: an arena of a struct that did not derive `DeviceLayout`. The
// error must say to add the derive (the trait is `unsafe`, so the derive is how to get it),
// not only speak of layout fields.
use devarena::Arena;

struct Frame {
    gray: [f32; 1024],
}

fn main() {
    let _arena = Arena::<Frame>::new();
}

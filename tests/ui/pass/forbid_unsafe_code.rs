// The derive's generated code (its `unsafe impl Disjoint` and `unsafe fn views` included)
// compiles in a crate that forbids unsafe code: the user writes none.
#![forbid(unsafe_code)]

use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Frame {
    gray: [f32; 64],
    hist: [u32; 16],
}

#[derive(DeviceLayout)]
#[layout(stages = 2)]
struct Staged {
    #[layout(live = 0..=0)]
    a: [u32; 64],
    #[layout(live = 1..=1)]
    b: [u32; 64],
}

#[derive(Clone, Copy, devarena::Element)]
#[repr(C)]
struct Rgba {
    r: u8,
    g: u8,
    b: u8,
    a: u8,
}

#[derive(DeviceLayout)]
struct Image {
    pixels: [Rgba; 64],
}

fn main() {
    let mut arena = Arena::<Frame>::new().unwrap();
    let views = arena.views_mut();
    views.gray[0] = 1.0;
    views.hist[0] = 2;
    let mut staged = Arena::<Staged>::new().unwrap();
    staged.stage_mut::<0>().a[0] = 1;
    staged.stage_mut::<1>().b[0] = 2;
    let mut image = Arena::<Image>::new().unwrap();
    image.views_mut().pixels[0].a = 255;
    assert_eq!(Image::SIZE, 256);
}

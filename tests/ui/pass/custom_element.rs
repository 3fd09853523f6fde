use devarena::{Arena, DeviceLayout, Element};

#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Rgba {
    r: u8,
    g: u8,
    b: u8,
    a: u8,
}

// SAFETY: four `u8`s in `repr(C)`: no padding, every bit pattern is valid.
unsafe impl Element for Rgba {}

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Vec4 {
    v: [f32; 4],
}

// SAFETY: four `f32`s, 16 bytes, `repr(C)`: no padding, every bit pattern is valid.
unsafe impl Element for Vec4 {}

#[derive(DeviceLayout)]
#[layout(align = 1)]
struct Image {
    tag: [u8; 3],
    pixels: [Rgba; 16],
    normals: [Vec4; 8],
}

// The struct default of 1 is raised to each element's alignment.
const _: () = assert!(Image::OFFSETS.pixels == 3);
const _: () = assert!(Image::OFFSETS.normals == 80); // 3 + 64 = 67, rounded up to 16
const _: () = assert!(Image::SIZE == 208 && Image::ALIGN == 16);

fn main() {
    let mut arena = Arena::<Image>::new().unwrap();
    let v = arena.views_mut();
    v.pixels[15] = Rgba { r: 1, g: 2, b: 3, a: 4 };
    v.normals[7].v[3] = 1.5;
    assert_eq!(arena.views().pixels[15], Rgba { r: 1, g: 2, b: 3, a: 4 });
}

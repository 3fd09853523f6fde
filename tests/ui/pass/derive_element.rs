#![deny(warnings)]
//! `#[derive(Element)]` on plain `#[repr(C)]` structs, nested, and used in a layout.

use devarena::{DeviceLayout, Element};

#[derive(Clone, Copy, Element)]
#[repr(C)]
pub struct Rgba {
    pub r: u8,
    pub g: u8,
    pub b: u8,
    pub a: u8,
}

#[derive(Clone, Copy, Element)]
#[repr(C)]
pub struct Vertex {
    pub pos: [f32; 3],
    pub color: Rgba,
}

#[derive(Clone, Copy, Element)]
#[repr(transparent)]
pub struct Meters(pub f64);

#[derive(DeviceLayout)]
pub struct Mesh {
    pub vertices: [Vertex; 1024],
    pub lengths: [Meters; 16],
}

fn main() {
    assert_eq!(Mesh::FIELDS[0].size, 1024 * 16);
    assert_eq!(Mesh::OFFSETS.lengths, 16 * 1024);
}

// A layout struct is never a value: its fields are never read, and that raises no warnings.
#![deny(warnings)]

use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct Inner {
    coeffs: [f32; 4],
}

#[derive(DeviceLayout)]
struct Frame<const N: usize> {
    rgb: [u8; N],
    inner: Inner,
}

#[derive(DeviceLayout)]
struct Unit;

fn main() {
    let mut arena = Arena::<Frame<16>>::new().unwrap();
    arena.views_mut().inner.coeffs[0] = 1.0;
    assert_eq!(Unit::SIZE, 0);
}

// The derive's own generic names (`'a`, `K`) do not capture user types of the same name.
use devarena::{Arena, DeviceLayout, Element};

#[derive(Clone, Copy)]
#[repr(C)]
struct K {
    value: u32,
}

// SAFETY: one `u32`, `repr(C)`: no padding, every bit pattern is valid.
unsafe impl Element for K {}

#[derive(DeviceLayout)]
struct Frame {
    keys: [K; 8],
}

#[derive(DeviceLayout)]
struct Outer<const N: usize> {
    frame: Frame,
    more: [K; N],
}

fn main() {
    let mut arena = Arena::<Outer<4>>::new().unwrap();
    let v = arena.views_mut();
    v.frame.keys[7] = K { value: 7 };
    v.more[3] = K { value: 3 };
    assert_eq!(arena.views().frame.keys[7].value, 7);
}

// A user type named `K` used only in a generic bound / where clause of the layout.
use devarena::{DeviceLayout, Element};

pub trait Tag {}
pub struct K;
impl Tag for K {}

pub trait Has<X> {}
impl Has<K> for u32 {}

#[derive(DeviceLayout)]
struct Frame<T: Element + Has<K>> {
    data: [T; 16],
}

fn main() {
    assert_eq!(Frame::<u32>::SIZE, 256);
}

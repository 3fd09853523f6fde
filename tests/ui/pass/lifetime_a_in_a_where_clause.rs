// A higher-ranked bound naming `'a`, the derive's own lifetime name.
use devarena::{DeviceLayout, Element};

pub trait Reads<'x> {}
impl<'x> Reads<'x> for u32 {}

#[derive(DeviceLayout)]
struct Frame<T>
where
    T: Element + for<'a> Reads<'a>,
{
    data: [T; 16],
}

fn main() {
    assert_eq!(Frame::<u32>::SIZE, 256);
}

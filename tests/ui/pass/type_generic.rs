use devarena::{Arena, DeviceLayout, Element};

#[derive(DeviceLayout)]
struct Buffers<T: Element, const N: usize> {
    data: [T; N],
    #[layout(align = 512)]
    scratch: [T; N],
}

#[derive(DeviceLayout)]
struct WithWhere<T>
where
    T: Element,
{
    data: [T; 10],
}

fn main() {
    assert_eq!(Buffers::<u8, 10>::OFFSETS.scratch, 512);
    assert_eq!(Buffers::<f64, 100>::OFFSETS.scratch, 1024); // 800 rounded up to 512
    assert_eq!(Buffers::<f64, 100>::SIZE, 2048); // 1024 + 800 = 1824, rounded up to 512
    assert_eq!(WithWhere::<u16>::SIZE, 256);
    let mut arena = Arena::<Buffers<u32, 8>>::new().unwrap();
    let v = arena.views_mut();
    let data: &mut [u32] = v.data;
    data[7] = 1;
    v.scratch[0] = 2;
}

// `#[repr(packed)]` on a layout changes nothing: the derive plans and aligns the buffers itself,
// and never takes a reference to the struct's (possibly unaligned) fields.
use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[repr(packed)]
struct Bytes {
    a: [u8; 1024],
    b: [u8; 256],
}

#[derive(DeviceLayout)]
#[repr(C, packed)]
struct Mixed {
    flag: [u8; 1],
    values: [f32; 1000],
}

fn main() {
    assert_eq!(Bytes::SIZE, 1280);
    assert_eq!(Mixed::OFFSETS.values % 256, 0);
}

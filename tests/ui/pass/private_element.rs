// A public layout whose buffers hold a private element type compiles without warnings.
#![deny(warnings)]

mod inner {
    use devarena::{DeviceLayout, Element};

    #[derive(Clone, Copy)]
    #[repr(C)]
    struct Secret {
        v: u32,
    }

    // SAFETY: one `u32`, `repr(C)`: no padding, every bit pattern is valid.
    unsafe impl Element for Secret {}

    #[derive(DeviceLayout)]
    pub struct Frame {
        secret: [Secret; 4],
        pub(crate) gray: [f32; 4],
    }
}

fn main() {
    use devarena::DeviceLayout;
    assert_eq!(inner::Frame::SIZE, 512);
}

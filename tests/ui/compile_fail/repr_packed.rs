// `#[repr(packed)]` means nothing for a layout: the derive plans the buffers.
use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[repr(packed)]
struct Frame {
    gray: [f32; 1024],
    hist: [u32; 256],
}

fn main() {}

use devarena::DeviceLayout;

// A struct that did not derive DeviceLayout.
struct Params {
    gain: [f32; 4],
}

#[derive(DeviceLayout)]
struct Frame {
    rgb: [u8; 64],
    params: Params,
}

fn main() {}

use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(align = 1024)]
struct Inner {
    a: [u8; 16],
}

#[derive(DeviceLayout)]
struct Outer {
    #[layout(align = 256)]
    inner: Inner,
}

fn main() {}

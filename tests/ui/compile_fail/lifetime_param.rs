use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame<'a> {
    rgb: [u8; 64],
    name: std::marker::PhantomData<&'a str>,
}

fn main() {}

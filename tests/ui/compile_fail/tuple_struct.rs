use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame([u8; 64], [f32; 16]);

fn main() {}

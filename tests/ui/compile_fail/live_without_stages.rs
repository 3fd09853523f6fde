use devarena::DeviceLayout;

#[derive(DeviceLayout)]
struct Frame {
    #[layout(live = 0..=1)]
    a: [f32; 64],
}

fn main() {}

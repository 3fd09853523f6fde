use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(stages = 3)]
struct Frame {
    #[layout(live = 1..=3)]
    a: [f32; 64],
}

fn main() {}

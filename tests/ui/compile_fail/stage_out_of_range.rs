use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
#[layout(stages = 3)]
struct Steps {
    #[layout(live = 0..=1)]
    input: [f32; 64],
    #[layout(live = 1..=2)]
    output: [f32; 64],
}

fn main() {
    let mut arena = Arena::<Steps>::new().unwrap();
    let _ = arena.stage_mut::<3>();
}

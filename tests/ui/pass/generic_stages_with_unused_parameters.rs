// A generic layout with stages: stage 1's live fields do not mention `T`.
use devarena::{Arena, DeviceLayout, Element};

#[derive(DeviceLayout)]
#[layout(stages = 2)]
struct Steps<T: Element> {
    #[layout(live = 0..=0)]
    input: [T; 64],
    #[layout(live = 1..=1)]
    output: [f32; 64],
}

fn main() {
    let mut arena = Arena::<Steps<u16>>::new().unwrap();
    arena.stage_mut::<0>().input[0] = 1;
    arena.stage_mut::<1>().output[0] = 2.0;
}

use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
#[layout(stages = 2)]
struct Staged {
    #[layout(live = 0..=0)]
    a: [f32; 64],
    #[layout(live = 1..=1)]
    b: [f32; 64],
}

fn main() {
    let mut arena = Arena::<Staged>::new().unwrap();
    let _views = arena.views_mut();
}

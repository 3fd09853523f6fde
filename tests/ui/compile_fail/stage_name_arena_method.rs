// A named stage's methods are `arena.<stage>()` and `arena.<stage>_mut()`: a name whose methods
// would be `Arena`'s own (which win over the stage trait's) is refused.
use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(stages(decode, free, host_views))]
struct Frame {
    #[layout(live = decode..=free)]
    a: [f32; 16],
    #[layout(live = free..=host_views)]
    b: [f32; 16],
}

fn main() {}

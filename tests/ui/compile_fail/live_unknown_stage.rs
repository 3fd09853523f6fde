use devarena::DeviceLayout;

#[derive(DeviceLayout)]
#[layout(stages(decode, blur, output))]
struct Frame {
    #[layout(live = decode..=sharpen)]
    a: [f32; 64],
}

fn main() {}

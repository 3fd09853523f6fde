use devarena::DeviceLayout;

// A stage name names the stage's methods (`arena.decode_mut()`): a keyword cannot, and no
// stage may take another's `_mut` method name.
#[derive(DeviceLayout)]
#[layout(stages(decode, type, self))]
struct Frame {
    a: [f32; 64],
}

#[derive(DeviceLayout)]
#[layout(stages(blur, blur_mut))]
struct Steps {
    a: [f32; 64],
}

fn main() {}

// An array behind a type alias: the derive sees the alias's name, not `[T; N]`.
use devarena::DeviceLayout;

type Gray = [f32; 1024];

#[derive(DeviceLayout)]
struct Frame {
    gray: Gray,
}

fn main() {}

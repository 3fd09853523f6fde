use devarena::DeviceLayout;

#[derive(DeviceLayout)]
enum Frame {
    Rgb([u8; 64]),
    Gray([f32; 16]),
}

fn main() {}

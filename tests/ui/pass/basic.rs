use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
#[layout(align = 256, max_bytes = 1 << 20)]
pub struct Frame {
    rgb: [u8; 300],
    gray: [f32; 100],
    #[layout(align = 4096)]
    hist: [u32; 256],
}

// Empty and unit structs are layouts of size zero.
#[derive(DeviceLayout)]
struct Empty {}

#[derive(DeviceLayout)]
struct Unit;

const _: () = assert!(Frame::OFFSETS.gray == 512); // 300 rounded up to 256
const _: () = assert!(Frame::OFFSETS.hist == 4096); // 512 + 400 = 912, rounded up to 4096
const _: () = assert!(Frame::SIZE == 8192); // 4096 + 1024 rounded up to ALIGN 4096
const _: () = assert!(Frame::ALIGN == 4096);
const _: () = assert!(Empty::SIZE == 0 && Unit::SIZE == 0);

fn main() {
    let mut arena = Arena::<Frame>::new().unwrap();
    let views = arena.views_mut();
    let (rgb, gray, hist): (&mut [u8], &mut [f32], &mut [u32]) =
        (views.rgb, views.gray, views.hist);
    rgb[299] = 1;
    gray[99] = 2.0;
    hist[255] = 3;
    assert_eq!(arena.views().hist[255], 3);
    assert_eq!(Frame::FIELDS.len(), 3);
    let _ = Arena::<Empty>::new().unwrap();
    let _ = Arena::<Unit>::new().unwrap();
}

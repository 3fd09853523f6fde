use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
#[layout(max_bytes = 64 << 20)]
struct Frame<const PIXELS: usize, const BYTES: usize> {
    rgb: [u8; BYTES],
    gray: [f32; PIXELS],
    #[layout(align = 4096)]
    hist: [u32; 256],
}

type Small = Frame<{ 64 * 64 }, { 64 * 64 * 3 }>;
type Large = Frame<{ 1920 * 1080 }, { 1920 * 1080 * 3 }>;

static SCRATCH: [u8; Small::SIZE] = [0; Small::SIZE];

fn main() {
    assert_eq!(SCRATCH.len(), Small::SIZE);
    assert_eq!(Small::OFFSETS.gray, 12288);
    assert_eq!(Large::OFFSETS.gray, 6_220_800);
    let mut arena = Arena::<Small>::new().unwrap();
    let v = arena.views_mut();
    assert_eq!((v.rgb.len(), v.gray.len(), v.hist.len()), (12288, 4096, 256));
}

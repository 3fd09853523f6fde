use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
#[layout(align = 1024)]
struct Params {
    gain: [f32; 4],
}

#[derive(DeviceLayout)]
struct Stage {
    params: Params,
    out: [u16; 100],
}

#[derive(DeviceLayout)]
struct Pipeline {
    input: [u8; 10],
    first: Stage,
    second: Stage,
    #[layout(align = 2048)]
    extra: Params,
}

const _: () = assert!(Params::SIZE == 1024 && Params::ALIGN == 1024);
const _: () = assert!(Stage::ALIGN == 1024 && Stage::SIZE == 2048);
const _: () = assert!(Pipeline::OFFSETS.first == 1024);
const _: () = assert!(Pipeline::OFFSETS.second == 3072);
const _: () = assert!(Pipeline::OFFSETS.extra == 6144);

fn main() {
    let mut arena = Arena::<Pipeline>::new().unwrap();
    let v = arena.views_mut();
    v.first.params.gain[0] = 1.0;
    v.second.params.gain[3] = 2.0;
    v.second.out[99] = 7;
    v.extra.gain[1] = 3.0;
    v.input[9] = 4;
    let r = arena.views();
    assert_eq!(r.second.params.gain[3], 2.0);
    assert_eq!(r.second.out[99], 7);
}

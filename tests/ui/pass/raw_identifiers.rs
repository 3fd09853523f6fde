// Raw identifiers (`r#Name`, `r#type`) name a layout, its fields and its stages; names are
// reported as Rust shows them, without the `r#`.
#![allow(non_camel_case_types)]
use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
struct r#Frame {
    r#type: [u8; 4],
}

#[derive(DeviceLayout)]
#[layout(stages(r#fn, r#match))]
struct r#Steps {
    #[layout(live = r#fn)]
    r#in: [u8; 4],
    #[layout(live = r#fn..=r#match)]
    out: [u8; 4],
}

fn main() {
    assert_eq!(r#Frame::NAME, "Frame");
    assert_eq!(r#Frame::FIELDS[0].name, "type");
    assert_eq!(r#Frame::OFFSETS.r#type, 0);
    assert_eq!(r#Steps::NAME, "Steps");
    assert_eq!(r#Steps::STAGE_NAMES, ["fn", "match"]);
    let mut arena = Arena::<r#Steps>::new().unwrap();
    use StepsStages;
    arena.fn_mut().r#in[0] = 1;
    arena.r#match_mut().out[0] = 2;
    assert_eq!(arena.r#match().out[0], 2);
}

// Arenas allocate `SIZE` bytes and hand out the views a `DeviceLayout` makes, trusting its
// constants: a hand-written layout that claims 16 bytes and slices 4096 would let safe code
// write past the allocation. `DeviceLayout` and `Stage` are `unsafe trait`s: a safe impl does
// not compile.
use devarena::{DeviceLayout, FieldPlacement, LiveRange, Stage, ViewKind};

struct Liar;

impl DeviceLayout for Liar {
    const NAME: &'static str = "Liar";
    const SIZE: usize = 16;
    const ALIGN: usize = 16;
    const FIELDS: &'static [FieldPlacement] = &[];
    const FIELD_TYPES: &'static [&'static str] = &[];
    const LIVE: &'static [LiveRange] = &[];
    const STAGES: usize = 1;
    const UNALIASED_SIZE: usize = 16;
    const PEAK_LIVE_BOUND: usize = 16;
    type Views<'a, K: ViewKind> = K::Slice<'a, u8>;
    unsafe fn views<'a, K: ViewKind>(base: K::Base<'a>) -> Self::Views<'a, K> {
        unsafe { K::slice::<u8>(base, 0, 4096) }
    }
}

impl Stage<0> for Liar {
    type StageViews<'a, K: ViewKind> = (K::Slice<'a, u8>, K::Slice<'a, u8>);
    unsafe fn stage_views<'a, K: ViewKind>(base: K::Base<'a>) -> Self::StageViews<'a, K> {
        unsafe { (K::slice::<u8>(base, 0, 16), K::slice::<u8>(base, 0, 16)) }
    }
}

fn main() {}

// A layout with stages shares bytes between fields; a safe `impl Disjoint` would let
// `views_mut()` hand out two `&mut` views of the same bytes. `Disjoint` is an `unsafe trait`.
#![forbid(unsafe_code)]

use devarena::{Arena, DeviceLayout};

#[derive(DeviceLayout)]
#[layout(stages = 2)]
struct Staged {
    #[layout(live = 0..=0)]
    a: [u32; 64],
    #[layout(live = 1..=1)]
    b: [u32; 64], // shares bytes with `a`
}

impl devarena::Disjoint for Staged {}

fn main() {
    let mut arena = Arena::<Staged>::new().unwrap();
    let views = arena.views_mut();
    views.a[0] = 1;
    views.b[0] = 2;
}

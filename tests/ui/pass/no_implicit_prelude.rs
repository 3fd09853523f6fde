// The derive's output names everything by absolute path: it compiles in a module without the
// implicit prelude.
#![no_implicit_prelude]

mod inner {
    #![no_implicit_prelude]

    #[derive(::devarena::DeviceLayout)]
    #[layout(align = 512, max_bytes = 1 << 20)]
    pub struct Params {
        pub gain: [f32; 4],
    }

    #[derive(::devarena::DeviceLayout)]
    pub struct Frame<const N: usize> {
        pub rgb: [u8; N],
        #[layout(align = 4096)]
        pub hist: [u32; 256],
        pub params: Params,
    }

    #[derive(::devarena::DeviceLayout)]
    pub struct Empty {}

    #[derive(::devarena::DeviceLayout)]
    #[layout(stages(decode, blur))]
    pub(crate) struct Staged {
        #[layout(live = decode)]
        pub input: [u8; 64],
        #[layout(live = decode..=blur)]
        pub gray: [f32; 64],
    }

    #[derive(::devarena::DeviceLayout)]
    pub struct Typed<T: ::devarena::Element> {
        pub data: [T; 4],
    }
}

fn main() {
    use ::devarena::DeviceLayout;
    let _: usize = inner::Frame::<100>::SIZE;
    let _: usize = inner::Frame::<100>::OFFSETS.params;
    let _: usize = inner::Empty::SIZE;
    let _: usize = inner::Typed::<f32>::SIZE;
    let _: usize = inner::Staged::SIZE;
    let mut arena = ::devarena::Arena::<inner::Frame<100>>::new().unwrap();
    let v = arena.views_mut();
    v.params.gain[0] = 1.0;
}

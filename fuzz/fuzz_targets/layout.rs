#![no_main]
//! `cargo +nightly fuzz run layout`: see `devarena_tests::fuzz::layout`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| devarena_tests::fuzz::layout::run(data));

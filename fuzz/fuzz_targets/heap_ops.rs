#![no_main]
//! `cargo +nightly fuzz run heap_ops`: see `devarena_tests::fuzz::heap_ops`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| devarena_tests::fuzz::heap_ops::run(data));

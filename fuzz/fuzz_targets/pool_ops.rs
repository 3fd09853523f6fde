#![no_main]
//! `cargo +nightly fuzz run pool_ops`: see `devarena_tests::fuzz::pool_ops`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| devarena_tests::fuzz::pool_ops::run(data));

#![no_main]
//! `cargo +nightly fuzz run torch_abi`: see `devarena_tests::fuzz::torch_abi`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| devarena_tests::fuzz::torch_abi::run(data));

#![no_main]
//! `cargo +nightly fuzz run csv_log`: see `devarena_tests::fuzz::csv_log`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| devarena_tests::fuzz::csv_log::run(data));

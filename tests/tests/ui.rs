//! Compile-time behaviour of `#[derive(DeviceLayout)]`: what compiles (`ui/pass`) and the
//! exact compile errors of what must not (`ui/compile_fail`, with checked-in `.stderr` files).
//!
//! Regenerate the expected output after a deliberate message change with
//! `TRYBUILD=overwrite cargo test -p devarena-tests --test ui`, then read every `.stderr`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/compile_fail/*.rs");
}

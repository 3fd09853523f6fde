//! `#[derive(DeviceLayout)]` for [devarena](https://docs.rs/devarena).
//!
//! The derive parses the struct into a model, checks what can be checked on the tokens
//! (attribute keys, literal alignments, stage names, field kinds), and emits constants that call
//! `devarena::plan`'s `const fn`s: the layout arithmetic lives in one place, shared with the
//! run-time `LayoutBuilder`. Everything the compiler must evaluate (element sizes, overflow,
//! `max_bytes`) is checked by constants spanned on the offending tokens.

mod element;
mod emit;
mod model;

use proc_macro::TokenStream;

/// Plans a struct of fixed-size buffers at compile time. See `devarena::DeviceLayout`.
#[proc_macro_derive(DeviceLayout, attributes(layout))]
pub fn derive_device_layout(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    match model::parse(input) {
        Ok(layout) => emit::emit(&layout).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Declares a plain `#[repr(C)]` struct a device element, safely: the derive checks the
/// `repr`, that every field is an `Element`, and that the struct has no padding.
/// See `devarena::Element`.
#[proc_macro_derive(Element)]
pub fn derive_element(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    match element::derive(input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

//! `#[derive(Element)]`: a safe way to declare a plain `#[repr(C)]` struct a device element.
//!
//! The derive proves what `unsafe impl Element` would only promise: the struct is `#[repr(C)]`
//! (or `#[repr(transparent)]`), every field is itself an `Element`, and the struct has no
//! padding (its size is the sum of its fields' sizes, checked by the compiler).

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields};

use crate::model::Errors;

pub fn derive(input: DeriveInput) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let name = &input.ident;
    // As Rust shows it: `r#Foo` is `Foo`.
    let name_str = name.unraw().to_string();
    let mut repr_ok = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("repr")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("C") || meta.path.is_ident("transparent") {
                repr_ok = true;
            }
            if meta.input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in meta.input);
                let _: TokenStream = content.parse()?;
            }
            Ok(())
        });
    }
    if !repr_ok {
        errors.push(
            name.span(),
            format_args!(
                "Element: `{name_str}` needs `#[repr(C)]` (or `#[repr(transparent)]`) so its \
                 layout is the same on the host and the device"
            ),
        );
    }
    if !input.generics.params.is_empty() {
        errors.push(
            input.generics.span(),
            format_args!(
                "Element: `{name_str}` is generic; implement `unsafe impl Element` by hand for \
                 each instance"
            ),
        );
    }
    let fields: Vec<&syn::Field> = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => f.named.iter().collect(),
            Fields::Unnamed(f) => f.unnamed.iter().collect(),
            Fields::Unit => {
                errors.push(
                    name.span(),
                    format_args!("Element: `{name_str}` has no fields; an element holds data"),
                );
                Vec::new()
            }
        },
        Data::Enum(e) => {
            errors.push(
                e.enum_token.span,
                format_args!(
                    "Element cannot be derived for enum `{name_str}`: not every bit pattern is \
                     a valid value"
                ),
            );
            Vec::new()
        }
        Data::Union(u) => {
            errors.push(
                u.union_token.span,
                format_args!("Element cannot be derived for union `{name_str}`"),
            );
            Vec::new()
        }
    };
    errors.finish()?;

    let bounds = fields.iter().map(|f| {
        let ty = &f.ty;
        quote_spanned!(ty.span()=> ::devarena::__private::assert_element::<#ty>();)
    });
    let sizes = fields.iter().map(|f| {
        let ty = &f.ty;
        quote!(::core::mem::size_of::<#ty>())
    });
    Ok(quote! {
        const _: () = {
            fn __devarena_fields_are_elements() {
                #(#bounds)*
            }
            ::devarena::plan::element_padding_check(
                #name_str,
                ::core::mem::size_of::<#name>(),
                0 #(+ #sizes)*,
            );
        };
        // SAFETY: `#[repr(C)]` (checked by the derive), every field is an `Element` (checked
        // above) and the size is the sum of the fields' sizes (checked above): no padding, and
        // every bit pattern is a valid value.
        unsafe impl ::devarena::Element for #name {}
    })
}

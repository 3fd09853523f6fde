//! Emit: a checked [`Layout`] model → tokens. The emitted code only *calls* devarena's const
//! fns; no layout arithmetic happens here.
//!
//! What a derive generates, and why each item is there:
//!
//! * hidden constants holding the `LayoutSpec`, the `FieldSpec`s and the result of
//!   `devarena::plan::plan` (the one planner), one `const _` check per field and attribute so
//!   each compile error is spanned on its own tokens (each reads whether the plan was found,
//!   and runs its check only when it was not), and the `DeviceLayout` impl, the
//!   `<Name>Offsets` struct and `OFFSETS` constant that read the plan;
//! * the views struct (`<Name>Views<'a, K>`), generic over devarena's `ViewKind`, so one
//!   struct serves host and device views, and the `views` fn that slices a region into it;
//! * `unsafe impl Disjoint` for a layout without stages (no two fields share bytes: the
//!   planner's promise, which `Disjoint`'s contract asks for), and per stage a
//!   `<Name>Stage<S>Views` struct with its `Stage<S>` impl;
//! * for named stages only (`#[layout(stages(decode, blur))]`), a `<Name>Stages` trait
//!   implemented for `devarena::Arena<Name, B>` over any `devarena::Backend`, so that
//!   `arena.decode_mut()` reads as the stage it names. This is the one place the generated code
//!   names the arena and the backend: a trait method is the only way a derive can add
//!   named methods to a type of another crate. It forwards to `Arena::stage_mut::<S>()`.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{GenericParam, Ident, Lifetime};

use crate::model::{Field, FieldKind, Layout};

/// How many constants the derive's search runs in (see `devarena::plan::improve_step`): each
/// evaluates within a fixed amount of work, so the search's whole cost is bounded by this.
/// `devarena::plan::COMPILE_TIME_STEPS` is the source of truth; the generated code checks
/// that the two agree.
const SEARCH_STEPS: usize = 4;

pub fn emit(layout: &Layout) -> TokenStream {
    let name = &layout.ident;
    // Names as Rust shows them: `r#Foo` is `Foo`.
    let name_str = name.unraw().to_string();
    let vis = &layout.vis;
    let n = layout.fields.len();
    let (impl_g, ty_g, where_c) = layout.generics.split_for_impl();
    let dl = quote!(::devarena::DeviceLayout);
    let plan = quote!(::devarena::plan);

    let views_ident = format_ident!("{}Views", name);
    let offsets_ident = format_ident!("{}Offsets", name);

    // Names for the views struct's extra parameters that cannot clash with the user's: neither
    // a generic parameter nor any name used in a bound, a where clause or a field's type (a
    // user type called `K`, a `for<'a>` bound).
    let mut taken: Vec<String> = layout
        .generics
        .params
        .iter()
        .map(|p| match p {
            GenericParam::Type(t) => t.ident.to_string(),
            GenericParam::Const(c) => c.ident.to_string(),
            GenericParam::Lifetime(l) => l.lifetime.ident.to_string(),
        })
        .collect();
    idents_in(layout.generics.to_token_stream(), &mut taken);
    if let Some(w) = &layout.generics.where_clause {
        idents_in(w.to_token_stream(), &mut taken);
    }
    for f in &layout.fields {
        idents_of_field(f, &mut taken);
    }
    let k = if taken.iter().any(|t| t == "K") {
        format_ident!("__DevarenaK")
    } else {
        format_ident!("K")
    };
    let lt = if taken.iter().any(|t| t == "a") {
        Lifetime::new("'__devarena_a", Span::call_site())
    } else {
        Lifetime::new("'a", Span::call_site())
    };

    // --- the layout spec -------------------------------------------------------------------
    let mut layout_spec = quote!(#plan::LayoutSpec::DEFAULT);
    if let Some(a) = &layout.align {
        layout_spec = quote!(#layout_spec.with_align(#a));
    }
    if let Some(m) = &layout.max_bytes {
        layout_spec = quote!(#layout_spec.with_max_bytes(#m));
    }
    if let Some(s) = &layout.stages {
        let c = s.count;
        layout_spec = quote!(#layout_spec.with_stages(#c));
    }

    // --- per field -------------------------------------------------------------------------
    let mut specs = Vec::new();
    let mut names = Vec::new();
    let mut types = Vec::new();
    let mut view_fields = Vec::new();
    let mut view_inits = Vec::new();
    let mut offset_fields = Vec::new();
    let mut offset_inits = Vec::new();
    let mut placements = Vec::new();
    let mut lives = Vec::new();
    let mut checks = Vec::new();
    for (i, f) in layout.fields.iter().enumerate() {
        let fid = &f.ident;
        let fname = fid.unraw().to_string();
        names.push(fname.clone());
        types.push(f.kind.elem_name());
        let mut spec = match &f.kind {
            FieldKind::Array { elem, len } => {
                quote_spanned!(len.span()=> #plan::FieldSpec::of::<#elem>(#len))
            }
            FieldKind::Nested(ty) => quote_spanned!(ty.span()=>
                #plan::FieldSpec::nested(<#ty as #dl>::SIZE, <#ty as #dl>::ALIGN)
            ),
        };
        if let Some(a) = &f.align {
            spec = quote!(#spec.with_align(#a));
        }
        if let Some((a, b, _)) = &f.live {
            spec = quote!(#spec.with_live(#a, #b));
        }
        specs.push(spec);

        let doc = format!("View of `{name_str}::{fname}`.");
        match &f.kind {
            FieldKind::Array { elem, .. } => {
                view_fields.push(quote_spanned!(elem.span()=>
                    #[doc = #doc]
                    pub #fid: <#k as ::devarena::ViewKind>::Slice<#lt, #elem>
                ));
                view_inits.push(quote!(
                    #fid: <#k as ::devarena::ViewKind>::slice::<#elem>(
                        base,
                        Self::__DEVARENA_PLAN.slots[#i].offset,
                        Self::__DEVARENA_SPECS[#i].len,
                    )
                ));
            }
            FieldKind::Nested(ty) => {
                view_fields.push(quote_spanned!(ty.span()=>
                    #[doc = #doc]
                    pub #fid: <#ty as #dl>::Views<#lt, #k>
                ));
                view_inits.push(quote!(
                    #fid: ::devarena::__private::nested_views::<#ty, #k>(
                        <#k as ::devarena::ViewKind>::offset(
                            base,
                            Self::__DEVARENA_PLAN.slots[#i].offset,
                        ),
                    )
                ));
            }
        }
        let odoc = format!("Byte offset of `{name_str}::{fname}`.");
        offset_fields.push(quote!(#[doc = #odoc] pub #fid: usize));
        offset_inits.push(quote!(#fid: Self::__DEVARENA_PLAN.slots[#i].offset));
        placements.push(quote!(
            ::devarena::FieldPlacement::new(#fname, Self::__DEVARENA_PLAN.slots[#i])
        ));
        lives.push(quote!(Self::__DEVARENA_SPECS[#i].live));

        // Free constants (non-generic layouts only): each check is spanned on its own tokens
        // and evaluated on its own, so every field's error is reported, once.
        if !layout.is_generic() {
            let check = |what: &str, span: Span| derive_check(name, &name_str, what, i, span);
            let align_span = f.align.as_ref().map_or(fid.span(), |a| a.span());
            checks.push(check("Align", align_span));
            let size_span = match &f.kind {
                FieldKind::Array { len, .. } => len.span(),
                FieldKind::Nested(ty) => ty.span(),
            };
            checks.push(check("Size", size_span));
            if let Some((_, _, span)) = &f.live {
                checks.push(check("Live", *span));
            }
            checks.push(check("Place", fid.span()));
        }
    }
    if !layout.is_generic() {
        if let Some(a) = &layout.align {
            checks.push(derive_check(name, &name_str, "LayoutAlign", 0, a.span()));
        }
        let span = layout.max_bytes.as_ref().map_or(name.span(), |m| m.span());
        checks.push(derive_check(name, &name_str, "Layout", 0, span));
    }
    let panic_on_error = layout.is_generic();
    // The plan, in constants of their own so that no one evaluation runs long: rustc's
    // `long_running_const_eval` lint counts each constant's evaluation apart, and a crate that
    // uses the layout's constants evaluates them again under its own lint levels, where no
    // attribute of ours reaches.
    //
    // With stages: one constant for what the greedy orderings share (the fields checked,
    // their spans, the lower bound), one per greedy ordering (without the `max_bytes` limit:
    // one ordering alone may be over it), the smallest of them, then a chain of search steps
    // that improve on it under a fixed amount of work each (`plan::improve_step`), and
    // `max_bytes` checked once on the final plan. The search's scratch space is sized from the layout, so
    // its length is a constant of its own, named by the type (an array length cannot name
    // `Self`, nor a generic layout's parameters: generic layouts keep the greedy plan).
    let result_ty = quote!(::core::result::Result<#plan::Plan<#n>, #plan::PlanError>);
    let scratch = quote!({ #plan::scratch_len(#n) });
    let plan_items = if layout.stages.is_some() {
        let orderings = ["BySize", "ByStart", "ByDuration", "Declaration"];
        let greedy: Vec<Ident> = orderings
            .iter()
            .map(|o| format_ident!("__DEVARENA_GREEDY_{}", o.to_uppercase()))
            .collect();
        let strategies: Vec<Ident> = orderings.iter().map(|o| format_ident!("{}", o)).collect();
        let (a, b, c, d) = (&greedy[0], &greedy[1], &greedy[2], &greedy[3]);
        let (search_items, searched) = if layout.is_generic() {
            (quote!(), quote!(Self::__DEVARENA_GREEDY))
        } else {
            let steps: Vec<Ident> = (0..=SEARCH_STEPS)
                .map(|k| format_ident!("__DEVARENA_SEARCH_{}", k))
                .collect();
            let (prev, next) = (&steps[..SEARCH_STEPS], &steps[1..]);
            let last = &steps[SEARCH_STEPS];
            let items = quote! {
                #[doc(hidden)]
                const __DEVARENA_SEARCH_STEPS: () = ::core::assert!(
                    #SEARCH_STEPS == #plan::COMPILE_TIME_STEPS,
                    "devarena-macros and devarena disagree on the search's steps: use matching versions",
                );
                #[doc(hidden)]
                const __DEVARENA_SEARCH_LEN: usize = #plan::search_len::<#n, #scratch>(
                    &Self::__DEVARENA_LAYOUT, &Self::__DEVARENA_SPECS, &Self::__DEVARENA_GREEDY,
                );
                #[doc(hidden)]
                const __DEVARENA_SEARCH_0: #plan::Improving<#n, { #name::__DEVARENA_SEARCH_LEN }> = {
                    let () = Self::__DEVARENA_SEARCH_STEPS;
                    #plan::Improving::new(Self::__DEVARENA_GREEDY)
                };
                #(
                    #[doc(hidden)]
                    const #next: #plan::Improving<#n, { #name::__DEVARENA_SEARCH_LEN }> =
                        #plan::improve_step::<#n, { #name::__DEVARENA_SEARCH_LEN }>(
                            &Self::__DEVARENA_LAYOUT, &Self::__DEVARENA_SPECS, Self::#prev,
                        );
                )*
            };
            (items, quote!(Self::#last.result()))
        };
        quote! {
            #[doc(hidden)]
            const __DEVARENA_PREPARED: #plan::Prepared<#n> = #plan::prepare::<#n, #scratch>(
                &Self::__DEVARENA_LAYOUT.with_max_bytes(usize::MAX),
                &Self::__DEVARENA_SPECS,
            );
            #(
                #[doc(hidden)]
                const #greedy: #result_ty = #plan::plan_prepared::<#n, #scratch>(
                    &Self::__DEVARENA_LAYOUT.with_max_bytes(usize::MAX),
                    &Self::__DEVARENA_SPECS,
                    &Self::__DEVARENA_PREPARED,
                    &[#plan::Strategy::#strategies],
                );
            )*
            #[doc(hidden)]
            const __DEVARENA_GREEDY: #result_ty = #plan::smaller(
                #plan::smaller(Self::#a, Self::#b),
                #plan::smaller(Self::#c, Self::#d),
            );
            #search_items
            #[doc(hidden)]
            const __DEVARENA_RESULT: #result_ty =
                #plan::within_max_bytes(&Self::__DEVARENA_LAYOUT, #searched);
        }
    } else {
        quote! {
            #[doc(hidden)]
            const __DEVARENA_RESULT: #result_ty =
                #plan::plan::<#n, #scratch>(&Self::__DEVARENA_LAYOUT, &Self::__DEVARENA_SPECS);
        }
    };
    // A generic layout's error surfaces when an instance is used; point at the struct's name.
    let derive_plan = quote_spanned!(name.span()=> ::devarena::plan::derive_plan(
        Self::__DEVARENA_RESULT, #panic_on_error, #name_str,
        &Self::__DEVARENA_NAMES, &Self::__DEVARENA_TYPES,
    ));

    // --- the views struct ------------------------------------------------------------------
    let mut vgenerics = layout.generics.clone();
    vgenerics
        .params
        .insert(0, syn::parse_quote!(#k: ::devarena::ViewKind));
    vgenerics.params.insert(0, syn::parse_quote!(#lt));
    let (vimpl_g, vty_g, vwhere) = vgenerics.split_for_impl();
    let _ = vimpl_g;
    let marker = if layout.fields.is_empty() {
        quote!(
            #[doc(hidden)]
            pub __devarena_marker: ::devarena::__private::PhantomData<(&#lt (), #k)>,
        )
    } else {
        quote!()
    };
    let marker_init = if layout.fields.is_empty() {
        quote!(__devarena_marker: ::devarena::__private::PhantomData,)
    } else {
        quote!()
    };
    let views_doc = format!(
        "Views of every field of [`{name_str}`], one per field, of kind `K` (host slices, \
         device views, ...). Made by an arena: `arena.views_mut()`."
    );
    let offsets_doc =
        format!("Byte offset of every field of [`{name_str}`]: `{name_str}::OFFSETS`.");

    let stages = layout.stages.as_ref().map_or(0, |s| s.count);
    let stage_names: Vec<String> = layout
        .stages
        .as_ref()
        .and_then(|s| s.names.as_ref())
        .map(|ns| ns.iter().map(|n| n.unraw().to_string()).collect())
        .unwrap_or_default();
    let disjoint = if layout.stages.is_none() {
        quote!(
            // SAFETY: no stages, so the planner placed every field in bytes of its own, and
            // the generated `views` slices each field's view from its own placement.
            unsafe impl #impl_g ::devarena::Disjoint for #name #ty_g #where_c {}
        )
    } else {
        quote!()
    };
    let vstruct_params = &vgenerics.params;
    let field_idents: Vec<&Ident> = layout.fields.iter().map(|f| &f.ident).collect();

    // --- stage views: per stage, only the fields live in it --------------------------------
    let ty_arg_list: Vec<TokenStream> = layout
        .generics
        .params
        .iter()
        .map(|p| match p {
            GenericParam::Type(t) => t.ident.to_token_stream(),
            GenericParam::Const(c) => c.ident.to_token_stream(),
            GenericParam::Lifetime(l) => l.lifetime.to_token_stream(),
        })
        .collect();
    let ty_args = quote!(#(#ty_arg_list,)*);
    let mut stage_items = Vec::new();
    if let Some(st) = &layout.stages {
        let mut methods_decl = Vec::new();
        let mut methods_impl = Vec::new();
        for stage in 0..st.count {
            let live: Vec<usize> = layout
                .fields
                .iter()
                .enumerate()
                .filter(|(_, f)| {
                    f.live
                        .as_ref()
                        .is_none_or(|(a, b, _)| *a <= stage && stage <= *b)
                })
                .map(|(i, _)| i)
                .collect();
            let sident = format_ident!("{}Stage{}Views", name, stage);
            let stage_name = st.names.as_ref().map(|ns| ns[stage].to_string());
            let label = match &stage_name {
                Some(sn) => format!("stage {stage} (`{sn}`)"),
                None => format!("stage {stage}"),
            };
            let sdoc = format!(
                "Views of the fields of [`{name_str}`] live in {label}: made by \
                 `arena.stage_mut::<{stage}>()`. Fields live together never share bytes."
            );
            let sfields: Vec<&TokenStream> = live.iter().map(|&i| &view_fields[i]).collect();
            let sinits: Vec<&TokenStream> = live.iter().map(|&i| &view_inits[i]).collect();
            // A marker where the stage's fields do not name every type parameter of the layout
            // (E0392 otherwise), or where it has none.
            let mut named = Vec::new();
            for &i in &live {
                idents_of_field(&layout.fields[i], &mut named);
            }
            let unnamed: Vec<&Ident> = layout
                .generics
                .type_params()
                .map(|t| &t.ident)
                .filter(|t| !named.iter().any(|n| *t == n))
                .collect();
            let (smarker, smarker_init) = if live.is_empty() || !unnamed.is_empty() {
                (
                    quote!(#[doc(hidden)] pub __devarena_marker: ::devarena::__private::PhantomData<(&#lt (), #k, #(fn() -> #unnamed,)*)>,),
                    quote!(__devarena_marker: ::devarena::__private::PhantomData,),
                )
            } else {
                (quote!(), quote!())
            };
            stage_items.push(quote! {
                #[doc = #sdoc]
                #[allow(dead_code, missing_debug_implementations, private_interfaces)]
                #vis struct #sident <#vstruct_params> #vwhere {
                    #(#sfields,)*
                    #smarker
                }

                // (The fields live in this stage all meet each other, so the planner kept them
                // apart, and each view is made from its own field's placement.)
                unsafe impl #impl_g ::devarena::Stage<#stage> for #name #ty_g #where_c {
                    type StageViews<#lt, #k: ::devarena::ViewKind> = #sident #vty_g;

                    unsafe fn stage_views<#lt, #k: ::devarena::ViewKind>(
                        base: <#k as ::devarena::ViewKind>::Base<#lt>,
                    ) -> Self::StageViews<#lt, #k> {
                        // SAFETY: the fields live in this stage all meet each other, so the
                        // planner kept them apart; the caller hands the whole region.
                        unsafe {
                            #sident {
                                #(#sinits,)*
                                #smarker_init
                            }
                        }
                    }
                }
            });
            if let Some(sn) = &stage_name {
                let m_mut = format_ident!("{}_mut", sn);
                let m_ref = format_ident!("{}", sn);
                let doc_mut = format!("Mutable views of the fields live in {label}.");
                let doc_ref = format!("Shared views of the fields live in {label}.");
                methods_decl.push(quote! {
                    #[doc = #doc_mut]
                    fn #m_mut(&mut self) -> #sident <'_, <__DevarenaB as ::devarena::Backend>::Mut, #ty_args>;
                    #[doc = #doc_ref]
                    fn #m_ref(&self) -> #sident <'_, <__DevarenaB as ::devarena::Backend>::Ref, #ty_args>;
                });
                methods_impl.push(quote! {
                    fn #m_mut(&mut self) -> #sident <'_, <__DevarenaB as ::devarena::Backend>::Mut, #ty_args> {
                        self.stage_mut::<#stage>()
                    }
                    fn #m_ref(&self) -> #sident <'_, <__DevarenaB as ::devarena::Backend>::Ref, #ty_args> {
                        self.stage::<#stage>()
                    }
                });
            }
        }
        if !methods_decl.is_empty() {
            let tident = format_ident!("{}Stages", name);
            let tdoc = format!(
                "Stage views of an arena of [`{name_str}`] by stage name: `use` this trait, \
                 then `arena.<stage>_mut()`."
            );
            let mut tgenerics = layout.generics.clone();
            tgenerics
                .params
                .push(syn::parse_quote!(__DevarenaB: ::devarena::backend::DirectViews));
            let (timpl_g, tty_g, _) = tgenerics.split_for_impl();
            let twhere = where_c;
            stage_items.push(quote! {
                #[doc = #tdoc]
                #vis trait #tident #timpl_g #twhere {
                    #(#methods_decl)*
                }

                impl #timpl_g #tident #tty_g for ::devarena::Arena<#name #ty_g, __DevarenaB> #twhere {
                    #(#methods_impl)*
                }
            });
        }
    }

    quote! {
        #[doc = #views_doc]
        // A view field is public even where its element type is private to the module.
        #[allow(dead_code, missing_debug_implementations, private_interfaces)]
        #vis struct #views_ident <#vstruct_params> #vwhere {
            #(#view_fields,)*
            #marker
        }

        #[doc = #offsets_doc]
        #[derive(::core::fmt::Debug, ::core::clone::Clone, ::core::marker::Copy,
                 ::core::cmp::PartialEq, ::core::cmp::Eq, ::core::hash::Hash)]
        #[allow(dead_code)]
        #vis struct #offsets_ident {
            #(#offset_fields,)*
        }

        #[allow(dead_code)]
        impl #impl_g #name #ty_g #where_c {
            #[doc(hidden)]
            const __DEVARENA_LAYOUT: #plan::LayoutSpec = #layout_spec;
            #[doc(hidden)]
            const __DEVARENA_SPECS: [#plan::FieldSpec; #n] = [#(#specs),*];
            #[doc(hidden)]
            const __DEVARENA_NAMES: [&'static str; #n] = [#(#names),*];
            #[doc(hidden)]
            const __DEVARENA_TYPES: [&'static str; #n] = [#(#types),*];
            #plan_items
            #[doc(hidden)]
            const __DEVARENA_PLANNED: bool = Self::__DEVARENA_RESULT.is_ok();
            #[doc(hidden)]
            const __DEVARENA_PLAN: #plan::Plan<#n> = #derive_plan;
            /// Byte offset of every field, computed by the compiler.
            pub const OFFSETS: #offsets_ident = #offsets_ident { #(#offset_inits,)* };
        }

        #(#checks)*

        // (The constants are the compile-time plan's, which the checks above hold to: every
        // field inside `SIZE`, aligned, apart from every field whose live range meets its own;
        // each view is made from its own field's placement.)
        unsafe impl #impl_g #dl for #name #ty_g #where_c {
            const NAME: &'static str = #name_str;
            const SIZE: usize = Self::__DEVARENA_PLAN.totals.size;
            const ALIGN: usize = Self::__DEVARENA_PLAN.totals.align;
            const FIELDS: &'static [::devarena::FieldPlacement] = &[#(#placements),*];
            const FIELD_TYPES: &'static [&'static str] = &Self::__DEVARENA_TYPES;
            const LIVE: &'static [::devarena::LiveRange] = &[#(#lives),*];
            const STAGES: usize = #stages;
            const STAGE_NAMES: &'static [&'static str] = &[#(#stage_names),*];
            const UNALIASED_SIZE: usize = Self::__DEVARENA_PLAN.totals.unaliased_size;
            const PEAK_LIVE_BOUND: usize = Self::__DEVARENA_PLAN.totals.peak_live_bound;

            type Views<#lt, #k: ::devarena::ViewKind> = #views_ident #vty_g;

            unsafe fn views<#lt, #k: ::devarena::ViewKind>(
                base: <#k as ::devarena::ViewKind>::Base<#lt>,
            ) -> Self::Views<#lt, #k> {
                // A layout struct is a description, never a value: its fields are read only
                // here, in a closure that never runs, so they raise no `dead_code` warnings.
                // (Through `addr_of!`, which takes no reference: a `#[repr(packed)]` layout's
                // fields may be unaligned.)
                let _ = |__devarena_this: &Self| {
                    #( let _ = ::core::ptr::addr_of!(__devarena_this.#field_idents); )*
                };
                // SAFETY: the caller hands a region of `SIZE` bytes at `ALIGN`, live and (for
                // mutable kinds) unaliased for `'a`; the plan keeps every field inside it,
                // aligned for its element, and, without stages, apart from every other field
                // (with stages, the caller makes no mutable views: `views`' contract).
                unsafe {
                    #views_ident {
                        #(#view_inits,)*
                        #marker_init
                    }
                }
            }
        }

        #disjoint

        #(#stage_items)*
    }
}

/// A free constant that runs one of the planner's checks. Every token carries `span`, so the
/// compiler points at the offending field or attribute.
fn derive_check(name: &Ident, name_str: &str, what: &str, index: usize, span: Span) -> TokenStream {
    let what = Ident::new(what, span);
    // The struct's own identifier, respanned: a raw one (`r#Foo`) stays raw.
    let mut ty = name.clone();
    ty.set_span(span);
    // A plan found means every check passes (the planner runs them all): the check reads
    // one `bool` and touches the layout's large constants only when there is an error.
    quote_spanned!(span=>
        const _: () = if !#ty::__DEVARENA_PLANNED {
            ::devarena::plan::derive_check(
                ::devarena::plan::Check::#what, #index,
                &#ty::__DEVARENA_LAYOUT, &#ty::__DEVARENA_SPECS,
                &#ty::__DEVARENA_RESULT, #name_str,
                &#ty::__DEVARENA_NAMES, &#ty::__DEVARENA_TYPES,
            )
        };
    )
}

/// Every identifier in `tokens`, however deeply grouped.
/// Every identifier in a field's type (and its array length).
fn idents_of_field(f: &Field, out: &mut Vec<String>) {
    match &f.kind {
        FieldKind::Array { elem, len } => {
            idents_in(elem.to_token_stream(), out);
            idents_in(len.to_token_stream(), out);
        }
        FieldKind::Nested(ty) => idents_in(ty.to_token_stream(), out),
    }
}

fn idents_in(tokens: TokenStream, out: &mut Vec<String>) {
    for tt in tokens {
        match tt {
            proc_macro2::TokenTree::Ident(i) => out.push(i.to_string()),
            proc_macro2::TokenTree::Group(g) => idents_in(g.stream(), out),
            _ => {}
        }
    }
}

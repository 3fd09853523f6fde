//! Parse: `DeriveInput` → a checked [`Layout`] model. All errors are collected and reported
//! together; nothing here emits tokens.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{
    Data, DeriveInput, Expr, ExprLit, ExprRange, Fields, GenericParam, Generics, Ident, Lit,
    RangeLimits, Type, Visibility,
};

/// Collects errors so every problem of one struct is reported at once.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.add(syn::Error::new(span, msg));
    }

    pub fn add(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub fn finish(self) -> Result<(), syn::Error> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

pub struct Layout {
    pub ident: Ident,
    pub vis: Visibility,
    pub generics: Generics,
    pub align: Option<Expr>,
    pub max_bytes: Option<Expr>,
    pub stages: Option<Stages>,
    pub fields: Vec<Field>,
}

pub struct Stages {
    pub count: usize,
    /// Names of the stages, when declared as `stages(a, b, c)`.
    pub names: Option<Vec<Ident>>,
}

pub struct Field {
    pub ident: Ident,
    pub kind: FieldKind,
    pub align: Option<Expr>,
    pub live: Option<(usize, usize, Span)>,
}

pub enum FieldKind {
    /// `[elem; len]`.
    Array { elem: Type, len: Expr },
    /// A nested `DeviceLayout`.
    Nested(Type),
}

impl FieldKind {
    pub fn elem_name(&self) -> String {
        let ty = match self {
            FieldKind::Array { elem, .. } => elem,
            FieldKind::Nested(ty) => ty,
        };
        tidy(&quote::ToTokens::to_token_stream(ty).to_string())
    }
}

/// `[u8 ; 3]` → `[u8; 3]`, `Foo < 3 >` → `Foo<3>`: how a person writes a type.
fn tidy(s: &str) -> String {
    s.replace(" ;", ";")
        .replace("[ ", "[")
        .replace(" ]", "]")
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace("& ", "&")
        .replace("* const ", "*const ")
        .replace("* mut ", "*mut ")
}

fn lit_int(expr: &Expr) -> Option<syn::Result<u128>> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => Some(i.base10_parse::<u128>()),
        Expr::Group(g) => lit_int(&g.expr),
        Expr::Paren(p) => lit_int(&p.expr),
        _ => None,
    }
}

/// An alignment: any const expression. A literal that is not a power of two is reported here,
/// spanned on the literal and together with the other attribute errors; everything else,
/// the largest alignment included, is checked by the planner's const fns (`plan::MAX_ALIGN` is
/// the one limit).
fn check_align_lit(expr: &Expr, what: &str, errors: &mut Errors) {
    if let Some(v) = lit_int(expr) {
        match v {
            Ok(v) if v.is_power_of_two() => {}
            Ok(v) => errors.push(
                expr.span(),
                format_args!("{what}: alignment {v} is not a power of two (e.g. 256, 4096)"),
            ),
            Err(e) => errors.add(e),
        }
    }
}

/// Skips the value of an unknown or repeated key so parsing can go on and find more errors.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        let _: Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| skip_value(&inner))?;
    }
    Ok(())
}

fn key_name(meta: &ParseNestedMeta<'_>) -> String {
    meta.path
        .get_ident()
        .map(|i| i.to_string())
        .unwrap_or_else(|| quote::ToTokens::to_token_stream(&meta.path).to_string())
}

/// Notes a key; if it was already given, reports the duplicate and returns false.
fn first_time(
    seen: &mut Vec<String>,
    key: &str,
    span: Span,
    ctx: &str,
    errors: &mut Errors,
) -> bool {
    if seen.iter().any(|k| k == key) {
        errors.push(
            span,
            format_args!("{ctx}: duplicate key `{key}` in #[layout(..)]: give it once"),
        );
        return false;
    }
    seen.push(key.to_owned());
    true
}

pub fn parse(input: DeriveInput) -> syn::Result<Layout> {
    let mut errors = Errors::default();
    let ident = input.ident.clone();
    let name = ident.unraw().to_string();

    let named = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => Some(f.named.iter().collect::<Vec<_>>()),
            Fields::Unit => Some(Vec::new()),
            Fields::Unnamed(f) => {
                errors.push(
                    f.span(),
                    format_args!(
                        "DeviceLayout: `{name}` is a tuple struct; a layout needs named fields, \
                         one per buffer (`struct {name} {{ rgb: [u8; N], .. }}`)"
                    ),
                );
                None
            }
        },
        Data::Enum(e) => {
            errors.push(
                e.enum_token.span,
                format_args!(
                    "DeviceLayout cannot be derived for enum `{name}`: a layout is a struct \
                     whose named fields are buffers"
                ),
            );
            None
        }
        Data::Union(u) => {
            errors.push(
                u.union_token.span,
                format_args!(
                    "DeviceLayout cannot be derived for union `{name}`: a layout is a struct \
                     whose named fields are buffers that never overlap"
                ),
            );
            None
        }
    };

    for param in &input.generics.params {
        if let GenericParam::Lifetime(l) = param {
            errors.push(
                l.lifetime.span(),
                format_args!(
                    "DeviceLayout: `{name}` has a lifetime parameter; a layout describes buffers \
                     and holds no references"
                ),
            );
        }
    }

    // Struct attributes.
    let mut align = None;
    let mut max_bytes = None;
    let mut stages: Option<Stages> = None;
    let mut seen = Vec::new();
    let ctx = format!("layout `{name}`");
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("layout")) {
        let r = attr.parse_nested_meta(|meta| {
            let key = key_name(&meta);
            let span = meta.path.span();
            match key.as_str() {
                "align" => {
                    let v: Expr = meta.value()?.parse()?;
                    if first_time(&mut seen, &key, span, &ctx, &mut errors) {
                        check_align_lit(&v, &ctx, &mut errors);
                        align = Some(v);
                    }
                }
                "max_bytes" => {
                    let v: Expr = meta.value()?.parse()?;
                    if first_time(&mut seen, &key, span, &ctx, &mut errors) {
                        if let Some(Err(e)) = lit_int(&v) {
                            errors.add(e);
                        }
                        max_bytes = Some(v);
                    }
                }
                "stages" => {
                    let parsed = parse_stages(&meta, &name, &mut errors)?;
                    if first_time(&mut seen, &key, span, &ctx, &mut errors) {
                        stages = parsed;
                    }
                }
                _ => {
                    skip_value(&meta)?;
                    errors.push(
                        span,
                        format_args!(
                            "{ctx}: unknown key `{key}` in #[layout(..)]; expected `align`, \
                             `max_bytes` or `stages`"
                        ),
                    );
                }
            }
            Ok(())
        });
        if let Err(e) = r {
            errors.add(e);
        }
    }

    // Fields.
    let mut fields = Vec::new();
    for f in named.into_iter().flatten() {
        let Some(fident) = f.ident.clone() else {
            continue;
        };
        let fname = fident.unraw().to_string();
        let fctx = format!("layout `{name}`, field `{fname}`");
        let kind = match field_kind(&f.ty) {
            Ok(k) => Some(k),
            Err(e) => {
                // Spanned on the whole type, not only its first token.
                errors.add(syn::Error::new_spanned(&f.ty, format_args!("{fctx}: {e}")));
                None
            }
        };
        let mut falign = None;
        let mut live = None;
        let mut seen = Vec::new();
        for attr in f.attrs.iter().filter(|a| a.path().is_ident("layout")) {
            let r = attr.parse_nested_meta(|meta| {
                let key = key_name(&meta);
                let span = meta.path.span();
                match key.as_str() {
                    "align" => {
                        let v: Expr = meta.value()?.parse()?;
                        if first_time(&mut seen, &key, span, &fctx, &mut errors) {
                            check_align_lit(&v, &fctx, &mut errors);
                            falign = Some(v);
                        }
                    }
                    "live" => {
                        let v: Expr = meta.value()?.parse()?;
                        if first_time(&mut seen, &key, span, &fctx, &mut errors) {
                            live = parse_live(&v, span, stages.as_ref(), &fctx, &mut errors);
                        }
                    }
                    _ => {
                        skip_value(&meta)?;
                        errors.push(
                            span,
                            format_args!(
                                "{fctx}: unknown key `{key}` in #[layout(..)]; expected \
                                 `align` or `live`"
                            ),
                        );
                    }
                }
                Ok(())
            });
            if let Err(e) = r {
                errors.add(e);
            }
        }
        if let Some(kind) = kind {
            fields.push(Field {
                ident: fident,
                kind,
                align: falign,
                live,
            });
        }
    }

    errors.finish()?;
    Ok(Layout {
        ident,
        vis: input.vis,
        generics: input.generics,
        align,
        max_bytes,
        stages,
        fields,
    })
}

/// The methods of `devarena::Arena` (on every backend; `tests/tests/stages.rs` checks this list
/// against `allocator/src/arena`).
/// A named stage's methods (`<stage>()`, `<stage>_mut()`) must not take one of these names:
/// inherent methods win over the stage trait's, so the call would quietly reach `Arena`'s
/// (`arena.free()` frees the arena).
const ARENA_METHODS: &[&str] = &[
    "new",
    "new_in",
    "views",
    "views_mut",
    "try_views",
    "try_views_mut",
    "stage",
    "stage_mut",
    "try_stage",
    "try_stage_mut",
    "backend",
    "allocation",
    "addr",
    "size",
    "fields",
    "free",
    "views_mut_on",
    "stage_mut_on",
    "prefetch_to_device",
    "prefetch_to_host",
    "host_views",
    "host_views_mut",
    "device_views_mut",
    "capture",
    "capture_on_own_stream",
];

/// The name of `Arena`'s method that one of stage `id`'s methods would take, if any.
fn arena_method_clash(id: &Ident) -> Option<String> {
    let name = id.unraw().to_string();
    let mutable = format!("{name}_mut");
    [name, mutable]
        .into_iter()
        .find(|m| ARENA_METHODS.contains(&m.as_str()))
}

fn parse_stages(
    meta: &ParseNestedMeta<'_>,
    name: &str,
    errors: &mut Errors,
) -> syn::Result<Option<Stages>> {
    if meta.input.peek(syn::token::Paren) {
        let mut names: Vec<Ident> = Vec::new();
        meta.parse_nested_meta(|inner| {
            match inner.path.get_ident() {
                Some(id) if names.iter().any(|n| n == id) => errors.push(
                    id.span(),
                    format_args!("stage `{id}` is named twice in `stages(..)` of `{name}`"),
                ),
                // A stage name names methods (`arena.<stage>()`); a keyword cannot.
                Some(id) if syn::parse_str::<Ident>(&id.to_string()).is_err() => errors.push(
                    id.span(),
                    format_args!(
                        "stage `{id}` in `stages(..)` of `{name}` is a Rust keyword, which \
                         cannot name the stage's methods (`arena.{id}()`): choose another name"
                    ),
                ),
                // `arena.<stage>()` and `arena.<stage>_mut()` are methods of a trait: where
                // `Arena` has a method of that name, the call reaches `Arena`'s instead.
                // (Kept as a stage all the same, so that live ranges naming it say nothing more.)
                Some(id) => {
                    if let Some(method) = arena_method_clash(id) {
                        errors.push(
                            id.span(),
                            format_args!(
                                "stage `{id}` in `stages(..)` of `{name}` would be reached as \
                                 `arena.{method}()`, which is `Arena`'s own method: choose \
                                 another name"
                            ),
                        );
                    }
                    names.push(id.clone());
                }
                None => errors.push(
                    inner.path.span(),
                    "a stage name is a plain identifier, e.g. `stages(decode, blur, output)`",
                ),
            }
            Ok(())
        })?;
        // Stage `a` has the methods `a()` and `a_mut()`: a stage called `a_mut` would clash.
        for id in &names {
            let mutable = format!("{}_mut", id.unraw());
            if let Some(clash) = names.iter().find(|n| n.unraw() == mutable) {
                errors.push(
                    clash.span(),
                    format_args!(
                        "stage `{clash}` in `stages(..)` of `{name}` has the name of stage \
                         `{id}`'s method `{mutable}()`: rename one of them"
                    ),
                );
            }
        }
        if names.is_empty() {
            errors.push(
                meta.path.span(),
                format_args!("`stages()` of `{name}` names no stage; give at least one"),
            );
            return Ok(None);
        }
        return Ok(Some(Stages {
            count: names.len(),
            names: Some(names),
        }));
    }
    let v: Expr = meta.value()?.parse()?;
    match lit_int(&v) {
        Some(Ok(n)) if (1..=4096).contains(&n) => Ok(Some(Stages {
            count: n as usize,
            names: None,
        })),
        Some(Ok(n)) => {
            errors.push(
                v.span(),
                format_args!("`stages = {n}` on `{name}`: a layout has 1 to 4096 stages"),
            );
            Ok(None)
        }
        Some(Err(e)) => Err(e),
        None => {
            errors.push(
                v.span(),
                "`stages` takes an integer literal (`stages = 4`) or names (`stages(a, b, c)`)",
            );
            Ok(None)
        }
    }
}

/// `A..=B`, or a single stage `A`; stages by number or by name.
fn parse_live(
    v: &Expr,
    key_span: Span,
    stages: Option<&Stages>,
    ctx: &str,
    errors: &mut Errors,
) -> Option<(usize, usize, Span)> {
    let Some(stages) = stages else {
        errors.push(
            key_span,
            format_args!(
                "{ctx}: `live` needs stages on the struct: add \
                 `#[layout(stages = N)]` or `#[layout(stages(a, b, ..))]`"
            ),
        );
        return None;
    };
    let (first, last) = match v {
        Expr::Range(ExprRange {
            start: Some(a),
            end: Some(b),
            limits: RangeLimits::Closed(_),
            ..
        }) => (a.as_ref(), b.as_ref()),
        Expr::Range(r) => {
            errors.push(
                r.span(),
                format_args!(
                    "{ctx}: a live range is inclusive with both ends given: \
                     `live = A..=B`"
                ),
            );
            return None;
        }
        single => (single, single),
    };
    let a = stage_index(first, stages, ctx, errors)?;
    let b = stage_index(last, stages, ctx, errors)?;
    if a > b {
        errors.push(
            v.span(),
            format_args!("{ctx}: live range {a}..={b} is empty: its first stage is after its last"),
        );
        return None;
    }
    if b >= stages.count {
        errors.push(
            v.span(),
            format_args!(
                "{ctx}: live range {a}..={b} is outside the stages 0..{}",
                stages.count
            ),
        );
        return None;
    }
    Some((a, b, v.span()))
}

fn stage_index(e: &Expr, stages: &Stages, ctx: &str, errors: &mut Errors) -> Option<usize> {
    if let Some(v) = lit_int(e) {
        return match v {
            Ok(v) => Some(v.min(usize::MAX as u128) as usize),
            Err(err) => {
                errors.add(err);
                None
            }
        };
    }
    let ident = match e {
        Expr::Path(p) => p.path.get_ident(),
        _ => None,
    };
    match (ident, &stages.names) {
        (Some(id), Some(names)) => match names.iter().position(|n| n == id) {
            Some(i) => Some(i),
            None => {
                let list: Vec<String> = names.iter().map(|n| n.to_string()).collect();
                errors.push(
                    id.span(),
                    format_args!(
                        "{ctx}: unknown stage `{id}`; the stages are {}",
                        list.join(", ")
                    ),
                );
                None
            }
        },
        (Some(id), None) => {
            errors.push(
                id.span(),
                format_args!(
                    "{ctx}: unknown stage `{id}`; the stages are numbered 0..{} \
                     (name them with `#[layout(stages({id}, ..))]`)",
                    stages.count
                ),
            );
            None
        }
        (None, _) => {
            errors.push(
                e.span(),
                format_args!("{ctx}: a stage is an integer literal or a stage name"),
            );
            None
        }
    }
}

const SCALARS: &[&str] = &[
    "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32",
    "f64", "bool", "char",
];

fn field_kind(ty: &Type) -> Result<FieldKind, String> {
    let shown = tidy(&quote::ToTokens::to_token_stream(ty).to_string());
    let neither = |what: &str| {
        format!(
            "`{shown}` is {what}; a layout field is a fixed-size buffer `[T; N]` or a \
             nested `#[derive(DeviceLayout)]` struct"
        )
    };
    match ty {
        Type::Array(a) => Ok(FieldKind::Array {
            elem: (*a.elem).clone(),
            len: a.len.clone(),
        }),
        Type::Group(g) => field_kind(&g.elem),
        Type::Paren(p) => field_kind(&p.elem),
        Type::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
            let id = p
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            if SCALARS.contains(&id.as_str()) {
                Err(format!(
                    "`{id}` is a single scalar; a layout field is a buffer such as \
                     `[{id}; 1]`, or a nested `#[derive(DeviceLayout)]` struct"
                ))
            } else {
                Ok(FieldKind::Nested(ty.clone()))
            }
        }
        Type::Path(_) => Ok(FieldKind::Nested(ty.clone())),
        Type::Reference(_) => Err(neither("a reference")),
        Type::Ptr(_) => Err(neither("a raw pointer")),
        Type::Slice(_) => Err(neither("a slice of unknown length")),
        Type::Tuple(_) => Err(neither("a tuple")),
        Type::BareFn(_) => Err(neither("a function pointer")),
        Type::TraitObject(_) | Type::ImplTrait(_) => Err(neither("a trait type")),
        _ => Err(neither("not a buffer")),
    }
}

impl Layout {
    pub fn is_generic(&self) -> bool {
        !self.generics.params.is_empty()
    }
}

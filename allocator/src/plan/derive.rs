//! What `#[derive(DeviceLayout)]` calls to turn a plan error into a compile error. Kept in a
//! file of its own so the lines the compiler quotes in those errors stay put.

use super::{
    FieldSpec, LayoutSpec, Plan, PlanError, PlanErrorKind, Slot, Totals, check_align, check_live,
    check_size, layout_default_align,
};

/// What one of the derive's compile-time checks looks at; each is spanned on its own tokens.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The field's `#[layout(align = ..)]`.
    Align,
    /// The field's length and element size.
    Size,
    /// The field's `#[layout(live = ..)]`.
    Live,
    /// The field's placement after the fields before it.
    Place,
    /// The layout's `#[layout(align = ..)]`.
    LayoutAlign,
    /// The layout itself: its final size and `max_bytes`.
    Layout,
}

/// The derive's compile-time check: panics (a compile error naming the layout, the field and
/// the numbers) if `what` of field `index` is wrong. `result` is the layout's plan.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub const fn derive_check<const N: usize>(
    what: Check,
    index: usize,
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
    result: &Result<Plan<N>, PlanError>,
    name: &str,
    names: &[&str; N],
    types: &[&str; N],
) {
    let outcome = match what {
        // A bad layout-level alignment fails every field's check; `LayoutAlign` reports it once.
        Check::Align => match check_align(layout, index, &specs[index]) {
            Err(e) if e.field.is_some() => Err(e),
            _ => Ok(()),
        },
        Check::Size => match check_size(index, &specs[index]) {
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        },
        Check::Live => check_live(layout, index, &specs[index]),
        Check::Place => match result {
            Err(e) if matches!(e.kind, PlanErrorKind::OffsetOverflow { .. }) => match e.field {
                Some(i) if i == index => Err(*e),
                _ => Ok(()),
            },
            _ => Ok(()),
        },
        Check::LayoutAlign => match layout_default_align(layout) {
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        },
        Check::Layout => match result {
            Err(e) if e.field.is_none() => match e.kind {
                PlanErrorKind::AlignNotPowerOfTwo { .. } => Ok(()),
                _ => Err(*e),
            },
            _ => Ok(()),
        },
    };
    if let Err(e) = outcome {
        e.panic(name, names, types)
    }
}

/// The derive's plan constant: the plan, or (for generic layouts, which have no free checks)
/// a compile error with the message. Non-generic layouts report through [`derive_check`] and
/// get an empty plan here, so each error is reported once.
#[doc(hidden)]
pub const fn derive_plan<const N: usize>(
    result: Result<Plan<N>, PlanError>,
    panic_on_error: bool,
    name: &str,
    names: &[&str; N],
    types: &[&str; N],
) -> Plan<N> {
    match result {
        Ok(plan) => plan,
        Err(e) => {
            if panic_on_error {
                e.panic(name, names, types)
            }
            Plan {
                slots: [Slot::EMPTY; N],
                totals: Totals {
                    size: 0,
                    align: 1,
                    requested: 0,
                    unaliased_size: 0,
                    peak_live_bound: 0,
                },
            }
        }
    }
}

/// `#[derive(Element)]`'s padding check: a compile error naming the type and the numbers when
/// the struct is larger than the sum of its fields.
#[doc(hidden)]
pub const fn element_padding_check(name: &str, size: usize, fields: usize) {
    if size != fields {
        let msg = super::Message::new()
            .push_str("Element: `")
            .push_str(name)
            .push_str("` is ")
            .push_usize(size)
            .push_str(" bytes but its fields add up to ")
            .push_usize(fields)
            .push_str(": ")
            .push_usize(size.saturating_sub(fields))
            .push_str(" padding bytes; add explicit padding fields or reorder the fields");
        panic!("{}", msg.as_str())
    }
}

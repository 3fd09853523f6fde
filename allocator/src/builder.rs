//! [`LayoutBuilder`]: layouts whose sizes are known only at run time, planned by the very same
//! `const fn`s the derive calls.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::error::Error;
use crate::layout::{DeviceLayout, Element};
use crate::plan::{self, FieldSpec, LayoutSpec, LiveRange, PlanError, PlanErrorKind, Slot, Totals};
use crate::report::LayoutReport;

/// Builds a layout at run time.
///
/// ```
/// use devarena::LayoutBuilder;
///
/// let (w, h) = (1280, 720); // known only at run time
/// let layout = LayoutBuilder::new("Frame")
///     .array::<u8>("rgb", w * h * 3)
///     .array::<f32>("gray", w * h)
///     .array_aligned::<u32>("hist", 256, 4096)
///     .build()?;
/// assert_eq!(layout.field("gray").unwrap().offset, 2_764_800);
/// assert_eq!(layout.field("hist").unwrap().offset, 6_451_200); // already 4096-aligned
/// assert_eq!(layout.size(), 6_455_296); // 6_452_224 rounded up to 4096
/// # Ok::<(), devarena::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct LayoutBuilder {
    name: String,
    spec: LayoutSpec,
    names: Vec<String>,
    types: Vec<String>,
    specs: Vec<FieldSpec>,
    /// The first misuse of the builder's calls (a `live` before any field), reported by
    /// `build`: the calls chain by value, so they cannot fail one by one.
    misuse: Option<PlanError>,
}

impl LayoutBuilder {
    /// An empty layout with default settings (256-byte alignment, no limit, no stages).
    pub fn new(name: impl Into<String>) -> Self {
        LayoutBuilder {
            name: name.into(),
            spec: LayoutSpec::DEFAULT,
            names: Vec::new(),
            types: Vec::new(),
            specs: Vec::new(),
            misuse: None,
        }
    }

    /// Default alignment of every field (`#[layout(align = N)]`).
    pub fn align(mut self, align: usize) -> Self {
        self.spec.align = Some(align);
        self
    }

    /// Size limit (`#[layout(max_bytes = N)]`).
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.spec.max_bytes = max_bytes;
        self
    }

    /// Declares stages `0..stages` (`#[layout(stages = N)]`).
    pub fn stages(mut self, stages: usize) -> Self {
        self.spec.stages = stages;
        self
    }

    /// Adds a field described by a [`FieldSpec`].
    pub fn field(
        mut self,
        name: impl Into<String>,
        ty: impl Into<String>,
        spec: FieldSpec,
    ) -> Self {
        self.names.push(name.into());
        self.types.push(ty.into());
        self.specs.push(spec);
        self
    }

    /// Adds a `[T; len]` buffer.
    pub fn array<T: Element>(self, name: impl Into<String>, len: usize) -> Self {
        self.field(name, core::any::type_name::<T>(), FieldSpec::of::<T>(len))
    }

    /// Adds a `[T; len]` buffer with its own alignment (`#[layout(align = N)]` on the field).
    pub fn array_aligned<T: Element>(
        self,
        name: impl Into<String>,
        len: usize,
        align: usize,
    ) -> Self {
        self.field(
            name,
            core::any::type_name::<T>(),
            FieldSpec::of::<T>(len).with_align(align),
        )
    }

    /// Adds a nested compile-time layout as one block.
    pub fn nested<L: DeviceLayout>(self, name: impl Into<String>) -> Self {
        self.field(name, L::NAME, FieldSpec::nested(L::SIZE, L::ALIGN))
    }

    /// Sets the live range (inclusive) of the field added last. Before any field there is no
    /// field to set it on: `build` then returns an error.
    pub fn live(mut self, first: usize, last: usize) -> Self {
        match self.specs.last_mut() {
            Some(spec) => spec.live = LiveRange::new(first, last),
            None => {
                self.misuse.get_or_insert(PlanError {
                    field: None,
                    kind: PlanErrorKind::LiveWithoutField { first, last },
                });
            }
        }
        self
    }

    /// The first field whose name an earlier field already has.
    fn duplicate_name(&self) -> Option<PlanError> {
        let mut seen = BTreeMap::new();
        for (i, name) in self.names.iter().enumerate() {
            if let Some(&first) = seen.get(name.as_str()) {
                return Some(PlanError {
                    field: Some(i),
                    kind: PlanErrorKind::DuplicateName { first },
                });
            }
            seen.insert(name.as_str(), i);
        }
        None
    }

    /// The error for `error`, with the layout's, the field's and the type's names.
    fn plan_error(&self, error: PlanError) -> Error {
        let (field, ty) = match error.field {
            Some(i) if i < self.names.len() => (self.names[i].as_str(), self.types[i].as_str()),
            _ => ("", ""),
        };
        Error::Plan {
            error,
            message: error.message(&self.name, field, ty).as_str().to_string(),
        }
    }

    /// Plans the layout, or reports the first problem with the layout, field and numbers.
    pub fn build(self) -> Result<RuntimeLayout, Error> {
        if let Some(error) = self.misuse.or_else(|| self.duplicate_name()) {
            return Err(self.plan_error(error));
        }
        let mut slots = alloc::vec![Slot::EMPTY; self.specs.len()];
        let n = self.specs.len();
        let mut scratch = alloc::vec![0; plan::scratch_len(n)];
        match plan::plan_into(&self.spec, &self.specs, &mut slots, &mut scratch) {
            Ok(totals) => Ok(RuntimeLayout {
                name: self.name,
                spec: self.spec,
                fields: self
                    .names
                    .into_iter()
                    .zip(self.types)
                    .zip(self.specs.iter().zip(slots))
                    .map(|((name, ty), (spec, slot))| RuntimeField {
                        name,
                        ty,
                        offset: slot.offset,
                        size: slot.size,
                        align: slot.align,
                        live: spec.live,
                    })
                    .collect(),
                totals,
            }),
            Err(error) => Err(self.plan_error(error)),
        }
    }
}

/// One field of a [`RuntimeLayout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeField {
    /// The field's name.
    pub name: String,
    /// The element type's name.
    pub ty: String,
    /// Byte offset from the start of the allocation.
    pub offset: usize,
    /// Bytes of the field.
    pub size: usize,
    /// Alignment the field was placed at.
    pub align: usize,
    /// Stages in which the field is live.
    pub live: LiveRange,
}

/// A planned run-time layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeLayout {
    name: String,
    spec: LayoutSpec,
    fields: Vec<RuntimeField>,
    totals: Totals,
}

impl RuntimeLayout {
    /// The layout's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of the backing allocation.
    pub fn size(&self) -> usize {
        self.totals.size
    }

    /// Alignment of the backing allocation.
    pub fn align(&self) -> usize {
        self.totals.align
    }

    /// Layout-wide results (size, alignment, requested bytes, bounds).
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Number of stages (0 without stages).
    pub fn stages(&self) -> usize {
        self.spec.stages
    }

    /// Every field, in declaration order.
    pub fn fields(&self) -> &[RuntimeField] {
        &self.fields
    }

    /// The field called `name`.
    pub fn field(&self, name: &str) -> Option<&RuntimeField> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The layout table and memory map.
    pub fn report(&self) -> LayoutReport {
        LayoutReport::from_parts(
            &self.name,
            self.spec.stages,
            self.totals,
            self.fields.iter().map(|f| {
                (
                    f.name.as_str(),
                    f.ty.as_str(),
                    Slot {
                        offset: f.offset,
                        size: f.size,
                        align: f.align,
                    },
                    f.live,
                )
            }),
        )
    }
}

//! [`LayoutBuilder`]: layouts whose sizes are known only at run time, planned by the very same
//! `const fn`s the derive calls.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::error::Error;
use crate::layout::{DeviceLayout, Element};
use crate::plan::{
    self, Engine, FieldSpec, Goal, LayoutSpec, LiveRange, PlanError, PlanErrorKind, Search, Slot,
    Step, Totals,
};
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
    ///
    /// Fast: the greedy planner (four orderings, the smallest plan kept), `O(n log n)` plus
    /// the conflicts between buffers. [`search`](Self::search) looks further for a smaller plan.
    pub fn build(self) -> Result<RuntimeLayout, Error> {
        let (slots, totals) = self.greedy(self.spec)?;
        Ok(self.finish(slots, totals, None))
    }

    /// Plans the layout like [`build`](Self::build), then searches for a smaller plan within
    /// `budget` and returns the best found: never larger than `build`'s, often at the lower
    /// bound `totals().peak_live_bound` on a layout with stages (the search is complete:
    /// given the budget, it finds the smallest plan and proves it so).
    ///
    /// With a [`max_bytes`](Self::max_bytes) limit that the greedy plan exceeds, the search
    /// looks for a plan within the limit and stops at the first; the error names the best size
    /// found when none is. A layout without stages has nothing to search.
    ///
    /// A layout the greedy planner misses by 3 bytes:
    ///
    /// ```
    /// use devarena::{Budget, LayoutBuilder};
    ///
    /// let b = LayoutBuilder::new("Tight")
    ///     .align(1)
    ///     .stages(4)
    ///     .array::<u8>("a", 5).live(1, 3)
    ///     .array::<u8>("b", 9).live(0, 0)
    ///     .array::<u8>("c", 1).live(0, 1)
    ///     .array::<u8>("d", 6).live(3, 3)
    ///     .array::<u8>("e", 7).live(2, 3)
    ///     .array::<u8>("f", 9).live(0, 2);
    /// assert_eq!(b.clone().build()?.size(), 24);
    /// let best = b.clone().search(Budget::nodes(100_000))?;
    /// assert_eq!(best.totals().peak_live_bound, 21); // stage 2 holds a, e and f
    /// assert_eq!(best.size(), 21);
    /// assert!(best.search_stats().unwrap().optimal);
    /// // Over a `max_bytes` the greedy plan misses, a goal below any plan still finds one.
    /// let tight = b.max_bytes(22).search(Budget::nodes(100_000).until_size(0))?;
    /// assert_eq!(tight.size(), 21);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn search(self, budget: Budget) -> Result<RuntimeLayout, Error> {
        let unlimited = LayoutSpec {
            max_bytes: usize::MAX,
            ..self.spec
        };
        let (mut slots, mut totals) = self.greedy(unlimited)?;
        let greedy_size = totals.size;
        let limit = self.spec.max_bytes;
        // No plan is below the peak of live bytes: a goal under it is that bound (otherwise
        // the search would give up at once, even where a plan within `max_bytes` exists).
        let goal = match budget.size.map(|bytes| bytes.max(totals.peak_live_bound)) {
            Some(bytes) if totals.size > limit => Goal::AtMost(bytes.min(limit)),
            Some(bytes) => Goal::AtMost(bytes),
            None if totals.size > limit => Goal::AtMost(limit),
            None => Goal::Smallest,
        };
        let mut stats = SearchStats {
            nodes: 0,
            greedy_size,
            lower: totals.peak_live_bound,
            optimal: totals.size <= totals.peak_live_bound,
        };
        if self.spec.stages > 0 && !stats.optimal {
            self.run_search(&mut slots, &mut totals, &mut stats, goal, &budget);
        }
        plan::check_max_bytes(&self.spec, totals.size).map_err(|e| self.plan_error(e))?;
        Ok(self.finish(slots, totals, Some(stats)))
    }

    /// The search proper: improves `slots` and `totals` in place.
    fn run_search(
        &self,
        slots: &mut [Slot],
        totals: &mut Totals,
        stats: &mut SearchStats,
        goal: Goal,
        budget: &Budget,
    ) {
        let n = self.specs.len();
        let mut head = alloc::vec![0; plan::scratch_len(n)];
        let sizes = plan::measure(&self.spec, &self.specs, slots, &mut head);
        drop(head);
        if sizes.scratch_len() > MAX_SEARCH_SCRATCH {
            return;
        }
        let mut scratch = alloc::vec![0; sizes.scratch_len()];
        let fixed: Vec<Slot> = slots.to_vec();
        let mut engine = Engine::new(&self.spec, &self.specs, &fixed, &sizes, &mut scratch);
        let offsets: Vec<usize> = slots.iter().map(|s| s.offset).collect();
        engine.set_incumbent(&offsets);
        let mut search = Search::new(goal, totals.size, totals.peak_live_bound, totals.align);
        let mut clock = budget.clock();
        loop {
            let spent = engine.nodes();
            if spent >= budget.nodes {
                break;
            }
            let allowed = clock.allowed(spent).min(budget.nodes - spent);
            if allowed == 0 {
                break;
            }
            match search.step(&mut engine, &self.specs, self.spec.stages, allowed) {
                Step::Finished => break,
                Step::Working | Step::OutOfNodes => {}
            }
        }
        stats.nodes = engine.nodes();
        stats.lower = search.lower();
        stats.optimal = search.optimal();
        if search.size() < totals.size {
            for (slot, &offset) in slots.iter_mut().zip(engine.offsets()) {
                slot.offset = offset;
            }
            totals.size = search.size();
        }
    }

    /// The greedy plan under `spec`, after the checks the planner cannot make (names, call
    /// order).
    fn greedy(&self, spec: LayoutSpec) -> Result<(Vec<Slot>, Totals), Error> {
        if let Some(error) = self.misuse.or_else(|| self.duplicate_name()) {
            return Err(self.plan_error(error));
        }
        let n = self.specs.len();
        let mut slots = alloc::vec![Slot::EMPTY; n];
        let mut scratch = alloc::vec![0; plan::scratch_len(n)];
        match plan::plan_into(&spec, &self.specs, &mut slots, &mut scratch) {
            Ok(totals) => Ok((slots, totals)),
            Err(error) => Err(self.plan_error(error)),
        }
    }

    /// The layout of a finished plan.
    fn finish(
        self,
        slots: Vec<Slot>,
        totals: Totals,
        search: Option<SearchStats>,
    ) -> RuntimeLayout {
        RuntimeLayout {
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
            search,
        }
    }
}

/// Entries of scratch space (of `usize`) past which [`LayoutBuilder::search`] does not search
/// but keeps the greedy plan: 2^27 entries, 1 GiB on a 64-bit host. A layout gets there with
/// millions of conflicting pairs of buffers.
const MAX_SEARCH_SCRATCH: usize = 1 << 27;

/// How much [`LayoutBuilder::search`] may search, and when it may stop early.
///
/// ```
/// # #[cfg(feature = "std")] {
/// use devarena::Budget;
/// use std::time::Duration;
///
/// let quick = Budget::time(Duration::from_millis(50));
/// let fits = Budget::time(Duration::from_secs(60)).until_size(1 << 20); // stop once it fits
/// let same_everywhere = Budget::nodes(1_000_000); // deterministic, whatever the machine
/// # let _ = (quick, fits, same_everywhere); }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Budget {
    nodes: u64,
    #[cfg(feature = "std")]
    time: Option<core::time::Duration>,
    size: Option<usize>,
}

impl Budget {
    /// At most `nodes` nodes of search (one node: one buffer placed on trial). The result is
    /// the same on every machine.
    pub const fn nodes(nodes: u64) -> Budget {
        Budget {
            nodes,
            #[cfg(feature = "std")]
            time: None,
            size: None,
        }
    }

    /// At most `time` of search (checked between runs of the search, each sized to the time
    /// left at the rate measured so far).
    #[cfg(feature = "std")]
    pub const fn time(time: core::time::Duration) -> Budget {
        Budget {
            nodes: u64::MAX,
            time: Some(time),
            size: None,
        }
    }

    /// Stops as soon as a plan of at most `bytes` bytes is found (and gives up as soon as the
    /// search proves there is none).
    pub const fn until_size(mut self, bytes: usize) -> Budget {
        self.size = Some(bytes);
        self
    }

    fn clock(&self) -> Clock {
        Clock {
            #[cfg(feature = "std")]
            deadline: self.time.map(|t| (std::time::Instant::now(), t)),
            #[cfg(feature = "std")]
            rate: 100_000.0,
        }
    }
}

/// The time side of a [`Budget`]: how many nodes fit in the time left.
struct Clock {
    #[cfg(feature = "std")]
    deadline: Option<(std::time::Instant, core::time::Duration)>,
    #[cfg(feature = "std")]
    rate: f64,
}

impl Clock {
    /// Nodes the next step may take, `spent` having been taken so far.
    #[cfg_attr(not(feature = "std"), allow(unused_variables))]
    fn allowed(&mut self, spent: u64) -> u64 {
        #[cfg(feature = "std")]
        if let Some((start, time)) = self.deadline {
            let elapsed = start.elapsed();
            if elapsed >= time {
                return 0;
            }
            if spent > 10_000 {
                self.rate = spent as f64 / elapsed.as_secs_f64().max(1e-6);
            }
            let left = (time - elapsed).as_secs_f64();
            return ((left * self.rate) as u64).max(1_000);
        }
        u64::MAX
    }
}

/// What [`LayoutBuilder::search`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SearchStats {
    /// Nodes searched (buffers placed on trial).
    pub nodes: u64,
    /// The greedy plan's size, where the search started.
    pub greedy_size: usize,
    /// No plan is smaller than this: the peak-live bound, or more where the search proved so.
    pub lower: usize,
    /// Whether the plan is proved the smallest there is.
    pub optimal: bool,
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
    search: Option<SearchStats>,
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

    /// What the search did, for a layout made by [`LayoutBuilder::search`].
    pub fn search_stats(&self) -> Option<SearchStats> {
        self.search
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

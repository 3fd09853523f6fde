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
    /// `budget` and returns the best found: never larger than `build`'s when the budget lets
    /// the greedy orderings finish (see [`Budget`] for what it bounds), often at the lower
    /// bound `totals().peak_live_bound` on a layout with stages (the search is complete:
    /// given the budget, it finds the smallest plan and proves it so).
    /// [`SearchStats::end`] says why it stopped.
    ///
    /// With a [`max_bytes`](Self::max_bytes) limit that the greedy plan exceeds, the search
    /// looks for a plan within the limit and stops at the first; the error names the best size
    /// found when none is, and says so when the time budget ran out first (a budget too short
    /// for the greedy orderings can miss a plan that `build` finds). A layout without stages
    /// has nothing to search.
    ///
    /// A layout the greedy planner misses by 3 bytes:
    ///
    /// ```
    /// use devarena::{Budget, LayoutBuilder, SearchEnd};
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
    /// assert_eq!(best.search_stats().unwrap().end, SearchEnd::Optimal);
    /// // Over a `max_bytes` the greedy plan misses, a goal below any plan still finds one.
    /// let tight = b.max_bytes(22).search(Budget::nodes(100_000).until_size(0))?;
    /// assert_eq!(tight.size(), 21);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn search(self, budget: Budget) -> Result<RuntimeLayout, Error> {
        if let Some(error) = self.misuse.or_else(|| self.duplicate_name()) {
            return Err(self.plan_error(error));
        }
        // The budget counts from here: the first plans are part of it.
        let mut clock = budget.clock();
        let unlimited = LayoutSpec {
            max_bytes: usize::MAX,
            ..self.spec
        };
        let within = plan::plan_within(&unlimited, &self.specs, &mut |units| {
            clock.keep_going(units)
        })
        .map_err(|e| self.plan_error(e))?;
        let (mut slots, mut totals) = (within.slots, within.totals);
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
            greedy_size: totals.size,
            lower: totals.peak_live_bound,
            optimal: totals.size <= totals.peak_live_bound,
            end: SearchEnd::Budget,
        };
        let settled = SearchEnd::settled(totals.size, stats.lower, goal);
        stats.end = match settled {
            Some(end) => end,
            None if self.spec.stages == 0 => SearchEnd::NotSearched,
            // The greedy orderings did not finish: the budget is spent.
            None if !within.complete => SearchEnd::Budget,
            None => self.run_search(
                &mut slots,
                &mut totals,
                &mut stats,
                goal,
                &budget,
                &mut clock,
            ),
        };
        if let Err(e) = plan::check_max_bytes(&self.spec, totals.size) {
            let mut error = self.plan_error(e);
            // Not what the layout needs: how far a search cut short got.
            if let (SearchEnd::Budget, Error::Plan { message, .. }) = (stats.end, &mut error) {
                message.push_str(
                    " (the best plan found before the search's time budget ran out: a larger \
                     budget may find one within the limit)",
                );
            }
            return Err(error);
        }
        Ok(self.finish(slots, totals, Some(stats)))
    }

    /// The search proper: improves `slots` and `totals` in place; returns why it stopped.
    fn run_search(
        &self,
        slots: &mut [Slot],
        totals: &mut Totals,
        stats: &mut SearchStats,
        goal: Goal,
        budget: &Budget,
        clock: &mut Clock,
    ) -> SearchEnd {
        let n = self.specs.len();
        let mut head = alloc::vec![0; plan::scratch_len(n)];
        let sizes = plan::measure(&self.spec, &self.specs, slots, &mut head);
        drop(head);
        if sizes.scratch_len() > MAX_SEARCH_SCRATCH {
            return SearchEnd::NotSearched;
        }
        // Building the engine is not cut short: it is built only when the time left covers it
        // at the rate measured so far.
        if !clock.covers(engine_work(&sizes)) {
            return SearchEnd::Budget;
        }
        let mut scratch = alloc::vec![0; sizes.scratch_len()];
        let fixed: Vec<Slot> = slots.to_vec();
        let mut engine = Engine::new(&self.spec, &self.specs, &fixed, &sizes, &mut scratch);
        let offsets: Vec<usize> = slots.iter().map(|s| s.offset).collect();
        engine.set_incumbent(&offsets);
        let mut search = Search::new(goal, totals.size, totals.peak_live_bound, totals.align);
        clock.start_search();
        let finished = loop {
            let spent = engine.nodes();
            if spent >= budget.nodes {
                break false;
            }
            // Each run stops within the time left (its work, at the rate measured so far);
            // a run cut short goes on at the next step.
            let Some(work) = clock.allowed_work(engine.work()) else {
                break false;
            };
            engine.set_work_stop(engine.work().saturating_add(work));
            match search.step(
                &mut engine,
                &self.specs,
                self.spec.stages,
                budget.nodes - spent,
            ) {
                Step::Finished => break true,
                Step::Working | Step::OutOfNodes => {}
            }
        };
        stats.nodes = engine.nodes();
        stats.lower = search.lower();
        stats.optimal = search.optimal();
        if search.size() < totals.size {
            for (slot, &offset) in slots.iter_mut().zip(engine.offsets()) {
                slot.offset = offset;
            }
            totals.size = search.size();
        }
        match SearchEnd::settled(search.size(), search.lower(), goal) {
            Some(end) => end,
            // `Finished` always settles; this is for a search stopped by its budget.
            None => {
                debug_assert!(!finished, "a finished search settles its goal");
                SearchEnd::Budget
            }
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

/// The engine's work (see [`plan::Engine::work`]) that building it is worth, from its sizes:
/// listing the conflicting pairs twice, each section's members, and the per-buffer arrays.
fn engine_work(sizes: &plan::Sizes) -> u64 {
    let units = 4 * sizes.conflicts + 4 * sizes.spanned + 32 * sizes.buffers + sizes.sections;
    units as u64
}

/// How much [`LayoutBuilder::search`] may search, and when it may stop early.
///
/// What a budget bounds:
///
/// * [`Budget::time`] bounds the whole call from its start: the greedy orderings (checked as
///   they go, every few hundred microseconds), building the search (only when the time left
///   covers it at the rate measured so far) and the search's runs (each sized to the time
///   left, cut short and resumed later). On top of the time it returns after the first
///   plan: checking the fields, the sections of the timeline and a best-fit sweep over them,
///   `O(n log n)` in the fields (0.14 to 0.23 s for 100,000 fields on a 2-core machine) plus, for the lower bound
///   `peak_live_bound`, the number of sections each field spans; and it may run past the time
///   by one step of the search's bookkeeping (sorting the fields once: milliseconds for
///   100,000). A budget of zero returns that first plan.
/// * [`Budget::nodes`] bounds the search's nodes alone: the greedy orderings always run to
///   the end (the plan is never larger than [`build`](LayoutBuilder::build)'s), and the result
///   is the same on every machine, whatever the time it takes.
///
/// Neither bounds what the layout's size costs before planning starts (building the
/// [`LayoutBuilder`]) nor the memory the search takes (its scratch space grows with the
/// conflicting pairs, up to 1 GiB, past which the layout is not searched).
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
    /// At most `nodes` nodes of search (one node: one buffer placed on trial), after the
    /// greedy orderings, which always finish. The result is the same on every machine.
    pub const fn nodes(nodes: u64) -> Budget {
        Budget {
            nodes,
            #[cfg(feature = "std")]
            time: None,
            size: None,
        }
    }

    /// At most about `time` for the whole call, the first plan excepted (see [`Budget`]):
    /// the greedy orderings are checked against it as they go and stopped when it is spent,
    /// the search's runs are sized to the time left. `Duration::ZERO` returns the first plan:
    /// a best-fit sweep made in `O(n log n)`, or the unaliased plan where that is smaller.
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
            greedy: (0, 0.0),
            #[cfg(feature = "std")]
            search: None,
        }
    }
}

/// The time side of a [`Budget`]: whether there is time left, and how much work fits in it.
struct Clock {
    #[cfg(feature = "std")]
    deadline: Option<(std::time::Instant, core::time::Duration)>,
    /// Work done by the greedy orderings, and the seconds they took.
    #[cfg(feature = "std")]
    greedy: (u64, f64),
    /// When the search's runs started, and the engine's work then.
    #[cfg(feature = "std")]
    search: Option<(std::time::Instant, u64)>,
}

/// Work per second assumed before any is measured: low, so that a first guess does not
/// overrun (the greedy orderings and the search run some 10^8 units a second).
#[cfg(feature = "std")]
const FIRST_RATE: f64 = 2e7;

/// Work measured before its rate counts: less says little about the rate.
#[cfg(feature = "std")]
const RATE_AFTER: u64 = 100_000;

/// The least work a run of the search is given while any time is left.
#[cfg(feature = "std")]
const LEAST_WORK: u64 = 10_000;

impl Clock {
    /// Whether there is time left, after `units` more units of the greedy orderings' work.
    #[cfg_attr(not(feature = "std"), allow(unused_variables))]
    fn keep_going(&mut self, units: u64) -> bool {
        #[cfg(feature = "std")]
        if let Some((start, time)) = self.deadline {
            let elapsed = start.elapsed();
            self.greedy = (self.greedy.0 + units, elapsed.as_secs_f64());
            return elapsed < time;
        }
        true
    }

    /// Seconds left, or `None` without a time budget.
    #[cfg(feature = "std")]
    fn left(&self) -> Option<f64> {
        self.deadline
            .map(|(start, time)| time.saturating_sub(start.elapsed()).as_secs_f64())
    }

    /// Whether the time left covers `units` of work at the greedy orderings' rate.
    #[cfg_attr(not(feature = "std"), allow(unused_variables))]
    fn covers(&self, units: u64) -> bool {
        #[cfg(feature = "std")]
        if let Some(left) = self.left() {
            let (work, secs) = self.greedy;
            let rate = if work >= RATE_AFTER && secs > 0.0 {
                work as f64 / secs
            } else {
                FIRST_RATE
            };
            return units as f64 <= left * rate;
        }
        true
    }

    /// The search's runs start now (the engine has done no work yet: it was just built).
    fn start_search(&mut self) {
        #[cfg(feature = "std")]
        {
            self.search = Some((std::time::Instant::now(), 0));
        }
    }

    /// The work the next run may do, the engine having done `work` in all; `None` once the
    /// time is spent. Without a time budget, no limit.
    #[cfg_attr(not(feature = "std"), allow(unused_variables))]
    fn allowed_work(&mut self, work: u64) -> Option<u64> {
        #[cfg(feature = "std")]
        if let Some(left) = self.left() {
            if left <= 0.0 {
                return None;
            }
            let (start, first) = *self.search.get_or_insert((std::time::Instant::now(), work));
            let done = work - first;
            let secs = start.elapsed().as_secs_f64();
            let rate = if done >= RATE_AFTER && secs > 0.0 {
                done as f64 / secs
            } else {
                FIRST_RATE
            };
            return Some(((left * rate) as u64).max(LEAST_WORK));
        }
        Some(u64::MAX)
    }
}

/// Why [`LayoutBuilder::search`] stopped. (Non-exhaustive: a later search may stop for
/// another reason.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SearchEnd {
    /// The plan is proved the smallest there is: its size is [`SearchStats::lower`].
    Optimal,
    /// A plan within the size asked for ([`Budget::until_size`], or `max_bytes` where the
    /// greedy plan is over it) was found: the search stopped there, as asked.
    GoalMet,
    /// The search proved that no plan is within the size asked for.
    GoalOutOfReach,
    /// The budget ran out first (its time, or its nodes): a smaller plan may exist.
    Budget,
    /// Nothing was searched: a layout without stages (no two fields may share bytes), or one
    /// whose search would need more scratch space than the search allows (1 GiB).
    NotSearched,
}

impl SearchEnd {
    /// What a plan of `size` bytes, when no plan is below `lower`, settles of `goal`, if
    /// anything: as the search's own stopping rule.
    fn settled(size: usize, lower: usize, goal: Goal) -> Option<SearchEnd> {
        if size <= lower {
            return Some(SearchEnd::Optimal);
        }
        match goal {
            Goal::AtMost(bytes) if size <= bytes => Some(SearchEnd::GoalMet),
            Goal::AtMost(bytes) if lower > bytes => Some(SearchEnd::GoalOutOfReach),
            _ => None,
        }
    }
}

/// What [`LayoutBuilder::search`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SearchStats {
    /// Nodes searched (buffers placed on trial).
    pub nodes: u64,
    /// The size of the plan the search started from: the smallest of the greedy orderings'
    /// (those the budget let finish), a best-fit sweep's and the unaliased plan's (every
    /// field apart, in declaration order: smaller than the sweep's where its alignment
    /// padding is less).
    pub greedy_size: usize,
    /// No plan is smaller than this: the peak-live bound, or more where the search proved so.
    pub lower: usize,
    /// Whether the plan is proved the smallest.
    pub optimal: bool,
    /// Why the search stopped.
    pub end: SearchEnd,
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

    /// The fields, to corrupt in tests of the code that must not trust them.
    #[cfg(test)]
    pub(crate) fn fields_mut(&mut self) -> &mut [RuntimeField] {
        &mut self.fields
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

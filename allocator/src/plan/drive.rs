//! The drivers of the search: which capacity to ask for, on which part of the timeline, with
//! which preorder and how much work, until the plan is as small as it can be or the budget is
//! spent.
//!
//! * [`Search`] serves [`LayoutBuilder::search`](crate::LayoutBuilder::search): a resumable
//!   `const fn` state machine, stepped between checks of a node or time budget.
//! * [`improve_slots`] (through [`improve_step`], one per constant) serves the derive: a fixed
//!   schedule of capacities closer and closer to the lower bound, under a fixed amount of
//!   work per constant, evaluated by the compiler; a try cut off by one constant goes on in
//!   the next, which carries the engine's scratch space as a value.

use super::align::align_up;
use super::error::PlanError;
use super::search::{Engine, Outcome, Preorder, Suspended, measure};
use super::stages::scratch_len;
use super::{FieldSpec, LayoutSpec, Plan, Slot, Totals};
use alloc::vec;

/// The strategies a [`Search`] tries in turn on a part: every preorder, reordering each
/// independent part as it starts, then keeping one order throughout. No one of them suits
/// every layout (the eleven MiniMalloc benchmarks need five different ones between them).
const STRATEGIES: [(Preorder, bool); 12] = [
    (Preorder::Wat, true),
    (Preorder::Taw, true),
    (Preorder::Twa, true),
    (Preorder::SectionWat, true),
    (Preorder::SectionTaw, true),
    (Preorder::SectionTwa, true),
    (Preorder::Wat, false),
    (Preorder::Taw, false),
    (Preorder::Twa, false),
    (Preorder::SectionWat, false),
    (Preorder::SectionTaw, false),
    (Preorder::SectionTwa, false),
];

/// What a [`Search`] is after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Goal {
    /// The smallest plan: asks for the lower bound, halfway, and one alignment step below
    /// the best plan so far, in turn, with more nodes each round.
    Smallest,
    /// Any plan of at most this many bytes: stops as soon as one is found (or proved not to
    /// exist). Tighter capacities are asked for too, as they are often found faster.
    AtMost(usize),
    /// A smaller plan, one alignment step at a time: the cheapest progress for a small
    /// budget (the derive's).
    Descend,
}

/// What one [`Search::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Made progress (or learned something); call again.
    Working,
    /// Done: the goal is met, or the plan is proved as small as it can be, or (for
    /// [`Goal::AtMost`]) proved unreachable.
    Finished,
    /// The step needed more nodes than it was allowed; call again with more.
    OutOfNodes,
}

/// A search for a smaller plan over an [`Engine`] that holds the incumbent: a resumable
/// schedule of runs, each on one part of the timeline, at one capacity, with one strategy and
/// a node limit that doubles every round (MiniMalloc's round robin with restarts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Search {
    goal: Goal,
    align: usize,
    lower: usize,
    size: usize,
    level: u32,
    target: usize,
    part: usize,
    strategy: usize,
    finished: bool,
    /// The last run was cut off by the engine's work limit: the next step resumes it.
    cut: bool,
}

impl Search {
    /// A search that starts from a plan of `size` bytes (the engine's incumbent, rounded up
    /// to `align`) and knows no plan is below `lower` (a multiple of `align`). The capacities
    /// it asks for are multiples of `align`; an `align` of 0 counts as 1.
    pub const fn new(goal: Goal, size: usize, lower: usize, align: usize) -> Search {
        Search {
            goal,
            // (Capacities are rounded down to it: 0 would divide by zero.)
            align: if align == 0 { 1 } else { align },
            lower,
            size,
            level: 1,
            target: 0,
            part: 0,
            strategy: 0,
            finished: false,
            cut: false,
        }
    }

    /// The best plan's size so far.
    pub const fn size(&self) -> usize {
        self.size
    }

    /// What is proved: no plan is smaller than this.
    pub const fn lower(&self) -> usize {
        self.lower
    }

    /// Whether the best plan is proved the smallest.
    pub const fn optimal(&self) -> bool {
        self.size <= self.lower
    }

    /// The capacity the current round asks for, or `None` when the goal is met or out of
    /// reach. A round asks for the most the goal accepts, then the lower bound, then halfway
    /// between: a tight capacity prunes harder and is often found faster than a loose one.
    const fn capacity(&mut self) -> Option<usize> {
        let a = self.align;
        if self.size <= self.lower || self.size < a {
            return None;
        }
        let below = self.size - a;
        let top = match self.goal {
            Goal::AtMost(bytes) => {
                let want = bytes - bytes % a;
                if self.size <= bytes || want < self.lower {
                    return None;
                }
                if want < below { want } else { below }
            }
            Goal::Descend => return Some(below),
            Goal::Smallest => below,
        };
        let mid = self.lower + (top - self.lower) / 2;
        let t = [top, self.lower, mid - mid % a];
        // lower <= mid <= top: ask each distinct one once a round.
        loop {
            let v = t[self.target];
            if (self.target >= 1 && v == t[0]) || (self.target == 2 && v == t[1]) {
                self.next_target();
                continue;
            }
            return Some(v);
        }
    }

    /// On to the next capacity of the round, or the next round with twice the nodes.
    const fn next_target(&mut self) {
        self.part = 0;
        self.strategy = 0;
        let targets = match self.goal {
            Goal::Descend => 1,
            _ => 3,
        };
        self.target += 1;
        if self.target >= targets {
            self.target = 0;
            if self.level < 40 {
                self.level += 1;
            }
        }
    }

    /// A fresh start after the bounds moved.
    const fn restart(&mut self) {
        self.target = 0;
        self.part = 0;
        self.strategy = 0;
    }

    /// One run of the engine, of at most `max_nodes` nodes. `specs` and `stages` are the
    /// layout's (for the preorders). A run cut off by the engine's work limit
    /// ([`Engine::set_work_stop`]) answers [`Step::OutOfNodes`] and goes on, where it
    /// stopped, at the next step (set a new limit first); one cut off by `max_nodes` starts
    /// again, with the nodes the next step allows.
    pub const fn step(
        &mut self,
        engine: &mut Engine<'_>,
        specs: &[FieldSpec],
        stages: usize,
        max_nodes: u64,
    ) -> Step {
        if self.finished {
            return Step::Finished;
        }
        let cap = match self.capacity() {
            Some(c) => c,
            None => {
                self.finished = true;
                return Step::Finished;
            }
        };
        let parts = engine.parts();
        let over = engine.first_part_over(self.part, cap);
        if over != self.part {
            self.part = over;
            self.strategy = 0;
        }
        if self.part == parts {
            // Every part fits: a smaller plan.
            self.size = match align_up(engine.end(), self.align) {
                Some(s) => s,
                None => self.size,
            };
            self.restart();
            return Step::Working;
        }
        let limit = (engine.buffers() as u64 + 1).saturating_mul(1 << self.level);
        let run = if max_nodes < limit { max_nodes } else { limit };
        let outcome = if self.cut {
            // The same state as when the run was cut: the same capacity, part and try.
            self.cut = false;
            engine.resume()
        } else {
            let (preorder, reorder) = STRATEGIES[self.strategy];
            engine.set_preorder(preorder, specs, stages);
            engine.set_reorder_parts(reorder);
            engine.run_part(self.part, cap, run)
        };
        match outcome {
            Outcome::Found { .. } => {
                self.part += 1;
                self.strategy = 0;
                Step::Working
            }
            Outcome::Infeasible => {
                // That part cannot fit `cap`: neither can the whole.
                self.lower = cap + self.align;
                self.restart();
                Step::Working
            }
            Outcome::OutOfNodes => {
                // Cut short by the caller's work limit: the next step goes on with the run.
                if engine.out_of_work() {
                    self.cut = true;
                    return Step::OutOfNodes;
                }
                // Cut short by the caller's nodes: the same try, with more, next time.
                if run < limit {
                    return Step::OutOfNodes;
                }
                self.strategy += 1;
                if self.strategy == STRATEGIES.len() {
                    self.next_target();
                }
                Step::Working
            }
        }
    }
}

/// One try of the derive's search: a capacity, in thousandths of the lower bound (0 for a
/// dive: anything below the best plan so far), the preorder, whether spatial inference also
/// uses the lowest waiting offsets (it prunes much more under a tight capacity), and the work
/// the try may take before it counts as failed (see [`Engine::work`]; for a dive, per field
/// squared).
#[doc(hidden)]
pub type Try = (usize, Preorder, bool, usize);

/// The derive's tries, in order, chosen on MiniMalloc's eleven hard instances within the
/// derive's work (BENCHMARKS.md; the `tune_schedule` example runs other schedules through the
/// same const fns). Each try is a fresh search at its capacity, so the schedule was chosen
/// from a table of what each (capacity, preorder, inference) finds on each instance and at
/// what work. A loose capacity first (120% under TWA, which most layouts reach within
/// 30,000 to 160,000 units), then 114% under TWA with the waiting-offset inference, which
/// brings the three hardest layouts under 115% (they need 300,000 to 530,000 units: the try
/// may take 600,000), then tighter capacities (110% to 105%) for the median.
const COMPILE_TIME_TRIES: [Try; 7] = [
    (1200, Preorder::Twa, false, 350_000),
    (1140, Preorder::Twa, true, 600_000),
    (1100, Preorder::Wat, true, 150_000),
    (1100, Preorder::Taw, true, 200_000),
    (1090, Preorder::Twa, true, 200_000),
    (1050, Preorder::Twa, true, 200_000),
    (1060, Preorder::Taw, true, 300_000),
];

/// The work (see [`Engine::work`]) one of the derive's constants may spend searching. rustc's
/// `long_running_const_eval` lint fires after 2,000,000 loop iterations and calls in one
/// evaluation, and a unit is one to a few of them: 800,000 units in one constant once
/// tripped it on a 409-field layout (with the engine built in the same constant), 400,000
/// did not; under a quarter of that leaves a wide margin. It also bounds the time: the compiler
/// runs this code some 3,000 times slower than native code, about 8 µs a unit.
pub const COMPILE_TIME_WORK: u64 = 175_000;

/// Where the derive's search schedule stands: the next try, whether it is under way, and the
/// engine's numbers (its arrays are in the scratch space carried with the schedule). See
/// [`improve_slots`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// The next try: index into the tries.
    next: usize,
    /// The largest capacity proved out of reach (0 for none): no try at or below it is made.
    proved: usize,
    /// The plan is proved the smallest: nothing more is tried.
    stopped: bool,
    /// The next try is under way, at capacity `cap`, until the engine's work reaches `until`.
    running: bool,
    cap: usize,
    until: u64,
    /// The engine, once built.
    engine: Option<Suspended>,
}

impl Schedule {
    /// The start of the schedule.
    pub const START: Schedule = Schedule {
        next: 0,
        proved: 0,
        stopped: false,
        running: false,
        cap: 0,
        until: 0,
        engine: None,
    };

    /// Whether the schedule is over: every try made, or the plan proved the smallest.
    pub const fn done(&self) -> bool {
        self.done_with(&COMPILE_TIME_TRIES)
    }

    /// Units of work (see [`Engine::work`]) the search has spent so far.
    pub const fn work(&self) -> u64 {
        match self.engine {
            Some(e) => e.work(),
            None => 0,
        }
    }

    /// [`done`](Self::done) for a schedule of other tries.
    const fn done_with(&self, tries: &[Try]) -> bool {
        self.stopped || self.next >= tries.len()
    }
}

/// The derive's search, carried from one constant to the next: the plan so far, where its
/// [`Schedule`] stands, and the search's scratch space (`LEN` entries, [`search_len`]), so
/// that a try cut off by one constant's work goes on in the next. Each constant runs
/// [`improve_step`]; no one constant's evaluation runs long, so rustc's lint for long
/// evaluations never fires, in the deriving crate or in any crate that evaluates its
/// constants again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Improving<const N: usize, const LEN: usize> {
    result: Result<Plan<N>, PlanError>,
    schedule: Schedule,
    scratch: [usize; LEN],
}

impl<const N: usize, const LEN: usize> Improving<N, LEN> {
    /// The search's start: the greedy plan (or its error, which passes through).
    pub const fn new(result: Result<Plan<N>, PlanError>) -> Self {
        Improving {
            result,
            schedule: Schedule::START,
            scratch: [0; LEN],
        }
    }

    /// The plan so far: never larger than the one the search started from.
    pub const fn result(&self) -> Result<Plan<N>, PlanError> {
        self.result
    }

    /// Whether the search is over.
    pub const fn done(&self) -> bool {
        self.schedule.done() || self.result.is_err()
    }
}

/// One of the derive's constants: continues the search from `state` ([`improve_slots`] within
/// [`COMPILE_TIME_WORK`]). `LEN` is the scratch space, [`search_len`] of the starting plan.
pub const fn improve_step<const N: usize, const LEN: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
    state: Improving<N, LEN>,
) -> Improving<N, LEN> {
    let mut state = state;
    let mut plan = match state.result {
        Ok(p) => p,
        Err(_) => return state,
    };
    if state.schedule.done() {
        return state;
    }
    improve_slots(
        layout,
        specs,
        &mut plan.slots,
        &mut plan.totals,
        &mut state.schedule,
        COMPILE_TIME_WORK,
        &mut state.scratch,
    );
    state.result = Ok(plan);
    state
}

/// The derive's search on a plan of any length: continues `schedule` on the plan `slots` /
/// `totals` (updated in place, never larger) within `work` (see [`Engine::work`]).
///
/// The schedule makes seven tries, each a run of the branch and bound under a preorder and a
/// capacity, in thousandths of the lower bound, cut off when it takes more than its share of
/// work: 1200 (TWA, 350,000 units), then, with the waiting-offset inference, 1140 (TWA,
/// 600,000), 1100 (WAT, 150,000), 1100 (TAW, 200,000), 1090 (TWA, 200,000), 1050 (TWA,
/// 200,000) and 1060 (TAW, 300,000). A try whose capacity the plan already meets, or that a
/// capacity proved out of reach rules out, is skipped. A try that the call's `work` cuts off
/// goes on in the next call, where it stopped, to the same end as if it had not been cut:
/// `scratch` holds the engine between calls (the same slice, untouched, with the same
/// `specs`, `slots` sizes and `schedule`). `scratch` holds [`search_len`] of the plan; a
/// layout without stages, a plan already at its lower bound, or one whose search needs more
/// than [`COMPILE_TIME_SCRATCH_MAX`] stops the schedule at once; calling until
/// [`Schedule::done`] ends.
pub const fn improve_slots(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    slots: &mut [Slot],
    totals: &mut Totals,
    schedule: &mut Schedule,
    work: u64,
    scratch: &mut [usize],
) {
    improve_slots_with(
        &COMPILE_TIME_TRIES,
        layout,
        specs,
        slots,
        totals,
        schedule,
        work,
        scratch,
    )
}

/// [`improve_slots`] with other tries, for tuning the schedule (the `tune_schedule` example).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub const fn improve_slots_with(
    tries: &[Try],
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    slots: &mut [Slot],
    totals: &mut Totals,
    schedule: &mut Schedule,
    work: u64,
    scratch: &mut [usize],
) {
    let t = *totals;
    let n = specs.len();
    if schedule.done_with(tries) {
        return;
    }
    if schedule.engine.is_none() {
        if layout.stages == 0 || t.size <= t.peak_live_bound || scratch.len() < scratch_len(n) {
            schedule.stopped = true;
            return;
        }
        // Tries the plan already meets are skipped here, for free.
        loop {
            if schedule.done_with(tries) {
                return;
            }
            match compile_time_cap(tries, &t, schedule, totals.size) {
                Some(cap) if cap < totals.size => break,
                _ => schedule.next += 1,
            }
        }
    }
    let (head, rest) = scratch.split_at_mut(scratch_len(n));
    let mut engine = match schedule.engine {
        Some(saved) => Engine::reattach(layout, specs, slots, rest, &saved),
        None => {
            let sizes = measure(layout, specs, slots, head);
            let len = sizes.scratch_len();
            if len > rest.len() || head.len() + len > COMPILE_TIME_SCRATCH_MAX {
                schedule.stopped = true;
                return;
            }
            Engine::new(layout, specs, slots, &sizes, rest)
        }
    };
    let stop = engine.work().saturating_add(work);
    let mut found = false;
    let mut best = totals.size;
    while !schedule.done_with(tries) && engine.work() < stop {
        let (permille, preorder, floors, work_share) = tries[schedule.next];
        let outcome = if schedule.running {
            engine.set_work_stop(if schedule.until < stop {
                schedule.until
            } else {
                stop
            });
            engine.resume()
        } else {
            let cap = match compile_time_cap(tries, &t, schedule, best) {
                Some(c) if c < best => c,
                // Met by an earlier try, or ruled out: on to the next.
                _ => {
                    schedule.next += 1;
                    continue;
                }
            };
            let share = if permille == 0 {
                (work_share as u64).saturating_mul((n as u64).saturating_mul(n as u64))
            } else {
                work_share as u64
            };
            schedule.cap = cap;
            schedule.until = engine.work().saturating_add(share);
            engine.set_work_stop(if schedule.until < stop {
                schedule.until
            } else {
                stop
            });
            engine.set_preorder(preorder, specs, layout.stages);
            // One order throughout (`set_preorder` turns reordering on).
            engine.set_reorder_parts(false);
            engine.set_waiting_floors(floors);
            engine.run(cap, u64::MAX)
        };
        schedule.running = false;
        match outcome {
            Outcome::Found { end } => {
                if let Some(size) = align_up(end, t.align) {
                    if size < best {
                        best = size;
                        found = true;
                    }
                }
            }
            Outcome::Infeasible => {
                if permille == 0 {
                    // Nothing below the best plan: it is the smallest.
                    schedule.stopped = true;
                } else if schedule.cap > schedule.proved {
                    schedule.proved = schedule.cap;
                }
            }
            Outcome::OutOfNodes => {
                if engine.work() < schedule.until {
                    // This call's work is spent: the next goes on with the try.
                    schedule.running = true;
                    break;
                }
            }
        }
        schedule.next += 1;
    }
    if found {
        // The engine keeps the offsets of its last plan found, the smallest; they move to
        // `slots` through `head` (free since measuring), as the engine borrows `slots`.
        let offsets = engine.offsets();
        let mut i = 0;
        while i < n {
            head[i] = offsets[i];
            i += 1;
        }
    }
    schedule.engine = Some(engine.suspend());
    if found {
        let mut i = 0;
        while i < n {
            slots[i].offset = head[i];
            i += 1;
        }
        totals.size = best;
    }
}

/// The capacity of the schedule's next try for a plan of totals `t` whose best size is
/// `best`, or `None` when the try is ruled out.
const fn compile_time_cap(
    tries: &[Try],
    t: &Totals,
    schedule: &Schedule,
    best: usize,
) -> Option<usize> {
    let (permille, _, _, _) = tries[schedule.next];
    let cap = if permille == 0 {
        if best > t.align {
            best - t.align
        } else {
            return None;
        }
    } else {
        match t.peak_live_bound.checked_mul(permille) {
            Some(v) => v / 1000 - (v / 1000) % t.align,
            None => return None,
        }
    };
    if cap <= schedule.proved || cap < t.peak_live_bound {
        None
    } else {
        Some(cap)
    }
}

/// How many constants the derive's search runs in, each [`improve_step`]: with
/// [`COMPILE_TIME_WORK`] each, this bounds what the search adds to a build (about 5 s for
/// 454 fields). The search carries over from one to the next (its scratch space is part of
/// each constant's value), so four constants of 175,000 units reach the plans one of
/// 700,000 would. (The derive emits this many and checks, at compile time, that the numbers
/// agree.)
pub const COMPILE_TIME_STEPS: usize = 4;

/// What the derive's chain of constants computes ([`COMPILE_TIME_STEPS`] calls of
/// [`improve_step`] from the greedy plan), as one call: the same plan. The state, scratch
/// space included (`LEN` entries, [`search_len`]), is a value: at run time,
/// [`plan_as_derive`] keeps it on the heap instead.
pub const fn improve<const N: usize, const LEN: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
    plan: Result<Plan<N>, PlanError>,
) -> Result<Plan<N>, PlanError> {
    let mut state = Improving::<N, LEN>::new(plan);
    let mut k = 0;
    while k < COMPILE_TIME_STEPS {
        state = improve_step::<N, LEN>(layout, specs, state);
        k += 1;
    }
    state.result
}

/// Scratch space [`improve`] needs for `plan`: [`scratch_len`]`(N)` for measuring plus the
/// engine's; 0 where there is no search: an error, a layout without stages, a plan already
/// at its lower bound, or a search over [`COMPILE_TIME_SCRATCH_MAX`]. `S` is
/// [`scratch_len`]`(N)`.
pub const fn search_len<const N: usize, const S: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
    plan: &Result<Plan<N>, PlanError>,
) -> usize {
    let plan = match plan {
        Ok(p) => p,
        Err(_) => return 0,
    };
    if layout.stages == 0 || plan.totals.size <= plan.totals.peak_live_bound {
        return 0;
    }
    let mut scratch = [0usize; S];
    let sizes = measure(layout, specs, &plan.slots, &mut scratch);
    let len = S + sizes.scratch_len();
    // Beyond it the search stops at once ([`improve_slots`]): no space for it.
    if len > COMPILE_TIME_SCRATCH_MAX {
        0
    } else {
        len
    }
}

/// The most scratch space (in words, [`search_len`]) the derive's search takes; a layout that
/// needs more keeps its greedy plan. Such a layout has over half a million conflicting pairs
/// or spanned sections, and one placement of every buffer visits each of them: the search
/// could not finish a single try within its work. The bound also keeps each constant's
/// value, which holds the scratch space, within 16 MiB.
pub const COMPILE_TIME_SCRATCH_MAX: usize = 1 << 21;

/// What the derive computes for a layout, run at run time: the four-ordering greedy plan
/// ([`plan_into`](super::plan_into)), then, for a layout with stages, the compile-time search's
/// [`COMPILE_TIME_STEPS`] steps of [`COMPILE_TIME_WORK`] each ([`improve_slots`]), into `slots`
/// (one per field). Returns the greedy plan's totals and the final ones. The same const fns
/// and the same work as in the compiler, so the same offsets: a derive's plan seen without
/// compiling it (the `compile_time_csv` example), and the compile-time search under test.
/// Like the derive, it plans without the layout's `max_bytes` and checks the final plan
/// against it: a greedy plan over the limit is no error when the search brings it under.
pub fn plan_as_derive(
    layout: &LayoutSpec,
    specs: &[FieldSpec],
    slots: &mut [Slot],
) -> Result<(Totals, Totals), PlanError> {
    let n = specs.len();
    let mut head = vec![0; scratch_len(n)];
    let unlimited = layout.with_max_bytes(usize::MAX);
    let greedy = super::plan_into(&unlimited, specs, slots, &mut head)?;
    let mut totals = greedy;
    if layout.stages > 0 {
        let sizes = measure(layout, specs, slots, &mut head);
        let mut scratch = vec![0; scratch_len(n) + sizes.scratch_len()];
        let mut schedule = Schedule::START;
        for _ in 0..COMPILE_TIME_STEPS {
            improve_slots(
                layout,
                specs,
                slots,
                &mut totals,
                &mut schedule,
                COMPILE_TIME_WORK,
                &mut scratch,
            );
        }
    }
    super::check_max_bytes(layout, totals.size)?;
    Ok((greedy, totals))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::super::{plan_into, scratch_len};
    use super::*;
    use std::vec::Vec;

    /// `improve_slots` on `n` buffers all live at once, from their plan in an arena twice as
    /// large as it needs: returns the work the search spent and the size it reached.
    fn search_all_at_once(n: usize) -> (u64, usize, usize) {
        let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(2);
        let specs: Vec<FieldSpec> = (0..n)
            .map(|i| FieldSpec::of::<u8>(1 + i % 7).with_live(0, 1))
            .collect();
        let mut slots = vec![Slot::EMPTY; n];
        let mut head = vec![0; scratch_len(n)];
        let mut totals = plan_into(&layout, &specs, &mut slots, &mut head).unwrap();
        let bound = totals.peak_live_bound;
        totals.size = 2 * bound;
        let sizes = measure(&layout, &specs, &slots, &mut head);
        let mut scratch = vec![0; scratch_len(n) + sizes.scratch_len()];
        let mut schedule = Schedule::START;
        let before = slots.clone();
        improve_slots(
            &layout,
            &specs,
            &mut slots,
            &mut totals,
            &mut schedule,
            COMPILE_TIME_WORK,
            &mut scratch,
        );
        if schedule.work() == 0 {
            assert_eq!(
                slots, before,
                "{n} buffers: the plan moved without a search"
            );
        }
        let over = scratch_len(n) + sizes.scratch_len() > COMPILE_TIME_SCRATCH_MAX;
        (schedule.work(), totals.size / bound, over as usize)
    }

    /// The derive's schedule cut into calls of any work, each going on where the last stopped
    /// (as the derive's constants do), ends with the plan, schedule and work of one uncut
    /// call; `plan_as_derive` matches its four calls of `COMPILE_TIME_WORK`; every plan is
    /// valid and never larger than the greedy one. Layouts with nested zero-size fields,
    /// alignments up to 4096 and one stage are among them.
    #[test]
    fn a_schedule_cut_into_calls_ends_as_an_uncut_one() {
        use super::super::validate::{Placed, validate};
        let mut next = crate::plan::test_rng(0x2545_F491_4F6C_DD1Du64);
        let (mut searched, mut cut) = (0, 0);
        for case in 0..1000 {
            let n = next(60);
            let stages = 1 + next(20);
            let specs: Vec<FieldSpec> = (0..n)
                .map(|_| {
                    let (x, y) = (next(stages), next(stages));
                    let size = match next(10) {
                        0 => 0,
                        1 => 1 + next(3),
                        _ => 1 + next(5000),
                    };
                    let big = next(8) == 0;
                    let align = 1 << next(if big { 13 } else { 4 });
                    let spec = if size == 0 {
                        FieldSpec::nested(0, align)
                    } else {
                        FieldSpec::of::<u8>(size).with_align(align)
                    };
                    spec.with_live(x.min(y), x.max(y))
                })
                .collect();
            let layout = LayoutSpec::DEFAULT
                .with_align(1 << next(9))
                .with_stages(stages);
            let mut greedy_slots = vec![Slot::EMPTY; n];
            let mut head = vec![0; scratch_len(n)];
            let greedy = plan_into(&layout, &specs, &mut greedy_slots, &mut head).unwrap();
            let sizes = measure(&layout, &specs, &greedy_slots, &mut head);
            let len = scratch_len(n) + sizes.scratch_len();
            // Calls of `work` each (`None`: random pieces) until the schedule is done, or `calls`.
            let run = |work: Option<u64>, calls: usize, next: &mut dyn FnMut(usize) -> usize| {
                let (mut slots, mut totals) = (greedy_slots.clone(), greedy);
                let (mut scratch, mut schedule) = (vec![0; len], Schedule::START);
                let mut k = 0;
                while !schedule.done() && k < calls {
                    let w = work.unwrap_or_else(|| 1 + next(3000) as u64);
                    improve_slots(
                        &layout,
                        &specs,
                        &mut slots,
                        &mut totals,
                        &mut schedule,
                        w,
                        &mut scratch,
                    );
                    k += 1;
                }
                (slots, totals, schedule.work(), schedule.done(), k)
            };
            let whole = run(Some(u64::MAX), 1, &mut next);
            // Far more calls than finishing takes (the tries share some 2,000,000 units).
            let pieces = run(None, 100_000, &mut next);
            assert!(whole.3 && pieces.3, "case {case}: not done");
            searched += (whole.2 > 0) as usize;
            cut += (pieces.4 > 1) as usize;
            assert_eq!(
                (&pieces.0, pieces.1, pieces.2),
                (&whole.0, whole.1, whole.2),
                "case {case}: {} calls",
                pieces.4
            );
            let derive = run(Some(COMPILE_TIME_WORK), COMPILE_TIME_STEPS, &mut next);
            let mut slots = vec![Slot::EMPTY; n];
            let (g, t) = plan_as_derive(&layout, &specs, &mut slots).unwrap();
            assert_eq!((g, t, &slots), (greedy, derive.1, &derive.0), "case {case}");
            for (slots, t) in [(&whole.0, whole.1), (&slots, t)] {
                let placed: Vec<Placed> = slots
                    .iter()
                    .zip(&specs)
                    .map(|(s, f)| Placed::of(s, f.live))
                    .collect();
                assert_eq!(validate(&placed, t.size), Ok(()), "case {case}");
                assert!(
                    t.size <= greedy.size && t.size % t.align == 0,
                    "case {case}"
                );
            }
        }
        // Many cases search, and most of those are cut.
        assert!(
            searched >= 100 && cut * 4 >= searched * 3,
            "{searched} {cut}"
        );
    }

    /// `plan_as_derive` gives what the derive's chain of constants gives (greedy orderings
    /// without `max_bytes`, the search, `max_bytes` checked on the final plan) on a layout whose
    /// greedy plan (24 bytes) is over its `max_bytes` and whose search is not (21 bytes), and
    /// with a limit neither meets.
    #[test]
    fn plan_as_derive_checks_max_bytes_on_the_final_plan_as_the_derive_does() {
        use super::super::{Prepared, Strategy, plan_prepared, prepare, smaller, within_max_bytes};
        const N: usize = 6;
        const S: usize = scratch_len(N);
        const SPECS: [FieldSpec; N] = [
            FieldSpec::of::<u8>(5).with_live(1, 3),
            FieldSpec::of::<u8>(9).with_live(0, 0),
            FieldSpec::of::<u8>(1).with_live(0, 1),
            FieldSpec::of::<u8>(6).with_live(3, 3),
            FieldSpec::of::<u8>(7).with_live(2, 3),
            FieldSpec::of::<u8>(9).with_live(0, 2),
        ];
        const UNLIMITED: LayoutSpec = LayoutSpec::DEFAULT.with_align(1).with_stages(4);
        const PREPARED: Prepared<N> = prepare::<N, S>(&UNLIMITED, &SPECS);
        const fn greedy(strategy: Strategy) -> Result<Plan<N>, PlanError> {
            plan_prepared::<N, S>(&UNLIMITED, &SPECS, &PREPARED, &[strategy])
        }
        const GREEDY: Result<Plan<N>, PlanError> = smaller(
            smaller(greedy(Strategy::BySize), greedy(Strategy::ByStart)),
            smaller(greedy(Strategy::ByDuration), greedy(Strategy::Declaration)),
        );
        const LEN: usize = search_len::<N, S>(&UNLIMITED, &SPECS, &GREEDY);
        assert_eq!(GREEDY.unwrap().totals.size, 24);
        for max_bytes in [usize::MAX, 22, 20] {
            let layout = UNLIMITED.with_max_bytes(max_bytes);
            let derive = within_max_bytes(&layout, improve::<N, LEN>(&layout, &SPECS, GREEDY));
            let mut slots = [Slot::EMPTY; N];
            let native = plan_as_derive(&layout, &SPECS, &mut slots);
            match derive {
                Ok(plan) => {
                    assert_eq!(plan.totals.size, 21, "max_bytes {max_bytes}");
                    let (_, totals) = native.unwrap();
                    assert_eq!((totals, slots), (plan.totals, plan.slots), "{max_bytes}");
                }
                Err(e) => {
                    assert_eq!(max_bytes, 20);
                    assert_eq!(native, Err(e));
                }
            }
        }
    }

    /// A layout whose search needs more than `COMPILE_TIME_SCRATCH_MAX` keeps its plan without
    /// searching; a smaller one searches and halves the arena.
    #[test]
    fn a_search_too_large_for_the_derive_is_not_run() {
        let (work, ratio, over) = search_all_at_once(1100);
        assert_eq!((work, ratio, over), (0, 2, 1));
        let (work, ratio, over) = search_all_at_once(100);
        assert!(work > 0 && ratio == 1 && over == 0, "{work} {ratio} {over}");
    }
}

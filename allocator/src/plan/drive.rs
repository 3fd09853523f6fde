//! The driver of the search: which capacity to ask for, on which part of the timeline, with
//! which preorder and how many nodes, until the plan is as small as it can be or the budget is
//! spent. One `const fn` state machine serves the derive (a fixed number of nodes, evaluated by
//! the compiler) and [`LayoutBuilder::search`](crate::LayoutBuilder::search) (a time budget,
//! checked between steps).

use super::align::align_up;
use super::error::PlanError;
use super::search::{Engine, Outcome, Preorder, measure};
use super::stages::scratch_len;
use super::{FieldSpec, LayoutSpec, Plan};

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
}

impl Search {
    /// A search that starts from a plan of `size` bytes (the engine's incumbent, rounded up
    /// to `align`) and knows no plan is below `lower` (a multiple of `align`).
    pub const fn new(goal: Goal, size: usize, lower: usize, align: usize) -> Search {
        Search {
            goal,
            align,
            lower,
            size,
            level: 1,
            target: 0,
            part: 0,
            strategy: 0,
            finished: false,
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
    /// layout's (for the preorders).
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
        while self.part < parts && engine.part_end(self.part) <= cap {
            self.part += 1;
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
        let (preorder, reorder) = STRATEGIES[self.strategy];
        engine.set_preorder(preorder, specs, stages);
        engine.set_reorder_parts(reorder);
        match engine.run_part(self.part, cap, run) {
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

/// The capacities the derive asks for, in hundredths of the lower bound, loosest first: it
/// stops at the first it cannot reach.
const COMPILE_TIME_TARGETS: [usize; 5] = [115, 110, 106, 103, 100];

/// The preorders the derive tries at each capacity.
const COMPILE_TIME_PREORDERS: [Preorder; 3] = [Preorder::Wat, Preorder::Taw, Preorder::Twa];

/// Lowers `plan`'s size with the search, within a fixed amount of work: the derive's driver,
/// evaluated by the compiler. It asks for plans within 115%, 110%, 106%, 103% and 100% of
/// the lower bound in turn, each with three preorders and `limit` nodes per try (`2n`: a dive
/// with a little backtracking), and stops at the first capacity it cannot reach. `LEN` is the
/// scratch space, [`search_len`] of the plan. A layout without stages, an error, or a plan
/// already at its lower bound passes through unchanged; the plan never gets larger.
pub const fn improve<const N: usize, const LEN: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
    plan: Result<Plan<N>, PlanError>,
    limit: u64,
) -> Result<Plan<N>, PlanError> {
    let mut plan = match plan {
        Ok(p) => p,
        Err(e) => return Err(e),
    };
    let t = plan.totals;
    if layout.stages == 0 || t.size <= t.peak_live_bound || LEN == 0 {
        return Ok(plan);
    }
    let mut scratch = [0usize; LEN];
    let (head, rest) = scratch.split_at_mut(scratch_len(N));
    let sizes = measure(layout, specs, &plan.slots, head);
    if sizes.scratch_len() > rest.len() {
        return Ok(plan);
    }
    let slots = plan.slots;
    let mut engine = Engine::new(layout, specs, &slots, &sizes, rest);
    let mut best = t.size;
    let mut i = 0;
    while i < COMPILE_TIME_TARGETS.len() {
        let want = match t.peak_live_bound.checked_mul(COMPILE_TIME_TARGETS[i]) {
            Some(v) => v / 100,
            None => break,
        };
        let cap = want - want % t.align;
        i += 1;
        if cap >= best {
            continue;
        }
        let mut reached = false;
        let mut k = 0;
        while k < COMPILE_TIME_PREORDERS.len() && !reached {
            engine.set_preorder(COMPILE_TIME_PREORDERS[k], specs, layout.stages);
            if let Outcome::Found { end } = engine.run(cap, limit) {
                if let Some(size) = align_up(end, t.align) {
                    if size < best {
                        best = size;
                        let offsets = engine.offsets();
                        let mut j = 0;
                        while j < N {
                            plan.slots[j].offset = offsets[j];
                            j += 1;
                        }
                    }
                }
                reached = true;
            }
            k += 1;
        }
        if !reached {
            break;
        }
    }
    plan.totals.size = best;
    Ok(plan)
}

/// [`improve`] as the derive calls it, `2n` nodes per try.
#[doc(hidden)]
pub const fn improve_at_compile_time<const N: usize, const LEN: usize>(
    layout: &LayoutSpec,
    specs: &[FieldSpec; N],
    plan: Result<Plan<N>, PlanError>,
) -> Result<Plan<N>, PlanError> {
    let limit = match option_env!("DEVARENA_EXP_LIMIT") {
        Some(v) => {
            let b = v.as_bytes();
            let (mut x, mut i) = (0u64, 0);
            while i < b.len() {
                x = x * 10 + (b[i] - b'0') as u64;
                i += 1;
            }
            x
        }
        None => 2 * (N as u64 + 1),
    };
    improve::<N, LEN>(layout, specs, plan, limit)
}

/// Scratch space [`improve`] needs for `plan`: [`scratch_len`]`(N)` for measuring plus the
/// engine's (0 for a layout without stages or an error). `S` is [`scratch_len`]`(N)`.
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
    S + sizes.scratch_len()
}

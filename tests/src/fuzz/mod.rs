//! The logic of devarena's fuzz targets, as plain functions over bytes.
//!
//! `fuzz/` (a crate of its own, built with `cargo +nightly fuzz`) wraps each of these in a
//! libFuzzer target, and `tests/fuzz_corpus.rs` runs each committed input of
//! `fuzz/corpus/<target>/` through the same function on the stable toolchain, so CI replays the
//! corpora on every run. A function panics when it finds a defect: an invariant of the pool or
//! the planner that does not hold, or a panic inside devarena itself.
//!
//! | target | what it drives | checked against |
//! | --- | --- | --- |
//! | [`pool_ops`] | a host pool: clients and quotas, streams through `ManualStreams`, slices, reuse settings, tracking, an event sink | a reference model: live blocks disjoint and inside the region, alignment, exact statistics per pool and client, which calls must succeed, signature bytes intact |
//! | [`heap_ops`] | a host pool (classic or growable) whose threads get heaps: up to four worker threads making operations in turn and runs at once, frees of other threads' blocks, threads that exit, sinks and tracking switched, trims | a reference model: live blocks disjoint and inside the region, alignment, exact statistics (the free blocks as if every heap were given back), which calls must succeed with blocks in other threads' heaps, signature bytes intact |
//! | [`layout`] | `LayoutBuilder` with any fields, alignments, stages and live ranges, then `DynArena` views | every field aligned and inside `SIZE`, fields that meet disjoint, views of the right length at the right address |
//! | [`torch_abi`] | the PyTorch C ABI's logic on host pools, and `DEVARENA_POOL_BYTES` parsing | a model of the segments handed out; the parser against a second, independent reading |
//! | [`csv_log`] | a pool logging to `CsvEventLog`, including a writer that fails | the log parsed back: one line per event, in order, replaying to the pool's live set |

pub mod csv_log;
pub mod heap_ops;
pub mod input;
pub mod layout;
mod model;
pub mod pool_ops;
pub mod torch_abi;

/// A target's logic: runs one input, panics on a defect.
pub type Target = fn(&[u8]);

/// The names of the targets (the folders of `fuzz/corpus/`), with their functions.
pub const TARGETS: [(&str, Target); 5] = [
    ("pool_ops", pool_ops::run),
    ("heap_ops", heap_ops::run),
    ("layout", layout::run),
    ("torch_abi", torch_abi::run),
    ("csv_log", csv_log::run),
];

//! # devarena
//!
//! GPU memory the way production pipelines hold it: **one allocation, sliced**.
//! `#[derive(DeviceLayout)]` on a struct of fixed-size buffers makes the compiler compute every
//! field's aligned offset, the total size and the alignment of the backing allocation; an
//! [`Arena`] then makes exactly one allocation of that size and hands out typed, disjoint,
//! borrow-checked views of every field. After setup a pipeline allocates nothing.
//!
//! ## Quick start
//!
//! ```
//! use devarena::{Arena, DeviceLayout, HostBackend, LayoutReport};
//!
//! #[derive(DeviceLayout)]
//! #[layout(max_bytes = 16 << 20)]          // a compile error if the layout outgrows 16 MiB
//! struct Frame {
//!     rgb: [u8; 640 * 480 * 3],
//!     gray: [f32; 640 * 480],
//!     #[layout(align = 4096)]
//!     hist: [u32; 256],
//! }
//!
//! // Every number is a compile-time constant.
//! const _: () = assert!(Frame::SIZE % Frame::ALIGN == 0);
//! assert_eq!(Frame::OFFSETS.gray, 640 * 480 * 3);
//! assert_eq!(Frame::OFFSETS.hist % 4096, 0);
//!
//! // One allocation backs every buffer.
//! let backend = HostBackend::new();
//! let mut arena = Arena::<Frame>::new_in(backend.clone())?;
//! let views = arena.views_mut();
//! views.rgb.fill(255);
//! for (g, px) in views.gray.iter_mut().zip(views.rgb.chunks(3)) {
//!     *g = px.iter().map(|&c| c as f32).sum::<f32>() / 765.0;
//! }
//! views.hist[255] = views.gray.len() as u32;
//! assert_eq!(backend.stats().allocations, 1);
//!
//! // The layout as a table (and `report.write_svg(path)` for a memory map).
//! let report = LayoutReport::of::<Frame>();
//! println!("{report}");
//! # Ok::<(), devarena::Error>(())
//! ```
//!
//! ## The placement rule
//!
//! Fields are placed in declaration order. A field's alignment is its own
//! `#[layout(align = N)]`, else the struct's `#[layout(align = N)]`, else 256 bytes (what
//! `cudaMalloc` guarantees). A struct-level default below an element's alignment is raised to
//! it; a field-level alignment below its element's is a compile error. A nested layout is one
//! block of its `SIZE` aligned to at least its `ALIGN`. `ALIGN` is the largest field alignment
//! and `SIZE` is rounded up to it. Details in [`plan`].
//!
//! ## Stages: buffers that share bytes
//!
//! With `#[layout(stages = N)]` (or `stages(a, b, ..)`) and a `#[layout(live = A..=B)]` on
//! each field, fields whose live ranges never meet may share bytes; the arena hands out the
//! views of one stage at a time ([`Arena::stage_mut`]; with named stages also `arena.blur_mut()`
//! and `arena.blur()` for a stage `blur`, methods of a trait the derive makes beside the
//! struct: a stage name that is a keyword, or whose methods would be `Arena`'s own, such as
//! `free` or `views`, is a compile error). Planning such a layout is the classic
//! static memory allocation problem, and devarena's planner works at three depths, all the
//! same `const fn`s in [`plan`]:
//!
//! * **Greedy** ([`LayoutBuilder::build`]): four orderings (by size, by first stage, by
//!   live-range length, declaration order), each buffer at the lowest gap its conflicting
//!   buffers leave, the smallest plan kept. `O(n log n)` plus the conflicts: 30,000 buffers
//!   plan in about 0.1 s.
//! * **Search** ([`LayoutBuilder::search`] with a [`Budget`] of nodes or time): MiniMalloc's
//!   complete branch and bound over canonical plans, from the greedy plan, never larger
//!   than it (under a time budget too short for the greedy orderings, from a best-fit sweep
//!   made in `O(n log n)`); given the budget it finds the smallest plan and proves it so
//!   ([`SearchStats::optimal`]; [`SearchStats::end`] says why it stopped). The `plan_csv` example runs it on the field's benchmark
//!   format (MiniMalloc's CSV): `cargo run --release -p devarena --example plan_csv --
//!   --input F.csv --output O.csv [--capacity BYTES] [--budget-ms MS]`.
//! * **At compile time** (the derive): the greedy plan, then the search under a fixed amount
//!   of work ([`plan::COMPILE_TIME_STEPS`] constants of [`plan::COMPILE_TIME_WORK`] each, so
//!   that no evaluation trips rustc's `long_running_const_eval` lint and no attribute is
//!   needed, and the search adds a bounded time to a build: about 5 s for 454 fields; a try
//!   cut off by one constant goes on in the next). A generic layout keeps the greedy plan.
//!   The compiler evaluates the planner a few thousand times slower than it runs, so the
//!   derive's plans stop short of what `search` reaches at run time in the same seconds
//!   (figures in BENCHMARKS.md).
//!
//! [`plan::validate`] checks any plan independently of the planner: conflicting buffers
//! never overlap, offsets are aligned, everything fits.
//!
//! ## Compile-time checks
//!
//! An alignment that is not a power of two, a field alignment below its element's, a
//! zero-length buffer, a size that overflows `usize`, a size over `max_bytes`, a bad live range,
//! a stage name that is a keyword or whose methods would be `Arena`'s own (`free`, `views`,
//! `capture`, ...), enums, unions, tuple structs and fields that are neither `[T; N]` nor a
//! `DeviceLayout` are compile errors that name the struct, the field and the numbers.
//!
//! ## What is `unsafe`, and why
//!
//! Arenas allocate `SIZE` bytes at `ALIGN` and hand out the views a layout makes, trusting
//! what the derive generates: [`DeviceLayout`], [`Stage`] and [`Disjoint`] are `unsafe trait`s
//! that `#[derive(DeviceLayout)]` implements; never write them by hand. With `cuda`,
//! `StreamOrdered` (the stream a backend orders its views on) and `TrustedDevicePtr` (a device
//! buffer whose address and length a safe kernel wrapper may trust; devarena's views and
//! cudarc's slices have it) are `unsafe trait`s as well, for backends and buffer types of your
//! own. `Arena::capture` and `Pool::capture` are `unsafe fn`s: a CUDA graph keeps alive only
//! the arena (or its own pool blocks), and their `# Safety` sections say which other memory the
//! caller keeps until the last replay. Views for another stream (`Arena::views_mut_on`) are
//! safe: they live only inside their closure, after which the arena's stream waits for the
//! other one. [`Element`] is an `unsafe trait` too, for plain element types of your own
//! (`#[derive(Element)]` checks one).
//!
//! ## Features
//!
//! * `std` (default): `std::error::Error`, writing reports to files, and the runtime
//!   [`Pool`] (sub-allocation of one reserved region under the TensorRT
//!   `IGpuAllocator` contract, with caps, statistics, leak reports and an event log).
//! * `cuda`: the CUDA backends through cudarc (device memory, stream-ordered, managed, pinned),
//!   and the pool on device memory (`Pool::cuda`, with CUDA events for stream ordering and
//!   device views of its slices); views for another stream, ordered both ways
//!   (`Arena::views_mut_on(&stream, |views| ..)`, `stage_mut_on`); CUDA graphs of arenas
//!   (`Arena::capture`, an `unsafe fn`, records a frame's work on the arena's stream once,
//!   `ArenaGraph::launch` replays it with one call, and the graph borrows the arena for as long
//!   as it lives).
//!
//! Without `std` the crate is `#![no_std]` and needs only `alloc`.
//!
//! ## The map
//!
//! Imports point one way, down: `plan` ← `layout` ← `backend` ← {`arena`, `dyn_arena`,
//! `builder`, `pool`} ← `report`. Only `backend::cuda` calls cudarc's driver API; the CUDA
//! conveniences of arenas and pools live beside them and go through it.
//!
//! | module | what |
//! | --- | --- |
//! | [`plan`] | `const fn` placement math shared by the derive and [`LayoutBuilder`]: alignment arithmetic (`align.rs`, the crate's one home of [`align_up`](plan::align_up) and the 256-byte [`CUDA_ALIGN`](plan::CUDA_ALIGN)), the placement rule, stage aliasing, error messages |
//! | `layout` | [`DeviceLayout`], [`Element`], view kinds ([`ViewKind`]) |
//! | [`backend`] | where an allocation comes from: [`HostBackend`], and with `cuda` the device, managed and pinned backends and device views; [`MemoryKind`] says what each hands out |
//! | `arena` | [`Arena`]: one allocation, typed views, stage views; `arena/cuda.rs`: views for another stream (`views_mut_on`), prefetching and host views of managed arenas, device views of pinned ones; `arena/graph.rs`: `Arena::capture`, `ArenaGraph` |
//! | `dyn_arena`, `builder` | layouts planned at run time: [`LayoutBuilder`], [`DynArena`] |
//! | [`pool`] | the run-time [`Pool`]: engine, builder, handles, region, TLSF index, statistics, event log, stream ordering, graph reservations (`pool::graph`); `pool::cuda` and `Pool::capture` with `cuda` |
//! | [`report`] | [`LayoutReport`]: tables and SVG maps of a layout |
#![no_std]
#![cfg_attr(docsrs, feature(doc_cfg))]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

// Lets the derive's `::devarena::` paths resolve inside this crate's own tests.
#[allow(unused_extern_crates)]
extern crate self as devarena;

mod arena;
pub mod backend;
mod builder;
mod dyn_arena;
mod error;
mod layout;
pub mod plan;
#[cfg(feature = "std")]
pub mod pool;
pub mod report;

/// How many times a test's loop runs: `n`, or a hundredth of it (at least once) under Miri
/// (`scripts/miri.sh`), which runs code thousands of times slower while it checks every
/// memory access and every interleaving it picks for data races.
#[cfg(test)]
pub(crate) const fn test_iterations(n: usize) -> usize {
    if cfg!(miri) {
        if n / 100 > 0 { n / 100 } else { 1 }
    } else {
        n
    }
}

pub use arena::{Arena, Disjoint, Stage};
#[cfg(feature = "cuda")]
pub use arena::{ArenaGraph, Capture};
pub use backend::{Allocation, Backend, BackendStats, HostBackend, MemoryKind};
pub use builder::{Budget, LayoutBuilder, RuntimeField, RuntimeLayout, SearchEnd, SearchStats};
pub use dyn_arena::DynArena;
pub use error::Error;
pub use layout::{DeviceLayout, Element, FieldPlacement, HostBase, HostMut, HostRef, ViewKind};
pub use plan::{DEFAULT_ALIGN, LiveRange};
#[cfg(feature = "std")]
pub use pool::{Pool, PoolClient, PoolSlice};
pub use report::LayoutReport;

/// `#[derive(DeviceLayout)]`: plans a struct of fixed-size buffers at compile time.
///
/// It is the way to implement the `unsafe trait`s [`DeviceLayout`] (and [`Disjoint`] or
/// [`Stage`]): what it generates is checked at compile time. See the [crate docs](crate) for
/// the attributes and the placement rule.
pub use devarena_macros::DeviceLayout;

/// `#[derive(Element)]`: declares a plain `#[repr(C)]` struct a device element, checking that
/// every field is an [`Element`] and that the struct has no padding.
///
/// ```
/// #[derive(Clone, Copy, devarena::Element)]
/// #[repr(C)]
/// struct Rgba { r: u8, g: u8, b: u8, a: u8 }
///
/// #[derive(devarena::DeviceLayout)]
/// struct Image { pixels: [Rgba; 64 * 64] }
/// # use devarena::DeviceLayout;
/// assert_eq!(Image::SIZE, 64 * 64 * 4);
/// ```
pub use devarena_macros::Element;

#[doc(hidden)]
pub mod __private {
    //! Items the derive's generated code names. Not public API.
    pub use core;
    pub use core::marker::PhantomData;

    use crate::{DeviceLayout, Element, ViewKind};

    /// Compiles only for element types (`#[derive(Element)]`'s field check).
    pub const fn assert_element<T: Element>() {}

    /// Views of a nested layout; only layouts whose fields never share bytes can nest.
    ///
    /// # Safety
    ///
    /// As [`DeviceLayout::views`].
    pub unsafe fn nested_views<'a, L: DeviceLayout, K: ViewKind>(
        base: K::Base<'a>,
    ) -> L::Views<'a, K> {
        const {
            assert!(
                L::STAGES == 0,
                "a layout with stages cannot be nested: its fields share bytes"
            )
        };
        // SAFETY: forwarded from the caller; the layout has no stages, so no sharing.
        unsafe { L::views::<K>(base) }
    }
}

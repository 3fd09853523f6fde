//! Frees of a heap's blocks made by other threads (a data-loader thread allocates, a consumer
//! frees), without the pool's lock.
//!
//! A free the calling thread's own heap cannot take went to the pool's lock, which found the
//! block's heap in the pool's map of spans and freed it there, with the heap locked: every such
//! free in the process waited in one line. On the H200 host, with each of 8 threads freeing
//! the blocks of the next one (benchmark `pool_handoff`), a free took 2.2–2.5 µs there. Now
//! the heap is found in a [`SpanDirectory`], a copy of that map readable without the pool's
//! lock, and the block is freed under the heap's lock alone; a thread whose last free was of
//! another heap's block asks the directory first and leaves its own heap alone
//! ([`OwnerHint`](super::OwnerHint)), so that its own heap's lock and map stay with the thread
//! that frees into it: 0.21 µs a free, as fast as `std::alloc`'s in the same run.
//!
//! The directory is a hint, never trusted: the block is freed only if the heap it names, once
//! locked, has a live allocation at that address, so a directory that lags behind a span given
//! back or taken costs a trip to the pool's lock, never a wrong free. It is brought up to date
//! lazily: a change of the pool's map of spans only marks it out of date
//! ([`Shared::spans_changed`]), a free that finds it so goes to the pool's lock, and the pool
//! rebuilds it there ([`Shared::refresh_span_directory`]), once for any number of changes. A
//! rebuild copies the whole map: near the capacity heaps take and give back small spans by the
//! thousand (in the pool benchmark, eight threads with a pool of 768 MiB held up to about a
//! thousand spans), and rebuilding at every change took about a tenth of the threads' time
//! where no thread frees another's blocks at all. Under the heap's lock the free is the one its own
//! thread makes ([`heap_free_locked`](Shared::heap_free_locked)), which is what the general
//! path does there ([`deallocate_on_heap`](Shared::deallocate_on_heap)) for a free on the
//! heap's stream with no sink: the same checks, the same counts. Everything else (a sink,
//! another stream, an allocation the caller may not free, an address no heap holds) goes on to
//! the pool's lock, which decides and reports as before.

use alloc::sync::Arc;
use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};

use super::ThreadHeap;
use crate::pool::counters::SPARE_SHARDS;
use crate::pool::engine::{Shared, State};
use crate::pool::stream::StreamId;

/// Where the thread heaps' spans lie: `(start, end, heap)`, sorted by start; one list shared
/// by every copy.
type Spans = Arc<[(u64, u64, Arc<ThreadHeap>)]>;

/// One copy of the span map, alone on its cache lines: threads read different copies, so
/// that taking a read lock moves no line between their cores.
#[repr(align(128))]
struct SpanCopy(RwLock<Spans>);

/// Copies of the pool's map of spans to heaps ([`State::spans`]), one per shard, each read
/// under a read lock of its own by the threads of its shard (by thread number).
pub(in crate::pool) struct SpanDirectory {
    copies: [SpanCopy; SPARE_SHARDS],
    /// The pool's map of spans changed since the copies were made, and they are empty (read
    /// and written under the pool's lock only).
    pub(super) stale: AtomicBool,
}

impl Default for SpanDirectory {
    fn default() -> Self {
        SpanDirectory {
            copies: core::array::from_fn(|_| SpanCopy(RwLock::new(Arc::new([])))),
            stale: AtomicBool::new(false),
        }
    }
}

impl SpanDirectory {
    /// The heap whose span holds `addr`, as last published (none while the directory is out
    /// of date: it is empty then).
    fn find(&self, addr: u64) -> Option<Arc<ThreadHeap>> {
        let shard = crate::pool::events::thread_number() as usize % SPARE_SHARDS;
        // (Nothing panics with the lock held: a poisoned copy is as good as any.)
        let spans = self.copies[shard]
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let at = spans.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (_, end, heap) = &spans[at];
        (addr < *end).then(|| heap.clone())
    }

    /// Replaces every copy with `spans`; the directory is up to date.
    pub(super) fn publish(&self, spans: Spans) {
        for copy in &self.copies {
            *copy.0.write().unwrap_or_else(PoisonError::into_inner) = spans.clone();
        }
        self.stale.store(false, Ordering::Relaxed);
    }

    /// Empties every copy and marks the directory out of date: what it named is dropped (a
    /// heap given back is not kept by a directory nobody rebuilds).
    fn clear(&self) {
        let empty: Spans = Arc::new([]);
        for copy in &self.copies {
            *copy.0.write().unwrap_or_else(PoisonError::into_inner) = empty.clone();
        }
        self.stale.store(true, Ordering::Relaxed);
    }
}

impl Shared {
    /// Marks the span directory out of date: the pool's map of spans changed (under the
    /// pool's lock). Frees of other heaps' blocks go to the pool's lock until it is rebuilt
    /// there ([`refresh_span_directory`](Self::refresh_span_directory)).
    #[inline]
    pub(in crate::pool) fn spans_changed(&self) {
        // (The flag is set and cleared under the pool's lock. The copies are emptied at the
        // first change after a rebuild: a reader that takes a copy's read lock just before
        // reads the copy one change behind, which a hint may be.)
        if !self.span_dir.stale.load(Ordering::Relaxed) {
            self.span_dir.clear();
        }
    }

    /// With the pool's lock held: rebuilds the span directory if a change of the map of
    /// spans left it out of date.
    pub(in crate::pool) fn refresh_span_directory(&self, state: &State) {
        if self.span_dir.stale.load(Ordering::Relaxed) {
            self.publish_spans(state);
        }
    }

    /// Rebuilds the span directory from the pool's map of spans (under the pool's lock; with
    /// heap locks held or not: the directory's readers hold no other lock while they hold one
    /// of its read locks).
    pub(in crate::pool) fn publish_spans(&self, state: &State) {
        let spans = state
            .spans
            .iter()
            .map(|(&start, (size, heap))| (start, start + size, heap.clone()))
            .collect();
        self.span_dir.publish(spans);
    }

    /// A free of a block of another thread's heap (or of the caller's own, whose lock another
    /// thread held a moment ago), under that heap's lock alone: whether it freed. `false`
    /// leaves everything as it was, for the pool's lock to decide.
    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn deallocate_remote(
        &self,
        caller: Option<u32>,
        addr: u64,
        stream: StreamId,
        from_slice: bool,
    ) -> bool {
        // Inside a callback of the pool this thread may hold a heap's lock further up its
        // stack (a stream runtime called while a span is added): the pool's lock answers
        // there (it defers the free).
        if self.state.in_callback() {
            return false;
        }
        let Some(heap) = self.span_dir.find(addr) else {
            return false;
        };
        // The calling thread's own heap (its lock was held a moment ago, or the thread's last
        // free was of another heap's block): its next free tries it first again. (The free
        // looked its heap up just before; a thread without one looks nothing up here.)
        let own = super::is_current(self.id, stream, Arc::as_ptr(&heap));
        if own {
            heap.frees_elsewhere.set(false);
        }
        // A heap hands its blocks out again on its own stream only: a free on another stream
        // parks the block, under the pool's lock.
        if self.streams.is_some() && stream != heap.stream {
            return false;
        }
        // Held by its owner for one allocation or free at a time, by others as briefly; this
        // thread holds no other lock here.
        let mut guard = heap.state.lock_wait();
        // A heap given back has no live allocation left; where the directory lags, the heap
        // holds none at `addr` and nothing changes. The free itself, its checks and counts,
        // are its owner's.
        let freed = if guard.retired {
            None
        } else {
            self.heap_free_locked(&mut guard, caller, addr, from_slice)
        };
        let Some(over) = freed else {
            return false;
        };
        drop(guard);
        // The caller's own heap, whose lock another thread held a moment ago: what its own
        // free would have done next (`shrink` finds its heap and takes the pool's lock).
        if over && own {
            self.shrink(stream);
        }
        true
    }
}

//! Trimming a growable region: unmapping chunks that hold no live byte, after the home
//! stream's work is done, and the release threshold that `synchronize` trims to.

use super::{LockGuard, Shared, State, TRIM_TRIES};
use crate::error::Error;
use crate::pool::StreamId;
use crate::pool::lock::logged;

/// What [`Shared::unmap_free_for_request`] did, or leaves to the request's entry point.
pub(super) enum FreeChunks {
    /// Nothing to give back, or not now: the request fails.
    None,
    /// Chunks went back to the device: the request looks again.
    Unmapped,
    /// Chunks can go back once the home stream is waited for, without the lock.
    AfterWait,
}

impl Shared {
    /// Unmaps chunks of a growable region that hold no live byte until at most `keep` bytes
    /// stay mapped; returns the bytes unmapped (always 0 for a classic region).
    ///
    /// Stream order: a block freed on the home stream is free at once, while work queued
    /// there may still use it; a block freed on another stream is parked until its event
    /// completes, so it is safe once free. The home stream is therefore synchronized before
    /// anything is unmapped, outside the lock so that other threads keep allocating and work
    /// queued there that calls into the pool runs. While the trim waits, a free on the home
    /// stream parks its block behind an event recorded there ([`State::home_fences`]), and so
    /// do the free blocks a home-stream thread heap gives back (its thread exits, it
    /// shrinks): what is free when the wait ends is what was free when it began, or came back
    /// through events that completed. Blocks that reach the pool's index meanwhile without an
    /// event of their own (taken back by the home stream for a request that would fail
    /// without them, given back by a heap of another stream once the home stream waits for
    /// it, or where no event could be recorded) move the home stream's epoch, and the trim
    /// looks again; after [`TRIM_TRIES`] tries it gives up and unmaps nothing more (never a
    /// wait with the lock held: a host function queued on the home stream that calls into
    /// the pool would wait for it for ever).
    pub(in crate::pool) fn trim_to(&self, keep: usize) -> Result<usize, Error> {
        if !self.growable {
            return Ok(0);
        }
        for _ in 0..TRIM_TRIES {
            let mut state = self.lock()?;
            self.make_deferred_frees(&mut state);
            if !self.prepare_trim(&mut state, keep) {
                return Ok(0);
            }
            let (epoch, mut state) = self.wait_for_home_fenced(state, || self.lock())?;
            if state.home_epoch == epoch {
                // SAFETY: the host waited for the home stream past every free made on it
                // before the wait (`epoch`), and every block that reaches the index without
                // an event of its own moves the epoch, which has not moved: frees on other
                // streams and blocks of other streams' heaps park behind their streams'
                // events (`prepare_trim` took back the completed ones, after ordering the home
                // stream after those heaps' streams), graph-held blocks stay held, and home-
                // stream frees and heaps given back during the wait parked behind an event
                // recorded on the home stream then.
                return unsafe { Self::unmap_free(&mut state, keep) };
            }
        }
        logged(|| {
            log::debug!(
                target: "devarena::pool",
                "pool `{}`: a trim gave up after {TRIM_TRIES} waits for the home stream: free \
                 blocks of thread heaps kept reaching the pool during each",
                self.name
            )
        });
        Ok(0)
    }

    /// Where more than `keep` bytes are mapped: gives every thread heap back, merges what
    /// waits in the reuse cache and takes back parked blocks whose events have completed;
    /// whether more than `keep` bytes are mapped.
    pub(super) fn prepare_trim(&self, state: &mut State, keep: usize) -> bool {
        // Nothing to give back: the heaps and the reuse cache stay as they are.
        if state.mapping.mapped_bytes() <= keep {
            return false;
        }
        self.dissolve_all(state, true);
        state.tlsf.flush();
        if !state.parked.is_empty() {
            self.reclaim_parked(state);
            // (The home stream, synchronized before anything is unmapped, then waits for the
            // streams whose heaps gave their free blocks back parked.)
            self.order_given_back(state);
        }
        state.mapping.mapped_bytes() > keep
    }

    /// For a request that found no device memory to map, with the lock held: whether the
    /// chunks inside free blocks can go back to the device so that it maps its own. Without a
    /// stream runtime they are unmapped here ([`FreeChunks::Unmapped`]; [`FreeChunks::None`]
    /// where there were none). With one, the home stream's queued work may still use freed
    /// blocks and must be waited for first, which must not happen under the lock (work queued
    /// there may call into the pool): [`FreeChunks::AfterWait`], the request's entry point
    /// trims once the lock is released. Nothing is given back while the home stream, which
    /// cannot be waited for then, or the request's `stream` captures a graph (or cannot say):
    /// the request fails instead, and the capture is left as it is.
    #[cold]
    #[inline(never)]
    pub(super) fn unmap_free_for_request(&self, state: &mut State, stream: StreamId) -> FreeChunks {
        if !self.growable || !self.prepare_trim(state, 0) {
            return FreeChunks::None;
        }
        // Every mapped chunk touched by a live (or parked) block: nothing to give back, and no
        // wait for the home stream (the common case of a device full of live memory).
        if !state.mapping.holds_free_chunks(state.tlsf.free_ranges()) {
            return FreeChunks::None;
        }
        let Some(streams) = &self.streams else {
            // SAFETY: without a stream runtime a free says that nothing uses the block any
            // more: code that queued device work on a raw address waits for it before it
            // frees (see `PoolBuilder::streams`), and safe code queues none (device views of
            // slices need the pool's own CUDA runtime).
            return match unsafe { Self::unmap_free(state, 0) } {
                Ok(0) => FreeChunks::None,
                Ok(_) => FreeChunks::Unmapped,
                Err(error) => {
                    logged(|| {
                        log::warn!(
                            target: "devarena::pool",
                            "pool `{}`: giving free chunks back to the device for a request \
                             that found none left failed: {error}",
                            self.name
                        )
                    });
                    // Some may have gone back before the error.
                    FreeChunks::Unmapped
                }
            };
        };
        let capturing = |s: StreamId| {
            self.stream_call("is_capturing", || streams.is_capturing(s))
                .unwrap_or(true)
        };
        if capturing(self.home) || stream != self.home && capturing(stream) {
            return FreeChunks::None;
        }
        FreeChunks::AfterWait
    }

    /// Unmaps the chunks inside the free blocks of the pool's index, down to `keep` bytes
    /// mapped.
    ///
    /// # Safety
    ///
    /// No work queued on a device can still touch a free block of the pool's index: the home
    /// stream was waited for past every free made on it, and blocks freed on other streams are
    /// parked, not free, until their events complete (or there is no stream runtime, and the
    /// frees say that nothing uses a block any more, see `PoolBuilder::streams`).
    pub(super) unsafe fn unmap_free(state: &mut State, keep: usize) -> Result<usize, Error> {
        state.tlsf.flush();
        let State { tlsf, mapping, .. } = state;
        // SAFETY: a free block of the index is no allocation's, so nothing on the host uses
        // it, and the lock (`state`) keeps it from being handed out until this returns; no
        // queued work touches it (this function's contract).
        unsafe { mapping.trim(tlsf.free_ranges(), keep) }
    }

    /// Waits for the home stream ([`synchronize_home`](Self::synchronize_home)) with the lock,
    /// `state`, released, and takes it again with `relock`; frees on the home stream made
    /// meanwhile, and the free blocks home-stream thread heaps give back meanwhile, park
    /// behind an event recorded there ([`State::home_fences`]). Returns the
    /// home stream's epoch when the wait began, and the lock.
    pub(super) fn wait_for_home_fenced<'a>(
        &'a self,
        mut state: LockGuard<'a, State>,
        relock: impl FnOnce() -> Result<LockGuard<'a, State>, Error>,
    ) -> Result<(u64, LockGuard<'a, State>), Error> {
        state.home_fences += 1;
        let epoch = state.home_epoch;
        drop(state);
        let waited = self.synchronize_home();
        // The lock was taken before on this thread, outside any callback of the pool: it is
        // taken again the same way (an error would leave the fence up: frees on the home
        // stream would keep parking, which stream order allows).
        let mut state = relock()?;
        state.home_fences -= 1;
        waited.map(|()| (epoch, state))
    }

    /// Waits for everything queued on the home stream so far, without the lock (nothing to
    /// wait for without a stream runtime: frees are then reusable at once).
    pub(super) fn synchronize_home(&self) -> Result<(), Error> {
        let Some(streams) = &self.streams else {
            return Ok(());
        };
        self.runtime_call("synchronize", || streams.synchronize(self.home))
    }

    /// Waits for the home stream, takes back parked blocks whose events have completed, and
    /// trims to the release threshold; returns the bytes unmapped.
    pub(in crate::pool) fn synchronize(&self) -> Result<usize, Error> {
        self.synchronize_home()?;
        let keep = {
            let mut state = self.lock()?;
            if !state.parked.is_empty() {
                self.reclaim_parked(&mut state);
            }
            state.mapping.release_threshold
        };
        self.trim_to(keep)
    }

    /// Bytes [`synchronize`](Self::synchronize) leaves mapped.
    pub(in crate::pool) fn release_threshold(&self) -> usize {
        self.lock_wait("its release threshold")
            .mapping
            .release_threshold
    }

    pub(in crate::pool) fn set_release_threshold(&self, bytes: usize) {
        self.lock_wait("a new release threshold")
            .mapping
            .release_threshold = bytes;
    }
}

//! Leases: the pool's headroom that heaps hold without asking, taken from the spare or the
//! pool and given back, and the paths that lock every heap to take unused leases back so that
//! a new peak or a refused quota is exact.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

use super::{HeapState, Locked, ThreadHeap, keep};
use crate::pool::counters::{Counters, Lease, Spare};
use crate::pool::engine::{PAUSE, Shared, State};
use crate::pool::lock::LockGuard;

/// Without exact peaks a lease keeps at most `1 / LEASE_KEEP_SHARE` of the capacity for the
/// size of its requests (see [`Shared::lease_keep`]).
const LEASE_KEEP_SHARE: usize = 32;

impl Shared {
    /// With exact peaks and heaps, for an allocation of `reserved` bytes for `client` on the
    /// pool's own index: where the counts leave no headroom for it (the headroom being leased
    /// to the spares), takes some from the spares, with what a heap would keep beyond it, so
    /// that the allocation neither locks every heap nor counts a peak it need not.
    pub(in crate::pool) fn draw_spare(&self, state: &mut State, client: u32, reserved: usize) {
        let counts = &mut state.counts;
        if !counts.admits(reserved) {
            let more = keep(counts.peak, state.heaps.len() + 1);
            if let Some(taken) = self.spare.take(0, reserved, more) {
                counts.unlease(taken);
            }
        }
        let c = &mut state.clients[client as usize];
        if !(c.counts.admits(reserved) && c.counts.allows(reserved, c.quota)) {
            let more = keep(c.counts.peak, c.heaps + 1);
            if let Some(taken) = c.spare.take(0, reserved, more) {
                c.counts.unlease(taken);
            }
        }
    }

    /// Leases `heap` enough of the pool's bytes for `reserved` more. Without exact peaks, a
    /// chunk beyond that, raising the peak where it must. With exact peaks: from the spare
    /// headroom where it holds enough; else from the headroom leased to none; else every
    /// heap's unused lease is taken back first (locking each), so that a new peak is exact.
    /// The heap takes its need and what it keeps; the rest of the headroom goes to the spare,
    /// where the heaps find it without the pool's lock.
    pub(super) fn grant_pool(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        reserved: usize,
    ) {
        let need = h.lease.used + reserved - h.lease.cap;
        if !self.exact_peaks {
            // The peak counts leases: a lease past it raises it.
            let counts = &mut state.counts;
            h.lease.keep = self.lease_keep(h.lease.keep, reserved);
            let extra = h
                .lease
                .keep
                .min(self.capacity.saturating_sub(counts.in_use + need));
            counts.lease(need + extra);
            // Other heaps' leases count in `in_use`: what is in use is never above the
            // capacity.
            counts.peak = counts.peak.max(counts.in_use.min(self.capacity));
            h.lease.cap += need + extra;
            return;
        }
        let heaps = state.heaps.len();
        h.lease.keep = keep(state.counts.peak, heaps);
        if h.lease.refill(&self.spare, h.shard, reserved) {
            return;
        }
        if state.counts.headroom() >= need {
            Self::share_headroom(&mut state.counts, &self.spare, h.shard, &mut h.lease, need);
            return;
        }
        self.with_other_heaps(state, heap, None, |state, others| {
            for o in others.iter_mut() {
                state.counts.unlease(o.lease.slack());
                o.lease.cap = o.lease.used;
            }
            state.counts.unlease(h.lease.slack());
            h.lease.cap = h.lease.used;
            state.counts.unlease(self.spare.drain());
            // Every lease is what its heap uses now and the spare is empty: `in_use` is what
            // is in use, and a new peak is exact.
            let counts = &mut state.counts;
            counts.peak = counts.peak.max(counts.in_use + reserved);
            h.lease.keep = keep(counts.peak, heaps);
            Self::share_headroom(counts, &self.spare, h.shard, &mut h.lease, reserved);
        });
    }

    /// With exact peaks: leases all the headroom below `counts`' peak (at least `need`):
    /// `need` and what `lease` keeps to the heap, the rest to `spare`, spread over its shards
    /// (`shard`, the heap's, gets what does not divide).
    pub(super) fn share_headroom(
        counts: &mut Counters,
        spare: &Spare,
        shard: usize,
        lease: &mut Lease,
        need: usize,
    ) {
        let headroom = counts.headroom();
        let grant = need + lease.keep.min(headroom - need);
        counts.lease(headroom);
        lease.cap += grant;
        spare.spread(shard, headroom - grant);
    }

    /// Without exact peaks: the headroom a lease that kept `keep` keeps after a request of
    /// `reserved` bytes made it ask the pool, and takes beyond its need: a chunk (1/256 of the
    /// capacity), or twice the largest such request up to 1/32 of the capacity, whichever is
    /// more (it never shrinks). A heap gives back what it holds beyond three times that:
    /// with requests as large as a chunk, a lease that kept one chunk in a band of two swung
    /// out of it every few dozen requests, each time a visit to the pool's lock.
    pub(super) fn lease_keep(&self, keep: usize, reserved: usize) -> usize {
        let largest = reserved
            .saturating_mul(2)
            .min(self.capacity / LEASE_KEEP_SHARE);
        keep.max(self.lease_chunk).max(largest)
    }

    /// As [`grant_pool`](Self::grant_pool) for a client's lease; `false` (nothing changed but
    /// unused leases) when `reserved` more bytes would pass the client's quota.
    pub(super) fn grant_client(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        client: u32,
        reserved: usize,
    ) -> bool {
        let c = client as usize;
        if h.clients[c].spare.is_none() {
            // Listed as holding the client's leases (only such heaps are locked to take them
            // back), with its spare headroom at hand.
            if let Some(entry) = state.entry(heap) {
                entry.clients.push(client);
                state.clients[c].heaps += 1;
                h.clients[c].spare = Some(state.clients[c].spare.clone());
            }
        }
        let share = &mut h.clients[c];
        let need = share.lease.used + reserved - share.lease.cap;
        if !self.exact_peaks {
            // What the lease keeps, whichever way it is granted below.
            share.lease.keep = self.lease_keep(share.lease.keep, reserved);
        }
        // The heaps that hold a lease of this client share its headroom.
        let heaps = state.clients[c].heaps;
        let quota = state.clients[c].quota;
        let counts = &mut state.clients[c].counts;
        if !self.exact_peaks && counts.in_use + need <= quota {
            // As for the pool: the client's peak counts its leases (never past its quota).
            let grant = need + share.lease.keep.min(quota - counts.in_use - need);
            counts.lease(grant);
            counts.peak = counts.peak.max(counts.in_use);
            share.lease.cap += grant;
            return true;
        }
        if self.exact_peaks {
            share.lease.keep = keep(counts.peak, heaps);
            if let Some(spare) = &share.spare {
                if share.lease.refill(spare, h.shard, reserved) {
                    return true;
                }
            }
        }
        if counts.headroom() >= need {
            match (&share.spare, self.exact_peaks) {
                (Some(spare), true) => {
                    Self::share_headroom(counts, spare, h.shard, &mut share.lease, need);
                }
                _ => {
                    let extra = (counts.headroom() - need) / heaps.max(1);
                    share.lease.cap += need + extra;
                    counts.lease(need + extra);
                }
            }
            return true;
        }
        self.with_other_heaps(state, heap, Some(client), |state, others| {
            let client = &mut state.clients[c];
            let counts = &mut client.counts;
            for o in others.iter_mut() {
                if let Some(share) = o.clients.get_mut(c) {
                    counts.unlease(share.lease.slack());
                    share.lease.cap = share.lease.used;
                }
            }
            let share = &mut h.clients[c];
            counts.unlease(share.lease.slack());
            share.lease.cap = share.lease.used;
            counts.unlease(client.spare.drain());
            let total = counts.in_use + reserved;
            if total > client.quota {
                return false;
            }
            counts.peak = counts.peak.max(total);
            match (&share.spare, self.exact_peaks) {
                (Some(spare), true) => {
                    share.lease.keep = keep(counts.peak, heaps);
                    Self::share_headroom(counts, spare, h.shard, &mut share.lease, reserved);
                }
                _ => {
                    let extra = (counts.headroom() - reserved) / heaps.max(1);
                    share.lease.cap += reserved + extra;
                    counts.lease(reserved + extra);
                }
            }
            true
        })
    }

    /// Runs `f` with every heap but `own` locked (with `client`: every heap that may hold a
    /// lease of that client).
    pub(super) fn with_other_heaps<R>(
        &self,
        state: &mut State,
        own: &Arc<ThreadHeap>,
        client: Option<u32>,
        f: impl FnOnce(&mut State, &mut [LockGuard<'_, HeapState>]) -> R,
    ) -> R {
        let others: Vec<Arc<ThreadHeap>> = state
            .heaps
            .iter()
            .filter(|e| !Arc::ptr_eq(&e.heap, own))
            .filter(|e| client.is_none_or(|c| e.clients.contains(&c)))
            .map(|e| e.heap.clone())
            .collect();
        let mut guards = self.lock_heaps(&others);
        f(state, &mut guards)
    }

    /// Locks every heap of `heaps` (the caller holds the pool's lock and none of theirs),
    /// with [`PAUSE`] set meanwhile: their owners let go of their locks and wait at the pool's.
    pub(in crate::pool) fn lock_heaps<'h>(
        &self,
        heaps: &'h [Arc<ThreadHeap>],
    ) -> Vec<LockGuard<'h, HeapState>> {
        /// Clears `PAUSE` when the locks are taken (or if taking them unwinds).
        struct Paused<'a>(&'a Shared);
        impl Drop for Paused<'_> {
            fn drop(&mut self) {
                self.0.flags.fetch_and(!PAUSE, Ordering::Relaxed);
            }
        }
        if heaps.is_empty() {
            return Vec::new();
        }
        self.flags.fetch_or(PAUSE, Ordering::Relaxed);
        let _paused = Paused(self);
        heaps.iter().map(|h| h.state.lock_wait()).collect()
    }

    /// Runs `f` with every heap locked (the caller holds none of their locks).
    pub(in crate::pool) fn with_heaps<R>(
        &self,
        state: &mut State,
        f: impl FnOnce(&mut State, &mut [Locked<'_>]) -> R,
    ) -> R {
        let heaps: Vec<Arc<ThreadHeap>> = state.heaps.iter().map(|e| e.heap.clone()).collect();
        let mut locked: Vec<Locked<'_>> = self
            .lock_heaps(&heaps)
            .into_iter()
            .map(|state| Locked { state })
            .collect();
        f(state, &mut locked)
    }

    /// Takes back every heap's unused leases and the spare headroom, of the pool and of
    /// `client`, so that `in_use` is what is in use (for as long as the heaps stay locked).
    pub(in crate::pool) fn revoke(&self, state: &mut State, heaps: &mut [Locked<'_>], client: u32) {
        let c = client as usize;
        state.counts.unlease(self.spare.drain());
        let spare = state.clients[c].spare.drain();
        state.clients[c].counts.unlease(spare);
        for h in heaps.iter_mut() {
            let h = &mut *h.state;
            state.counts.unlease(h.lease.slack());
            h.lease.cap = h.lease.used;
            if let Some(share) = h.clients.get_mut(c) {
                state.clients[c].counts.unlease(share.lease.slack());
                share.lease.cap = share.lease.used;
            }
        }
    }
}

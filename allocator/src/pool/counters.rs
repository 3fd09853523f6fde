//! The counters a pool keeps for itself and for each client, updated in one place.

#[cfg(not(all(loom, test)))]
use core::sync::atomic::AtomicUsize;
use core::sync::atomic::Ordering;
// The model check of the spare's hand-off (`RUSTFLAGS="--cfg loom"`, see `loom_tests`).
#[cfg(all(loom, test))]
use loom::sync::atomic::AtomicUsize;

/// Bytes and counts of allocations: the pool keeps one for all its clients and one per client,
/// and every allocation and free updates both through [`on_alloc`](Counters::on_alloc) and
/// [`on_free`](Counters::on_free).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counters {
    /// Bytes held by live allocations counted here, each rounded up to its size class, and
    /// the bytes leased to thread heaps (`leased` of them): with leases out, a bound that
    /// their unused part makes conservative (the quota check) and the exact figure once they
    /// are taken back.
    pub(super) in_use: usize,
    /// Bytes the live allocations asked for.
    pub(super) requested: usize,
    /// The most `in_use` has ever been.
    pub(super) peak: usize,
    /// Successful allocations so far.
    pub(super) allocations: u64,
    /// Frees so far.
    pub(super) frees: u64,
    /// Failed allocations so far.
    pub(super) failures: u64,
    /// Bytes leased to thread heaps (counted in `in_use`): what their live allocations hold
    /// plus the headroom they may still use without asking. `in_use` never passes `peak`, so
    /// that a thread heap allocates within its lease without changing the peak, and the peak
    /// stays exact.
    pub(super) leased: usize,
}

impl Counters {
    /// An allocation of `requested` bytes that holds `reserved` bytes.
    #[inline(always)]
    pub(super) fn on_alloc(&mut self, reserved: usize, requested: usize) {
        self.on_alloc_bytes(reserved);
        self.requested += requested;
        self.allocations += 1;
    }

    /// The bytes of an allocation only: the pool's own counters, whose other counts are its
    /// clients' added up.
    #[inline(always)]
    pub(super) fn on_alloc_bytes(&mut self, reserved: usize) {
        self.in_use += reserved;
        self.peak = self.peak.max(self.in_use);
    }

    /// Whether an allocation of `reserved` bytes keeps the peak exact as
    /// [`on_alloc`](Self::on_alloc) counts it: no lease, or no new peak. Otherwise the leases'
    /// headroom must be taken back first (it would count as in use).
    #[inline(always)]
    pub(super) fn admits(&self, reserved: usize) -> bool {
        self.leased == 0 || self.in_use + reserved <= self.peak
    }

    /// Headroom below the peak that no lease holds. (With exact peaks `in_use ≤ peak` always;
    /// without them leases may take `in_use` past a peak held at the capacity, where there is
    /// no headroom.)
    pub(super) fn headroom(&self) -> usize {
        self.peak.saturating_sub(self.in_use)
    }

    /// Leases `bytes` more to a thread heap.
    pub(super) fn lease(&mut self, bytes: usize) {
        self.leased += bytes;
        self.in_use += bytes;
    }

    /// Takes `bytes` of leases back.
    pub(super) fn unlease(&mut self, bytes: usize) {
        self.leased -= bytes;
        self.in_use -= bytes;
    }

    /// The free of an allocation counted by [`on_alloc`](Self::on_alloc) with the same numbers.
    #[inline(always)]
    pub(super) fn on_free(&mut self, reserved: usize, requested: usize) {
        self.in_use -= reserved;
        self.requested -= requested;
        self.frees += 1;
    }

    /// As [`on_alloc_bytes`](Self::on_alloc_bytes), for a free.
    #[inline(always)]
    pub(super) fn on_free_bytes(&mut self, reserved: usize) {
        self.in_use -= reserved;
    }

    /// A failed allocation.
    pub(super) fn on_failure(&mut self) {
        self.failures += 1;
    }

    /// Live allocations (every allocation is freed at most once).
    pub(super) fn live(&self) -> u64 {
        self.allocations - self.frees
    }

    /// Whether `reserved` more bytes stay within `limit` (a quota or the capacity), the
    /// leases counted as in use (exact once they are taken back): the one check every
    /// allocation path makes.
    #[inline(always)]
    pub(super) fn allows(&self, reserved: usize, limit: usize) -> bool {
        // No overflow: both are at most the capacity.
        self.in_use + reserved <= limit
    }
}

/// A thread heap's share of the pool's (or a client's) bytes: it may hold up to `cap` bytes
/// in live allocations without asking the pool, and holds `used`. The pool counts `cap` in
/// [`Counters::leased`].
///
/// With exact peaks a heap takes headroom from a [`Spare`] when its lease runs short, `keep`
/// bytes beyond its need, and gives back what it holds beyond [`GIVE_BACK`] times `keep`;
/// without, it takes and gives back through the pool's lock, by the same rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Lease {
    pub(super) cap: usize,
    pub(super) used: usize,
    /// The headroom the heap keeps (set by the pool whenever the heap asks it).
    pub(super) keep: usize,
}

/// A heap holding more than `GIVE_BACK` times its `keep` unused gives back all but `keep`.
pub(super) const GIVE_BACK: usize = 3;

impl Lease {
    /// Whether `reserved` more bytes fit in the lease.
    #[inline(always)]
    pub(super) fn fits(&self, reserved: usize) -> bool {
        self.used + reserved <= self.cap
    }

    /// Headroom the lease holds and does not use.
    pub(super) fn slack(&self) -> usize {
        self.cap - self.used
    }

    /// Whether the lease holds more unused headroom than it should keep.
    #[inline(always)]
    pub(super) fn hoards(&self) -> bool {
        self.cap - self.used > GIVE_BACK * self.keep
    }

    /// Takes what `reserved` more bytes need from `spare` (shard `shard` first), and `keep`
    /// more if there is; whether it fits now.
    pub(super) fn refill(&mut self, spare: &Spare, shard: usize, reserved: usize) -> bool {
        let need = self.used + reserved - self.cap;
        match spare.take(shard, need, self.keep) {
            Some(taken) => {
                self.cap += taken;
                true
            }
            None => false,
        }
    }

    /// Gives what it holds beyond `keep` unused back to shard `shard` of `spare`.
    pub(super) fn give_back(&mut self, spare: &Spare, shard: usize) {
        let back = self.slack().saturating_sub(self.keep);
        self.cap -= back;
        spare.give(shard, back);
    }
}

/// How many shards a [`Spare`] has: heaps take from and give back to their own first, so that
/// heaps on different cores rarely touch the same cache line. (Fewer under loom, whose model
/// checks every interleaving of every atomic access.)
#[cfg(not(all(loom, test)))]
pub(super) const SPARE_SHARDS: usize = 8;
#[cfg(all(loom, test))]
pub(super) const SPARE_SHARDS: usize = 2;

/// One shard of a [`Spare`], alone on its cache lines (Intel fetches lines in pairs).
#[repr(align(128))]
#[derive(Debug, Default)]
struct Shard(AtomicUsize);

impl Shard {
    /// Takes `need` bytes and up to `more` beyond them, as many as there are: the bytes
    /// taken, or `None` (nothing taken) when there are fewer than `need`.
    fn take(&self, need: usize, more: usize) -> Option<usize> {
        // Relaxed: the value is a count that publishes nothing; its readers that need it
        // exact hold every lock of those who change it.
        let mut there = self.0.load(Ordering::Relaxed);
        loop {
            if there < need {
                return None;
            }
            let take = need + more.min(there - need);
            match self.0.compare_exchange_weak(
                there,
                there - take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(take),
                Err(now) => there = now,
            }
        }
    }
}

/// Headroom leased to no heap in particular: bytes below a peak (and a quota) that the pool
/// counts as leased ([`Counters::leased`]) and that thread heaps take from and give back to
/// without the pool's lock, so that a heap short of lease rarely needs the lock. Only the
/// pool, with every heap that may touch it locked, drains it back into its counts.
///
/// In [`SPARE_SHARDS`] shards: each heap gives to its own shard and takes from it first, then
/// from the others. With one counter for all, every few dozen pairs a heap's compare-and-swap
/// fetched the line from the core of the heap that touched it last; on the H200 host eight
/// threads sharing a pool paid about 20% more a pair with exact peaks (this spare) than with
/// peaks that count leases (no spare).
#[derive(Debug, Default)]
pub(super) struct Spare([Shard; SPARE_SHARDS]);

impl Spare {
    /// Takes `need` bytes and up to `more` beyond them, as many as there are, from shard
    /// `shard` first, then from the others: the bytes taken, or `None` (nothing taken) when
    /// the shards hold fewer than `need` together (or seemed to, while others took).
    pub(super) fn take(&self, shard: usize, need: usize, more: usize) -> Option<usize> {
        let at = |i: usize| &self.0[(shard + i) % SPARE_SHARDS];
        // One shard with enough: its own first.
        for i in 0..SPARE_SHARDS {
            if let Some(taken) = at(i).take(need, more) {
                return Some(taken);
            }
        }
        // Enough only together: gathered, shard by shard, `more` too where there is (a heap
        // that got only its need would gather again at its next shortfall); given back to its
        // own shard when even that falls short.
        let want = need.saturating_add(more);
        let mut got = 0;
        for i in 0..SPARE_SHARDS {
            let there = at(i).0.load(Ordering::Relaxed);
            if there > 0 {
                got += at(i).take(1, (want - got).min(there) - 1).unwrap_or(0);
            }
            if got >= want {
                break;
            }
        }
        if got >= need {
            return Some(got);
        }
        self.give(shard, got);
        None
    }

    /// Puts `bytes` back into shard `shard`.
    pub(super) fn give(&self, shard: usize, bytes: usize) {
        if bytes > 0 {
            self.0[shard % SPARE_SHARDS]
                .0
                .fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Puts `bytes` back spread evenly over the shards, what does not divide into `shard`.
    pub(super) fn spread(&self, shard: usize, bytes: usize) {
        let each = bytes / SPARE_SHARDS;
        for s in 0..SPARE_SHARDS {
            self.give(s, each);
        }
        self.give(shard, bytes % SPARE_SHARDS);
    }

    /// Takes everything (the caller holds every lock of those who change it).
    pub(super) fn drain(&self) -> usize {
        self.0.iter().map(|s| s.0.swap(0, Ordering::Relaxed)).sum()
    }

    /// Bytes there now (tests).
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use std::sync::Mutex;

    #[test]
    fn a_spare_loses_no_byte_while_leases_take_and_give_at_once() {
        // Four leases, each behind a lock of its own as a heap's is, take from one spare and
        // give back to it at random; a fifth thread locks them all now and then and checks
        // that the bytes add up (no update lost or counted twice by the compare-and-swap
        // loop), draining the spare and putting it back as the pool does.
        const TOTAL: usize = 1 << 30;
        let spare = Spare::default();
        spare.give(0, TOTAL);
        let leases: Vec<Mutex<Lease>> = (0..4)
            .map(|_| {
                Mutex::new(Lease {
                    keep: 1 << 20,
                    ..Lease::default()
                })
            })
            .collect();
        let running = AtomicUsize::new(4);
        std::thread::scope(|s| {
            for (t, lease) in leases.iter().enumerate() {
                let (spare, running) = (&spare, &running);
                s.spawn(move || {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                    for _ in 0..crate::test_iterations(100_000) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let mut l = lease.lock().unwrap();
                        let bytes = (x % (4 << 20)) as usize;
                        if x % 2 == 0 {
                            if l.fits(bytes) || l.refill(spare, t, bytes) {
                                l.used += bytes;
                            }
                        } else {
                            l.used -= bytes.min(l.used);
                            if l.hoards() {
                                l.give_back(spare, t);
                            }
                        }
                        assert!(l.used <= l.cap);
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                });
            }
            let mut checks = 0;
            while running.load(Ordering::SeqCst) > 0 || checks == 0 {
                let mut locked: Vec<_> = leases.iter().map(|l| l.lock().unwrap()).collect();
                let caps: usize = locked.iter().map(|l| l.cap).sum();
                let drained = spare.drain();
                assert_eq!(caps + drained, TOTAL);
                spare.give(0, drained);
                // Now and then the pool takes every unused byte back, as a take-back does.
                if checks % 7 == 0 {
                    for l in locked.iter_mut() {
                        let slack = l.slack();
                        l.cap -= slack;
                        spare.give(1, slack);
                    }
                }
                drop(locked);
                checks += 1;
                std::thread::yield_now();
            }
        });
        let caps: usize = leases.iter().map(|l| l.lock().unwrap().cap).sum();
        assert_eq!(caps + spare.bytes(), TOTAL);
    }

    #[test]
    fn a_spare_takes_from_its_own_shard_first_then_from_the_others_then_from_several() {
        let spare = Spare::default();
        spare.give(2, 5);
        spare.give(5, 4);
        // Shard 1 has nothing: the next shard with enough, with what `more` asks beyond.
        assert_eq!(spare.take(1, 4, 1), Some(5));
        assert_eq!(spare.bytes(), 4);
        spare.give(1, 3);
        // Its own shard first.
        assert_eq!(spare.take(1, 2, 0), Some(2));
        assert_eq!(spare.take(1, 1, 10), Some(1));
        // No shard with enough alone: gathered from several, with `more` where there is.
        spare.give(0, 3);
        spare.give(7, 2);
        assert_eq!(spare.bytes(), 9);
        assert_eq!(spare.take(3, 8, 100), Some(9));
        assert_eq!(spare.bytes(), 0);
        // Gathering stops at the need and `more`: shards 5 and 7 (from shard 2 on) give 3 + 2.
        spare.give(0, 3);
        spare.give(5, 3);
        spare.give(7, 3);
        assert_eq!(spare.take(2, 4, 1), Some(5));
        assert_eq!(spare.bytes(), 4);
        // Not enough together: nothing taken, and the bytes it gathered are still there.
        spare.give(6, 1);
        assert_eq!(spare.take(4, 6, 0), None);
        assert_eq!(spare.bytes(), 5);
        assert_eq!(spare.drain(), 5);
        assert_eq!(spare.bytes(), 0);
    }
}

/// Model checks of the spare's hand-off under every interleaving loom explores (run with
/// `RUSTFLAGS="--cfg loom" cargo test -p devarena --lib loom --release`): heaps take from and
/// give back to one spare without a lock between them, and no byte is lost or made.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use alloc::vec::Vec;
    use loom::sync::{Arc, Mutex};

    /// Two heaps' leases, empty, each keeping 1 byte, each behind a lock of its own as a
    /// heap's is.
    fn two_leases() -> Arc<Vec<Mutex<Lease>>> {
        Arc::new(
            (0..2)
                .map(|_| {
                    Mutex::new(Lease {
                        keep: 1,
                        ..Lease::default()
                    })
                })
                .collect(),
        )
    }

    /// The pool's drain: every lease locked (in order), the spare drained and given back to
    /// shard 0. The bytes the leases and the spare held together at that moment.
    fn drain_with_leases_locked(spare: &Spare, leases: &[Mutex<Lease>]) -> usize {
        let locked: Vec<_> = leases.iter().map(|l| l.lock().unwrap()).collect();
        let leased: usize = locked.iter().map(|l| l.cap).sum();
        let drained = spare.drain();
        spare.give(0, drained);
        leased + drained
    }

    /// Two heaps, each a lease behind a lock of its own as a heap's is, refill from the spare
    /// (the compare-and-swap loop, racing each other) and give back what they hoard; the pool,
    /// holding every lease's lock, drains the spare meanwhile and puts it back, as it does
    /// before it counts a peak. After joining, leases and spare hold exactly the bytes there
    /// were.
    #[test]
    fn loom_leases_and_the_spare_lose_no_byte() {
        loom::model(|| {
            const TOTAL: usize = 12;
            let spare = Arc::new(Spare::default());
            spare.give(0, TOTAL);
            let leases = two_leases();
            let heaps: Vec<_> = (0..2)
                .map(|h| {
                    let (spare, leases) = (spare.clone(), leases.clone());
                    loom::thread::spawn(move || {
                        let mut lease = leases[h].lock().unwrap();
                        let reserved = 3 + h;
                        if !lease.fits(reserved) && lease.refill(&spare, h, reserved) {
                            assert!(lease.fits(reserved));
                            lease.used += reserved;
                        }
                        drop(lease);
                        let mut lease = leases[h].lock().unwrap();
                        lease.used = 0;
                        if lease.hoards() {
                            lease.give_back(&spare, h);
                        }
                    })
                })
                .collect();
            // The pool: every lease locked (in order), the spare drained and given back.
            let held = drain_with_leases_locked(&spare, &leases);
            assert!(held <= TOTAL);
            assert_eq!(held, TOTAL, "a byte went missing with the leases locked");
            for heap in heaps {
                heap.join().unwrap();
            }
            let leased: usize = leases.iter().map(|l| l.lock().unwrap().cap).sum();
            assert_eq!(leased + spare.drain(), TOTAL);
        });
    }

    /// The spare split over both shards so that no shard alone holds what heap 0 needs: it
    /// gathers from both (or fails and gives back what it gathered) while heap 1 takes from
    /// its own shard and the pool, under its lock but without the heaps', draws from the spare
    /// as `draw_spare` does, then drains it with every lease locked. A request that fails
    /// takes nothing; no byte is lost or made; and once they are done the bytes left are
    /// found again whole, whichever shard the failed gathering gave them back to.
    #[test]
    fn loom_gathering_from_several_shards_loses_no_byte() {
        loom::model(|| {
            const TOTAL: usize = 6;
            let spare = Arc::new(Spare::default());
            spare.give(0, 3);
            spare.give(1, 3);
            let leases = two_leases();
            let heaps: Vec<_> = [4, 2]
                .into_iter()
                .enumerate()
                .map(|(h, reserved)| {
                    let (spare, leases) = (spare.clone(), leases.clone());
                    loom::thread::spawn(move || {
                        let mut lease = leases[h].lock().unwrap();
                        if lease.refill(&spare, h, reserved) {
                            assert!(lease.fits(reserved));
                        } else {
                            assert_eq!(lease.cap, 0, "a failed refill took bytes");
                        }
                    })
                })
                .collect();
            // The pool's draw, without the heaps' locks.
            let drawn = spare.take(0, 1, 0).unwrap_or(0);
            let held = drain_with_leases_locked(&spare, &leases);
            assert_eq!(
                held + drawn,
                TOTAL,
                "a byte went missing with the leases locked"
            );
            for heap in heaps {
                heap.join().unwrap();
            }
            let leased: usize = leases.iter().map(|l| l.lock().unwrap().cap).sum();
            let left = TOTAL - leased - drawn;
            assert_eq!(spare.bytes(), left);
            // Nothing stranded: a request for all that is left, from either shard, gets it.
            if left > 0 {
                assert_eq!(spare.take(1, left, 0), Some(left));
            }
        });
    }
}

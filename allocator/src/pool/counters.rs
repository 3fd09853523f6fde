//! The counters a pool keeps for itself and for each client, updated in one place.

/// Bytes and counts of allocations: the pool keeps one for all its clients and one per client,
/// and every allocation and free updates both through [`on_alloc`](Counters::on_alloc) and
/// [`on_free`](Counters::on_free).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counters {
    /// Bytes held by live allocations, each rounded up to its size class.
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
}

impl Counters {
    /// An allocation of `requested` bytes that holds `reserved` bytes.
    #[inline(always)]
    pub(super) fn on_alloc(&mut self, reserved: usize, requested: usize) {
        self.in_use += reserved;
        self.requested += requested;
        self.peak = self.peak.max(self.in_use);
        self.allocations += 1;
    }

    /// The free of an allocation counted by [`on_alloc`](Self::on_alloc) with the same numbers.
    #[inline(always)]
    pub(super) fn on_free(&mut self, reserved: usize, requested: usize) {
        self.in_use -= reserved;
        self.requested -= requested;
        self.frees += 1;
    }

    /// A failed allocation.
    pub(super) fn on_failure(&mut self) {
        self.failures += 1;
    }

    /// Live allocations (every allocation is freed at most once).
    pub(super) fn live(&self) -> u64 {
        self.allocations - self.frees
    }

    /// Whether `reserved` more bytes stay within `limit` (a quota or the capacity): the one
    /// check both allocation paths make.
    #[inline(always)]
    pub(super) fn allows(&self, reserved: usize, limit: usize) -> bool {
        reserved <= limit.saturating_sub(self.in_use)
    }
}

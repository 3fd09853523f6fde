//! Sorting in `const fn`: a heap sort of indices by up to three keys, ties broken by the index, so
//! every order is a strict total order and the same on every run. O(n log n) comparisons and
//! no recursion (the compiler's evaluator has a shallow stack).

/// Up to three sort keys, each indexed by the values being sorted.
#[derive(Clone, Copy)]
pub(super) struct Keys<'a> {
    k1: &'a [usize],
    k2: &'a [usize],
    k3: &'a [usize],
}

impl<'a> Keys<'a> {
    /// Keys `k1`, then `k2`, then `k3`.
    pub(super) const fn three(k1: &'a [usize], k2: &'a [usize], k3: &'a [usize]) -> Self {
        Keys { k1, k2, k3 }
    }

    /// Whether index `a` goes before index `b`: `(k1, k2, k3, index)` in increasing order.
    const fn less(&self, a: usize, b: usize) -> bool {
        if self.k1[a] != self.k1[b] {
            return self.k1[a] < self.k1[b];
        }
        if self.k2[a] != self.k2[b] {
            return self.k2[a] < self.k2[b];
        }
        if self.k3[a] != self.k3[b] {
            return self.k3[a] < self.k3[b];
        }
        a < b
    }
}

/// Moves `order[root]` down the max-heap `order[..end]`.
const fn sift_down(order: &mut [usize], keys: Keys<'_>, mut root: usize, end: usize) {
    loop {
        let mut child = 2 * root + 1;
        if child >= end {
            return;
        }
        if child + 1 < end && keys.less(order[child], order[child + 1]) {
            child += 1;
        }
        if !keys.less(order[root], order[child]) {
            return;
        }
        let t = order[root];
        order[root] = order[child];
        order[child] = t;
        root = child;
    }
}

/// Sorts the indices in `order` by `(k1[i], k2[i], i)`, increasing. `k1` and `k2` are indexed
/// by the values in `order`.
pub(super) const fn sort_by_keys(order: &mut [usize], k1: &[usize], k2: &[usize]) {
    sort(order, Keys::three(k1, k2, k2));
}

/// Sorts the indices in `order` by `keys`, then by index, increasing.
pub(super) const fn sort(order: &mut [usize], keys: Keys<'_>) {
    let n = order.len();
    if n < 2 {
        return;
    }
    let mut i = n / 2;
    while i > 0 {
        i -= 1;
        sift_down(order, keys, i, n);
    }
    let mut end = n;
    while end > 1 {
        end -= 1;
        let t = order[0];
        order[0] = order[end];
        order[end] = t;
        sift_down(order, keys, 0, end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_by_both_keys_then_index() {
        let k1 = [3, 1, 3, 0, 1, 3];
        let k2 = [5, 9, 5, 7, 2, 4];
        let mut order = [0, 1, 2, 3, 4, 5];
        sort_by_keys(&mut order, &k1, &k2);
        assert_eq!(order, [3, 4, 1, 5, 0, 2]);
        let mut order = [5, 4, 3, 2, 1, 0];
        sort_by_keys(&mut order, &k1, &k2);
        assert_eq!(order, [3, 4, 1, 5, 0, 2]);
    }

    #[test]
    fn sorts_a_subset() {
        let k1 = [9, 8, 7, 6, 5];
        let mut order = [4, 0, 2];
        sort_by_keys(&mut order, &k1, &k1);
        assert_eq!(order, [4, 2, 0]);
        let mut none: [usize; 0] = [];
        sort_by_keys(&mut none, &k1, &k1);
    }
}

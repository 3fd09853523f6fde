//! The pool's lock: one compare-and-swap to take it, one plain store to release it.
//!
//! `std::sync::Mutex` releases with an atomic swap (it must learn whether to wake a sleeper),
//! so an uncontended lock/unlock costs two read-modify-write instructions; an alloc+free pair
//! takes the lock twice, and those four instructions alone exceeded the pool's budget of 50 ns
//! per pair on the development machine. This lock releases with a `Release` store and waits by
//! spinning briefly, then yielding the thread: the pool's critical sections are a few dozen
//! nanoseconds, and a holder preempted on an oversubscribed machine gets the CPU back through
//! the waiters' yields.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

/// Spins this many times before yielding.
const SPINS: u32 = 64;

/// A spin-then-yield lock around `T`.
pub(crate) struct Lock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `T` to one thread at a time, so `T: Send` suffices for
// sharing the lock between threads, as for `std::sync::Mutex`.
unsafe impl<T: Send> Sync for Lock<T> {}
// SAFETY: moving the lock moves the `T`.
unsafe impl<T: Send> Send for Lock<T> {}

impl<T> Lock<T> {
    pub(crate) fn new(value: T) -> Self {
        Lock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> LockGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        LockGuard { lock: self }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0;
        loop {
            // Wait on a plain load (no cache-line ping-pong), then try again.
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS {
                    spins += 1;
                    core::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

/// Access to the locked value; releases the lock on drop (also during unwinding).
pub(crate) struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
}

impl<T> Deref for LockGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock, so no other
        // reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for LockGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for LockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::sync::Arc;
    use alloc::vec::Vec;

    #[test]
    fn excludes_across_threads() {
        // A non-atomic read-modify-write under the lock: lost updates would show in the sum.
        let lock = Arc::new(Lock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = lock.lock();
                        let (a, b) = *g;
                        *g = (a + 1, b + 2);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), (80_000, 160_000));
    }
}

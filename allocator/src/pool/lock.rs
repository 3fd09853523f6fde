//! The pool's lock: one compare-and-swap to take it, one plain store to release it; waiters
//! back off exponentially, then yield.
//!
//! Uncontended cost decides the pool's speed: an alloc+free pair takes the lock twice.
//! `std::sync::Mutex` (and any lock that parks waiters on a futex) must learn at release
//! whether to wake a sleeper, so it releases with an atomic swap or compare-and-swap: on the
//! development machine a lock+unlock costs about 17 ns that way against 11 ns with a plain
//! store, 13 ns more per pair.
//!
//! Under contention what matters is how often the pool's state moves between cores. A waiter
//! that polls the lock word often and retries as soon as it is released steals the lock (and
//! with it every cache line of the state) from the thread that has just released it and would
//! otherwise take it again while its caches are hot. Waiters here back off exponentially
//! (1, 2, 4, … up to [`BACKOFF_LIMIT`] spin-loop hints between looks), so the running thread
//! mostly keeps the lock for a run of operations; past the limit they yield the CPU, which
//! lets a preempted holder run on an oversubscribed machine. Two threads on two vCPUs went
//! from 2.8 to 5.5 – 6.6 million pairs per second (one thread: 9.5) with this; parking the
//! waiters instead (a condition variable, woken on release) did no better there, was worse
//! with more threads than CPUs, and put a system call on the releasing thread's path.

use alloc::boxed::Box;
use alloc::string::String;
use core::cell::{Cell, UnsafeCell};
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

std::thread_local! {
    /// The innermost user callback this thread is running under a lock (null when none): the
    /// head of a list of [`CallbackFrame`]s, one for each callback on the thread's stack, which
    /// names every lock taking again here could only wait for ever on. (All of them, not only
    /// the innermost: pool A's callback may call pool B, whose callback calls pool A.) No
    /// destructor, so that it can be read while the thread's other thread-locals are destroyed.
    static IN_CALLBACK: Cell<*const CallbackFrame> = const { Cell::new(core::ptr::null()) };
}

/// One callback running on this thread: the lock it runs under, and the callback it runs
/// inside (null: none). Lives on the stack of [`LockId::callback`] while the callback runs.
struct CallbackFrame {
    lock: LockId,
    outer: *const CallbackFrame,
}

/// The calling thread already holds this lock, further up its stack, in a user callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reentrant;

/// A lock's identity: a number no other lock of the process ever has (see [`Lock::id`]).
///
/// Not the lock's address: an identity outlives its lock where a destructor that runs as a
/// callback of the lock is kept past it (an event a thread heap holds after its pool is
/// gone), and a new lock at the same address would then find itself in that callback: a
/// call into it from there would fail with [`Reentrant`] for nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockId(u64);

/// The next lock's [`LockId`]. (At a billion locks a second, 584 years to wrap.)
static NEXT_LOCK_ID: AtomicU64 = AtomicU64::new(0);

impl LockId {
    /// Every lock at once: a frame of it (see [`logged`]) makes this thread's wait for any lock
    /// fail, as inside a callback of that lock. (No lock has this number.)
    pub(crate) const ANY: LockId = LockId(u64::MAX);

    /// A number for a new lock.
    fn fresh() -> LockId {
        LockId(NEXT_LOCK_ID.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether this thread is running a user callback under the lock, at any depth.
    fn in_callback(self) -> bool {
        let mut frame = IN_CALLBACK.with(Cell::get);
        while !frame.is_null() {
            // SAFETY: every frame on the list is a local of a `LockId::callback` call of this
            // thread that has not returned: `callback` puts its frame at the head only for the
            // time it runs the callback and puts the head it found back when the callback
            // returns or unwinds (`Restore`), before the frame goes; calls nest, so the frames
            // that list reaches are those of the calls further up the stack, each still
            // running.
            let f = unsafe { &*frame };
            if f.lock == self || f.lock == LockId::ANY {
                return true;
            }
            frame = f.outer;
        }
        false
    }

    /// Runs `f`, a user callback made while this thread holds the lock or made where it
    /// might (a destructor of something the lock's value owns), so that a call back into the
    /// lock from `f` fails with [`Reentrant`] instead of waiting for ever.
    pub(crate) fn callback<R>(self, f: impl FnOnce() -> R) -> R {
        /// Puts back the outer callback's frame, also when `f` unwinds.
        struct Restore(*const CallbackFrame);
        impl Drop for Restore {
            fn drop(&mut self) {
                IN_CALLBACK.with(|c| c.set(self.0));
            }
        }
        let frame = CallbackFrame {
            lock: self,
            outer: IN_CALLBACK.with(Cell::get),
        };
        // Declared after `frame`, so dropped before it: the list never names a frame that is
        // gone.
        let _restore = Restore(frame.outer);
        IN_CALLBACK.with(|c| c.set(&frame));
        f()
    }
}

/// Runs `log`, a call into the `log` crate made where this thread may hold a pool's lock (or a
/// heap's). The logger is user code: a pool call from it that would wait for a lock fails
/// instead of waiting for ever on the one this thread holds (allocations and frees return an
/// error; statistics, reports and settings unwind, see `Shared::lock_wait`), and that unwind or
/// a panic of the logger is caught here, before it could leave the pool's state half-changed;
/// the record is then lost.
pub(crate) fn logged(log: impl FnOnce()) {
    LockId::ANY.callback(|| logged_unlocked(log));
}

/// Runs `log`, a call into the `log` crate made where this thread holds no lock of the pool
/// (a destructor; events delivered after the lock is released). A pool call from the logger
/// works there as any call does; a panic of the logger is caught here, so that it does not
/// unwind out of the pool's call or destructor (the record is then lost).
pub(crate) fn logged_unlocked(log: impl FnOnce()) {
    let _ = caught(log);
}

/// A panic caught from user code (a callback, a logger, a stream runtime, a virtual-memory
/// backend): its payload, dropped without letting a panic of the payload's own `Drop` unwind
/// out of the pool. User code may panic with any payload (`std::panic::panic_any`), and a
/// payload whose destructor panics, dropped as usual, would unwind from wherever the pool
/// dropped it, with its lock or a half-done change in hand. The payload of that destructor's
/// panic is dropped the same way in turn (a panic's usual payload, its message, drops
/// quietly), up to [`PAYLOAD_DROPS`] payloads in all; one beyond them is forgotten (leaked, a
/// few bytes) rather than dropped, so that a chain of destructors that panic ends.
pub(crate) struct Caught(Option<Box<dyn core::any::Any + Send>>);

impl Caught {
    /// The payload, to read its message or its type.
    pub(crate) fn payload(&self) -> &(dyn core::any::Any + Send) {
        match &self.0 {
            Some(payload) => &**payload,
            // (Taken only by `drop`.)
            None => &(),
        }
    }
}

/// How many payloads in a row [`Caught`] drops, each from the panic of the one before's
/// destructor, before it forgets the next.
const PAYLOAD_DROPS: usize = 4;

impl Drop for Caught {
    fn drop(&mut self) {
        let mut payload = self.0.take();
        for _ in 0..PAYLOAD_DROPS {
            match std::panic::catch_unwind(core::panic::AssertUnwindSafe(move || drop(payload))) {
                Ok(()) => return,
                Err(again) => payload = Some(again),
            }
        }
        core::mem::forget(payload);
    }
}

/// `std::panic::catch_unwind` for user code that the pool calls: a panic becomes a
/// [`Caught`], whose payload is dropped safely.
pub(crate) fn caught<R>(f: impl FnOnce() -> R) -> Result<R, Caught> {
    std::panic::catch_unwind(core::panic::AssertUnwindSafe(f))
        .map_err(|payload| Caught(Some(payload)))
}

/// The message of a caught panic's payload, where it has one (`panic!` with a literal or a
/// format string).
pub(crate) fn panic_message(payload: &(dyn core::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

/// The longest back-off, in spin-loop hints, before a waiter starts yielding the CPU: about
/// 2,000 hints in all, tens of microseconds, far beyond the pool's critical sections (well
/// under a microsecond) unless the holder was preempted.
const BACKOFF_LIMIT: u32 = 1 << 10;

/// The lock word, alone on its cache lines (Intel fetches lines in pairs): a waiter reading it
/// does not take a line of the state away from the holder. The lock's identity, read only by
/// waiters and callbacks, shares the padding.
#[repr(align(128))]
struct LockWord {
    taken: AtomicBool,
    id: LockId,
}

/// A spin-then-yield lock around `T`.
pub(crate) struct Lock<T> {
    locked: LockWord,
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
            locked: LockWord {
                taken: AtomicBool::new(false),
                id: LockId::fresh(),
            },
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        // Strong: a lock that is free is taken. A weak exchange may fail spuriously where the
        // CPU offers load-linked/store-conditional (an Arm without LSE atomics), and every
        // `try_guard` caller reads a failure as another thread holding the lock: its request
        // would take the contended path (a thread heap where none was needed) for nothing.
        // (On x86-64 both compile to the same `lock cmpxchg`.)
        self.locked
            .taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes the lock, waiting for it; [`Reentrant`] instead of waiting for ever when this
    /// thread holds it already, in a callback run by [`callback`](Self::callback).
    #[inline]
    pub(crate) fn lock(&self) -> Result<LockGuard<'_, T>, Reentrant> {
        if !self.try_lock() {
            self.lock_contended()?;
        }
        Ok(LockGuard {
            lock: self,
            _access: PhantomData,
        })
    }

    /// Takes the lock if it is free now.
    #[inline]
    pub(crate) fn try_guard(&self) -> Option<LockGuard<'_, T>> {
        // Lazily: a guard made and dropped would release the lock.
        self.try_lock().then(|| LockGuard {
            lock: self,
            _access: PhantomData,
        })
    }

    /// Waits, spinning up to about `spins` loop hints, while another thread holds the lock;
    /// whether it is free now (it may be taken again at once).
    pub(crate) fn wait_unlocked(&self, spins: u32) -> bool {
        let mut left = spins;
        while self.locked.taken.load(Ordering::Relaxed) {
            if left == 0 {
                return false;
            }
            left -= 1;
            core::hint::spin_loop();
        }
        true
    }

    /// Takes the lock, waiting for it, where this thread cannot be inside a callback made
    /// under it (a lock no callback runs under).
    pub(crate) fn lock_wait(&self) -> LockGuard<'_, T> {
        loop {
            if let Ok(guard) = self.lock() {
                return guard;
            }
            std::thread::yield_now();
        }
    }

    /// Whether this thread is running a callback made while it holds this lock.
    pub(crate) fn in_callback(&self) -> bool {
        self.id().in_callback()
    }

    /// Runs `f`, a user callback made while this thread holds the lock, so that a call back
    /// into the lock from `f` fails with [`Reentrant`] instead of waiting for ever.
    pub(crate) fn callback<R>(&self, f: impl FnOnce() -> R) -> R {
        self.id().callback(f)
    }

    /// The lock's identity, for running callbacks under it where the lock itself is not at
    /// hand (a destructor).
    pub(crate) fn id(&self) -> LockId {
        self.locked.id
    }

    #[cold]
    fn lock_contended(&self) -> Result<(), Reentrant> {
        if self.in_callback() {
            return Err(Reentrant);
        }
        let mut backoff = 1;
        loop {
            // Look with plain loads (the line stays shared), backing off between looks.
            while self.locked.taken.load(Ordering::Relaxed) {
                if backoff <= BACKOFF_LIMIT {
                    for _ in 0..backoff {
                        core::hint::spin_loop();
                    }
                    backoff *= 2;
                } else {
                    std::thread::yield_now();
                }
            }
            if self.try_lock() {
                return Ok(());
            }
        }
    }
}

/// Access to the locked value; releases the lock on drop (also during unwinding).
pub(crate) struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
    /// Shared between threads only where `T` is `Sync`, as a `&mut T` (the guard hands out
    /// `&T` through `Deref`; the lock alone would make it `Sync` for any `T: Send`).
    _access: PhantomData<&'a mut T>,
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
        self.lock.locked.taken.store(false, Ordering::Release);
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
        // Eight threads on a machine with fewer CPUs also take the yielding path.
        let lock = Arc::new(Lock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..crate::test_iterations(20_000) {
                        let mut g = lock.lock().unwrap();
                        let (a, b) = *g;
                        *g = (a + 1, b + 2);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = 8 * crate::test_iterations(20_000) as u64;
        assert_eq!(*lock.lock().unwrap(), (n, 2 * n));
    }

    #[test]
    fn a_failed_try_leaves_the_lock_held() {
        let lock = Lock::new(1u32);
        let guard = lock.try_guard().expect("free");
        assert!(lock.try_guard().is_none());
        // Still held by `guard`: a second failed try changes nothing either.
        assert!(lock.try_guard().is_none());
        drop(guard);
        assert_eq!(lock.try_guard().map(|g| *g), Some(1));
    }

    #[test]
    fn a_callback_that_takes_the_lock_again_fails_instead_of_waiting() {
        let lock = Lock::new(0u32);
        let guard = lock.lock().unwrap();
        assert_eq!(lock.callback(|| lock.lock().err()), Some(Reentrant));
        drop(guard);
        // Outside the callback the lock is free again and taken normally.
        assert_eq!(*lock.lock().unwrap(), 0);
    }

    #[test]
    fn a_callback_of_a_gone_lock_does_not_name_a_new_lock_at_its_address() {
        // A destructor kept past its lock (an event a thread heap holds after its pool is
        // gone) runs as a callback of the old lock's identity; a new lock at the same address
        // is another lock, and a call into it from there works.
        let mut slot = Lock::new(0u32);
        let old = slot.id();
        let at = &slot as *const Lock<u32>;
        slot = Lock::new(1);
        assert_eq!(&slot as *const Lock<u32>, at, "the same place");
        assert_ne!(slot.id(), old);
        let taken = old.callback(|| {
            assert!(
                !slot.in_callback(),
                "the new lock thinks it is in the old one's callback"
            );
            slot.lock().map(|g| *g)
        });
        assert_eq!(taken, Ok(1));
        // Its own callbacks still fail a second take.
        let guard = slot.lock().unwrap();
        assert_eq!(slot.callback(|| slot.lock().err()), Some(Reentrant));
        drop(guard);
    }

    #[test]
    fn a_callback_of_another_lock_inside_a_callback_still_knows_the_outer_lock() {
        let (a, b) = (Lock::new(0u32), Lock::new(0u32));
        let guard_a = a.lock().unwrap();
        let inner = a.callback(|| {
            let guard_b = b.lock().unwrap();
            let seen = b.callback(|| (a.lock().err(), b.lock().err(), a.in_callback()));
            drop(guard_b);
            seen
        });
        assert_eq!(inner, (Some(Reentrant), Some(Reentrant), true));
        // Each callback's frame is gone with it, also when the callback unwinds.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            b.callback(|| panic!("callback panics"))
        }));
        assert!(unwound.is_err());
        assert!(!a.in_callback() && !b.in_callback());
        drop(guard_a);
        assert_eq!((*a.lock().unwrap(), *b.lock().unwrap()), (0, 0));
    }

    #[test]
    fn inside_a_logged_call_no_lock_is_waited_for() {
        let (a, b) = (Lock::new(0u32), Lock::new(0u32));
        let guard_a = a.lock().unwrap();
        let mut seen = None;
        logged(|| {
            // `a` is this thread's: an error, not a wait. `b` is free: taken as usual.
            let free = b.lock().map(|g| *g);
            seen = Some((a.lock().err(), free, a.in_callback(), b.in_callback()));
        });
        assert_eq!(seen, Some((Some(Reentrant), Ok(0), true, true)));
        // A panic inside is caught, and the frame is gone afterwards.
        logged(|| panic!("a logger that panics"));
        assert!(!a.in_callback() && !b.in_callback());
        drop(guard_a);
        assert_eq!(*a.lock().unwrap(), 0);
    }
}

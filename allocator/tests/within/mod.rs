//! A call that may hang, run on a thread of its own (shared by the test files that check that
//! something returns; `mod within;` in each).

/// `f` on a thread of its own; `None` when it has not returned within `secs` seconds (the
/// thread is then left behind).
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs)).ok()
}

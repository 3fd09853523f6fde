//! What the device pool tests share: the GPU gate and a way to hold a stream.
//!
//! Without a CUDA driver or device a test prints `skipped: no CUDA device` and passes; with
//! `DEVARENA_REQUIRE_GPU=1` set it fails instead.

// Each test file uses a part of this module.
#![allow(dead_code)]

/// Whether the environment demands a GPU (`DEVARENA_REQUIRE_GPU=1`).
fn gpu_required() -> bool {
    std::env::var("DEVARENA_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Skips (prints `skipped: no CUDA device`) or, when a GPU is required, fails with `why`.
pub fn skip_or_fail(why: &str) {
    assert!(
        !gpu_required(),
        "DEVARENA_REQUIRE_GPU=1 but no CUDA device is usable: {why}"
    );
    println!("skipped: no CUDA device ({why})");
}

#[cfg(feature = "cuda")]
pub use gpu::{StreamGate, gpu};

#[cfg(feature = "cuda")]
mod gpu {
    use std::ffi::c_void;
    use std::sync::{Arc, Condvar, Mutex, MutexGuard};

    use cudarc::driver::result;
    use devarena::backend::cuda::{CudaStream, cuda_stream};

    use super::skip_or_fail;

    /// The tests of a file share one device and compare free-memory readings: one at a time.
    static DEVICE: Mutex<()> = Mutex::new(());

    /// The device lock and a stream on GPU 0, or `None` after [`skip_or_fail`].
    pub fn gpu() -> Option<(MutexGuard<'static, ()>, Arc<CudaStream>)> {
        let guard = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
        match cuda_stream(0) {
            Ok(stream) => Some((guard, stream)),
            Err(e) => {
                skip_or_fail(&e.to_string());
                None
            }
        }
    }

    /// Holds a stream at a host function until released (or dropped, so a failing test never
    /// leaves the stream blocked): deterministic "work still queued on this stream".
    pub struct StreamGate {
        state: Arc<(Mutex<bool>, Condvar)>,
    }

    unsafe extern "C" fn wait_for_gate(arg: *mut c_void) {
        // SAFETY: `arg` is the `Arc` leaked by `StreamGate::block`, reclaimed here once.
        let state = unsafe { Arc::from_raw(arg as *const (Mutex<bool>, Condvar)) };
        let (open, cv) = &*state;
        let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }

    impl StreamGate {
        /// Queues a host function on `stream` that returns only once the gate opens.
        pub fn block(stream: &CudaStream) -> StreamGate {
            let state = Arc::new((Mutex::new(false), Condvar::new()));
            let arg = Arc::into_raw(state.clone()) as *mut c_void;
            stream.context().bind_to_thread().unwrap();
            // SAFETY: the stream is alive; the host function makes no CUDA calls and owns one
            // reference to the gate's state, which outlives it.
            unsafe { result::stream::launch_host_function(stream.cu_stream(), wait_for_gate, arg) }
                .expect("cuLaunchHostFunc");
            StreamGate { state }
        }

        /// Lets the stream run on.
        pub fn open(&self) {
            let (open, cv) = &*self.state;
            *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        }

        /// Opens the gate from a thread of its own `after` from now. Started right after
        /// [`block`](Self::block), before the test makes any other CUDA call: with the gate
        /// closed, a call of this thread may wait inside the driver for another thread's
        /// device-wide wait (a `cuMemFree` of a test running in parallel), which waits for the
        /// gated stream.
        #[allow(dead_code)]
        pub fn open_after(&self, after: std::time::Duration) -> std::thread::JoinHandle<()> {
            let opener = self.opener();
            std::thread::spawn(move || {
                std::thread::sleep(after);
                opener.open();
            })
        }

        /// A handle that opens the gate from another thread.
        pub fn opener(&self) -> StreamGate {
            StreamGate {
                state: self.state.clone(),
            }
        }
    }

    impl Drop for StreamGate {
        fn drop(&mut self) {
            self.open();
        }
    }
}

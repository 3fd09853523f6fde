//! Setup cost on the GPU: making a layout's buffers with one `cuMemAlloc` each, one
//! `cuMemAllocAsync` each, one arena (one `cuMemAlloc` of the planned size), and one bare
//! `cuMemAlloc` of the same total. Medians over rounds; prints a table (or `--json`).
//!
//!     cargo bench -p devarena-kernels --features cuda --bench setup [-- --rounds 50] [--json]
//!
//! Without a GPU it prints `skipped: no CUDA device` and exits 0.

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("skipped: no CUDA device (built without the `cuda` feature)");
}

#[cfg(feature = "cuda")]
fn main() {
    gpu::main()
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::time::{Duration, Instant};

    use cudarc::driver::{CudaStream, result};
    use devarena::backend::cuda::{CudaBackend, cuda_stream, describe_device};
    use devarena::{Arena, DeviceLayout};
    use devarena_tests_layouts::{Many, Pipeline1080};

    mod devarena_tests_layouts {
        /// The 1080p pipeline's buffers.
        #[derive(devarena::DeviceLayout)]
        pub struct Pipeline1080 {
            pub rgb: [u8; 1920 * 1080 * 3],
            pub gray: [f32; 1920 * 1080],
            pub scratch_a: [f32; 1920 * 1080],
            pub scratch_b: [f32; 1920 * 1080],
            pub hist: [u32; 256],
        }
        include!("../../tests/src/many_fields.rs");
    }

    fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        v[v.len() / 2]
    }

    struct Row {
        layout: &'static str,
        variant: &'static str,
        calls: usize,
        median: Duration,
    }

    fn time_rounds(rounds: usize, mut f: impl FnMut() -> Duration) -> Duration {
        for _ in 0..3 {
            f();
        }
        median((0..rounds).map(|_| f()).collect())
    }

    fn per_buffer_sync(sizes: &[usize]) -> Duration {
        let t = Instant::now();
        let ptrs: Vec<u64> = sizes
            .iter()
            .map(|&s| {
                // SAFETY: plain allocations, freed below; never read.
                unsafe { result::malloc_sync(s) }.expect("cuMemAlloc")
            })
            .collect();
        let d = t.elapsed();
        for p in ptrs {
            // SAFETY: allocated above, freed once.
            unsafe { result::free_sync(p) }.expect("cuMemFree");
        }
        d
    }

    fn per_buffer_async(stream: &CudaStream, sizes: &[usize]) -> Duration {
        let t = Instant::now();
        let ptrs: Vec<u64> = sizes
            .iter()
            .map(|&s| {
                // SAFETY: stream-ordered allocations on a live stream, freed below.
                unsafe { result::malloc_async(stream.cu_stream(), s) }.expect("cuMemAllocAsync")
            })
            .collect();
        stream.synchronize().expect("sync");
        let d = t.elapsed();
        for p in ptrs {
            // SAFETY: allocated above on this stream, freed once.
            unsafe { result::free_async(p, stream.cu_stream()) }.expect("cuMemFreeAsync");
        }
        stream.synchronize().expect("sync");
        d
    }

    fn one_alloc(total: usize) -> Duration {
        let t = Instant::now();
        // SAFETY: as above.
        let p = unsafe { result::malloc_sync(total) }.expect("cuMemAlloc");
        let d = t.elapsed();
        // SAFETY: allocated above, freed once.
        unsafe { result::free_sync(p) }.expect("cuMemFree");
        d
    }

    fn arena<L: DeviceLayout>(stream: &std::sync::Arc<CudaStream>) -> Duration {
        let t = Instant::now();
        let a = Arena::<L, _>::new_in(CudaBackend::new(stream.clone())).expect("arena");
        let d = t.elapsed();
        drop(a);
        d
    }

    fn bench<L: DeviceLayout>(
        name: &'static str,
        stream: &std::sync::Arc<CudaStream>,
        rounds: usize,
        rows: &mut Vec<Row>,
    ) {
        let sizes: Vec<usize> = L::FIELDS.iter().map(|f| f.size).collect();
        let n = sizes.len();
        rows.push(Row {
            layout: name,
            variant: "cuMemAlloc per buffer",
            calls: n,
            median: time_rounds(rounds, || per_buffer_sync(&sizes)),
        });
        rows.push(Row {
            layout: name,
            variant: "cuMemAllocAsync per buffer",
            calls: n,
            median: time_rounds(rounds, || per_buffer_async(stream, &sizes)),
        });
        rows.push(Row {
            layout: name,
            variant: "one cuMemAlloc of the total",
            calls: 1,
            median: time_rounds(rounds, || one_alloc(L::SIZE)),
        });
        rows.push(Row {
            layout: name,
            variant: "devarena arena",
            calls: 1,
            median: time_rounds(rounds, || arena::<L>(stream)),
        });
    }

    pub fn main() {
        let args: Vec<String> = std::env::args().collect();
        let json = args.iter().any(|a| a == "--json");
        let rounds = args
            .iter()
            .position(|a| a == "--rounds")
            .and_then(|i| args.get(i + 1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(30usize);
        let stream = match cuda_stream(0) {
            Ok(s) => s,
            Err(e) => {
                println!("skipped: no CUDA device ({e})");
                return;
            }
        };
        stream.context().bind_to_thread().expect("bind");
        let device = describe_device(&stream).expect("device");
        let mut rows = Vec::new();
        bench::<Pipeline1080>("pipeline 1080p (5 buffers)", &stream, rounds, &mut rows);
        bench::<Many>("1000 small buffers", &stream, rounds, &mut rows);
        if json {
            let items: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "{{\"layout\":\"{}\",\"variant\":\"{}\",\"calls\":{},\"median_us\":{:.3}}}",
                        r.layout,
                        r.variant,
                        r.calls,
                        r.median.as_secs_f64() * 1e6
                    )
                })
                .collect();
            println!(
                "{{\"device\":\"{device}\",\"rounds\":{rounds},\"rows\":[{}]}}",
                items.join(",")
            );
            return;
        }
        println!("setup benchmark on {device}; median of {rounds} rounds (3 warm-up)");
        println!(
            "{:<28} {:<30} {:>6} {:>12} {:>10}",
            "layout", "variant", "calls", "median µs", "× arena"
        );
        for chunk in rows.chunks(4) {
            let arena = chunk[3].median.as_secs_f64();
            for r in chunk {
                println!(
                    "{:<28} {:<30} {:>6} {:>12.1} {:>10.2}",
                    r.layout,
                    r.variant,
                    r.calls,
                    r.median.as_secs_f64() * 1e6,
                    r.median.as_secs_f64() / arena
                );
            }
        }
    }
}

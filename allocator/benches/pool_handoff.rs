//! Pool benchmark: frees made by another thread than the one that allocated (a data-loader
//! thread allocates, a consumer frees), against frees by the allocating thread.
//!
//! Each round, every thread allocates `--blocks` blocks (sizes log-uniform in [256 B, 64 KiB],
//! alignment 256, drawn before timing from a fixed seed), then, after a barrier, frees either
//! its own blocks (`own`) or those of the next thread (`next`: thread t frees thread t+1's,
//! the last frees the first's). Both phases are timed on every thread, after a barrier each.
//! Reported: the median over rounds and threads of ns per allocation and per free (one
//! thread's phase / its blocks; the first round is a warm-up), and the free phase's aggregate
//! throughput (every thread's frees over the time from the first thread's start to the last
//! one's end), against `std::alloc` in the same run.
//!
//! ```text
//! cargo bench -p devarena --bench pool_handoff
//! options: --threads 1,2,4,8  --rounds N  --blocks N  --only NAME (columns whose name
//!          contains NAME, or one of `A|B|…`)
//! ```
//!
//! A second table runs producers and consumers at once, as a data loader does: each of
//! `threads / 2` producers allocates the same blocks (fresh sizes each round) and hands them
//! over in batches of 64 through a bounded channel (8 batches) to a consumer of its own,
//! which frees them while the producer goes on allocating. Reported: the median over rounds
//! of the time from the first producer's start to the last consumer's end, per block of one
//! pair (ns), and the blocks per second of all pairs together, against `std::alloc`.
//!
//! Columns: the system allocator (the baseline), a `devarena::Pool` on host memory as built by
//! default (thread heaps), and the same pool without thread heaps (`thread_heaps(0)`: every
//! thread on the pool's one index and lock). Host memory only: what is measured is the pool's
//! bookkeeping, which is the same for device memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use devarena::Pool;

/// What a column allocates with; `free` gets the size `alloc` was given.
trait Allocator: Sync {
    fn name(&self) -> String;
    fn alloc(&self, size: usize) -> u64;
    /// # Safety
    ///
    /// `addr` was returned by this allocator's `alloc(size)` and is freed once.
    unsafe fn free(&self, addr: u64, size: usize);
}

struct SystemAlloc;

impl Allocator for SystemAlloc {
    fn name(&self) -> String {
        "std::alloc (System)".into()
    }
    fn alloc(&self, size: usize) -> u64 {
        let layout = Layout::from_size_align(size, 256).expect("valid layout");
        // SAFETY: the layout has a non-zero size (at least 256).
        let ptr = unsafe { System.alloc(layout) };
        assert!(!ptr.is_null(), "the system allocator refused {size} bytes");
        ptr as u64
    }
    unsafe fn free(&self, addr: u64, size: usize) {
        let layout = Layout::from_size_align(size, 256).expect("valid layout");
        // SAFETY: by `free`'s contract `addr` came from `alloc` with this layout (size, 256)
        // and is freed once.
        unsafe { System.dealloc(addr as usize as *mut u8, layout) }
    }
}

struct DevarenaPool {
    pool: Pool,
    label: &'static str,
}

impl Allocator for DevarenaPool {
    fn name(&self) -> String {
        format!("devarena Pool (host{})", self.label)
    }
    fn alloc(&self, size: usize) -> u64 {
        self.pool.allocate(size, 256).expect("the pool has room")
    }
    unsafe fn free(&self, addr: u64, _size: usize) {
        self.pool.deallocate(addr).expect("free a live allocation");
    }
}

/// Sizes log-uniform in [256 B, 64 KiB] (xorshift, fixed seed per thread and round).
fn sizes(seed: u64, n: usize) -> Vec<usize> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let exponent = 8.0 + (x % 1_000_000) as f64 / 1_000_000.0 * 8.0;
            (exponent.exp2() as usize).max(256)
        })
        .collect()
}

/// One thread's phase: when it started and ended, and how many operations it made.
#[derive(Clone, Copy)]
struct Phase {
    start: Instant,
    end: Instant,
}

struct Figures {
    alloc_ns: f64,
    free_ns: f64,
    /// Frees per second over the free phase, all threads together (median over rounds).
    free_rate: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure(a: &dyn Allocator, threads: usize, rounds: usize, blocks: usize, next: bool) -> Figures {
    let handed: Vec<Mutex<Vec<(u64, usize)>>> = (0..threads).map(|_| Mutex::default()).collect();
    let barrier = Barrier::new(threads);
    // (round, allocation phase, free phase) of every thread.
    let phases: Mutex<Vec<(usize, Phase, Phase)>> = Mutex::default();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (handed, barrier, phases) = (&handed, &barrier, &phases);
            s.spawn(move || {
                for round in 0..rounds {
                    let script = sizes((round * 1000 + t) as u64 + 1, blocks);
                    let mut mine = Vec::with_capacity(blocks);
                    barrier.wait();
                    let start = Instant::now();
                    mine.extend(script.iter().map(|&size| (a.alloc(size), size)));
                    let alloc = Phase {
                        start,
                        end: Instant::now(),
                    };
                    *handed[t].lock().unwrap() = mine;
                    barrier.wait();
                    let from = if next { (t + 1) % threads } else { t };
                    let to_free = std::mem::take(&mut *handed[from].lock().unwrap());
                    barrier.wait();
                    let start = Instant::now();
                    for &(addr, size) in &to_free {
                        // SAFETY: allocated by `a` with this size this round (by this thread
                        // or the one it took them from) and freed here only.
                        unsafe { a.free(addr, size) };
                    }
                    let free = Phase {
                        start,
                        end: Instant::now(),
                    };
                    phases.lock().unwrap().push((round, alloc, free));
                }
            });
        }
    });
    let phases = phases.into_inner().unwrap();
    let timed = || phases.iter().filter(|p| p.0 > 0 || rounds == 1);
    let per_op = |d: Duration| d.as_nanos() as f64 / blocks as f64;
    let alloc_ns = median(timed().map(|p| per_op(p.1.end - p.1.start)).collect());
    let free_ns = median(timed().map(|p| per_op(p.2.end - p.2.start)).collect());
    let rates = (0..rounds)
        .filter(|&r| r > 0 || rounds == 1)
        .map(|r| {
            let of_round = phases.iter().filter(|p| p.0 == r);
            let start = of_round.clone().map(|p| p.2.start).min().unwrap();
            let end = of_round.map(|p| p.2.end).max().unwrap();
            (threads * blocks) as f64 / (end - start).as_secs_f64()
        })
        .collect();
    Figures {
        alloc_ns,
        free_ns,
        free_rate: median(rates),
    }
}

/// Producers and consumers at once: the median over rounds of (ns per block of one pair,
/// blocks per second of all pairs).
fn measure_pipe(a: &dyn Allocator, pairs: usize, rounds: usize, blocks: usize) -> (f64, f64) {
    const BATCH: usize = 64;
    let mut per_block = Vec::new();
    let mut rates = Vec::new();
    for round in 0..rounds {
        let barrier = Barrier::new(2 * pairs);
        let elapsed = Mutex::new((None::<Instant>, None::<Instant>));
        std::thread::scope(|s| {
            for p in 0..pairs {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<(u64, usize)>>(8);
                let script = sizes((round * 1000 + p) as u64 + 7, blocks);
                let (barrier, elapsed) = (&barrier, &elapsed);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    {
                        let mut e = elapsed.lock().unwrap();
                        e.0 = Some(e.0.map_or(start, |t| t.min(start)));
                    }
                    for chunk in script.chunks(BATCH) {
                        let batch = chunk.iter().map(|&size| (a.alloc(size), size)).collect();
                        tx.send(batch).expect("the consumer is there");
                    }
                });
                s.spawn(move || {
                    barrier.wait();
                    for batch in rx {
                        for (addr, size) in batch {
                            // SAFETY: allocated by `a` with this size by this consumer's
                            // producer, handed over once and freed here only.
                            unsafe { a.free(addr, size) };
                        }
                    }
                    let end = Instant::now();
                    let mut e = elapsed.lock().unwrap();
                    e.1 = Some(e.1.map_or(end, |t| t.max(end)));
                });
            }
        });
        let (start, end) = elapsed.into_inner().unwrap();
        let secs = (end.unwrap() - start.unwrap()).as_secs_f64();
        if round > 0 || rounds == 1 {
            per_block.push(secs * 1e9 / blocks as f64);
            rates.push((pairs * blocks) as f64 / secs);
        }
    }
    (median(per_block), median(rates))
}

fn main() {
    let mut threads: Vec<usize> = vec![1, 2, 4, 8];
    let mut rounds = 9;
    let mut blocks = 4096;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--threads" => {
                threads = value()
                    .split(',')
                    .map(|t| t.parse().expect("--threads 1,2,4"))
                    .collect()
            }
            "--rounds" => rounds = value().parse().expect("--rounds N"),
            "--blocks" => blocks = value().parse().expect("--blocks N"),
            "--only" => only = Some(value()),
            "--bench" => {}
            other => panic!("unknown option {other}"),
        }
    }
    // Room for every thread's blocks at the largest size.
    let capacity = (threads.iter().max().unwrap() * blocks * (64 << 10)).next_power_of_two();
    let columns: Vec<Box<dyn Allocator>> = vec![
        Box::new(SystemAlloc),
        Box::new(DevarenaPool {
            pool: Pool::builder(capacity)
                .build_host()
                .expect("reserve the pool"),
            label: "",
        }),
        Box::new(DevarenaPool {
            pool: Pool::builder(capacity)
                .thread_heaps(0)
                .build_host()
                .expect("reserve the pool"),
            label: ", one index",
        }),
    ];
    let wanted = |name: &str| {
        only.as_ref()
            .is_none_or(|o| o.split('|').any(|part| name.contains(part)))
    };
    println!(
        "pool_handoff: {rounds} rounds (the first a warm-up) of {blocks} blocks per thread, \
         sizes log-uniform in [256 B, 64 KiB]; medians"
    );
    println!(
        "{:<34} {:>7} {:>5} {:>9} {:>9} {:>12} {:>10}",
        "allocator", "threads", "frees", "alloc ns", "free ns", "Mfrees/s", "x std"
    );
    for &t in &threads {
        for next in [false, true] {
            let mut baseline = None;
            for column in columns.iter().filter(|c| wanted(&c.name())) {
                let f = measure(&**column, t, rounds, blocks, next);
                let ratio = match baseline {
                    None if column.name().starts_with("std::alloc") => {
                        baseline = Some(f.free_rate);
                        "-".to_string()
                    }
                    Some(b) => format!("{:.2}x", f.free_rate / b),
                    None => "-".to_string(),
                };
                println!(
                    "{:<34} {:>7} {:>5} {:>9.1} {:>9.1} {:>12.2} {:>10}",
                    column.name(),
                    t,
                    if next { "next" } else { "own" },
                    f.alloc_ns,
                    f.free_ns,
                    f.free_rate / 1e6,
                    ratio
                );
            }
        }
    }
    println!();
    println!(
        "producers and consumers at once (each producer's blocks freed by its consumer, \
         batches of 64); medians"
    );
    println!(
        "{:<34} {:>7} {:>13} {:>12} {:>10}",
        "allocator", "pairs", "ns per block", "Mblocks/s", "x std"
    );
    for pairs in threads.iter().map(|t| t / 2).filter(|&p| p > 0) {
        let mut baseline = None;
        for column in columns.iter().filter(|c| wanted(&c.name())) {
            let (ns, rate) = measure_pipe(&**column, pairs, rounds, blocks);
            let ratio = match baseline {
                None if column.name().starts_with("std::alloc") => {
                    baseline = Some(rate);
                    "-".to_string()
                }
                Some(b) => format!("{:.2}x", rate / b),
                None => "-".to_string(),
            };
            println!(
                "{:<34} {:>7} {:>13.1} {:>12.2} {:>10}",
                column.name(),
                pairs,
                ns,
                rate / 1e6,
                ratio
            );
        }
    }
}

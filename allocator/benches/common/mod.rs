//! What the planner's benchmarks share: a network-shaped instance generator, the layout of an
//! instance, and the check of a plan.

// Each benchmark uses only some of it.
#![allow(dead_code)]

use devarena::plan::{self, Placed};
use devarena::{LayoutBuilder, RuntimeLayout};

/// The layout `name` of `buffers` (bytes, live from `first` to `last`) over `stages` stages.
pub fn builder(name: &str, buffers: &[Buffer], stages: usize) -> LayoutBuilder {
    let mut b = LayoutBuilder::new(name).stages(stages);
    for (i, x) in buffers.iter().enumerate() {
        b = b.array::<u8>(format!("b{i}"), x.size).live(x.first, x.last);
    }
    b
}

/// Checks a plan with the independent validator; panics (the benchmark is wrong) if it fails.
pub fn check(layout: &RuntimeLayout) {
    let placed: Vec<Placed> = layout.fields().iter().map(Placed::from).collect();
    if let Err(v) = plan::validate(&placed, layout.size()) {
        panic!("invalid plan: {v}");
    }
}

/// One generated buffer: size in bytes, first and last stage.
#[derive(Clone, Copy)]
pub struct Buffer {
    pub size: usize,
    pub first: usize,
    pub last: usize,
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A network-shaped instance of about `n` buffers (see `plan_scale`'s documentation); returns
/// the buffers and the number of stages.
pub fn activations(n: usize, seed: u64) -> (Vec<Buffer>, usize) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = Vec::with_capacity(n + 8);
    // Operations: about 1.6 buffers each.
    let ops = (n as f64 / 1.6) as usize + 1;
    let (min_log, max_log) = (7.0f64, 29.0f64); // 128 B .. 512 MiB
    let mut block_log = 20.0f64;
    let mut op = 0;
    while out.len() < n {
        if op % 64 == 0 {
            // A new block of the network: its resolution moves by up to 8x either way.
            block_log = (block_log + (rng.unit() * 6.0 - 3.0)).clamp(min_log + 3.0, max_log - 3.0);
        }
        let size = |rng: &mut Rng, spread: f64| {
            let l = (block_log + (rng.unit() * 2.0 - 1.0) * spread).clamp(min_log, max_log);
            (2f64.powf(l) as usize).max(128)
        };
        let last = ops.max(op + 1);
        // The output, read by the next one or two operations.
        let s = size(&mut rng, 1.5);
        out.push(Buffer {
            size: s,
            first: op,
            last: (op + 1 + rng.below(2) as usize).min(last),
        });
        if rng.below(2) == 0 {
            // A workspace, live in this operation only.
            let s = size(&mut rng, 3.0);
            out.push(Buffer {
                size: s,
                first: op,
                last: op,
            });
        }
        if rng.below(20) == 0 {
            let s = size(&mut rng, 1.0);
            out.push(Buffer {
                size: s,
                first: op,
                last: (op + 5 + rng.below(196) as usize).min(last),
            });
        }
        if rng.below(500) == 0 {
            let s = size(&mut rng, 1.0);
            out.push(Buffer {
                size: s,
                first: op,
                last,
            });
        }
        op += 1;
    }
    out.truncate(n);
    let stages = out.iter().map(|b| b.last + 1).max().unwrap_or(1);
    (out, stages)
}

/// An instance of `n` buffers over `n / 2` stages whose live ranges are long and overlap
/// heavily: each starts at a uniform stage and lives for a log-uniform 1 to `longest` stages,
/// with sizes log-uniform from 256 B to 64 MiB. Many buffers are live at once (about
/// `longest / ln(longest)` on average), so every buffer conflicts with hundreds of others.
pub fn long_lived(n: usize, longest: f64, seed: u64) -> (Vec<Buffer>, usize) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let stages = (n / 2).max(1);
    let out = (0..n)
        .map(|_| {
            let len = longest.powf(rng.unit()) as usize;
            let first = rng.below(stages as u64) as usize;
            Buffer {
                size: 2f64.powf(8.0 + rng.unit() * 18.0) as usize,
                first,
                last: (first + len).min(stages - 1),
            }
        })
        .collect();
    (out, stages)
}

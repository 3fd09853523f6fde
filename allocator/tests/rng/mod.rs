//! The tests' random numbers: xorshift64, a fixed sequence per seed (shared by the test files
//! that draw operations at random; `mod rng;` in each).

/// xorshift64: a fixed sequence per seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Log-uniform-ish in `1..=max`.
    pub fn size(&mut self, max: usize) -> usize {
        let bits = 1 + self.below(max.ilog2() as u64) as u32;
        1 + (self.next() as usize) % (1usize << bits).min(max)
    }

    /// 0 ("any"), or a power of two from 256 to 4096.
    pub fn align(&mut self) -> usize {
        match self.below(6) {
            0 => 0,
            k => 128 << k,
        }
    }
}

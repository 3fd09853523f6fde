//! Reading fuzz input: numbers and choices taken from the front of a byte string. Past the end
//! every read gives 0, so every input, however short, is a complete program.

/// A cursor over fuzz input.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    /// Reads from `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Input { bytes }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next eight bytes, little-endian.
    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }

    /// A number in `0..n` (`n > 0`) from one byte (two when `n > 256`).
    pub fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        if n <= 256 {
            self.u8() as usize % n
        } else {
            self.u16() as usize % n
        }
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// A yes or no.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A size spread over every scale: small numbers often, the edges of `usize` sometimes.
    pub fn size(&mut self, typical_max: usize) -> usize {
        match self.u8() % 16 {
            0 => 0,
            1 => 1,
            2 => self.pick(&[
                usize::MAX,
                isize::MAX as usize,
                usize::MAX - 255,
                1 << 40,
                (1 << 32) + 1,
            ]),
            3..=8 => self.below(4096),
            _ => {
                let bits = usize::BITS - typical_max.max(1).leading_zeros();
                let shift = self.below(bits as usize + 1) as u32;
                let mask = (1usize << shift.min(63)).wrapping_sub(1);
                (self.u64() as usize & mask) % typical_max.max(1).saturating_add(1)
            }
        }
    }

    /// An alignment: usually a power of two up to 8192, sometimes 0, a non power of two or a
    /// huge one.
    pub fn align(&mut self) -> usize {
        match self.u8() % 16 {
            0 => 0,
            1 => self.pick(&[3, 24, 100, 4095, 4097, usize::MAX, 1 << 63, 1 << 31]),
            _ => 1 << self.below(14),
        }
    }

    /// A short string (UTF-8, lossily).
    pub fn string(&mut self, max: usize) -> String {
        let n = self.below(max + 1);
        let bytes: Vec<u8> = (0..n).map(|_| self.u8()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::Input;

    #[test]
    fn reads_past_the_end_give_zero() {
        let mut input = Input::new(&[1, 2, 3]);
        assert_eq!(input.u16(), 0x0201);
        assert_eq!(input.u16(), 3);
        assert!(input.is_empty());
        assert_eq!(input.u64(), 0);
        assert_eq!(input.below(7), 0);
    }
}

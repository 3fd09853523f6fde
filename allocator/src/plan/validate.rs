//! An independent check of a finished plan: written from the definition of a valid plan
//! alone, sharing no code with the planner, so that tests, benchmarks and tools can trust a
//! plan without trusting the planner.

use alloc::vec::Vec;
use core::fmt;

use super::LiveRange;

/// One buffer of a plan, as [`validate`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Placed {
    /// Byte offset from the start of the allocation.
    pub offset: usize,
    /// Bytes of the buffer.
    pub size: usize,
    /// The alignment its offset must be a multiple of.
    pub align: usize,
    /// The stages in which it is live.
    pub live: LiveRange,
}

impl Placed {
    /// The buffer a planner placed in `slot`, live over `live`.
    pub const fn of(slot: &super::Slot, live: LiveRange) -> Placed {
        Placed {
            offset: slot.offset,
            size: slot.size,
            align: slot.align,
            live,
        }
    }
}

impl From<&crate::RuntimeField> for Placed {
    fn from(f: &crate::RuntimeField) -> Placed {
        Placed {
            offset: f.offset,
            size: f.size,
            align: f.align,
            live: f.live,
        }
    }
}

/// What [`validate`] found wrong with a plan (the first problem, by buffer index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Violation {
    /// A buffer's offset is not a multiple of its alignment (or the alignment is not a power
    /// of two).
    Misaligned {
        /// Index of the buffer.
        buffer: usize,
        /// Its offset.
        offset: usize,
        /// Its alignment.
        align: usize,
    },
    /// A buffer ends past the limit (the plan's size, or a capacity).
    OutOfBounds {
        /// Index of the buffer.
        buffer: usize,
        /// Its offset.
        offset: usize,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Two buffers live at the same time share bytes.
    Overlap {
        /// Index of one buffer.
        first: usize,
        /// Index of the other (larger).
        second: usize,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Violation::Misaligned {
                buffer,
                offset,
                align,
            } => write!(
                f,
                "buffer {buffer}: offset {offset} is not a multiple of its alignment {align}"
            ),
            Violation::OutOfBounds {
                buffer,
                offset,
                size,
                limit,
            } => write!(
                f,
                "buffer {buffer}: {size} bytes at offset {offset} end past the limit of {limit} \
                 bytes"
            ),
            Violation::Overlap { first, second } => write!(
                f,
                "buffers {first} and {second} are live at the same time and share bytes"
            ),
        }
    }
}

/// Checks that a plan is valid: every offset is a multiple of its (power-of-two) alignment,
/// every buffer ends at or below `limit`, and no two buffers whose live ranges meet share a
/// byte (buffers of zero bytes share none).
///
/// A sweep over the buffers by first stage compares each buffer with the buffers still live,
/// so the cost is the number of pairs live together, not the square of the buffers.
///
/// ```
/// use devarena::plan::{validate, LiveRange, Placed, Violation};
///
/// let a = Placed { offset: 0, size: 64, align: 64, live: LiveRange::new(0, 1) };
/// let b = Placed { offset: 64, size: 32, align: 32, live: LiveRange::new(1, 2) };
/// let c = Placed { offset: 0, size: 64, align: 64, live: LiveRange::new(2, 3) };
/// assert_eq!(validate(&[a, b, c], 96), Ok(())); // a and c never meet
/// assert_eq!(
///     validate(&[a, Placed { offset: 32, ..b }], 96),
///     Err(Violation::Overlap { first: 0, second: 1 })
/// );
/// assert!(validate(&[a, b], 95).is_err()); // b ends at 96
/// ```
pub fn validate(buffers: &[Placed], limit: usize) -> Result<(), Violation> {
    for (i, b) in buffers.iter().enumerate() {
        if !b.align.is_power_of_two() || b.offset % b.align != 0 {
            return Err(Violation::Misaligned {
                buffer: i,
                offset: b.offset,
                align: b.align,
            });
        }
        if b.offset.checked_add(b.size).is_none_or(|end| end > limit) {
            return Err(Violation::OutOfBounds {
                buffer: i,
                offset: b.offset,
                size: b.size,
                limit,
            });
        }
    }
    let mut order: Vec<usize> = (0..buffers.len())
        .filter(|&i| buffers[i].size > 0)
        .collect();
    order.sort_by_key(|&i| (buffers[i].live.first, i));
    let mut live: Vec<usize> = Vec::new();
    let mut found: Option<(usize, usize)> = None;
    for &i in &order {
        let b = &buffers[i];
        live.retain(|&j| buffers[j].live.last >= b.live.first);
        for &j in &live {
            let c = &buffers[j];
            if b.offset < c.offset + c.size && c.offset < b.offset + b.size {
                let pair = (i.min(j), i.max(j));
                if found.is_none_or(|f| pair < f) {
                    found = Some(pair);
                }
            }
        }
        live.push(i);
    }
    match found {
        Some((first, second)) => Err(Violation::Overlap { first, second }),
        None => Ok(()),
    }
}

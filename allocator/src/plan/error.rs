//! Planning errors and the messages the compiler prints for them, built in `const fn`s.

/// What went wrong while planning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlanErrorKind {
    /// An alignment that is not a power of two (or is over [`MAX_ALIGN`](super::MAX_ALIGN)).
    AlignNotPowerOfTwo {
        /// The alignment asked for.
        align: usize,
    },
    /// A field-level alignment below the alignment of the field's element type.
    AlignBelowElement {
        /// The alignment asked for.
        align: usize,
        /// `align_of` the element.
        elem_align: usize,
    },
    /// A buffer of zero elements.
    ZeroLength,
    /// `elem_size * len` does not fit in `usize`.
    SizeOverflow {
        /// Bytes of one element.
        elem_size: usize,
        /// Number of elements.
        len: usize,
    },
    /// The field's end (its offset, aligned, plus its size), or `SIZE` rounded up to the
    /// layout's alignment, does not fit in `usize`.
    OffsetOverflow {
        /// Where the previous field ends (for the layout: where the last field ends).
        offset: usize,
        /// Bytes of the field (0 for the layout).
        size: usize,
        /// The alignment the field (or the layout's `SIZE`) is rounded up to.
        align: usize,
    },
    /// `SIZE` is over `max_bytes`.
    OverMaxBytes {
        /// The planned size.
        size: usize,
        /// The limit.
        max_bytes: usize,
    },
    /// The element's own alignment (for a nested layout: its `ALIGN`) is not a power of two up
    /// to [`MAX_ALIGN`](super::MAX_ALIGN). Only a hand-written [`FieldSpec`](super::FieldSpec)
    /// can get here: every Rust type's alignment is a power of two up to 2^29.
    ElementAlignTooLarge {
        /// The element's alignment.
        elem_align: usize,
    },
    /// More stages than [`MAX_STAGES`](super::MAX_STAGES).
    TooManyStages {
        /// The stages asked for.
        stages: usize,
        /// The limit.
        max: usize,
    },
    /// Two fields of a [`LayoutBuilder`](crate::LayoutBuilder) have one name (the second
    /// could never be found by name). The error's field is the second.
    DuplicateName {
        /// Index of the first field with that name.
        first: usize,
    },
    /// [`LayoutBuilder::live`](crate::LayoutBuilder::live) before any field: there is no field
    /// for the range to belong to.
    LiveWithoutField {
        /// First stage of the range.
        first: usize,
        /// Last stage of the range.
        last: usize,
    },
    /// A live range that is empty, reversed, or outside `0..stages`.
    BadLiveRange {
        /// First stage of the range.
        first: usize,
        /// Last stage of the range.
        last: usize,
        /// Number of stages of the layout (0: the layout declares none).
        stages: usize,
    },
}

/// A planning error: what went wrong and, where it belongs to one field, which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanError {
    /// Index of the offending field in declaration order, or `None` for the layout itself.
    pub field: Option<usize>,
    /// What went wrong.
    pub kind: PlanErrorKind,
}

pub(super) const fn field_err(field: usize, kind: PlanErrorKind) -> PlanError {
    PlanError {
        field: Some(field),
        kind,
    }
}

/// A message in a fixed buffer, built in const context (the compiler prints it in the error).
#[derive(Clone, Copy)]
pub struct Message {
    buf: [u8; Message::CAPACITY],
    len: usize,
}

impl core::fmt::Debug for Message {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Message {
    /// Bytes a message can hold; longer text is cut at a character boundary.
    pub const CAPACITY: usize = 480;

    /// An empty message.
    pub const fn new() -> Self {
        Message {
            buf: [0; Message::CAPACITY],
            len: 0,
        }
    }

    /// Appends a string, cutting at a character boundary if the buffer is full.
    pub const fn push_str(mut self, s: &str) -> Self {
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() && self.len < Message::CAPACITY {
            // Stop before a multi-byte character that would not fit whole.
            let b = bytes[i];
            let width = if b < 0x80 {
                1
            } else if b >= 0xF0 {
                4
            } else if b >= 0xE0 {
                3
            } else {
                2
            };
            if self.len + width > Message::CAPACITY {
                break;
            }
            let mut k = 0;
            while k < width {
                self.buf[self.len] = bytes[i + k];
                self.len += 1;
                k += 1;
            }
            i += width;
        }
        self
    }

    /// Appends a number in decimal.
    pub const fn push_usize(self, mut v: usize) -> Self {
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        let mut out = [0u8; 20];
        let mut i = 0;
        while i < n {
            out[i] = digits[n - 1 - i];
            i += 1;
        }
        let (s, _) = out.split_at(n);
        match core::str::from_utf8(s) {
            Ok(s) => self.push_str(s),
            Err(_) => self,
        }
    }

    /// The text.
    pub const fn as_str(&self) -> &str {
        let (s, _) = self.buf.split_at(self.len);
        match core::str::from_utf8(s) {
            Ok(s) => s,
            Err(_) => "",
        }
    }
}

impl Default for Message {
    fn default() -> Self {
        Self::new()
    }
}

impl PlanError {
    /// Describes the error, naming the layout, the field (and its type, when given) and the
    /// numbers. The same text appears in compile errors and in run-time [`Display`] output.
    ///
    /// [`Display`]: core::fmt::Display
    pub const fn message(&self, layout: &str, field: &str, ty: &str) -> Message {
        let m = Message::new()
            .push_str("layout `")
            .push_str(layout)
            .push_str("`");
        let m = if self.field.is_some() {
            let m = m.push_str(", field `").push_str(field).push_str("`");
            if ty.is_empty() {
                m
            } else {
                m.push_str(" (").push_str(ty).push_str(")")
            }
        } else {
            m
        };
        let m = m.push_str(": ");
        match self.kind {
            PlanErrorKind::AlignNotPowerOfTwo { align } => {
                let m = m.push_str("alignment ").push_usize(align);
                if align.is_power_of_two() {
                    m.push_str(" is over the largest alignment, ")
                        .push_usize(super::MAX_ALIGN)
                        .push_str(" bytes (2^30)")
                } else {
                    m.push_str(" is not a power of two between 1 and 2^30")
                }
            }
            PlanErrorKind::AlignBelowElement { align, elem_align } => m
                .push_str("alignment ")
                .push_usize(align)
                .push_str(" is below the element's own alignment of ")
                .push_usize(elem_align)
                .push_str(" bytes; ask for ")
                .push_usize(elem_align)
                .push_str(" or more"),
            PlanErrorKind::ZeroLength => {
                m.push_str("a buffer of 0 elements gets no memory; give it at least one element")
            }
            PlanErrorKind::SizeOverflow { elem_size, len } => m
                .push_str("size overflows usize: ")
                .push_usize(len)
                .push_str(" elements of ")
                .push_usize(elem_size)
                .push_str(" bytes exceed ")
                .push_usize(usize::MAX)
                .push_str(" bytes"),
            PlanErrorKind::OffsetOverflow {
                offset,
                size,
                align,
            } => {
                if self.field.is_some() {
                    m.push_str("offset overflows usize: ")
                        .push_usize(size)
                        .push_str(" bytes at alignment ")
                        .push_usize(align)
                        .push_str(", placed after the previous field's end at byte ")
                        .push_usize(offset)
                        .push_str(", would end past byte ")
                        .push_usize(usize::MAX)
                } else {
                    m.push_str("size overflows usize: the fields end at byte ")
                        .push_usize(offset)
                        .push_str(", which cannot be rounded up to the layout's alignment of ")
                        .push_usize(align)
                        .push_str(" bytes")
                }
            }
            PlanErrorKind::OverMaxBytes { size, max_bytes } => m
                .push_str("needs ")
                .push_usize(size)
                .push_str(" bytes, over its max_bytes limit of ")
                .push_usize(max_bytes)
                .push_str(" by ")
                .push_usize(size - max_bytes)
                .push_str(" bytes"),
            PlanErrorKind::ElementAlignTooLarge { elem_align } => {
                let m = m
                    .push_str("the element's alignment of ")
                    .push_usize(elem_align)
                    .push_str(" bytes is ");
                if elem_align.is_power_of_two() {
                    m.push_str("over the largest alignment, ")
                        .push_usize(super::MAX_ALIGN)
                        .push_str(" bytes (2^30)")
                } else {
                    m.push_str("not a power of two")
                }
            }
            PlanErrorKind::TooManyStages { stages, max } => m
                .push_usize(stages)
                .push_str(" stages are over the limit of ")
                .push_usize(max)
                .push_str(" stages"),
            PlanErrorKind::DuplicateName { first } => {
                let m = match self.field {
                    Some(i) => m.push_str("field ").push_usize(i),
                    None => m.push_str("a field"),
                };
                m.push_str(" has the name of field ")
                    .push_usize(first)
                    .push_str("; give every field a name of its own")
            }
            PlanErrorKind::LiveWithoutField { first, last } => m
                .push_str("live(")
                .push_usize(first)
                .push_str(", ")
                .push_usize(last)
                .push_str(") comes before any field; call it after the field it belongs to"),
            PlanErrorKind::BadLiveRange {
                first,
                last,
                stages,
            } => {
                if stages == 0 {
                    m.push_str("a live range needs `#[layout(stages = N)]` on the layout")
                } else {
                    let m = m
                        .push_str("live range ")
                        .push_usize(first)
                        .push_str("..=")
                        .push_usize(last);
                    if first > last {
                        m.push_str(" is empty (its first stage is after its last)")
                    } else {
                        m.push_str(" is outside the stages 0..").push_usize(stages)
                    }
                }
            }
        }
    }

    /// Panics with [`message`](Self::message) (a compile error when evaluated by the compiler).
    #[track_caller]
    pub const fn panic(&self, layout: &str, names: &[&str], types: &[&str]) -> ! {
        let (field, ty) = match self.field {
            Some(i) if i < names.len() && i < types.len() => (names[i], types[i]),
            _ => ("", ""),
        };
        let msg = self.message(layout, field, ty);
        panic!("{}", msg.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_numbers() {
        let e = PlanError {
            field: Some(1),
            kind: PlanErrorKind::AlignBelowElement {
                align: 2,
                elem_align: 8,
            },
        };
        assert_eq!(
            e.message("Frame", "gray", "f64").as_str(),
            "layout `Frame`, field `gray` (f64): alignment 2 is below the element's own \
             alignment of 8 bytes; ask for 8 or more"
        );
        let e = PlanError {
            field: None,
            kind: PlanErrorKind::OverMaxBytes {
                size: 1024,
                max_bytes: 1000,
            },
        };
        assert_eq!(
            e.message("Frame", "", "").as_str(),
            "layout `Frame`: needs 1024 bytes, over its max_bytes limit of 1000 by 24 bytes"
        );
    }

    #[test]
    fn message_cuts_long_text_at_a_char_boundary() {
        let long = "é".repeat(400);
        let m = Message::new().push_str(&long);
        assert!(m.as_str().len() <= Message::CAPACITY);
        assert!(m.as_str().chars().all(|c| c == 'é'));
        assert_eq!(Message::new().push_usize(0).as_str(), "0");
        assert_eq!(
            Message::new().push_usize(usize::MAX).as_str(),
            "18446744073709551615"
        );
    }
}

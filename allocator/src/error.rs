//! devarena's one error type.

use alloc::string::String;
use core::fmt;

use crate::plan::PlanError;

/// Everything that can go wrong at run time. Nothing in devarena panics on a run-time
/// condition: out of memory, a cap exceeded, no device: each comes back as an `Error` that names
/// the thing and the numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A layout built at run time ([`LayoutBuilder`](crate::LayoutBuilder)) could not be planned.
    Plan {
        /// The planner's verdict.
        error: PlanError,
        /// The full message, naming the layout, the field and the numbers.
        message: String,
    },
    /// The backend could not provide the memory.
    OutOfMemory {
        /// Which backend ("host", "cuda", ...).
        backend: &'static str,
        /// Bytes asked for.
        requested: usize,
        /// Bytes free on the device when known.
        free: Option<usize>,
        /// The driver's error name, when a driver said so.
        detail: Option<&'static str>,
    },
    /// A CUDA driver call failed.
    Driver {
        /// The operation that failed, e.g. `cuMemAlloc`.
        call: &'static str,
        /// The CUDA error name, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
        /// The driver's description of the error.
        text: String,
        /// The numeric `CUresult`.
        code: u32,
    },
    /// No CUDA driver, or no device, is present.
    NoDevice {
        /// What was missing.
        reason: String,
    },
    /// An argument was out of range (a size of zero, an alignment that is not a power of two,
    /// ...).
    InvalidArgument {
        /// What was wrong, with the numbers.
        what: String,
    },
    /// A request did not fit in a pool's capacity or a client's quota; nothing already
    /// allocated was disturbed.
    PoolExhausted {
        /// The client (the pool's name, `"pool"` unless it was given one, for the pool itself).
        client: String,
        /// Bytes asked for.
        requested: usize,
        /// Alignment asked for.
        align: usize,
        /// What limited the request: `"capacity"` or `"quota"`.
        limit: &'static str,
        /// The limit in bytes.
        limit_bytes: usize,
        /// Bytes already in use under that limit.
        in_use: usize,
        /// Bytes free in the pool.
        free: usize,
        /// The largest free block of the pool.
        largest_free: usize,
        /// Bytes freed on other streams that are not reusable yet (their events have not
        /// completed).
        pending: usize,
    },
    /// An address that the pool did not hand out, or already freed.
    UnknownAddress {
        /// The address.
        addr: u64,
        /// Who asked.
        client: String,
    },
}

impl Error {
    pub(crate) fn invalid(what: impl Into<String>) -> Self {
        Error::InvalidArgument { what: what.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Plan { message, .. } => f.write_str(message),
            Error::OutOfMemory {
                backend,
                requested,
                free,
                detail,
            } => {
                write!(
                    f,
                    "{backend} backend: out of memory allocating {requested} bytes"
                )?;
                if let Some(free) = free {
                    write!(f, " ({free} bytes free)")?;
                }
                if let Some(detail) = detail {
                    write!(f, " [{detail}]")?;
                }
                Ok(())
            }
            Error::Driver {
                call,
                name,
                text,
                code,
            } => write!(f, "{call} failed: {name} ({code}): {text}"),
            Error::NoDevice { reason } => write!(f, "no CUDA device: {reason}"),
            Error::InvalidArgument { what } => f.write_str(what),
            Error::PoolExhausted {
                client,
                requested,
                align,
                limit,
                limit_bytes,
                in_use,
                free,
                largest_free,
                pending,
            } => {
                let whose = if *limit == "quota" {
                    "its"
                } else {
                    "the pool's"
                };
                write!(f, "client `{client}`: {requested} bytes (align {align}")?;
                // What the limits count is the request's size class, which may be over a limit
                // that `requested` is not (a pool of `capacity` bytes refusing `capacity`).
                #[cfg(feature = "std")]
                match crate::pool::reserved_bytes(*requested) {
                    Some(reserved) if reserved != *requested => {
                        write!(f, ", {reserved} bytes with its size class")?;
                    }
                    Some(_) => {}
                    None => f.write_str(", a size class past usize")?,
                }
                write!(
                    f,
                    ") would exceed {whose} {limit} of {limit_bytes} bytes ({in_use} in use); the \
                     pool has {free} bytes free, largest free block {largest_free} bytes"
                )?;
                if *pending > 0 {
                    write!(
                        f,
                        ", {pending} bytes freed and waiting for stream events before reuse \
                         (frees on other streams, graphs' replays)"
                    )?;
                }
                Ok(())
            }
            Error::UnknownAddress { addr, client } => write!(
                f,
                "client `{client}`: address {addr:#x} is not a live allocation of this pool \
                 (double free or foreign pointer)"
            ),
        }
    }
}

impl core::error::Error for Error {}

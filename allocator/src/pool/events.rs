//! The event log: every allocation, free and failed allocation, to the `log` facade, a
//! callback, or a CSV file in RMM's replay-log format.

use alloc::string::String;
use alloc::sync::Arc;
use core::fmt;
use std::cell::Cell;
use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::stream::StreamId;
use crate::error::Error;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolAction {
    /// An allocation succeeded.
    Allocate,
    /// An allocation was freed.
    Free,
    /// An allocation failed (over quota or capacity, or bad arguments).
    AllocateFailure,
}

impl PoolAction {
    /// The action as RMM's replay log spells it: `allocate`, `free`, `allocate failure`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolAction::Allocate => "allocate",
            PoolAction::Free => "free",
            PoolAction::AllocateFailure => "allocate failure",
        }
    }
}

impl fmt::Display for PoolAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of the event log.
#[derive(Debug, Clone, Copy)]
pub struct PoolEvent<'a> {
    /// The pool's name.
    pub pool: &'a str,
    /// What happened.
    pub action: PoolAction,
    /// The address handed out or freed; `0` for a failure.
    pub addr: u64,
    /// Bytes requested.
    pub size: usize,
    /// Bytes the allocation takes from the pool (rounded up); `0` for a failure.
    pub reserved: usize,
    /// The alignment in effect (`0` asked for is reported as 256).
    pub align: usize,
    /// The client that asked.
    pub client: &'a str,
    /// The allocation's tag, when tracking recorded one.
    pub tag: Option<&'a str>,
    /// The stream of the call.
    pub stream: StreamId,
    /// When it happened (wall clock).
    pub time: SystemTime,
    /// A small number naming the calling thread (1 for the first thread that used any pool,
    /// 2 for the next, ...).
    pub thread: u64,
    /// Why an allocation failed.
    pub error: Option<&'a Error>,
}

/// An event recorded under the pool's lock, delivered to its sink after the lock is released.
pub(super) struct Record {
    pub(super) sink: Arc<dyn EventSink>,
    pub(super) action: PoolAction,
    pub(super) addr: u64,
    pub(super) size: usize,
    pub(super) reserved: usize,
    pub(super) align: usize,
    pub(super) client: Arc<str>,
    pub(super) tag: Option<String>,
    pub(super) stream: StreamId,
    pub(super) time: SystemTime,
    pub(super) thread: u64,
    pub(super) error: Option<Error>,
}

impl Record {
    /// Hands the event to its sink; `false` when the sink panicked (the panic is caught).
    pub(super) fn deliver(&self, pool: &str) -> bool {
        let event = PoolEvent {
            pool,
            action: self.action,
            addr: self.addr,
            size: self.size,
            reserved: self.reserved,
            align: self.align,
            client: &self.client,
            tag: self.tag.as_deref(),
            stream: self.stream,
            time: self.time,
            thread: self.thread,
            error: self.error.as_ref(),
        };
        // The sink sees only its event; nothing of the pool is borrowed across the call.
        super::lock::caught(|| self.sink.event(&event)).is_ok()
    }
}

/// The calling thread's number in the event log.
pub(crate) fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    std::thread_local! {
        static NUMBER: Cell<u64> = const { Cell::new(0) };
    }
    NUMBER.with(|n| {
        if n.get() == 0 {
            n.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        n.get()
    })
}

/// Receives the event log. Any `Fn(&PoolEvent<'_>) + Send + Sync` is a sink.
///
/// The pool records each event under its lock, in the order in which it did things (a free is
/// always logged before the allocation that reuses its address), and calls the sink after
/// releasing the lock: one thread at a time, in that order. The call that caused an event
/// usually delivers it before it returns; while another thread is delivering, that thread
/// delivers it instead. So a sink may call back into the pool (the events of those calls
/// follow), and a slow sink holds up only the threads that deliver, never the pool's lock.
///
/// A sink that panics does not disturb the pool: the panic is caught, the event is dropped,
/// the call that caused it returns normally, and the first such panic of a pool is logged
/// (target `devarena::pool`, level `error`).
pub trait EventSink: Send + Sync {
    /// Takes one event.
    fn event(&self, event: &PoolEvent<'_>);
}

impl<F: Fn(&PoolEvent<'_>) + Send + Sync> EventSink for F {
    fn event(&self, event: &PoolEvent<'_>) {
        self(event)
    }
}

/// Writes every event to the `log` facade (target `devarena::pool`): allocations and frees at
/// `debug`, failures at `warn`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogEvents;

impl EventSink for LogEvents {
    fn event(&self, e: &PoolEvent<'_>) {
        match e.error {
            Some(error) => log::warn!(
                target: "devarena::pool",
                "pool `{}`: {} client={} size={} align={} stream={}: {error}",
                e.pool, e.action, e.client, e.size, e.align, e.stream
            ),
            None => log::debug!(
                target: "devarena::pool",
                "pool `{}`: {} client={} addr={:#x} size={} reserved={} align={} stream={}{}{}",
                e.pool, e.action, e.client, e.addr, e.size, e.reserved, e.align, e.stream,
                if e.tag.is_some() { " tag=" } else { "" },
                e.tag.unwrap_or("")
            ),
        }
    }
}

/// The event log as CSV with RMM's replay-log columns, `Thread,Time,Action,Pointer,Size,Stream`,
/// so RMM's replay tools and scripts written for them read it:
///
/// ```text
/// Thread,Time,Action,Pointer,Size,Stream
/// 1,14:03:07.512304,allocate,0x7f3a2c000000,1024,0x0
/// 1,14:03:07.512391,free,0x7f3a2c000000,1024,0x0
/// ```
///
/// `Thread` is the pool's thread number ([`PoolEvent::thread`]), `Time` the wall clock as
/// `HH:MM:SS.microseconds` (UTC), `Action` one of `allocate`, `free`, `allocate failure`,
/// `Pointer` and `Stream` hexadecimal, `Size` the bytes requested.
///
/// ```
/// use std::sync::Arc;
/// use devarena::pool::{CsvEventLog, Pool};
///
/// let csv = Arc::new(CsvEventLog::new(Vec::new())?);
/// let pool = Pool::builder(1 << 20).events(csv.clone()).build_host()?;
/// let a = pool.allocate(1000, 0)?;
/// pool.deallocate(a)?;
/// let text = csv.with_writer(|w| String::from_utf8(w.clone()).unwrap())?;
/// let lines: Vec<&str> = text.lines().collect();
/// assert_eq!(lines[0], "Thread,Time,Action,Pointer,Size,Stream");
/// assert!(lines[1].ends_with(&format!(",allocate,{a:#x},1000,0x0")));
/// assert!(lines[2].ends_with(&format!(",free,{a:#x},1000,0x0")));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CsvEventLog<W: Write + Send> {
    inner: Mutex<CsvInner<W>>,
    /// The [`thread_number`] of the thread that holds `inner` (0: none), set and cleared by
    /// that thread alone: a thread that reads its own number here holds the lock (a nested
    /// `with_writer` or `flush` is an error there, not a wait for ever).
    holder: AtomicU64,
    /// Rows of events that found `inner` held (by a `with_writer` closure or a writer that
    /// uses a pool logging here, on any thread): written in order by the holder when it
    /// releases it, or by the next holder before anything else. Never held while the writer
    /// or a closure runs.
    deferred: Mutex<String>,
}

#[derive(Debug)]
struct CsvInner<W> {
    writer: W,
    error: Option<io::Error>,
}

/// RMM's replay-log header.
pub const CSV_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

impl<W: Write + Send> CsvEventLog<W> {
    /// Writes the header to `writer` and logs to it from then on.
    pub fn new(mut writer: W) -> io::Result<Self> {
        writeln!(writer, "{CSV_HEADER}")?;
        Ok(CsvEventLog {
            inner: Mutex::new(CsvInner {
                writer,
                error: None,
            }),
            holder: AtomicU64::new(0),
            deferred: Mutex::new(String::new()),
        })
    }

    /// The writer, locked (waiting for another thread that holds it), with the rows deferred
    /// so far written first; `None` where the calling thread holds it already.
    fn lock(&self) -> Option<Held<'_, W>> {
        let me = thread_number();
        if self.holder.load(Ordering::Relaxed) == me {
            return None;
        }
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Some(self.held(inner, me))
    }

    /// The writer, locked, where no thread holds it (this one included); as
    /// [`lock`](Self::lock).
    fn try_lock(&self) -> Option<Held<'_, W>> {
        let inner = match self.inner.try_lock() {
            Ok(inner) => inner,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(self.held(inner, thread_number()))
    }

    fn held<'a>(&'a self, inner: std::sync::MutexGuard<'a, CsvInner<W>>, me: u64) -> Held<'a, W> {
        self.holder.store(me, Ordering::Relaxed);
        let mut held = Held { log: self, inner };
        held.write_deferred();
        held
    }

    /// Writes the rows deferred so far and releases the writer, then writes the rows deferred
    /// meanwhile if no other thread holds it: a row deferred because this thread held it is
    /// written here or by the next holder (each deferring thread looks again after it
    /// deferred, each holder after it released).
    fn release(&self, mut held: Held<'_, W>) {
        held.write_deferred();
        drop(held);
        while !lock_deferred(&self.deferred).is_empty() {
            match self.try_lock() {
                Some(held) => drop(held),
                None => break,
            }
        }
    }

    /// Runs `f` on the writer (to read a `Vec<u8>` back, for example).
    ///
    /// `f` may use a pool that logs here, on this thread or on others it waits for: the rows
    /// of what it does are written after it returns, before any later row (an event never
    /// waits for the writer). Called on a thread that holds the writer already (from
    /// an `f` of an outer call, or from the writer's own methods), it does not run `f` and
    /// returns an error of kind [`io::ErrorKind::Deadlock`]: the writer is in use there.
    pub fn with_writer<R>(&self, f: impl FnOnce(&mut W) -> R) -> io::Result<R> {
        let Some(mut held) = self.lock() else {
            return Err(in_use());
        };
        // A panic of `f` is passed on once the writer is released as on return, the rows
        // deferred meanwhile written (they would otherwise wait for the next use of the log).
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut held.inner.writer)));
        self.release(held);
        match result {
            Ok(result) => Ok(result),
            Err(payload) => std::panic::resume_unwind(payload),
        }
    }

    /// Flushes the writer and reports the first write error since the last call, if any.
    /// Called on a thread that holds the writer already, an error of kind
    /// [`io::ErrorKind::Deadlock`], as for [`with_writer`](Self::with_writer).
    pub fn flush(&self) -> io::Result<()> {
        let Some(mut held) = self.lock() else {
            return Err(in_use());
        };
        let mut result = held.inner.writer.flush();
        // Rows the writer's flush caused (a writer that uses a pool logging here), flushed too.
        if held.write_deferred() && result.is_ok() {
            result = held.inner.writer.flush();
        }
        let error = held.inner.error.take();
        self.release(held);
        match error {
            Some(error) => Err(error),
            None => result,
        }
    }

    /// The writer back, flushed, with every deferred row written; the first write error, if
    /// any.
    pub fn into_inner(self) -> io::Result<W> {
        let mut inner = self.inner.into_inner().unwrap_or_else(|e| e.into_inner());
        let deferred = self
            .deferred
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        if !deferred.is_empty() {
            if let Err(error) = inner.writer.write_all(deferred.as_bytes()) {
                inner.error.get_or_insert(error);
            }
        }
        if let Some(error) = inner.error.take() {
            return Err(error);
        }
        inner.writer.flush()?;
        Ok(inner.writer)
    }
}

/// A [`CsvEventLog`]'s writer, locked by the calling thread (marked its holder until dropped).
struct Held<'a, W: Write + Send> {
    log: &'a CsvEventLog<W>,
    inner: std::sync::MutexGuard<'a, CsvInner<W>>,
}

impl<W: Write + Send> Held<'_, W> {
    /// Writes the rows deferred so far, and those that writing them deferred (a writer that
    /// uses a pool logging here), up to [`DEFERRED_PASSES`] times: a writer that logs a row
    /// for every row it writes would never end. Whether anything was written.
    fn write_deferred(&mut self) -> bool {
        let mut wrote = false;
        for _ in 0..DEFERRED_PASSES {
            let rows = core::mem::take(&mut *lock_deferred(&self.log.deferred));
            if rows.is_empty() {
                break;
            }
            wrote = true;
            if let Err(error) = self.inner.writer.write_all(rows.as_bytes()) {
                self.inner.error.get_or_insert(error);
            }
        }
        wrote
    }
}

/// How many times [`Held::write_deferred`] looks again for rows that writing rows deferred.
const DEFERRED_PASSES: usize = 16;

impl<W: Write + Send> Drop for Held<'_, W> {
    fn drop(&mut self) {
        // Cleared before the lock is released (the guard drops after this).
        self.log.holder.store(0, Ordering::Relaxed);
    }
}

/// The error of a call that needs the writer on a thread that holds it already.
fn in_use() -> io::Error {
    io::Error::new(
        io::ErrorKind::Deadlock,
        "the CSV event log's writer is in use on this thread (called from inside with_writer's \
         closure or from the writer's methods)",
    )
}

fn lock_deferred(deferred: &Mutex<String>) -> std::sync::MutexGuard<'_, String> {
    deferred.lock().unwrap_or_else(|e| e.into_inner())
}

impl CsvEventLog<io::BufWriter<std::fs::File>> {
    /// Creates (truncates) the file at `path` and writes the header.
    pub fn create(path: impl AsRef<std::path::Path>) -> io::Result<Self> {
        Self::new(io::BufWriter::new(std::fs::File::create(path)?))
    }
}

/// `HH:MM:SS.ffffff` (UTC) of a wall-clock time.
pub fn format_time(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() % 86_400;
    alloc::format!(
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        since.subsec_micros()
    )
}

impl<W: Write + Send> EventSink for CsvEventLog<W> {
    fn event(&self, e: &PoolEvent<'_>) {
        if let Some(mut held) = self.try_lock() {
            if let Err(error) = write!(held.inner.writer, "{}", CsvRow(e)) {
                held.inner.error.get_or_insert(error);
            }
            self.release(held);
            return;
        }
        // Another thread holds the writer (or this one: the event comes from a pool that the
        // writer, or a `with_writer` closure, is using). Waiting for it could wait for ever
        // (its closure may wait for this thread): the row is deferred, and written by the
        // holder when it releases the writer, or here if it released it meanwhile.
        {
            let mut deferred = lock_deferred(&self.deferred);
            let _ = fmt::Write::write_fmt(&mut *deferred, format_args!("{}", CsvRow(e)));
        }
        if let Some(held) = self.try_lock() {
            self.release(held);
        }
    }
}

/// An event's row of the CSV log, its line end included.
struct CsvRow<'a, 'e>(&'a PoolEvent<'e>);

impl fmt::Display for CsvRow<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        writeln!(
            f,
            "{},{},{},{:#x},{},{:#x}",
            e.thread,
            format_time(e.time),
            e.action,
            e.addr,
            e.size,
            e.stream.0
        )
    }
}

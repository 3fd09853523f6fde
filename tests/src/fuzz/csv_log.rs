//! Fuzz target `csv_log`: a pool logging to a [`CsvEventLog`], read back.
//!
//! The input chooses the pool, a writer (an in-memory buffer, or one that fails after some
//! bytes, with a given error), and a sequence of allocations, frees (good and bad) on several
//! streams, tracking switches and flushes. Afterwards the log is parsed as RMM's replay CSV:
//! the header, then one line per event, in the order the pool did them, each with six fields
//! that say exactly what happened (thread, time, action, pointer, size, stream); replayed, the
//! log's live set is the pool's. A writer that fails loses only lines: the pool's calls all
//! succeed as before, the lines written are a prefix of the events, `flush` reports the first
//! error once.
//!
//! [`format_time`] is checked on its own against the arithmetic of a clock.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use devarena::Pool;
use devarena::pool::{
    AllocRequest, CSV_HEADER, CsvEventLog, EventSink, StreamId, Tracking, format_time,
};

use super::input::Input;

/// Operations per input at most.
const MAX_OPS: usize = 2000;

/// A writer that accepts `budget` bytes and then fails (if `fail` is set).
#[derive(Debug)]
struct Writer {
    bytes: Vec<u8>,
    budget: usize,
    fail: Option<io::ErrorKind>,
    /// Whether a write has failed (a write that failed wrote nothing).
    failed: bool,
}

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.fail {
            Some(kind) if self.bytes.len() + buf.len() > self.budget => {
                // Part of the buffer goes in before the failure, as with a full disk.
                let room = self.budget - self.bytes.len();
                if room > 0 {
                    self.bytes.extend_from_slice(&buf[..room]);
                    return Ok(room);
                }
                self.failed = true;
                Err(io::Error::new(kind, "injected write failure"))
            }
            _ => {
                self.bytes.extend_from_slice(buf);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the log must say about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    action: &'static str,
    addr: u64,
    size: usize,
    stream: StreamId,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    check_format_time(input.u64());

    let capacity = 256 * (1 + input.below(1024));
    let fail = match input.u8() % 4 {
        0 => Some(input.pick(&[
            io::ErrorKind::Other,
            io::ErrorKind::WriteZero,
            io::ErrorKind::StorageFull,
            io::ErrorKind::BrokenPipe,
        ])),
        _ => None,
    };
    let budget = CSV_HEADER.len() + 1 + input.below(4096);
    let log = Arc::new(
        CsvEventLog::new(Writer {
            bytes: Vec::new(),
            budget,
            fail,
            failed: false,
        })
        .expect("the header fits in the budget"),
    );
    let name = input.string(16);
    let pool = Pool::builder(capacity)
        .name(name)
        .log_leaks_on_drop(false)
        .events(log.clone() as Arc<dyn EventSink>)
        .build_host()
        .expect("a host pool of at most 256 KiB");

    let mut expected = Vec::new();
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    let mut ops = 0;
    while !input.is_empty() && ops < MAX_OPS {
        ops += 1;
        match input.u8() % 8 {
            0..=3 => {
                let size = input.size(capacity);
                let align = input.align();
                let stream = StreamId(input.u8() as u64 * 0x1000);
                let tag = input.string(8);
                match pool.allocate_with(AllocRequest::new(size, align).on(stream).tag(&tag)) {
                    Ok(addr) => {
                        live.insert(addr, size);
                        expected.push(Expected {
                            action: "allocate",
                            addr,
                            size,
                            stream,
                        });
                    }
                    Err(_) => expected.push(Expected {
                        action: "allocate failure",
                        addr: 0,
                        size,
                        stream,
                    }),
                }
            }
            4..=5 if !live.is_empty() => {
                let i = input.below(live.len());
                let addr = *live.keys().nth(i).expect("index below len");
                let stream = StreamId(input.u8() as u64);
                pool.deallocate_on(addr, stream)
                    .expect("a live allocation of a pool without a stream runtime");
                let size = live.remove(&addr).expect("live");
                expected.push(Expected {
                    action: "free",
                    addr,
                    size,
                    stream,
                });
            }
            6 => {
                // A bad free: not logged, changes nothing.
                let addr = pool.base() + input.u16() as u64;
                if !live.contains_key(&addr) {
                    assert!(pool.deallocate(addr).is_err());
                }
            }
            _ => {
                pool.set_tracking(if input.bool() {
                    Tracking::Tags
                } else {
                    Tracking::Off
                });
            }
        }
    }

    // The pool kept working whatever the writer did.
    let stats = pool.stats();
    assert_eq!(stats.live as usize, live.len());
    let failed = log.with_writer(|w| w.failed).unwrap();
    match log.flush() {
        Err(e) => {
            assert!(failed, "flush reported {e} but no write failed");
            assert_eq!(Some(e.kind()), fail);
            log.flush().expect("the error is reported once");
        }
        Ok(()) => assert!(!failed, "a write failed and flush did not say so"),
    }
    let text = log.with_writer(|w| w.bytes.clone()).unwrap();
    let text = String::from_utf8(text).expect("the log is ASCII");
    check_log(&text, &expected, failed);
    if !failed {
        let mut replayed: BTreeMap<u64, usize> = BTreeMap::new();
        for e in &expected {
            match e.action {
                "allocate" => assert!(replayed.insert(e.addr, e.size).is_none()),
                "free" => assert_eq!(replayed.remove(&e.addr), Some(e.size)),
                _ => {}
            }
        }
        let leaks: Vec<(u64, usize)> = pool
            .leak_report()
            .leaks
            .iter()
            .map(|l| (l.addr, l.size))
            .collect();
        assert_eq!(leaks, replayed.into_iter().collect::<Vec<_>>());
    }
    for addr in live.into_keys() {
        pool.deallocate(addr).expect("freeing what is live");
    }
}

/// Parses the CSV and compares it with the events; with a failing writer only a prefix of the
/// lines (the last one possibly cut) is there.
fn check_log(text: &str, expected: &[Expected], may_be_cut: bool) {
    let mut lines = text.split('\n');
    assert_eq!(lines.next(), Some(CSV_HEADER));
    let lines: Vec<&str> = lines.collect();
    // The text ends with a newline when complete: the last piece is empty (or cut).
    let (complete, last) = lines.split_at(lines.len() - 1);
    if !may_be_cut {
        assert_eq!(last, [""], "the log ends with a newline");
        assert_eq!(complete.len(), expected.len(), "one line per event");
    }
    assert!(complete.len() <= expected.len());
    let mut threads = Vec::new();
    for (line, e) in complete.iter().zip(expected) {
        let fields: Vec<&str> = line.split(',').collect();
        assert_eq!(fields.len(), 6, "{line:?}");
        let thread: u64 = fields[0].parse().expect("a thread number");
        assert!(thread >= 1);
        threads.push(thread);
        check_time_field(fields[1]);
        assert_eq!(fields[2], e.action, "{line:?}");
        assert_eq!(fields[3], format!("{:#x}", e.addr), "{line:?}");
        assert_eq!(fields[4], e.size.to_string(), "{line:?}");
        assert_eq!(fields[5], format!("{:#x}", e.stream.0), "{line:?}");
    }
    threads.dedup();
    assert!(
        threads.len() <= 1,
        "one thread wrote every line: {threads:?}"
    );
}

/// `HH:MM:SS.ffffff`.
fn check_time_field(time: &str) {
    let b = time.as_bytes();
    assert_eq!(b.len(), 15, "{time:?}");
    for (i, &c) in b.iter().enumerate() {
        match i {
            2 | 5 => assert_eq!(c, b':', "{time:?}"),
            8 => assert_eq!(c, b'.', "{time:?}"),
            _ => assert!(c.is_ascii_digit(), "{time:?}"),
        }
    }
    let field = |r: std::ops::Range<usize>| time[r].parse::<u64>().expect("digits");
    assert!(
        field(0..2) < 24 && field(3..5) < 60 && field(6..8) < 60,
        "{time:?}"
    );
}

/// `format_time` against a clock's arithmetic, for any time (before the epoch it reads 0).
fn check_format_time(micros: u64) {
    let since = Duration::from_micros(micros % (1 << 62));
    let Some(time) = UNIX_EPOCH.checked_add(since) else {
        return;
    };
    let text = format_time(time);
    let secs = since.as_secs();
    let want = format!(
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60,
        since.subsec_micros()
    );
    assert_eq!(text, want);
    check_time_field(&text);
    if let Some(before) = UNIX_EPOCH.checked_sub(since) {
        if since > Duration::ZERO {
            assert_eq!(format_time(before), "00:00:00.000000");
        }
    }
}

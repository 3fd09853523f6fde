//! Fuzz target `torch_abi`: the logic of the PyTorch C ABI (`allocator/examples/
//! torch_allocator/abi.rs`, compiled here as [`abi`]) on host pools, and the parser of
//! `DEVARENA_POOL_BYTES`.
//!
//! The input first gives a text that both [`abi::parse_bytes`] and an independent reading of
//! the same grammar parse (they must agree, and a number written with a unit must read back),
//! then a sequence of calls on a table of per-device pools, some of whose creation fails:
//! allocations on any device (in range or not), frees of live, stale, foreign and null
//! addresses with the right size or another, on the right device or another, and stats and
//! report queries. A model of the segments predicts every outcome: a free succeeds exactly for
//! a live segment of that device with its recorded size, a refused free changes nothing, and
//! the stats codes say which devices have a pool, none yet, or a failed one.

#[path = "../../../allocator/examples/torch_allocator/abi.rs"]
pub mod abi;

use std::collections::BTreeMap;

use devarena::Pool;
use devarena::pool::{StreamId, Tracking};

use super::input::Input;
use abi::{MAX_DEVICES, Pools, STATS_INVALID_ARGUMENT, STATS_NO_POOL_YET, STATS_POOL_FAILED};

/// Calls per input at most.
const MAX_OPS: usize = 1000;
/// Devices the calls choose from: in range, at the edges, and out of it.
const DEVICES: [i32; 7] = [0, 1, 2, 63, 64, -1, i32::MAX];

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let text = input.string(24);
    check_parse(&text);
    let n = input.u64() as usize;
    let unit = input.pick(&["", "b", "K", "kb", "KiB", "M", "mib", "G", "GB", "T", "tib"]);
    check_round_trip(n, unit, input.bool());
    calls(&mut input);
}

/// An independent reading of the grammar: blanks, decimal digits, blanks, a unit.
fn reference_parse(text: &str) -> Option<u128> {
    let t = text.trim();
    let end = t
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(t.len());
    if end == 0 || end > 39 {
        return None;
    }
    let mut n: u128 = 0;
    for b in t[..end].bytes() {
        n = n.checked_mul(10)?.checked_add((b - b'0') as u128)?;
    }
    let unit = t[end..].trim().to_ascii_lowercase();
    let shift = ["", "k", "m", "g", "t"].iter().position(|u| {
        unit == *u || unit == format!("{u}b") || (!u.is_empty() && unit == format!("{u}ib"))
    })?;
    Some(n << (10 * shift))
}

fn check_parse(text: &str) {
    let ours = abi::parse_bytes(text);
    match (ours, reference_parse(text)) {
        (Ok(n), Some(want)) => assert_eq!(n as u128, want, "{text:?}"),
        (Err(e), Some(want)) => {
            // Only a number that does not fit may be refused, and the message says which.
            assert!(want > usize::MAX as u128, "{text:?} refused: {e}");
            assert!(e.contains("DEVARENA_POOL_BYTES"), "{e}");
        }
        (Ok(n), None) => panic!("{text:?} read as {n}, which the grammar does not allow"),
        (Err(e), None) => assert!(e.contains("DEVARENA_POOL_BYTES"), "{e}"),
    }
}

fn check_round_trip(n: usize, unit: &str, spaced: bool) {
    let text = if spaced {
        format!("  {n} {unit} ")
    } else {
        format!("{n}{unit}")
    };
    let shift = match unit.to_ascii_lowercase().chars().next() {
        Some('k') => 10,
        Some('m') => 20,
        Some('g') => 30,
        Some('t') => 40,
        _ => 0,
    };
    match n.checked_mul(1 << shift) {
        Some(bytes) => assert_eq!(abi::parse_bytes(&text), Ok(bytes), "{text:?}"),
        None => assert!(abi::parse_bytes(&text).unwrap_err().contains("overflows")),
    }
}

/// What the model knows of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Device {
    NoPoolYet,
    Failed,
    Ready {
        capacity: usize,
        segments: BTreeMap<u64, usize>,
        allocations: u64,
        frees: u64,
        failures: u64,
    },
}

fn quiet(_: &str) {}

fn calls(input: &mut Input<'_>) {
    let pools = Pools::new();
    let mut model: BTreeMap<i32, Device> = BTreeMap::new();
    let mut stale: Vec<(u64, usize)> = Vec::new();
    let mut ops = 0;
    while !input.is_empty() && ops < MAX_OPS {
        ops += 1;
        let device = input.pick(&DEVICES);
        let in_range = (0..MAX_DEVICES as i32).contains(&device);
        let state = model.entry(device).or_insert(Device::NoPoolYet).clone();
        // SAFETY: host pools only: no CUDA stream runtime passes the id to the driver.
        let stream = unsafe { abi::LiveStream::new(StreamId(input.u8() as u64)) };
        match input.u8() % 8 {
            0..=2 => {
                let size = input.size(1 << 20);
                let capacity = 256 * input.below(8192);
                let fails = input.u8() % 8 == 0;
                let created = std::cell::Cell::new(false);
                let create = |d: usize| {
                    created.set(true);
                    assert_eq!(d as i32, device);
                    if fails {
                        return Err("creation refused".to_string());
                    }
                    Pool::builder(capacity)
                        .tracking(Tracking::Tags)
                        .log_leaks_on_drop(false)
                        .build_host()
                        .map_err(|e| e.to_string())
                };
                let result = pools.alloc(size, device, stream, create, input.bool(), &quiet);
                assert_eq!(
                    created.get(),
                    in_range && state == Device::NoPoolYet,
                    "a pool is created once, on the first allocation"
                );
                let state = if created.get() {
                    if fails || capacity == 0 {
                        Device::Failed
                    } else {
                        Device::Ready {
                            capacity,
                            segments: BTreeMap::new(),
                            allocations: 0,
                            frees: 0,
                            failures: 0,
                        }
                    }
                } else {
                    state
                };
                let state = match (state, result) {
                    (Device::Ready { .. }, _) if !in_range => unreachable!(),
                    (
                        Device::Ready {
                            capacity,
                            mut segments,
                            allocations,
                            frees,
                            failures,
                        },
                        result,
                    ) => match result {
                        Ok(addr) => {
                            assert_eq!(addr % abi::SEGMENT_ALIGN as u64, 0);
                            assert!(segments.insert(addr, size).is_none(), "{addr:#x} twice");
                            stale.retain(|&(a, _)| a != addr);
                            Device::Ready {
                                capacity,
                                segments,
                                allocations: allocations + 1,
                                frees,
                                failures,
                            }
                        }
                        Err(e) => {
                            assert!(e.contains("devarena_torch_alloc"), "{e}");
                            Device::Ready {
                                capacity,
                                segments,
                                allocations,
                                frees,
                                failures: failures + 1,
                            }
                        }
                    },
                    (other, result) => {
                        assert!(result.is_err(), "{device}: no pool, yet {result:?}");
                        other
                    }
                };
                if in_range {
                    model.insert(device, state);
                }
            }
            3..=4 => {
                // A live segment (of any device), a stale one, a foreign address or null;
                // with its size or another.
                let live: Vec<(i32, u64, usize)> = model
                    .iter()
                    .flat_map(|(&d, s)| match s {
                        Device::Ready { segments, .. } => segments
                            .iter()
                            .map(|(&a, &z)| (d, a, z))
                            .collect::<Vec<_>>(),
                        _ => Vec::new(),
                    })
                    .collect();
                let (addr, size, device) = match input.u8() % 6 {
                    0..=2 if !live.is_empty() => {
                        let (d, a, z) = live[input.below(live.len())];
                        let d = if input.u8() % 8 == 0 { device } else { d };
                        (a, z, d)
                    }
                    3 if !stale.is_empty() => {
                        let (a, z) = stale[input.below(stale.len())];
                        (a, z, device)
                    }
                    4 => (0, input.size(1 << 20), device),
                    _ => (input.u64(), input.size(1 << 20), device),
                };
                let size = if input.u8() % 4 == 0 {
                    input.size(1 << 20)
                } else {
                    size
                };
                let result = pools.free(addr, size, device, stream);
                let entry = model.get_mut(&device);
                match entry {
                    _ if addr == 0 => assert_eq!(result, Ok(()), "null is ignored"),
                    Some(Device::Ready {
                        segments, frees, ..
                    }) if segments.get(&addr) == Some(&size) => {
                        result.unwrap_or_else(|e| panic!("freeing a live segment: {e}"));
                        segments.remove(&addr);
                        *frees += 1;
                        stale.push((addr, size));
                        if stale.len() > 32 {
                            stale.remove(0);
                        }
                    }
                    _ => {
                        let e = result.expect_err("a free the ledger must refuse");
                        assert!(e.contains("devarena_torch_free"), "{e}");
                    }
                }
            }
            5..=6 => match (pools.stats(device), &state) {
                (Err(code), _) if !in_range => assert_eq!(code, STATS_INVALID_ARGUMENT),
                (Err(code), Device::NoPoolYet) => assert_eq!(code, STATS_NO_POOL_YET),
                (Err(code), Device::Failed) => assert_eq!(code, STATS_POOL_FAILED),
                (
                    Ok(stats),
                    Device::Ready {
                        capacity,
                        segments,
                        allocations,
                        frees,
                        failures,
                    },
                ) => {
                    assert_eq!(stats.capacity as usize, *capacity);
                    assert_eq!(stats.live as usize, segments.len());
                    assert_eq!(
                        (stats.allocations, stats.frees, stats.failures),
                        (*allocations, *frees, *failures)
                    );
                    let requested: usize = segments.values().sum();
                    assert!(stats.in_use as usize >= requested);
                    let torch = pools.existing(device).expect("a pool");
                    assert_eq!(torch.segments(), segments.len());
                }
                (got, state) => panic!("stats of {device} ({state:?}): {got:?}"),
            },
            _ => {
                let report = pools.report(device);
                match (&state, report) {
                    (Device::Ready { segments, .. }, Some((text, live))) if in_range => {
                        assert_eq!(live as usize, segments.len());
                        assert!(text.contains("live allocation"), "{text}");
                    }
                    (Device::Ready { .. }, None) => panic!("no report for a device with a pool"),
                    (_, None) => {}
                    (state, Some(r)) => panic!("a report for {device} ({state:?}): {r:?}"),
                }
            }
        }
    }
}

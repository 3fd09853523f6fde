//! The tables (or one JSON object) of a run, and the targets they are checked against.

use std::time::Duration;

use crate::Args;
use crate::footprint::{self, FootprintRow};
use crate::setup::{self, SetupRow};
use crate::steady::{self, SteadyRow};

/// One target, checked on this run.
pub struct Target {
    pub what: String,
    pub value: String,
    pub target: &'static str,
    pub met: bool,
}

/// Every measurement of a run.
pub struct Tables {
    pub device: String,
    pub setup: Vec<SetupRow>,
    pub steady: Vec<SteadyRow>,
    pub footprint: Vec<FootprintRow>,
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `s` as the inside of a JSON string.
pub fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A JSON array of already written values.
fn array(values: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", values.into_iter().collect::<Vec<_>>().join(","))
}

impl Tables {
    fn targets(&self) -> Vec<Target> {
        let mut all = setup::targets(&self.setup);
        all.extend(steady::targets(&self.steady));
        all.extend(footprint::targets(&self.footprint));
        all
    }

    pub fn print(&self, args: &Args) {
        println!("devarena pipeline benchmark");
        println!("device: {}", self.device);
        println!(
            "medians of {} interleaved rounds (setup) and {} frames per method (steady state){}",
            args.rounds,
            args.frames,
            if args.quick {
                " — a quick run under a test runner; run the bench itself for the figures"
            } else {
                ""
            }
        );
        println!();
        setup::print(&self.setup);
        println!();
        steady::print(&self.steady);
        println!();
        footprint::print(&self.footprint);
        println!();
        println!("targets");
        for t in self.targets() {
            println!(
                "  {:<4} {:<72} {:<36} target {}",
                if t.met { "met" } else { "MISS" },
                t.what,
                t.value,
                t.target
            );
        }
    }

    pub fn json(&self, args: &Args) -> String {
        let targets = self.targets().into_iter().map(|t| {
            format!(
                "{{\"what\":\"{}\",\"value\":\"{}\",\"target\":\"{}\",\"met\":{}}}",
                esc(&t.what),
                esc(&t.value),
                esc(t.target),
                t.met
            )
        });
        format!(
            "{{\"device\":\"{}\",\"rounds\":{},\"frames\":{},\"quick\":{},\"setup\":{},\"steady\":{},\"footprint\":{},\"targets\":{}}}",
            esc(&self.device),
            args.rounds,
            args.frames,
            args.quick,
            array(self.setup.iter().map(setup::json)),
            array(self.steady.iter().map(|r| steady::json(&self.steady, r))),
            array(self.footprint.iter().map(footprint::json)),
            array(targets)
        )
    }
}

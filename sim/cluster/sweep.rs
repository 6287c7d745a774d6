//! Many seeds in a row: `quorate sim cluster --seeds N`, and the budgeted sweep of
//! `cargo test`. Failing seeds are listed with the command that reproduces each.

use super::{history::secs, reproduce, run, same_trace, OpCounts, Options, Report};
use std::fmt::Write as _;
use std::time::Duration;

/// What a sweep found.
#[derive(Debug, Default)]
pub struct Sweep {
    pub seeds: u64,
    pub simulated: Duration,
    pub ops: OpCounts,
    pub faults: u64,
    pub fast_excess: u64,
    /// Failing seeds and their violations.
    pub failing: Vec<(u64, Vec<String>)>,
}

/// Another run's trace of the same options (the CLI runs itself as a child process: see
/// docs/verification.md on why the repeat runs in a fresh process).
pub type Repeat<'a> = &'a dyn Fn(&Options) -> Result<String, String>;

/// Runs seeds `first..first + count` with `base`'s other options. With `twice`, each seed
/// runs a second time and a trace that differs is a violation (determinism).
/// `progress` is called after each seed.
pub fn sweep(
    base: &Options,
    first: u64,
    count: u64,
    twice: Option<Repeat<'_>>,
    mut progress: impl FnMut(u64, &Report),
) -> Sweep {
    let mut s = Sweep::default();
    for (i, seed) in (first..first.saturating_add(count)).enumerate() {
        let opts = Options {
            seed,
            ..base.clone()
        };
        let mut report = run(&opts);
        if let Some(repeat) = twice {
            match repeat(&opts) {
                Ok(again) => {
                    if let Some(diff) = same_trace(&report.history.trace, &again) {
                        report.violations.push(format!(
                            "determinism: the same seed gave another trace at {diff}"
                        ));
                    }
                }
                Err(e) => report
                    .violations
                    .push(format!("determinism: the repeat run failed: {e}")),
            }
        }
        s.seeds += 1;
        s.simulated += report.simulated;
        s.faults += report.faults;
        s.fast_excess += report.fast_excess;
        let o = &mut s.ops;
        o.invoked += report.ops.invoked;
        o.allowed += report.ops.allowed;
        o.denied += report.ops.denied;
        o.failed += report.ops.failed;
        o.unknown += report.ops.unknown;
        o.unknown_admitted += report.ops.unknown_admitted;
        if !report.violations.is_empty() {
            s.failing.push((seed, report.violations.clone()));
        }
        progress(i as u64 + 1, &report);
    }
    s
}

impl Sweep {
    /// The human summary: totals, then every failing seed with its reproduction command.
    pub fn summary(&self, base: &Options) -> String {
        let mut t = String::new();
        let o = &self.ops;
        let _ = writeln!(
            t,
            "quorate sim cluster: {} seed(s), {} s simulated ({:.2} h)",
            self.seeds,
            secs(self.simulated.as_nanos() as u64),
            self.simulated.as_secs_f64() / 3600.0
        );
        let _ = writeln!(
            t,
            "operations: {} invoked, {} allowed, {} denied, {} failed, {} unknown ({} of them applied as admissions)",
            o.invoked, o.allowed, o.denied, o.failed, o.unknown, o.unknown_admitted
        );
        let _ = writeln!(
            t,
            "faults: {}; fast admissions not in the log (within bound): {}",
            self.faults, self.fast_excess
        );
        let violations: usize = self.failing.iter().map(|f| f.1.len()).sum();
        let _ = writeln!(
            t,
            "violations: {violations} in {} seed(s)",
            self.failing.len()
        );
        for (seed, v) in &self.failing {
            let _ = writeln!(t, "\nseed {seed} FAILED:");
            for line in v.iter().take(20) {
                let _ = writeln!(t, "  - {line}");
            }
            if v.len() > 20 {
                let _ = writeln!(t, "  ... and {} more", v.len() - 20);
            }
            let opts = Options {
                seed: *seed,
                ..base.clone()
            };
            let _ = writeln!(t, "  reproduce: {}", reproduce(&opts));
        }
        t
    }
}

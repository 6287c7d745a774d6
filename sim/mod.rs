//! The workload simulator behind `quorate sim ...`.
//!
//! Why it exists: the algorithms differ in *which* requests they admit, not just how many, and
//! the differences only show under concrete arrival patterns. The simulator feeds the same
//! arrivals to every policy of a policy set — each key with its own state per policy, cost 1
//! per request — and reports what each admitted, so the trade-offs can be seen in one command
//! instead of argued about:
//!
//! - [`replay`]: arrivals read from a trace file ([`trace`] parses it, exactly, into shard time);
//! - [`poisson`]: seeded random arrivals, where window limiters reject Poisson clumping that
//!   the bucket algorithms absorb;
//! - [`boundary`]: the burst at a fixed window's boundary, `2 x limit` in two milliseconds.
//!
//! The simulator drives the real algorithm core ([`crate::limiter`]) with integer shard time;
//! floats appear only where arrivals are generated ([`poisson`]) and where results are drawn
//! ([`plot`]) or shown as percentages ([`report`]), never in limiter state.
//!
//! Each submodule has one job; this module holds the types they share and the three entry
//! points the CLI calls.

pub mod boundary;
pub mod cluster;
pub mod plot;
pub mod poisson;
pub mod report;
pub mod run;
pub mod trace;
pub mod window;

use crate::limiter::Nanos;
use crate::policy::{PolicyFileError, PolicySet};
use std::path::{Path, PathBuf};

pub use report::Report;
pub use window::max_in_any_window;

/// One request: when it arrives (shard time) and which key it is for (an index into
/// [`Workload::keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at: Nanos,
    pub key: usize,
}

/// The arrivals of a scenario, sorted by time, with their keys interned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// Key names, in order of first appearance.
    pub keys: Vec<String>,
    /// Arrivals in non-decreasing time order.
    pub arrivals: Vec<Arrival>,
}

/// Why a simulation could not run. Every variant but [`SimError::Plot`] is bad input.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    #[error("{path}: {source}")]
    Policy {
        path: String,
        source: PolicyFileError,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("cannot write plot {path}: {message}")]
    Plot { path: String, message: String },
}

impl SimError {
    /// True when the error is the user's input (exit code 2), not a failure to write output.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, SimError::Plot { .. })
    }
}

/// Loads the policy file if one is given, else the comparison set
/// ([`PolicySet::comparison`]).
pub fn load_policies(path: Option<&Path>) -> Result<PolicySet, SimError> {
    match path {
        None => Ok(PolicySet::comparison()),
        Some(p) => PolicySet::load(p).map_err(|source| SimError::Policy {
            path: p.display().to_string(),
            source,
        }),
    }
}

/// `quorate sim replay`: runs the policy set over the arrivals of a trace file.
/// `keep_times` is needed only for a plot (see [`run::run`]).
pub fn replay(
    trace_path: &Path,
    policies: Option<&Path>,
    keep_times: bool,
) -> Result<Report, SimError> {
    let set = load_policies(policies)?;
    let workload = trace::load(trace_path)?;
    let mut notes = vec![format!(
        "{} arrivals, {} {}, {} s span; cost 1 each",
        workload.arrivals.len(),
        workload.keys.len(),
        if workload.keys.len() == 1 {
            "key"
        } else {
            "keys"
        },
        report::seconds(span(&workload)),
    )];
    notes.push(policies_note(policies));
    Ok(Report {
        title: format!("quorate sim replay {}", trace_path.display()),
        notes,
        results: run::run(&set, &workload, keep_times),
    })
}

/// The options of `quorate sim poisson`.
#[derive(Debug, Clone)]
pub struct PoissonOptions {
    /// Total arrivals per second, across all keys.
    pub rate: f64,
    /// How long to generate arrivals for.
    pub duration: Nanos,
    pub seed: u64,
    pub keys: u64,
    pub policies: Option<PathBuf>,
    /// Keep every arrival's time in the results, for a plot (see [`run::run`]).
    pub keep_times: bool,
}

/// `quorate sim poisson`: runs the policy set over seeded Poisson arrivals.
pub fn poisson(opts: &PoissonOptions) -> Result<Report, SimError> {
    let set = load_policies(opts.policies.as_deref())?;
    let workload = poisson::arrivals(opts.rate, opts.duration, opts.seed, opts.keys)?;
    let notes = vec![
        format!(
            "rate {}/s for {} s, seed {}, {} {} (each key sees rate/keys): {} arrivals; cost 1 each",
            opts.rate,
            report::seconds(opts.duration),
            opts.seed,
            opts.keys,
            if opts.keys == 1 { "key" } else { "keys" },
            workload.arrivals.len(),
        ),
        policies_note(opts.policies.as_deref()),
    ];
    Ok(Report {
        title: "quorate sim poisson".to_string(),
        notes,
        results: run::run(&set, &workload, opts.keep_times),
    })
}

/// `quorate sim boundary`: the burst-at-the-boundary scenario (see [`boundary`]).
pub fn boundary() -> Report {
    let set = boundary::policies();
    let workload = boundary::arrivals();
    Report {
        title: "quorate sim boundary".to_string(),
        notes: boundary::notes(),
        results: run::run(&set, &workload, true),
    }
}

fn span(w: &Workload) -> Nanos {
    match (w.arrivals.first(), w.arrivals.last()) {
        (Some(a), Some(b)) => b.at - a.at,
        _ => 0,
    }
}

fn policies_note(path: Option<&Path>) -> String {
    match path {
        Some(p) => format!("policies from {}", p.display()),
        None => "comparison set: 10 per 1 s for the window algorithms; token_bucket and gcra 10/s with capacity 20".to_string(),
    }
}

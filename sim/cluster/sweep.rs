//! Many seeds: `quorate sim cluster --seeds N`, and the budgeted sweep of `cargo test`.
//!
//! Each seed runs in a process of its own (the binary's `sim cluster --seeds 1 --json`),
//! `jobs` of them at once. Only the first simulation in a process is bit-reproducible
//! (docs/verification.md): a seed run after others in the same process took another path
//! than the printed command that was meant to reproduce it. A fresh process per seed makes
//! every seed of a sweep exactly its command, and a panicking node (which aborts its
//! process) fails its seed instead of the sweep. Failing seeds are listed with the command.

use super::{history::secs, reproduce, same_trace, OpCounts, Options, Report};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// One seed's outcome, as a child process reports it (one JSON line on stdout).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedResult {
    pub seed: u64,
    /// Simulated nanoseconds, healing included.
    pub simulated_ns: u64,
    pub ops: OpCounts,
    pub faults: u64,
    /// Absent from an older binary's result: 0.
    #[serde(default)]
    pub handovers: u64,
    #[serde(default)]
    pub handovers_failed: u64,
    #[serde(default)]
    pub disk_stalls: u64,
    #[serde(default)]
    pub stall_crashes: u64,
    #[serde(default)]
    pub failovers: Vec<u64>,
    #[serde(default)]
    pub failovers_unresolved: u64,
    #[serde(default)]
    pub replaced: u64,
    #[serde(default)]
    pub removed_refusals: u64,
    #[serde(default)]
    pub snapshots_installed: u64,
    #[serde(default)]
    pub votes: u64,
    #[serde(default)]
    pub forwarded: u64,
    #[serde(default)]
    pub forward_calls: u64,
    pub fast_excess: u64,
    pub violations: Vec<String>,
}

impl SeedResult {
    pub fn of(r: &Report) -> SeedResult {
        SeedResult {
            seed: r.seed,
            simulated_ns: r.simulated.as_nanos() as u64,
            ops: r.ops,
            faults: r.faults,
            handovers: r.handovers,
            handovers_failed: r.handovers_failed,
            disk_stalls: r.disk_stalls,
            stall_crashes: r.stall_crashes,
            failovers: r.failovers.clone(),
            failovers_unresolved: r.failovers_unresolved,
            replaced: r.replaced,
            removed_refusals: r.removed_refusals,
            snapshots_installed: r.snapshots_installed,
            votes: r.votes,
            forwarded: r.forwarded,
            forward_calls: r.forward_calls,
            fast_excess: r.fast_excess,
            violations: r.violations.clone(),
        }
    }
}

/// What a sweep found.
#[derive(Debug, Default)]
pub struct Sweep {
    pub seeds: u64,
    pub simulated: Duration,
    pub ops: OpCounts,
    pub faults: u64,
    pub handovers: u64,
    pub handovers_failed: u64,
    /// Disk stalls of `--disk-stalls`, and those that ended in a crash.
    pub disk_stalls: u64,
    pub stall_crashes: u64,
    /// Failover times after the nemesis crashed a shard's leader (see
    /// `Report::failovers`), in ns, and the shards left without another leader.
    pub failovers: Vec<u64>,
    pub failovers_unresolved: u64,
    pub replaced: u64,
    /// The members' refusals of the removed node's requests (see `Report::removed_refusals`).
    pub removed_refusals: u64,
    /// Snapshots the nodes installed (see `Report::snapshots_installed`).
    pub snapshots_installed: u64,
    /// Votes checked (see `Report::votes`).
    pub votes: u64,
    /// Checks forwarded and the calls that carried them (see `Report::forwarded`).
    pub forwarded: u64,
    pub forward_calls: u64,
    pub fast_excess: u64,
    /// Failing seeds and their violations, by seed.
    pub failing: Vec<(u64, Vec<String>)>,
}

/// How a sweep runs its seeds.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The `quorate` binary that runs one seed per process.
    pub exe: PathBuf,
    /// Seeds run at once (each in its own process).
    pub jobs: usize,
    /// Run each seed twice (two fresh processes); a trace that differs is a violation.
    pub twice: bool,
    /// Write the last seed's event trace here.
    pub trace_last: Option<PathBuf>,
    /// Start no further seed once one has failed (a test's sweep: one failing seed already
    /// fails it, and a broken build then fails in seconds instead of running every seed;
    /// seeds already running finish; `trace_last` is then not written, as the last seed
    /// never ran). The CLI runs them all, to list every failing seed.
    pub stop_at_first_failure: bool,
}

/// "median M s, 90th percentile P s, max X s" of failover times (ns); None without any.
pub fn failover_spread(ns: &[u64]) -> Option<String> {
    let mut v = ns.to_vec();
    v.sort_unstable();
    // Nearest rank: the smallest time at least q % of them are within.
    let at = |q: usize| v[(v.len() * q).div_ceil(100).max(1) - 1];
    let max = *v.last()?;
    Some(format!(
        "median {} s, 90th percentile {} s, max {} s",
        secs(at(50)),
        secs(at(90)),
        secs(max)
    ))
}

/// The child command line that runs `opts` (one seed) and prints its [`SeedResult`].
fn child(exe: &Path, opts: &Options, trace: Option<&Path>) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["sim", "cluster", "--seeds", "1", "--json"])
        .args(["--seed", &opts.seed.to_string()])
        .args(["--duration", &format!("{}ns", opts.duration.as_nanos())])
        .args(["--nodes", &opts.nodes.to_string()])
        .args(["--shards", &opts.shards.to_string()])
        .args(["--clients", &opts.clients.to_string()]);
    cmd.args(["--sharding", opts.sharding.name()]);
    cmd.args(opts.switches());
    if let Some(t) = trace {
        cmd.arg("--trace").arg(t);
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs one seed in a fresh process. A process that dies without its report (a node's
/// panic aborts the simulation) gives a failing result that quotes its last words.
pub fn run_in_child(exe: &Path, opts: &Options, trace: Option<&Path>) -> SeedResult {
    let failed = |why: String| SeedResult {
        seed: opts.seed,
        violations: vec![why],
        ..SeedResult::default()
    };
    let out = match child(exe, opts, trace).output() {
        Ok(o) => o,
        Err(e) => return failed(format!("cannot run {}: {e}", exe.display())),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().rev().find(|l| l.starts_with('{'));
    match last.map(serde_json::from_str::<SeedResult>) {
        Some(Ok(r)) => r,
        _ => {
            // The first panic and its message, else the last lines.
            let stderr = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = stderr.lines().collect();
            let words = match lines.iter().position(|l| l.contains("panicked at")) {
                Some(i) => lines[i..lines.len().min(i + 2)].join(" "),
                None => lines[lines.len().saturating_sub(4)..].join(" | "),
            };
            failed(format!(
                "the run died without a report ({}): {}",
                out.status,
                words.trim()
            ))
        }
    }
}

fn temp_trace(seed: u64, tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "quorate-sim-{}-{seed}-{tag}.txt",
        std::process::id()
    ))
}

/// One seed per the plan: once, or twice with the traces compared.
fn run_seed(plan: &Plan, opts: &Options, last: bool) -> SeedResult {
    let keep = plan.trace_last.as_deref().filter(|_| last);
    if !plan.twice {
        return run_in_child(&plan.exe, opts, keep);
    }
    let (a, b) = (temp_trace(opts.seed, "a"), temp_trace(opts.seed, "b"));
    let mut r = run_in_child(&plan.exe, opts, Some(&a));
    // The repeat counts only by its trace: equal traces mean equal histories and checks.
    run_in_child(&plan.exe, opts, Some(&b));
    match (std::fs::read_to_string(&a), std::fs::read_to_string(&b)) {
        (Ok(x), Ok(y)) => {
            if let Some(diff) = same_trace(&x, &y) {
                r.violations.push(format!(
                    "determinism: the same seed gave another trace at {diff}"
                ));
            }
            if let Some(k) = keep {
                let _ = std::fs::write(k, x);
            }
        }
        _ => r
            .violations
            .push("determinism: a run left no trace to compare".into()),
    }
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
    r
}

/// Runs seeds `first..first + count` with `base`'s other options (`base.clock_script` must be
/// empty: a child cannot be given one), `plan.jobs` at a time, each in its own process.
/// `progress` is called after each seed, in the order they finish. With
/// `plan.stop_at_first_failure` the sweep may end early: [`Sweep::seeds`] says how many ran.
pub fn sweep(
    base: &Options,
    first: u64,
    count: u64,
    plan: &Plan,
    progress: impl FnMut(u64, &SeedResult) + Send,
) -> Sweep {
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let shared = Mutex::new((Vec::new(), progress));
    std::thread::scope(|scope| {
        for _ in 0..plan.jobs.max(1) {
            scope.spawn(|| loop {
                if plan.stop_at_first_failure && failed.load(Ordering::Relaxed) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let opts = Options {
                    seed: first.saturating_add(i),
                    ..base.clone()
                };
                let r = run_seed(plan, &opts, i + 1 == count);
                if !r.violations.is_empty() {
                    failed.store(true, Ordering::Relaxed);
                }
                let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
                let (done, progress) = &mut *guard;
                done.push(r);
                let n = done.len() as u64;
                progress(n, done.last().expect("just pushed"));
            });
        }
    });
    let (mut done, _) = shared.into_inner().unwrap_or_else(|p| p.into_inner());
    done.sort_by_key(|r| r.seed);
    let mut s = Sweep::default();
    for r in done {
        s.add(r);
    }
    s
}

impl Sweep {
    /// Counts one seed's result in.
    pub fn add(&mut self, r: SeedResult) {
        self.seeds += 1;
        self.simulated += Duration::from_nanos(r.simulated_ns);
        self.faults += r.faults;
        self.handovers += r.handovers;
        self.handovers_failed += r.handovers_failed;
        self.disk_stalls += r.disk_stalls;
        self.stall_crashes += r.stall_crashes;
        self.failovers.extend(&r.failovers);
        self.failovers_unresolved += r.failovers_unresolved;
        self.replaced += r.replaced;
        self.removed_refusals += r.removed_refusals;
        self.snapshots_installed += r.snapshots_installed;
        self.votes += r.votes;
        self.forwarded += r.forwarded;
        self.forward_calls += r.forward_calls;
        self.fast_excess += r.fast_excess;
        let o = &mut self.ops;
        o.invoked += r.ops.invoked;
        o.allowed += r.ops.allowed;
        o.denied += r.ops.denied;
        o.failed += r.ops.failed;
        o.unknown += r.ops.unknown;
        o.undecided += r.ops.undecided;
        o.unknown_admitted += r.ops.unknown_admitted;
        o.retried += r.ops.retried;
        o.replayed += r.ops.replayed;
        o.multi += r.ops.multi;
        o.refunds += r.ops.refunds;
        o.kept += r.ops.kept;
        o.local_admitted += r.ops.local_admitted;
        o.allow_admitted += r.ops.allow_admitted;
        if !r.violations.is_empty() {
            self.failing.push((r.seed, r.violations));
        }
    }

    /// The human summary: totals, then every failing seed with its reproduction command.
    pub fn summary(&self, base: &Options) -> String {
        let mut t = String::new();
        let o = &self.ops;
        let _ = writeln!(
            t,
            "quorate sim cluster: {} seed(s) of {} nodes, {} s simulated ({:.2} h)",
            self.seeds,
            base.nodes,
            secs(self.simulated.as_nanos() as u64),
            self.simulated.as_secs_f64() / 3600.0
        );
        let _ = writeln!(
            t,
            "operations: {} invoked, {} allowed, {} denied, {} failed, {} unknown ({} of them TRYAGAIN from a shard that could not decide in time; {} applied as admissions)",
            o.invoked, o.allowed, o.denied, o.failed, o.unknown, o.undecided, o.unknown_admitted
        );
        if o.retried > 0 {
            let _ = writeln!(
                t,
                "retries: {} checks sent again under their request id after an unknown outcome; \
                 {} answered in the log from their id's first decision",
                o.retried, o.replayed
            );
        }
        if o.multi > 0 {
            let _ = writeln!(
                t,
                "checks of two items: {}; refunds in the log: {}; admissions of denied checks \
                 kept (refund not applied, the safe side): {}",
                o.multi, o.refunds, o.kept
            );
        }
        if o.local_admitted + o.allow_admitted > 0 {
            let _ = writeln!(
                t,
                "admitted by a node itself while their shard could not decide: {} within its \
                 share (`local`), {} by `allow`",
                o.local_admitted, o.allow_admitted
            );
        }
        let _ = writeln!(
            t,
            "faults: {}; leadership handovers: {} ({} more failed); fast admissions not in \
             the log (within bound): {}",
            self.faults, self.handovers, self.handovers_failed, self.fast_excess
        );
        if self.disk_stalls > 0 {
            let _ = writeln!(
                t,
                "disks stalled (a shard leader's, where it had one: it replicated what it had not \
                 written): {}, {} of them crashed before the disk wrote again",
                self.disk_stalls, self.stall_crashes
            );
        }
        if !self.failovers.is_empty() || self.failovers_unresolved > 0 {
            let _ = writeln!(
                t,
                "shards whose leader was crashed: {} led by another node after {}; {} still \
                 without one when the next fault came",
                self.failovers.len(),
                failover_spread(&self.failovers).unwrap_or_else(|| "-".into()),
                self.failovers_unresolved
            );
        }
        if self.replaced > 0 {
            let _ = writeln!(
                t,
                "members replaced through the admin API (a node added, then a member removed): {}; \
                 the removed node's votes and forwarded checks refused: {}",
                self.replaced, self.removed_refusals
            );
        }
        if self.snapshots_installed > 0 {
            let _ = writeln!(
                t,
                "snapshots received from a leader and installed: {}",
                self.snapshots_installed
            );
        }
        if self.votes > 0 {
            let _ = writeln!(
                t,
                "votes saved by the nodes' Raft stores or found on disk at their starts, checked: {}",
                self.votes
            );
        }
        if self.forwarded > 0 {
            let _ = writeln!(
                t,
                "checks forwarded to a shard's leader: {} in {} peer calls",
                self.forwarded, self.forward_calls
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary that cannot run fails every seed ("cannot run ..."), without simulating.
    fn broken(stop_at_first_failure: bool, jobs: usize) -> Sweep {
        let plan = Plan {
            exe: PathBuf::from("/nonexistent/quorate"),
            jobs,
            twice: false,
            trace_last: None,
            stop_at_first_failure,
        };
        sweep(&Options::default(), 1, 8, &plan, |_, _| {})
    }

    #[test]
    fn a_sweep_that_stops_at_the_first_failure_starts_no_further_seed() {
        let s = broken(true, 1);
        assert_eq!((s.seeds, s.failing.len()), (1, 1));
        assert_eq!(s.failing[0].0, 1);
        assert!(s.failing[0].1[0].contains("cannot run"), "{:?}", s.failing);
        // Two at once: the other worker may have taken a seed before the first failed.
        let s = broken(true, 2);
        assert!((1..=2).contains(&s.seeds), "{} seeds ran", s.seeds);
    }

    #[test]
    fn a_sweep_told_to_go_on_runs_and_lists_every_failing_seed() {
        let s = broken(false, 2);
        assert_eq!((s.seeds, s.failing.len()), (8, 8));
        let seeds: Vec<u64> = s.failing.iter().map(|f| f.0).collect();
        assert_eq!(seeds, (1..=8).collect::<Vec<_>>());
    }
}

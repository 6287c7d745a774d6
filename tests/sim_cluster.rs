//! The deterministic simulation of the cluster (`quorate::sim::cluster`): a budgeted seed
//! sweep under the full nemesis, named regression seeds, determinism, the clock-skew
//! scenarios, and the negative controls (`negative_control_*`: each passes only if its broken
//! switch is caught).
//!
//! A failing seed prints the command that reproduces it (`quorate sim cluster --seed N ...`).

use quorate::sim::cluster::{
    history::Outcome,
    reproduce, run, same_trace,
    sweep::{run_in_child, sweep, Plan, Sweep},
    ClockStep, Controls, Options, Report, Target,
};
use std::time::Duration;

/// Seeds in the sweep (per test; four tests share the sweep so both cores work). The other
/// tests of this file sweep 47 more seeds of their own kinds (30 clients, failover clients,
/// slot sharding, quick restarts, retrying clients, checks of two items, fallbacks,
/// handovers, a member replaced, snapshots, leaders' disks stalled, leaders crashed, five
/// members), 87 in all on the debug build; `.ci/run` adds 370 seeds on the release build,
/// where a seed runs ~5x faster. Each seed runs in a `quorate` process of its own, so a
/// failing seed's printed command replays exactly its run. Override with QUORATE_SIM_SEEDS
/// (per test) for a longer local run.
fn seeds_per_part() -> u64 {
    std::env::var("QUORATE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

fn sweep_options() -> Options {
    Options {
        duration: Duration::from_secs(20),
        ..Options::default()
    }
}

/// 30 clients with every client option, and quick restarts.
fn every_client_option() -> Options {
    Options {
        clients: 30,
        failover_clients: true,
        quick_restarts: true,
        retry_clients: true,
        multi_item_clients: true,
        fallback_clients: true,
        ..sweep_options()
    }
}

fn assert_clean(r: &Report, opts: &Options) {
    assert!(
        r.violations.is_empty(),
        "seed {} violated invariants:\n  {}\nreproduce: {}",
        r.seed,
        r.violations.join("\n  "),
        reproduce(opts)
    );
}

fn sweep_part(part: u64) {
    let n = seeds_per_part();
    sweep_seeds(&sweep_options(), 1000 + part * n, n);
}

/// Runs seeds `first..first + n` of `base`, one process each, and asserts none violated.
/// It stops at the first failing seed (so a mutant of scripts/negative-controls is caught in
/// one seed's time, not every seed's).
fn sweep_seeds(base: &Options, first: u64, n: u64) -> Sweep {
    let plan = Plan {
        exe: env!("CARGO_BIN_EXE_quorate").into(),
        jobs: 1,
        twice: false,
        trace_last: None,
        stop_at_first_failure: true,
    };
    let s = sweep(base, first, n, &plan, |_, _| {});
    assert!(s.failing.is_empty(), "{}", s.summary(base));
    // The runs did real work under real faults.
    assert!(s.ops.allowed > 0 && s.ops.denied > 0 && s.faults > n);
    eprintln!("{}", s.summary(base));
    s
}

#[test]
fn sweep_part_1_of_4_finds_no_violation() {
    sweep_part(0);
}

#[test]
fn sweep_part_2_of_4_finds_no_violation() {
    sweep_part(1);
}

#[test]
fn sweep_part_3_of_4_finds_no_violation() {
    sweep_part(2);
}

#[test]
fn sweep_part_4_of_4_finds_no_violation() {
    sweep_part(3);
}

/// Five times the clients (30), so a shard's fast callers keep arriving while its entry is
/// in flight: entries are gathered in parts (the open entry), each part at its own shard
/// time, and the log must repeat those times for the replicas to give the leader's answers.
/// scripts/negative-controls breaks the parts' times and sees this fail: a fast admission
/// the log holds as a denial (`check_fast`). That mutant shows in 31 of seeds 1-40 at 30
/// clients, and in 4 of these 6 on the debug build (11, 12, 14 and 16; the sweep stops at
/// seed 11), so a change of timing is unlikely to hide it from the whole range. Six seeds,
/// not ten: 32.5 s of `cargo test` here (10 took 59 s); `.ci/run` runs 30 more at 30
/// clients on the release build.
#[test]
fn sweep_under_heavy_fast_load_finds_no_violation() {
    let base = Options {
        clients: 30,
        ..sweep_options()
    };
    sweep_seeds(&base, 11, 6);
}

/// Clients that know every node (as `Client::cluster` builds them: failover, and routing
/// to shard leaders) under the full nemesis: no violation,
/// and they ride through the crashes that fail single-node clients. Seed 10 crashes a node
/// while clients wait on it: its clients of one node each see calls fail or end unknown
/// (the control, run here too, so the seed is seen to test failover), while the failover
/// clients lose none (a `TRYAGAIN` from a shard between leaders is an answer, not a loss).
/// `.ci/run` runs 50 more seeds of this kind on the release build.
///
/// In seed 10 node 3, shard 2's leader, is crashed; as it restarts, each failover client's
/// pooled connection to it (the client sends shard 2's checks there) closes under a call,
/// and the reconnect is refused. Every check here has a request id, so the client sends it
/// to the next member (`Resend` in src/client/mod.rs). A client that went back to the
/// crashed node only lost that call, as 6 calls were lost in seed 10 (and 1-6 in seeds 11,
/// 13, 15, 16, 19, 21, 35 and 36 of 1-40; none now). Seed 6, which showed it before,
/// no longer reaches that moment since the cluster spawns a task more per shard.
#[test]
fn failover_clients_find_no_violation_and_ride_through_crashes() {
    let base = Options {
        failover_clients: true,
        ..sweep_options()
    };
    sweep_seeds(&base, 2000, 4);
    let plain = Options {
        seed: 10,
        ..sweep_options()
    };
    let failover = Options {
        failover_clients: true,
        ..plain.clone()
    };
    let p = run(&plain);
    let f = run(&failover);
    assert_clean(&p, &plain);
    assert_clean(&f, &failover);
    assert!(f.history.trace.contains("nemesis crash"));
    assert!(
        !lost(&p).is_empty(),
        "seed 10 no longer fails a single-node client ({:?}): pick a seed that does",
        p.ops
    );
    let lost = lost(&f);
    assert!(
        lost.is_empty(),
        "failover clients lost calls in {}: {lost:#?}",
        reproduce(&failover)
    );
    assert!(f.ops.invoked > p.ops.invoked, "{:?} vs {:?}", f.ops, p.ops);
}

/// The calls of a run that failed, or whose outcome the client could not learn: not the
/// `TRYAGAIN` of a shard between leaders (every check here has a request id, so that is the
/// cluster's answer to a shard it cannot decide in time, not a call lost on the way).
fn lost(r: &Report) -> Vec<&quorate::sim::cluster::history::Op> {
    r.history
        .ops
        .iter()
        .filter(|o| match &o.outcome {
            Outcome::Failed(_) | Outcome::Pending => true,
            Outcome::Unknown(_) => !o.outcome.is_undecided(),
            _ => false,
        })
        .collect()
}

/// A cluster created with slot sharding (Redis Cluster's hash slots, `--sharding slots`),
/// with clients that route by slot through `QR.ROUTES`, under the full nemesis: no
/// violation. The checkers place keys as the nodes do (`shard_of_key`). `.ci/run` runs 30
/// more seeds of this kind on the release build.
#[test]
fn slot_sharding_finds_no_violation() {
    let base = Options {
        failover_clients: true,
        sharding: quorate::shard::route::Sharding::Slots,
        ..sweep_options()
    };
    sweep_seeds(&base, 3000, 4);
    assert!(reproduce(&base).contains("--sharding slots"));
}

/// Named regression seeds: seeds that once reported a violation, kept so the fix stays. (The
/// workload gained a policy since, `fw_fast`, so they no longer replay the runs that found
/// those bugs; they stay as seeds that must run clean.)
/// Seed 7 (20 s): the window checker counted admissions at the batch's stamp instead of the
/// time apply used (`max(batch time, state time)`) and flagged a correct run.
#[test]
fn regression_seed_7_window_check_uses_the_applied_time() {
    let opts = Options {
        seed: 7,
        ..sweep_options()
    };
    let r = run(&opts);
    assert_clean(&r, &opts);
}

/// Crashed nodes back within 1-350 ms (`--quick-restarts`: about half the faults are crashes),
/// under 30 clients' fast load: a shard's leader often comes back before the others' election
/// timeout, with entries it proposed before the crash and did not commit. It comes back a
/// follower (since `03d0ae8`; before, openraft restored it as its own term's leader) and
/// leads again only through an election in a later term, whose leader's speculative state
/// waits until every entry before that term's first applies. Simulation seed 118 at 30
/// clients found a bug of this case once (a restarted leader's speculative state built
/// before its old entries applied admitted fast checks the log denied; `log_applied` in the
/// proposer); a later change of timing hid it from that seed, so this sweep makes the case
/// common instead. Its mutant was retired (docs/verification.md, "Negative controls"): a
/// restarted node no longer leads its old term, so the case cannot arise.
/// `.ci/run` runs 20 more seeds of this kind on the release build.
#[test]
fn quick_restarts_under_heavy_fast_load_find_no_violation() {
    let base = Options {
        clients: 30,
        quick_restarts: true,
        ..sweep_options()
    };
    sweep_seeds(&base, 1, 6);
}

/// A shard leader's disk stalls for 5-400 ms (`--disk-stalls`) while it goes on replicating,
/// so its followers commit entries it has not written, and half the stalls end in a crash
/// with a restart 1-350 ms later, usually before the others' election timeout. The restarted
/// node must come back a follower (its log store hands openraft its own committed vote as not
/// committed): else openraft restores it as its old term's leader, with a log missing what
/// its followers committed, and it writes other entries under the same log ids, which the
/// followers take for theirs. scripts/negative-controls hands the vote over committed and
/// sees this fail (acknowledged strict admissions in no applied log: on the release build in
/// 9 of seeds 1-20 of this kind, seed 3 among them). `.ci/run` runs 20 more seeds with
/// every option and the stalls on the release build.
#[test]
fn a_leader_crashed_while_its_disk_stalled_loses_nothing_its_followers_committed() {
    let base = Options {
        clients: 30,
        quick_restarts: true,
        disk_stalls: true,
        ..sweep_options()
    };
    let s = sweep_seeds(&base, 3, 3);
    assert!(
        s.disk_stalls > 0 && s.stall_crashes > 0,
        "disk stalls {}, crashed in a stall {}",
        s.disk_stalls,
        s.stall_crashes
    );
}

/// Clients that send a check again under its request id when its outcome is unknown
/// (`--retry-clients`), while crashed nodes come back quickly and leaders change: every
/// id is decided once in the committed log (`check_once`), a repeat is answered from the
/// replicated idempotency table, and an acknowledged answer is the log's (`check_lost`).
/// scripts/negative-controls stops the table from remembering ids and sees this fail (here,
/// on the debug build, at seed 1 with 16 violations; on the release build in each of seeds
/// 1-6; without retrying clients no checker sees it).
/// `.ci/run` runs 20 more seeds of this kind on the release build.
#[test]
fn retried_checks_are_decided_once() {
    let base = Options {
        clients: 30,
        quick_restarts: true,
        retry_clients: true,
        ..sweep_options()
    };
    let s = sweep_seeds(&base, 1, 3);
    // Retries happened, and some met their id's first decision (a replay): what the
    // checker judges.
    assert!(
        s.ops.retried > 0 && s.ops.replayed > 0,
        "retried {}, replayed {}",
        s.ops.retried,
        s.ops.replayed
    );
}

/// Checks of two items, all or nothing across shards (`--multi-item-clients`), some
/// without a request id, from clients that retry under the id, while crashed nodes come
/// back quickly and leaders change: every bound holds over the log's admissions less its
/// refunds (`check_strict`, `check_fast`'s log bound, `check_drift`), no admitted check's
/// item is refunded and every acknowledged strict item is in the log (`check_lost`).
/// scripts/negative-controls makes a refund give back its whole cost after a later admission
/// of the key and sees this fail (a bucket or GCRA then admits past its bound: on the debug
/// build at seed 1, 4 units of a fast GCRA key in 396 ms where 3.79 are allowed).
/// `.ci/run` runs 20 more seeds of this kind on the release build.
#[test]
fn checks_of_two_items_keep_every_bound_through_their_refunds() {
    let base = Options {
        clients: 30,
        quick_restarts: true,
        retry_clients: true,
        multi_item_clients: true,
        ..sweep_options()
    };
    let s = sweep_seeds(&base, 1, 3);
    assert!(
        s.ops.multi > 0 && s.ops.refunds > 0,
        "checks of two items {}, refunds {}",
        s.ops.multi,
        s.ops.refunds
    );
}

/// Limits whose `on_unavailable` is `local` or `allow` (`--fallback-clients`), spent by
/// checks of one and two items from clients that retry, while nodes crash and come back and
/// partitions cut shards off: a node that cannot get its shard's decision in time answers by
/// itself, and under `local` each node (each start of it) keeps to its share of the limit
/// (`check_local`); those admissions are the node's, outside the log, and every other
/// checker still holds the log's. scripts/negative-controls makes a node enforce the whole
/// limit, not its share, and sees this fail. `.ci/run` runs 20 more seeds with the option.
#[test]
fn fallback_answers_keep_each_members_local_share() {
    let s = sweep_seeds(&every_client_option(), 1, 3);
    assert!(
        s.ops.local_admitted > 0 && s.ops.allow_admitted > 0,
        "admitted by a node itself: {} local, {} allow",
        s.ops.local_admitted,
        s.ops.allow_admitted
    );
}

/// Leaderships handed from node to node amid the other faults (`--handover-faults`: the
/// nemesis asks a shard's leader to hand it to another node, as a rebalance or a removal
/// does, to a node that may be down or cut off): every checker still holds, fast checks
/// included (a leader answers none early once its handover began). `.ci/run` runs 20 more
/// seeds with the option.
#[test]
fn handovers_amid_faults_keep_every_bound() {
    let base = Options {
        handover_faults: true,
        ..every_client_option()
    };
    let s = sweep_seeds(&base, 1, 3);
    assert!(s.handovers > 0, "no leadership was handed over");
}

/// A member replaced through the admin API amid the other faults (`--membership-faults`: a
/// node started to join is added, then a member removed, each through a member's HTTP API
/// and sent again until answered 200), with every client option and handovers: every
/// checker still holds, and once healed every member sees each shard's voters as exactly
/// the members, the removed id in its history (`membership::check_voters`; an add left a
/// learner fails it in 10 of 10 seeds, by hand). `.ci/run` runs 20 more seeds with it.
#[test]
fn a_member_replaced_amid_faults_keeps_every_bound() {
    let base = Options {
        membership_faults: true,
        handover_faults: true,
        ..every_client_option()
    };
    let s = sweep_seeds(&base, 1, 3);
    assert_eq!(s.replaced, 3, "a replacement did not go through");
}

/// Five members, each a voter of every shard (a majority is three), under the whole
/// nemesis with every client option, handovers, a member replaced through the admin API
/// (node 6 added, one removed), small snapshots and disk stalls: every checker holds as
/// with three. `.ci/run` runs 20 more seeds of five members.
#[test]
fn five_members_keep_every_bound_under_every_fault() {
    let base = Options {
        nodes: 5,
        membership_faults: true,
        handover_faults: true,
        small_snapshots: true,
        disk_stalls: true,
        ..every_client_option()
    };
    let s = sweep_seeds(&base, 1, 1);
    assert_eq!(s.replaced, 1, "the replacement did not go through");
    assert!(s.snapshots_installed > 0 && s.disk_stalls > 0 && s.handovers > 0);
}

/// The removed node runs on, and campaigns once no leader sends it anything. Until it
/// stopped its elections once it knew it was out (refused votes), those campaigns gave a
/// member that had not applied the removal yet ever higher terms, and that member then
/// refused its leaders' appends: in these seeds no shard had an agreed leader 20 s after
/// healing (3 of 4 such seeds of 300 failed so with the elections left on, by hand). The
/// removed node did run on: the members refused its votes or forwarded checks.
#[test]
fn a_removed_node_that_runs_on_disrupts_no_member() {
    let base = Options {
        membership_faults: true,
        duration: Duration::from_secs(20),
        ..Options::default()
    };
    for seed in [67038, 67104] {
        let s = sweep_seeds(&base, seed, 1);
        assert_eq!(s.replaced, 1);
        assert!(s.removed_refusals > 0, "seed {seed}: nothing refused");
    }
}

/// Snapshots every 50 entries (`--small-snapshots`): restarted and lagging nodes install the
/// leader's snapshot amid the faults. Seed 93007 guards a stall: node 1 proposed an entry as
/// shard 3's leader, was cut off, and caught up by installing a snapshot past that entry;
/// openraft 0.9 answers a waiting client only when its entry is applied or truncated, so the
/// proposer's pipeline slot stayed taken, and when node 1 led shard 3 again (a rebalance) it
/// proposed nothing: no check on shard 3 was admitted after healing. The vendored openraft
/// now answers such a client when the log is purged past its entry (vendor/README.md).
/// The same seed sees purges reach a store before the installed snapshot is on disk when
/// the purge does not wait for the install (the fourth change there).
#[test]
fn snapshot_installs_amid_faults_keep_every_bound_and_stall_no_shard() {
    let base = Options {
        small_snapshots: true,
        quick_restarts: true,
        clients: 30,
        ..sweep_options()
    };
    let s = sweep_seeds(&base, 93007, 1);
    assert!(
        s.snapshots_installed > 0,
        "seed 93007 installed no snapshot"
    );
    let every = Options {
        small_snapshots: true,
        ..every_client_option()
    };
    let s = sweep_seeds(&every, 93100, 3);
    assert!(s.snapshots_installed > 0, "{}", s.summary(&every));
}

/// A shard whose leader crashed is led again within one election: the survivors wait out
/// the lease (800 ms) and an election timeout (400-800 ms), then the next tick (150 ms)
/// starts an election the longest log wins; 2 s leaves the links' latency room, and a
/// second round would need at least another timeout. 30 clients, the nemesis restarting
/// the node it crashed last and crashing a shard's leader every few seconds. The parts of
/// vendor/openraft's sixth change, each undone by a mutant of scripts/negative-controls:
/// without the stale greater-log flag cleared, a survivor waits 1.6 s more (both seeds,
/// up to 3.5 s); without the term above those seen, seed 2 loses a round (2.49 s); without
/// the longest log's hurry after a split vote, seed 20 waits out a timeout (2.41 s).
#[test]
fn a_crashed_leaders_shards_are_led_again_within_one_election() {
    let base = Options {
        crash_leaders: true,
        clients: 30,
        duration: Duration::from_secs(30),
        ..sweep_options()
    };
    let bound = 2_000_000_000;
    for seed in [20, 2] {
        let s = sweep_seeds(&base, seed, 1);
        let slow: Vec<_> = s.failovers.iter().filter(|&&f| f > bound).collect();
        assert!(
            s.failovers.len() >= 5 && slow.is_empty() && s.failovers_unresolved == 0,
            "seed {seed}: {} failovers, {} over 2 s ({slow:?} ns), {} not within 20 s\n{}",
            s.failovers.len(),
            slow.len(),
            s.failovers_unresolved,
            s.summary(&base)
        );
    }
}

/// Two fresh processes, the same seed (60 s with crashes, partitions and clock faults): the
/// same bytes. (Within one process a second run is not yet identical after a crash fault:
/// docs/verification.md, "Known gaps".)
#[test]
fn the_same_seed_gives_a_byte_identical_trace() {
    let opts = Options {
        seed: 5021,
        duration: Duration::from_secs(60),
        ..Options::default()
    };
    // Each run in a fresh `quorate` process, as a sweep runs its seeds.
    let trace = |tag: &str| {
        let file =
            std::env::temp_dir().join(format!("quorate-det-{}-{tag}.txt", std::process::id()));
        let r = run_in_child(env!("CARGO_BIN_EXE_quorate").as_ref(), &opts, Some(&file));
        assert!(
            r.violations.is_empty(),
            "{}: {:?}",
            reproduce(&opts),
            r.violations
        );
        let text = std::fs::read_to_string(&file).unwrap();
        let _ = std::fs::remove_file(&file);
        text
    };
    let a = trace("a");
    let b = trace("b");
    assert!(a.contains("nemesis crash") && a.lines().count() > 1000);
    assert_eq!(same_trace(&a, &b), None);
    // And another seed gives another trace (the seed reaches the run).
    let c = run(&Options {
        seed: 8,
        ..sweep_options()
    });
    assert_ne!(a, c.history.trace);
}

/// A run without the nemesis, with scripted wall-clock steps, must decide exactly as the
/// same seed without them: decisions read only shard time (from monotonic clocks).
fn skew_changes_no_decision(script: Vec<ClockStep>) {
    let plain = Options {
        seed: 42,
        nemesis: false,
        duration: Duration::from_secs(20),
        ..Options::default()
    };
    let skewed = Options {
        clock_script: script,
        ..plain.clone()
    };
    let a = run(&plain);
    let b = run(&skewed);
    assert_clean(&a, &plain);
    assert_clean(&b, &skewed);
    assert_eq!(
        b.faults as usize,
        skewed.clock_script.len(),
        "every step hit"
    );
    assert!(a.ops.allowed > 0 && a.ops.denied > 0);
    assert_eq!(
        same_trace(&a.history.ops_trace(), &b.history.ops_trace()),
        None
    );
}

const S: i64 = 1_000_000_000;

#[test]
fn a_leader_300_s_ahead_changes_no_decision() {
    skew_changes_no_decision(vec![ClockStep {
        at: Duration::from_secs(3),
        target: Target::LeaderOf(0),
        wall_by: 300 * S,
        drift_ppm: None,
    }]);
}

#[test]
fn a_follower_300_s_behind_changes_no_decision() {
    skew_changes_no_decision(vec![ClockStep {
        at: Duration::from_secs(3),
        target: Target::FollowerOf(0),
        wall_by: -300 * S,
        drift_ppm: None,
    }]);
}

#[test]
fn a_leader_wall_clock_stepping_back_60_s_mid_window_changes_no_decision() {
    skew_changes_no_decision(vec![
        ClockStep {
            at: Duration::from_secs(6),
            target: Target::LeaderOf(0),
            wall_by: -60 * S,
            drift_ppm: None,
        },
        ClockStep {
            at: Duration::from_secs(6) + Duration::from_millis(500),
            target: Target::LeaderOf(1),
            wall_by: -60 * S,
            drift_ppm: None,
        },
    ]);
}

/// Every node's clock runs `ppm` fast from the start, no other fault, 60 s; checked with
/// the drift bound `bound_ppm` (`check_drift`; `check_strict` still holds in shard time).
fn drifting(ppm: i64, bound_ppm: i64) -> (Report, Options) {
    let opts = Options {
        seed: 77,
        nemesis: false,
        duration: Duration::from_secs(60),
        clock_script: vec![ClockStep {
            at: Duration::ZERO,
            target: Target::Every,
            wall_by: 0,
            drift_ppm: Some(ppm),
        }],
        drift_bound_ppm: bound_ppm,
        ..Options::default()
    };
    (run(&opts), opts)
}

/// A leader whose clock runs 1 % fast refills its buckets 1 % fast: in real time a strict
/// bucket admits at most `capacity + quota x 1.01 x dt / period` (docs/semantics.md).
#[test]
fn a_clock_running_1_percent_fast_over_admits_no_more_than_its_drift() {
    let (r, opts) = drifting(10_000, 10_000);
    assert_clean(&r, &opts);
    assert!(r.ops.allowed > 1000 && r.ops.denied > 1000, "{:?}", r.ops);
}

/// The checker is not vacuous: clocks 10 % fast, judged against a 1 % bound, are caught
/// (hot keys are asked far more often than they refill, so admissions follow the refill).
#[test]
fn negative_control_a_clock_10_percent_fast_breaks_the_1_percent_bound() {
    let (r, _) = drifting(100_000, 10_000);
    let drift: Vec<_> = r
        .violations
        .iter()
        .filter(|v| v.contains("beyond the drift bound"))
        .collect();
    assert!(
        !drift.is_empty(),
        "10 % drift went unnoticed: {:?}",
        r.violations
    );
    assert_eq!(
        drift.len(),
        r.violations.len(),
        "only the drift bound breaks"
    );
}

/// Runs seeds from `first` until one reports a violation; returns it.
fn first_violation(controls: Controls, first: u64, tries: u64) -> Option<Report> {
    (first..first + tries).find_map(|seed| {
        let r = run(&Options {
            seed,
            controls,
            ..sweep_options()
        });
        eprintln!("seed {seed}: {} violations", r.violations.len());
        (!r.violations.is_empty()).then_some(r)
    })
}

#[test]
fn negative_control_apply_reading_the_local_clock_is_caught() {
    let r = first_violation(
        Controls {
            apply_local_clock: true,
            ..Controls::default()
        },
        1,
        10,
    )
    .expect("apply at the local clock went unnoticed");
    eprintln!(
        "seed {}: {:#?}",
        r.seed,
        &r.violations[..r.violations.len().min(5)]
    );
}

#[test]
fn negative_control_answering_strict_checks_before_commit_is_caught() {
    let r = first_violation(
        Controls {
            answer_before_commit: true,
            ..Controls::default()
        },
        1,
        20,
    )
    .expect("answers before commit went unnoticed");
    eprintln!(
        "seed {}: {:#?}",
        r.seed,
        &r.violations[..r.violations.len().min(5)]
    );
}

/// Votes reported saved but never written (`--unsafe-forget-votes`): a crashed node comes
/// back without the votes it gave, which only `check_vote` sees (openraft's own checks and
/// the other checkers pass such a run).
#[test]
fn negative_control_forgetting_votes_is_caught() {
    let r = first_violation(
        Controls {
            forget_votes: true,
            ..Controls::default()
        },
        1,
        10,
    )
    .expect("forgotten votes went unnoticed in 10 seeds");
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("restarted with a vote") && v.contains("its vote went back")),
        "seed {} failed for another reason: {:#?}",
        r.seed,
        r.violations
    );
}

/// Skipping fsync (acknowledging WAL writes held in memory, lost when the node crashes) is
/// caught by openraft itself before our checkers run: a leader sees a follower's log go back
/// ("follower log reversion") and panics, which takes the simulation process down. So this
/// control runs the CLI as a child process and expects it to fail.
#[test]
fn negative_control_skipping_fsync_is_caught() {
    for seed in 1..=10u64 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_quorate"))
            .args(["sim", "cluster", "--duration", "20", "--unsafe-skip-fsync"])
            .args(["--seed", &seed.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        eprintln!("seed {seed}: exit {:?}", out.status.code());
        if !out.status.success() {
            assert!(
                text.contains("log reversion") || text.contains("FAILED"),
                "failed for another reason:\n{text}"
            );
            return;
        }
    }
    panic!("lost unsynced writes went unnoticed in 10 seeds");
}

//! `quorate sim cluster`: the deterministic simulation of a 3-node cluster (or up to 7
//! members, `--nodes`) under faults.
//!
//! turmoil runs every node — the REAL node, `Node::start_member`, with its WAL, Raft groups,
//! peer transport and RESP API — as a simulated host on one thread, over simulated sockets
//! (`net::turmoil`) and a simulated clock per host (`clock::SimClock`), so a run is a pure
//! function of its seed. Clients ([`workload`]) send checks while the [`nemesis`] breaks the
//! network, the nodes and their clocks; then everything is healed and the checkers judge the
//! history, one invariant per file:
//! - [`check_strict`] — strict limits never over-admit in any window;
//! - [`check_fast`] — fast limits over-admit only within their bound;
//! - [`check_lost`] — no acknowledged strict admission is lost, and no denial was spent;
//! - [`check_local`] — a member admitting by itself (`on_unavailable = "local"`) keeps its
//!   share;
//! - [`check_once`] — a request id is decided once, however often it is retried;
//! - [`check_drift`] — in true time, strict limits over-admit no more than clock drift allows;
//! - [`check_agree`] — replicas applied the same log and agree once healed;
//! - [`check_vote`] — no node forgets or takes back a vote, and no leader stands on its own;
//! - [`check_live`] — after healing, leaders everywhere and admissions within a bound;
//! - determinism — the same seed gives a byte-identical trace ([`same_trace`]).
//!
//! Randomness, all derived from the one seed ([`derive`]): turmoil's world (`rng_seed`: link
//! latencies, losses, and with `--cfg tokio_unstable` each host runtime's `select!` choices),
//! the simulated epoch (fixed), each node's start (handshake nonces and openraft's election
//! timeouts, through `raft::types::with_raft_seed`), each host's clock origin, each
//! client's choices and retry jitter, and the nemesis. The WAL writer runs as a task on its
//! host (a thread would run outside simulated time). Hash maps with random seeds exist in
//! node code (foldhash in the shard tables) but no decision, message or trace depends on
//! their order.

pub mod bound;
pub mod check_agree;
pub mod check_drift;
pub mod check_fast;
pub mod check_live;
pub mod check_local;
pub mod check_lost;
pub mod check_once;
pub mod check_strict;
pub mod check_vote;
pub mod history;
pub mod hosts;
pub mod membership;
pub mod nemesis;
pub mod sweep;
pub mod workload;

use crate::policy::Consistency;
use crate::raft::NodeId;
use crate::shard::route::{fnv1a, Sharding};
use history::{AppliedLog, History, Outcome};
use hosts::NodeHandle;
use nemesis::Nemesis;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

/// The simulated wall time at the start of every run (turmoil's default is the real clock).
pub const EPOCH_SECS: u64 = 1_700_000_000;

/// Switches that break one safety mechanism each (negative controls).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Controls {
    /// Apply decides at the applying node's clock, not the batch's shard time.
    pub apply_local_clock: bool,
    /// Strict checks are answered before their entry commits.
    pub answer_before_commit: bool,
    /// The WAL acknowledges before it syncs and keeps writes in memory (lost on a crash).
    pub skip_fsync: bool,
    /// The Raft log stores report votes saved without writing them (lost on a crash).
    pub forget_votes: bool,
}

impl Controls {
    /// The `quorate sim cluster` flags that set these switches.
    pub fn flags(&self) -> Vec<&'static str> {
        [
            (self.apply_local_clock, "--unsafe-apply-local-clock"),
            (self.answer_before_commit, "--unsafe-answer-before-commit"),
            (self.skip_fsync, "--unsafe-skip-fsync"),
            (self.forget_votes, "--unsafe-forget-votes"),
        ]
        .into_iter()
        .filter_map(|(on, flag)| on.then_some(flag))
        .collect()
    }
}

/// Who a scripted clock step hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The node leading this shard at the time.
    LeaderOf(u64),
    /// A node not leading this shard at the time.
    FollowerOf(u64),
    /// Every node.
    Every,
}

/// A scripted wall-clock step (the skew scenarios).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockStep {
    pub at: Duration,
    pub target: Target,
    /// Nanoseconds; negative steps the wall clock back.
    pub wall_by: i64,
    /// From then on the clock (monotonic and wall) runs this many ppm fast (negative: slow).
    pub drift_ppm: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    /// How long clients and the nemesis run; healing and checks follow.
    pub duration: Duration,
    /// The cluster's members from the start (`--nodes`), each a voter of every shard.
    pub nodes: usize,
    pub shards: u32,
    /// How the nodes spread keys over shards (`--sharding`).
    pub sharding: Sharding,
    pub clients: usize,
    /// Each client knows every node (`Client::with_nodes`, its chosen node first) and fails
    /// over between them, instead of one client per node. Off by default, so that seeds
    /// replay as they did before the option existed.
    pub failover_clients: bool,
    /// About half the faults are crashes, and a crashed node restarts after 1-350 ms
    /// (`--quick-restarts`), usually before the others' election timeout, instead of at the
    /// nemesis's next heal. Off by default, so that
    /// seeds replay as they did before the option existed.
    pub quick_restarts: bool,
    /// A client whose check's outcome is unknown (a timeout, a lost connection, the
    /// cluster's `TRYAGAIN`) sends it again under the same request id, up to
    /// [`workload::RETRIES`] times (`--retry-clients`): what `check_once` judges. Off by
    /// default, so that seeds replay as they did before the option existed.
    pub retry_clients: bool,
    /// Half the checks name two limits, drawn like a single check's (`--multi-item-clients`):
    /// all-or-nothing across shards, so a denied one refunds what its other item admitted,
    /// which `check_strict` and `check_lost` account for. Off by default, so that seeds
    /// replay as they did before the option existed.
    pub multi_item_clients: bool,
    /// Clients also spend limits whose `on_unavailable` is `local` or `allow`
    /// (`--fallback-clients`): a node answers those by itself when their shard cannot
    /// decide in time, outside the log, and `check_local` bounds what `local` admits. Off
    /// by default, so that seeds replay as they did before the option existed.
    pub fallback_clients: bool,
    /// About a quarter of the nemesis's picks ask a shard's leader to hand its leadership
    /// to another node at once (`--handover-faults`), as a rebalance or a removal does,
    /// amid the other faults. Off by default, so that seeds replay as they did before the
    /// option existed.
    pub handover_faults: bool,
    /// A spare host runs a node started to join (`--membership-faults`, id `nodes + 1`);
    /// once in a run the nemesis has an operator replace a member with it through the
    /// admin API (`POST /v1/admin/members`: add the spare, then remove the member), amid
    /// the other faults. The removed node keeps running, outside every shard. Off by
    /// default, so that seeds replay as they did before the option existed.
    pub membership_faults: bool,
    /// Every node snapshots each shard every 50 entries instead of 20,000, or 4 KiB of
    /// entries instead of 16 MiB (`--small-snapshots`), keeping 25 entries behind each, or
    /// 1 KiB of them: a node that restarts or lags gets the leader's snapshot, so snapshot
    /// builds, installs and the log's purges run amid the faults. Off by default, so that seeds replay as they did before the option
    /// existed.
    pub small_snapshots: bool,
    /// About a quarter of the nemesis's picks stall a shard leader's disk for 5-400 ms
    /// (`--disk-stalls`: its WAL writes nothing; it still replicates, so its followers
    /// commit entries it has not written), and half of those end in a crash with a restart
    /// 1-350 ms later, which loses what it had not written. Off by default, so that seeds
    /// replay as they did before the option existed.
    pub disk_stalls: bool,
    /// `--crash-leaders`: every pick of the nemesis restarts the node it crashed last and
    /// crashes a shard's leader; the next pick waits until another node leads each shard
    /// the crashed one led (up to 20 s), then at least `fault_every.0` more (no more when
    /// the 20 s ran out). The failover times are in the report ([`Report::failovers`]).
    pub crash_leaders: bool,
    pub keys: usize,
    /// Each client waits a uniform time in this range (ms) between operations.
    pub think_ms: (u64, u64),
    pub nemesis: bool,
    /// The nemesis picks a new fault every uniform time in this range.
    pub fault_every: (Duration, Duration),
    pub clock_script: Vec<ClockStep>,
    pub controls: Controls,
    /// The liveness bound after healing.
    pub heal_within: Duration,
    /// The fastest clock drift any node may have (the nemesis draws up to 2 %): what
    /// `check_drift` allows.
    pub drift_bound_ppm: i64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 1,
            duration: Duration::from_secs(60),
            nodes: 3,
            shards: 4,
            sharding: Sharding::Hash,
            clients: 6,
            failover_clients: false,
            quick_restarts: false,
            retry_clients: false,
            multi_item_clients: false,
            fallback_clients: false,
            handover_faults: false,
            membership_faults: false,
            small_snapshots: false,
            disk_stalls: false,
            crash_leaders: false,
            keys: 300,
            think_ms: (5, 40),
            nemesis: true,
            fault_every: (Duration::from_secs(2), Duration::from_secs(5)),
            clock_script: Vec::new(),
            controls: Controls::default(),
            heal_within: Duration::from_secs(20),
            drift_bound_ppm: nemesis::MAX_DRIFT_PPM,
        }
    }
}

impl Options {
    /// The command-line switches for this run's options that are on (workload, nemesis and
    /// the negative controls' flags): the one list that both [`reproduce`] and a sweep's
    /// child command line are built from, so neither can miss a switch.
    pub fn switches(&self) -> Vec<&'static str> {
        let workload = [
            (self.failover_clients, "--failover-clients"),
            (self.quick_restarts, "--quick-restarts"),
            (self.retry_clients, "--retry-clients"),
            (self.multi_item_clients, "--multi-item-clients"),
            (self.fallback_clients, "--fallback-clients"),
            (self.handover_faults, "--handover-faults"),
            (self.membership_faults, "--membership-faults"),
            (self.small_snapshots, "--small-snapshots"),
            (self.disk_stalls, "--disk-stalls"),
            (self.crash_leaders, "--crash-leaders"),
            (!self.nemesis, "--no-nemesis"),
        ];
        let on = workload.into_iter().filter_map(|(on, s)| on.then_some(s));
        on.chain(self.controls.flags()).collect()
    }
}

/// What clients saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpCounts {
    pub invoked: u64,
    pub allowed: u64,
    pub denied: u64,
    pub failed: u64,
    pub unknown: u64,
    /// Of the unknown outcomes, the `TRYAGAIN` answers of a shard that could not decide in
    /// time (every check here has a request id, so it gets that, not a denial).
    pub undecided: u64,
    /// Unknown outcomes the applied logs show were admitted.
    pub unknown_admitted: u64,
    /// Checks sent again under their request id (`--retry-clients`); absent from the
    /// results of builds before the option.
    #[serde(default)]
    pub retried: u64,
    /// Checks the log answered from the idempotency table: a request id seen before.
    #[serde(default)]
    pub replayed: u64,
    /// Checks of several items (`--multi-item-clients`).
    #[serde(default)]
    pub multi: u64,
    /// Refunds in the log (of checks of several items that one item denied).
    #[serde(default)]
    pub refunds: u64,
    /// Admissions of denied checks that the log kept: their refund never applied
    /// (`check_lost::kept`).
    #[serde(default)]
    pub kept: u64,
    /// Items nodes admitted by themselves under `on_unavailable = "local"` (within their
    /// share) and `"allow"` (`--fallback-clients`).
    #[serde(default)]
    pub local_admitted: u64,
    #[serde(default)]
    pub allow_admitted: u64,
}

/// One run's result.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    /// Simulated time, healing included.
    pub simulated: Duration,
    pub ops: OpCounts,
    pub faults: u64,
    /// Shard leaderships handed from one node to another (rebalancing, or the nemesis's
    /// `--handover-faults`), and handovers that failed.
    pub handovers: u64,
    pub handovers_failed: u64,
    /// Disk stalls (`--disk-stalls`), and those that ended in a crash.
    pub disk_stalls: u64,
    pub stall_crashes: u64,
    /// Per shard whose leader the nemesis crashed: simulated ns until another node led it;
    /// and the shards still without one when the next fault came.
    pub failovers: Vec<u64>,
    pub failovers_unresolved: u64,
    /// Members replaced through the admin API (`--membership-faults`: the spare added and
    /// a member removed, both answered 200).
    pub replaced: u64,
    /// Requests of the removed node that the members refused at the end, because it was
    /// removed (`quorate_removed_node_refusals_total`, votes and forwarded checks; counts of
    /// a member's instances before a crash are lost).
    pub removed_refusals: u64,
    /// Snapshots the nodes received from a leader and installed (their last instances:
    /// counts before a crash are lost).
    pub snapshots_installed: u64,
    /// Votes the nodes' log stores saved, and found on disk at their starts, all checked
    /// by [`check_vote`].
    pub votes: u64,
    /// Checks the nodes forwarded to a shard's leader, and the peer calls that carried
    /// them (`quorate_forwarded_checks_total`, `quorate_forward_calls_total`; their last
    /// instances): fewer calls than checks when callers waiting shared calls.
    pub forwarded: u64,
    pub forward_calls: u64,
    /// Fast admissions told to clients that the log does not hold (within the bound unless
    /// reported as a violation).
    pub fast_excess: u64,
    pub violations: Vec<String>,
    pub history: History,
}

impl Report {
    pub fn trace_digest(&self) -> u64 {
        self.history.trace_digest()
    }
}

/// 32 bytes for one purpose from the seed: SHA-256 of the seed and a label.
pub fn derive(seed: u64, label: &str) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(label.as_bytes());
    h.finalize().into()
}

/// The first line where two traces differ, or `None` when they are byte-identical.
pub fn same_trace(a: &str, b: &str) -> Option<String> {
    if a == b {
        return None;
    }
    for (n, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return Some(format!("line {}: `{x}` vs `{y}`", n + 1));
        }
    }
    Some(format!(
        "one trace is a prefix of the other ({} vs {} lines)",
        a.lines().count(),
        b.lines().count()
    ))
}

/// The command that reproduces a run.
pub fn reproduce(opts: &Options) -> String {
    let d = Options::default();
    let mut cmd = format!(
        "quorate sim cluster --seed {} --duration {}s",
        opts.seed,
        opts.duration.as_secs()
    );
    if opts.nodes != d.nodes {
        cmd += &format!(" --nodes {}", opts.nodes);
    }
    if opts.shards != d.shards {
        cmd += &format!(" --shards {}", opts.shards);
    }
    if opts.clients != d.clients {
        cmd += &format!(" --clients {}", opts.clients);
    }
    if opts.sharding != Sharding::Hash {
        cmd += &format!(" --sharding {}", opts.sharding.name());
    }
    for switch in opts.switches() {
        cmd += " ";
        cmd += switch;
    }
    if !opts.clock_script.is_empty() {
        cmd += " (with the test's scripted clock steps)";
    }
    cmd
}

/// The first ten of a check's `lines` (formatted lazily), then `... N {what} in all` when
/// there were more: a violation that repeats thousands of times stays a short report.
fn first_ten(lines: impl ExactSizeIterator<Item = String>, what: &str) -> Vec<String> {
    const SHOWN: usize = 10;
    let n = lines.len();
    let mut out: Vec<String> = lines.take(SHOWN).collect();
    if n > SHOWN {
        out.push(format!("... {n} {what} in all"));
    }
    out
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shard of `key` under the named limit `policy` (whose key prefix is `policy:`), as
/// the nodes place it.
fn shard_of_key(opts: &Options, policy: &str, key: &str) -> u32 {
    let prefix = fnv1a(format!("{policy}:").as_bytes());
    opts.sharding
        .shard(opts.sharding.route(prefix, key), opts.shards)
}

/// True when every node is up and sees the same leader for every shard.
fn leaders_agree(nodes: &[Arc<NodeHandle>], shards: u32) -> bool {
    let mut views = Vec::new();
    for n in nodes {
        let Some(s) = n.service() else { return false };
        let Some(c) = s.cluster() else { return false };
        let v: Vec<Option<NodeId>> = c.status().iter().map(|g| g.leader).collect();
        if v.len() != shards as usize || v.iter().any(Option::is_none) {
            return false;
        }
        views.push(v);
    }
    views.windows(2).all(|w| w[0] == w[1])
}

fn digests(nodes: &[Arc<NodeHandle>]) -> history::Digests {
    nodes
        .iter()
        .filter_map(|n| Some((n.id, n.service()?.cluster()?.digests())))
        .collect()
}

thread_local! {
    /// The reproduction command of the simulation running on this thread, for the panic hook.
    static RUNNING: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// A panic inside a simulated node (openraft asserts, for one) takes the whole process down
/// — tokio shuts the host's runtime down inside the step, and that unwinds no further — so
/// the seed is printed from the panic hook, before the default message.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(cmd) = RUNNING.with(|r| r.borrow().clone()) {
                eprintln!("simulation panicked; reproduce: {cmd}");
            }
            default(info);
        }));
    });
}

/// Runs one simulation and checks it.
pub fn run(opts: &Options) -> Report {
    install_panic_hook();
    RUNNING.with(|r| *r.borrow_mut() = Some(reproduce(opts)));
    let report = run_checked(opts);
    RUNNING.with(|r| *r.borrow_mut() = None);
    report
}

fn run_checked(opts: &Options) -> Report {
    let mut violations = Vec::new();
    let dir = match hosts::RunDir::new(opts.seed) {
        Ok(d) => d,
        Err(e) => {
            return Report {
                seed: opts.seed,
                simulated: Duration::ZERO,
                ops: OpCounts::default(),
                faults: 0,
                handovers: 0,
                handovers_failed: 0,
                disk_stalls: 0,
                stall_crashes: 0,
                failovers: Vec::new(),
                failovers_unresolved: 0,
                replaced: 0,
                removed_refusals: 0,
                snapshots_installed: 0,
                votes: 0,
                forwarded: 0,
                forward_calls: 0,
                fast_excess: 0,
                violations: vec![format!("cannot create the nodes' directory: {e}")],
                history: History::default(),
            }
        }
    };
    let total = opts.duration + opts.heal_within * 3 + Duration::from_secs(30);
    let mut sim = turmoil::Builder::new()
        .simulation_duration(total)
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(nemesis::MIN_LATENCY)
        .max_message_latency(nemesis::MAX_LATENCY)
        .rng_seed(opts.seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .tcp_capacity(4096)
        .build();
    // With `--membership-faults`, a spare host after the members: a node started to join.
    let hosts = opts.nodes + usize::from(opts.membership_faults);
    let names: Vec<String> = (1..=hosts).map(|i| format!("n{i}")).collect();
    let ips: Vec<_> = names.iter().map(|n| sim.lookup(n.as_str())).collect();
    let log = Arc::new(Mutex::new(AppliedLog::default()));
    let history = Arc::new(Mutex::new(History {
        votes: check_vote::Votes::new(opts.nodes),
        ..History::default()
    }));
    let policies = workload::policies();
    let nodes = hosts::handles(
        opts,
        &ips,
        &dir,
        &policies,
        &log,
        &history,
        EPOCH_SECS * 1_000_000_000,
    );
    for n in &nodes {
        let h = n.clone();
        sim.host(n.name.as_str(), move || h.clone().run());
    }
    let stop_ns = ns(opts.duration);
    // Clients know the members the cluster starts with (not the spare).
    let first_members: Vec<Arc<NodeHandle>> = nodes[..opts.nodes].to_vec();
    for c in 0..opts.clients {
        sim.client(
            format!("c{c}"),
            workload::client(
                c,
                opts.clone(),
                first_members.clone(),
                history.clone(),
                stop_ns,
            ),
        );
    }
    // `--membership-faults`: when, and which member the spare replaces.
    let replacement = membership::Shared::default();
    let replace = opts.membership_faults.then(|| {
        let mut rng = ChaCha8Rng::from_seed(derive(opts.seed, "membership"));
        // From 3 s (a fifth of a shorter workload) to 60 % of it: always within it.
        let lo = (stop_ns / 5).min(3_000_000_000);
        let at = rng.random_range(lo..=(stop_ns * 3 / 5).max(lo));
        (at, rng.random_range(0..opts.nodes))
    });
    let mut nemesis = Nemesis::new(
        opts.seed,
        opts.fault_every,
        opts.quick_restarts,
        opts.handover_faults,
        opts.disk_stalls,
        opts.crash_leaders,
    );
    let mut script = opts.clock_script.clone();
    script.sort_by_key(|s| s.at);
    let mut script = script.into_iter().peekable();

    // Whether every node that should run does; a node whose software ended by itself
    // (a panic shuts its runtime down) is a violation.
    let check_running = |sim: &mut turmoil::Sim<'_>, violations: &mut Vec<String>| -> bool {
        for n in &nodes {
            if !n.down.load(Ordering::SeqCst) && !sim.is_host_running(n.name.as_str()) {
                violations.push(format!(
                    "node {} stopped by itself at {} s (a panic or a startup error)",
                    n.name,
                    history::secs(ns(sim.elapsed()))
                ));
                return false;
            }
        }
        true
    };
    let step = |sim: &mut turmoil::Sim<'_>, violations: &mut Vec<String>| -> bool {
        match sim.step() {
            Ok(_) => true,
            Err(e) => {
                violations.push(format!(
                    "the simulation failed at {} s: {e}",
                    history::secs(ns(sim.elapsed()))
                ));
                false
            }
        }
    };
    // Steps the simulation, 50 steps at a time, until `done` holds or `within` (ns of
    // simulated time) has passed; false once a step failed.
    let run_until = |sim: &mut turmoil::Sim<'_>,
                     violations: &mut Vec<String>,
                     within: u64,
                     done: &mut dyn FnMut() -> bool|
     -> bool {
        let until = ns(sim.elapsed()) + within;
        while !done() && ns(sim.elapsed()) < until {
            for _ in 0..50 {
                if !step(sim, violations) {
                    return false;
                }
            }
        }
        true
    };

    // 1. Workload under faults.
    let mut alive = true;
    while alive && sim.elapsed() < opts.duration {
        let now = ns(sim.elapsed());
        if opts.nemesis {
            nemesis.step(&mut sim, &nodes, opts.shards, now, &mut lock(&history));
        }
        if let Some((at, victim)) = replace {
            if now >= at && !lock(&replacement).started {
                lock(&replacement).started = true;
                let spare = opts.nodes;
                lock(&history).fault(
                    now,
                    format_args!(
                        "replace {} by {} (admin: add {}, then remove {})",
                        nodes[victim].name,
                        nodes[spare].name,
                        nodes[spare].name,
                        nodes[victim].name
                    ),
                );
                sim.client(
                    "admin",
                    membership::replace(
                        nodes.clone(),
                        opts.nodes,
                        victim,
                        spare,
                        replacement.clone(),
                        history.clone(),
                    ),
                );
            }
        }
        while script.peek().is_some_and(|s| ns(s.at) <= now) {
            if let Some(s) = script.next() {
                let leader = match s.target {
                    Target::LeaderOf(g) | Target::FollowerOf(g) => nemesis::leader_of(&nodes, g),
                    Target::Every => None,
                };
                let victims = nodes.iter().filter(|n| match s.target {
                    Target::LeaderOf(_) => Some(n.id) == leader,
                    Target::FollowerOf(_) => leader.is_some() && Some(n.id) != leader,
                    Target::Every => true,
                });
                let mut hit = Vec::new();
                for v in victims {
                    if s.wall_by != 0 {
                        v.clock.step_wall(s.wall_by);
                    }
                    if let Some(ppm) = s.drift_ppm {
                        v.clock.set_drift_ppm(Duration::from_nanos(now), ppm);
                    }
                    hit.push(v.name.clone());
                    if !matches!(s.target, Target::Every) {
                        break;
                    }
                }
                if !hit.is_empty() {
                    lock(&history).fault(
                        now,
                        format_args!(
                            "clock {} ({:?}) wall steps {} ms, drift {:?} ppm",
                            hit.join(","),
                            s.target,
                            s.wall_by / 1_000_000,
                            s.drift_ppm
                        ),
                    );
                }
            }
        }
        alive = step(&mut sim, &mut violations) && check_running(&mut sim, &mut violations);
    }

    // 2. Heal everything; clients have stopped.
    let healed_at = ns(sim.elapsed());
    nemesis.heal(&mut sim, &nodes, healed_at, &mut lock(&history));
    let mut live = check_live::Liveness::default();
    let within = ns(opts.heal_within);
    // The members as the replacement leaves them (all nodes without it): once its changes
    // are through, they must agree on every shard's leader.
    let members = |r: &membership::Replacement| membership::members(&nodes, opts.nodes, r);
    if alive {
        while ns(sim.elapsed()) - healed_at <= within {
            let r = lock(&replacement).clone();
            if (!r.started || r.done) && leaders_agree(&members(&r), opts.shards) {
                live.leaders_after = Some(ns(sim.elapsed()) - healed_at);
                break;
            }
            for _ in 0..10 {
                alive = alive && step(&mut sim, &mut violations);
            }
            alive = alive && check_running(&mut sim, &mut violations);
            if !alive {
                break;
            }
        }
    }
    // 3. One under-limit check per shard, retried until admitted or out of time.
    let admitted: Arc<Mutex<Vec<Option<u64>>>> =
        Arc::new(Mutex::new(vec![None; opts.shards as usize]));
    let members = members(&lock(&replacement));
    if alive {
        sim.client(
            "probe",
            probe(
                opts.clone(),
                members.clone(),
                admitted.clone(),
                healed_at,
                healed_at + within,
            ),
        );
        let mut done = false;
        while alive && !done && ns(sim.elapsed()) - healed_at <= within + 1_000_000_000 {
            match sim.step() {
                Ok(finished) => done = finished,
                Err(e) => {
                    violations.push(format!("the simulation failed while probing: {e}"));
                    alive = false;
                }
            }
        }
        alive = alive && check_running(&mut sim, &mut violations);
    }
    live.admitted_after = lock(&admitted).clone();
    live.views = (0..opts.shards as usize)
        .map(|shard| {
            let view = |n: &Arc<NodeHandle>| {
                let c = n.service()?.cluster().cloned()?;
                let g = c.status_with(false).into_iter().nth(shard)?;
                Some(format!(
                    "{} {} of term {} (leader {:?}), log {} committed {} applied {}, \
                     snapshots built {} installed {}",
                    n.name,
                    g.state,
                    g.term,
                    g.leader,
                    g.last_log_index,
                    g.commit_index,
                    g.applied_index,
                    g.snapshots,
                    g.snapshots_installed
                ))
            };
            members
                .iter()
                .map(|n| view(n).unwrap_or_else(|| format!("{} down", n.name)))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect();
    // 4. Let the replicas catch up, then compare them. First a settling second: a fast
    // answer given just before the probe finished may sit in an entry still lingering or in
    // flight, which the replicas agree without (seed 50110 with the fallback clients ended
    // 1 ms after such an answer, and `check_fast` counted it lost).
    let mut final_digests = digests(&members);
    if alive {
        let settled = ns(sim.elapsed()) + SETTLE;
        while alive && ns(sim.elapsed()) < settled {
            alive = step(&mut sim, &mut violations);
        }
    }
    if alive {
        alive = run_until(&mut sim, &mut violations, ns(opts.heal_within), &mut || {
            final_digests = digests(&members);
            final_digests.len() == members.len()
                && final_digests.windows(2).all(|w| w[0].1 == w[1].1)
        });
    }
    if alive && opts.membership_faults {
        violations.extend(membership::check_voters(
            &members,
            &lock(&replacement),
            &nodes,
        ));
        // The removed node, still running, learns that it is out of every shard (a member
        // refuses its votes or the checks it forwards, or it applies its removal), and so
        // refuses their checks.
        let mut unaware = Vec::new();
        alive = run_until(&mut sim, &mut violations, ns(opts.heal_within), &mut || {
            unaware = membership::unaware_of_removal(&lock(&replacement), &nodes);
            unaware.is_empty()
        });
        if alive && !unaware.is_empty() {
            violations.push(format!(
                "the removed node does not know it was removed from shards {unaware:?} {} s \
                 after the caught-up replicas were compared",
                history::secs(ns(opts.heal_within))
            ));
        }
    }
    let simulated = sim.elapsed();
    let removed_refusals = members
        .iter()
        .filter_map(|n| n.service())
        .map(|s| {
            let refused = &s.metrics().removed_refusals;
            refused.with_label_values(&["vote"]).get()
                + refused.with_label_values(&["forward"]).get()
        })
        .sum();
    let snapshots_installed = nodes
        .iter()
        .filter_map(|n| n.service()?.cluster().cloned())
        .flat_map(|c| c.status_with(false))
        .map(|g| g.snapshots_installed)
        .sum();
    let counted = |count: fn(&crate::metrics::Metrics) -> u64| -> u64 {
        nodes
            .iter()
            .filter_map(|n| n.service())
            .map(|s| count(s.metrics()))
            .sum()
    };
    let forwarded = counted(|m| m.forwarded.get());
    let forward_calls = counted(|m| m.forward_calls.get());
    // A purge that reached a store before the snapshot covering it was durable: a crash
    // between would have left that replica unable to restart (the store counts it and
    // waits). Counted over every instance of each node, crashed ones included.
    let early_purges: u64 = nodes.iter().map(|n| n.early_purges()).sum();
    if early_purges > 0 {
        violations.push(format!(
            "{early_purges} log purges came before the snapshot covering them was on disk"
        ));
    }
    let replaced = {
        let r = lock(&replacement);
        if opts.membership_faults && !r.done && alive {
            violations.push(format!(
                "the replacement of a member was not through {} s after healing (added: {}, \
                 removed: {:?})",
                history::secs(ns(simulated).saturating_sub(healed_at)),
                r.added,
                r.removed.map(|i| nodes[i].name.clone())
            ));
        }
        r.done
    };
    // Stop every host before the directory goes (their runtimes hold its files).
    drop(sim);
    for n in &nodes {
        n.forget();
    }

    let mut history = std::mem::take(&mut *lock(&history));
    let log = std::mem::take(&mut *lock(&log));
    let decisions = log.decisions();
    let consistency = |storage_key: &str| {
        let name = storage_key.split(':').next().unwrap_or("");
        policies.get(name).map(|(l, o)| {
            let lost = hosts::ELECTION_TIMEOUT.as_nanos() as crate::limiter::Nanos;
            (check_fast::allowance(l, lost), o.consistency)
        })
    };
    let mut ops = OpCounts {
        retried: history.retries,
        replayed: log
            .entries
            .values()
            .flat_map(|r| &r.checks)
            .filter(|c| c.replayed)
            .count() as u64,
        ..OpCounts::default()
    };
    ops.refunds = log.refunds().count() as u64;
    for op in &history.ops {
        ops.invoked += 1;
        if op.items.len() > 1 {
            ops.multi += 1;
        }
        match &op.outcome {
            Outcome::Allowed => ops.allowed += 1,
            Outcome::Denied => ops.denied += 1,
            Outcome::Failed(_) => ops.failed += 1,
            Outcome::Unknown(_) | Outcome::Pending => {
                ops.unknown += 1;
                if op.outcome.is_undecided() {
                    ops.undecided += 1;
                }
                if op
                    .logged()
                    .any(|(id, _)| matches!(decisions.get(id.as_str()), Some((true, _))))
                {
                    ops.unknown_admitted += 1;
                }
            }
        }
    }
    violations.extend(check_strict::check(&log, |k| {
        consistency(k).is_some_and(|c| c.1 == Consistency::Strict)
    }));
    let outside = history::admitted_outside_the_log(&history.fallbacks);
    violations.extend(check_drift::check(
        &log,
        &history.ops,
        ns(simulated),
        opts.drift_bound_ppm,
        &outside,
        |k| consistency(k).is_some_and(|c| c.1 == Consistency::Strict),
    ));
    let refunded = log.refunded();
    for f in history.fallbacks.iter().filter(|f| f.allowed) {
        match f.rule {
            crate::policy::OnUnavailable::Local => ops.local_admitted += 1,
            crate::policy::OnUnavailable::Allow => ops.allow_admitted += 1,
            crate::policy::OnUnavailable::Deny => {}
        }
    }
    violations.extend(check_local::check(&history.fallbacks, opts.nodes as u64));
    ops.kept = check_lost::kept(&history, &decisions, &refunded);
    violations.extend(check_lost::check(&history, &decisions, &refunded, &outside));
    violations.extend(check_once::check(&log));
    violations.extend(check_vote::check(&history.votes));
    let (fast_excess, fast) = check_fast::check(
        &history,
        &log,
        &decisions,
        &outside,
        |policy, key| shard_of_key(opts, policy, key),
        |k| consistency(k).is_some_and(|c| c.1 == Consistency::Fast),
        |k| consistency(k).map_or(0, |c| c.0),
    );
    violations.extend(fast);
    if alive {
        violations.extend(check_agree::check(&log, &final_digests));
        violations.extend(check_live::check(&live, opts.heal_within));
    } else {
        violations.extend(check_agree::check(&log, &Vec::new()));
    }
    let end = format!(
        "end: {} ops, {} faults, {} violations",
        ops.invoked,
        history.faults,
        violations.len()
    );
    history.event(ns(simulated), end);
    drop(dir);
    Report {
        seed: opts.seed,
        simulated,
        ops,
        faults: history.faults,
        handovers: history.handovers,
        handovers_failed: history.handovers_failed,
        disk_stalls: history.disk_stalls,
        stall_crashes: history.stall_crashes,
        failovers: history.failovers.clone(),
        failovers_unresolved: history.failovers_unresolved,
        replaced: u64::from(replaced),
        removed_refusals,
        snapshots_installed,
        votes: history.votes.saved + history.votes.restored,
        forwarded,
        forward_calls,
        fast_excess,
        violations,
        history,
    }
}

/// Simulated time the nodes run after the probes, before their replicas are compared: far
/// longer than a fast entry lingers (`ClusterConfig::fast_linger`, 20 ms) plus a commit.
const SETTLE: u64 = 1_000_000_000;

/// After healing: one fresh key per shard under a strict limit, retried (on the next node)
/// until admitted; records how long after the heal each shard admitted.
async fn probe(
    opts: Options,
    nodes: Vec<Arc<NodeHandle>>,
    admitted: Arc<Mutex<Vec<Option<u64>>>>,
    healed_at: u64,
    deadline: u64,
) -> turmoil::Result {
    use crate::client::{Client, ClientConfig};
    use crate::net::turmoil::TurmoilConnector;
    let clients: Vec<_> = nodes
        .iter()
        .map(|n| {
            Client::with_connector(
                n.resp_addr(),
                TurmoilConnector,
                ClientConfig {
                    connections: 1,
                    timeout: Duration::from_secs(2),
                    jitter_seed: 0,
                    down_for: Duration::from_secs(1),
                    failback_after: Duration::from_secs(10),
                    routes_every: None,
                },
            )
        })
        .collect();
    for shard in 0..opts.shards {
        let key = (0..)
            .map(|i| format!("probe-{i}"))
            .find(|k| shard_of_key(&opts, "tb_strict", k) == shard)
            .unwrap_or_default();
        let mut attempt = 0usize;
        while workload::now() < deadline {
            let c = &clients[attempt % clients.len()];
            let id = format!("probe-{shard}-{attempt}");
            attempt += 1;
            if let Ok(a) = c.check(&[("tb_strict", key.as_str(), 1)], Some(&id)).await {
                if a.allowed {
                    lock(&admitted)[shard as usize] = Some(workload::now() - healed_at);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::first_ten;

    fn lines(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("v{i}")).collect()
    }

    #[test]
    fn first_ten_keeps_ten_lines_and_counts_the_rest() {
        assert_eq!(first_ten(lines(10).into_iter(), "x"), lines(10));
        let out = first_ten(lines(11).into_iter(), "divergent applies");
        assert_eq!(out.len(), 11);
        assert_eq!(out[..10], lines(10)[..]);
        assert_eq!(out[10], "... 11 divergent applies in all");
        assert!(first_ten(lines(0).into_iter(), "x").is_empty());
    }
}

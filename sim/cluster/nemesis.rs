//! The nemesis: every few simulated seconds it heals what it broke and picks a new fault —
//! isolate a shard's leader or a follower from the other nodes, a one-way partition, hold a
//! link's messages then release them, a latency spike, packet loss on a link, crash a node
//! and restart it from its disk, or disturb one host's clock (a wall-clock jump of up to
//! +/-300 s, a drift of up to +/-2 %, a backward wall step). Clock faults persist; the rest
//! last until the next pick, except that with `--quick-restarts` about half the faults are
//! crashes and a crashed node comes back after 1-350 ms (a supervisor's restart, usually
//! before the others' election timeout, with entries it proposed as leader and did not
//! commit; it comes back a follower, and leads again only through an election). With
//! `--disk-stalls` about a quarter of the picks stall a shard leader's disk for 5-400 ms: it
//! writes nothing but still replicates, so its followers commit entries it has not written;
//! half of those stalls end in a crash (a restart 1-350 ms later), which loses them from its
//! disk. At most one node is down at a time, so a majority can always form once the network
//! heals.

use super::history::History;
use super::hosts::NodeHandle;
use crate::raft::NodeId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use turmoil::Sim;

/// The links' normal latency bounds.
pub const MIN_LATENCY: Duration = Duration::from_millis(1);
pub const MAX_LATENCY: Duration = Duration::from_millis(10);
/// The largest clock drift the nemesis gives a node (2 %), either way.
pub const MAX_DRIFT_PPM: i64 = 20_000;

/// A fault in force, to be healed.
#[derive(Debug, Clone)]
enum Active {
    Partition(usize, usize),
    OneWay(usize, usize),
    Hold(usize, usize),
    Latency(usize, usize),
    Loss(usize, usize),
    Crashed(usize),
    Stalled(usize),
}

pub struct Nemesis {
    rng: ChaCha8Rng,
    next_at: u64,
    every: (Duration, Duration),
    active: Vec<Active>,
    /// `--quick-restarts`: crashed nodes come back within [`QUICK_RESTART_MS`].
    quick_restarts: bool,
    /// The crashed node a quick restart brings back, and when (simulated ns).
    restart_at: Option<(usize, u64)>,
    /// `--handover-faults`: some picks ask a leader to hand its shard over.
    handover_faults: bool,
    /// `--disk-stalls`: some picks stall a leader's disk.
    disk_stalls: bool,
    /// The node whose disk is stalled, when the stall ends (simulated ns), and whether it
    /// ends in a crash.
    stall_end: Option<(usize, u64, bool)>,
    /// `--crash-leaders`: every pick crashes a shard's leader.
    crash_leaders: bool,
    /// Shards whose leader a crash (not a quick one) took down: the crashed node, and when
    /// (simulated ns). Watched until another node leads the shard ([`History::failovers`]).
    awaiting: Vec<(u64, NodeId, u64)>,
}

/// How long a quickly restarted node stays down (ms): up to below the election timeout.
pub const QUICK_RESTART_MS: (u64, u64) = (1, 350);

/// The leader of `group` as the running nodes see it (the first answer found; a node that
/// knows it was removed from the shard gives none).
pub fn leader_of(nodes: &[Arc<NodeHandle>], group: u64) -> Option<NodeId> {
    nodes.iter().find_map(|n| view_of(n, group))
}

/// The leader of `group` by `n`'s own account: none while it is down, knows of none, or
/// knows it was removed from the shard.
fn view_of(n: &NodeHandle, group: u64) -> Option<NodeId> {
    let s = n.service()?;
    let c = s.cluster()?;
    c.leaders().get(group as usize)?.0
}

fn index_of(nodes: &[Arc<NodeHandle>], id: NodeId) -> Option<usize> {
    nodes.iter().position(|n| n.id == id)
}

impl Nemesis {
    pub fn new(
        seed: u64,
        every: (Duration, Duration),
        quick_restarts: bool,
        handover_faults: bool,
        disk_stalls: bool,
        crash_leaders: bool,
    ) -> Nemesis {
        Nemesis {
            rng: ChaCha8Rng::from_seed(super::derive(seed, "nemesis")),
            next_at: 3_000_000_000,
            every,
            active: Vec::new(),
            quick_restarts,
            restart_at: None,
            handover_faults,
            disk_stalls,
            stall_end: None,
            crash_leaders,
            awaiting: Vec::new(),
        }
    }

    /// Called before each simulation step at simulated time `now`.
    pub fn step(
        &mut self,
        sim: &mut Sim<'_>,
        nodes: &[Arc<NodeHandle>],
        shards: u32,
        now: u64,
        history: &mut History,
    ) {
        self.watch_failovers(nodes, now, history);
        if let Some((v, at, crash)) = self.stall_end {
            if now >= at {
                self.stall_end = None;
                self.active
                    .retain(|a| !matches!(a, Active::Stalled(s) if *s == v));
                nodes[v].stall.store(false, Ordering::SeqCst);
                if crash {
                    history.stall_crashes += 1;
                    self.crash(sim, nodes, v, now, history, true);
                } else {
                    history.event(
                        now,
                        format_args!("nemesis {}'s disk writes again", nodes[v].name),
                    );
                }
            }
        }
        if let Some((v, at)) = self.restart_at {
            if now >= at {
                self.restart_at = None;
                self.active
                    .retain(|a| !matches!(a, Active::Crashed(c) if *c == v));
                restart(sim, nodes, v, now, history);
            }
        }
        if now < self.next_at {
            return;
        }
        // `--crash-leaders`: the next crash waits for the last one's failovers (up to 20 s),
        // so each is timed alone.
        if self.crash_leaders
            && self
                .awaiting
                .iter()
                .any(|&(_, _, at)| now < at + 20_000_000_000)
        {
            return;
        }
        // A shard still without another leader when the next fault comes: the new fault
        // would muddle its time, so it is counted apart.
        history.failovers_unresolved += self.awaiting.len() as u64;
        self.awaiting.clear();
        self.heal(sim, nodes, now, history);
        let (lo, hi) = (
            self.every.0.as_millis() as u64,
            self.every.1.as_millis() as u64,
        );
        self.next_at = now + self.rng.random_range(lo..=hi.max(lo)) * 1_000_000;
        self.strike(sim, nodes, shards, now, history);
    }

    /// Records the shards of a crashed leader that another node now leads (by that node's
    /// own account: elected, its first entry perhaps not yet committed).
    fn watch_failovers(&mut self, nodes: &[Arc<NodeHandle>], now: u64, history: &mut History) {
        if self.awaiting.is_empty() {
            return;
        }
        self.awaiting.retain(|&(shard, crashed, at)| {
            let led = nodes.iter().any(|n| {
                n.id != crashed && !n.down.load(Ordering::SeqCst) && view_of(n, shard) == Some(n.id)
            });
            if led {
                history.failovers.push(now - at);
                history.event(
                    now,
                    format_args!(
                        "shard {shard} has a new leader {} s after its leader's crash",
                        super::history::secs(now - at)
                    ),
                );
            }
            !led
        });
        // `--crash-leaders`: the next crash comes at least the shortest pause after the last
        // failover, not the moment it ends.
        if self.crash_leaders && self.awaiting.is_empty() {
            let rest = self.every.0.as_nanos() as u64;
            self.next_at = self.next_at.max(now + rest);
        }
    }

    /// A shard drawn at random, and the index of its leader by the nodes' account.
    fn some_shards_leader(
        &mut self,
        nodes: &[Arc<NodeHandle>],
        shards: u32,
    ) -> (u32, Option<usize>) {
        let group = self.rng.random_range(0..shards.max(1));
        let leader = leader_of(nodes, u64::from(group)).and_then(|id| index_of(nodes, id));
        (group, leader)
    }

    fn pair(&mut self, n: usize) -> (usize, usize) {
        let a = self.rng.random_range(0..n);
        let b = (a + self.rng.random_range(1..n)) % n;
        (a, b)
    }

    fn strike(
        &mut self,
        sim: &mut Sim<'_>,
        nodes: &[Arc<NodeHandle>],
        shards: u32,
        now: u64,
        history: &mut History,
    ) {
        let n = nodes.len();
        let name = |i: usize| nodes[i].name.clone();
        if self.crash_leaders {
            // Crash a shard's leader (any node if it has none), to time its failover.
            let (_, leader) = self.some_shards_leader(nodes, shards);
            let v = leader.unwrap_or_else(|| self.rng.random_range(0..n));
            self.crash(sim, nodes, v, now, history, false);
            return;
        }
        if self.disk_stalls && self.rng.random_bool(0.25) {
            // Stall the disk of a shard's leader (any node if it has none); its writes wait
            // while it goes on replicating, so its followers commit what it has not written.
            let (group, leader) = self.some_shards_leader(nodes, shards);
            let v = leader.unwrap_or_else(|| self.rng.random_range(0..n));
            let ms = self.rng.random_range(5..=400u64);
            let crash = self.rng.random_bool(0.5);
            nodes[v].stall.store(true, Ordering::SeqCst);
            history.disk_stalls += 1;
            self.active.push(Active::Stalled(v));
            self.stall_end = Some((v, now + ms * 1_000_000, crash));
            let end = if crash { " then crash it" } else { "" };
            let whose = if leader.is_some() {
                "its leader by the nodes' account"
            } else {
                "no leader known: a node at random"
            };
            history.fault(
                now,
                format_args!(
                    "stall {}'s disk for {ms} ms{end} (shard {group}, {whose})",
                    name(v)
                ),
            );
            return;
        }
        if self.handover_faults && self.rng.random_bool(0.25) {
            // Ask a shard's leader to hand the shard to another node (which may be down or
            // cut off: the handover then fails, and the leader stays).
            let (group, leader) = self.some_shards_leader(nodes, shards);
            let Some(from) = leader else {
                history.fault(now, format_args!("handover of shard {group}: no leader"));
                return;
            };
            let to = (from + self.rng.random_range(1..n)) % n;
            let asked = nodes[from]
                .service()
                .and_then(|s| s.cluster().map(|c| c.start_handover(group, nodes[to].id)))
                .unwrap_or(false);
            history.fault(
                now,
                format_args!(
                    "hand shard {group} from {} to {} (asked: {asked})",
                    name(from),
                    name(to)
                ),
            );
            return;
        }
        // With quick restarts, about half the faults are crashes. The victim is any node; with
        // four shards' leaders spread over three nodes, it usually leads at least one (over
        // five, about one node in five leads none).
        let pick = if self.quick_restarts && self.rng.random_bool(0.5) {
            6
        } else {
            self.rng.random_range(0..10u32)
        };
        match pick {
            0 | 1 => {
                // Isolate a shard's leader (0) or a follower of it (1) from the other nodes.
                let (group, leader) = self.some_shards_leader(nodes, shards);
                let leader = leader.unwrap_or_else(|| self.rng.random_range(0..n));
                let victim = if self.rng.random_bool(0.5) {
                    leader
                } else {
                    (leader + self.rng.random_range(1..n)) % n
                };
                for other in (0..n).filter(|&o| o != victim) {
                    sim.partition(name(victim), name(other));
                    self.active.push(Active::Partition(victim, other));
                }
                let role = if victim == leader {
                    "leader"
                } else {
                    "a follower"
                };
                history.fault(
                    now,
                    format_args!("isolate {} ({role} of shard {group})", name(victim)),
                );
            }
            2 => {
                let (a, b) = self.pair(n);
                sim.partition_oneway(name(a), name(b));
                self.active.push(Active::OneWay(a, b));
                history.fault(now, format_args!("drop {} -> {}", name(a), name(b)));
            }
            3 => {
                let (a, b) = self.pair(n);
                sim.hold(name(a), name(b));
                self.active.push(Active::Hold(a, b));
                history.fault(now, format_args!("hold {} <-> {}", name(a), name(b)));
            }
            4 => {
                let (a, b) = self.pair(n);
                let ms = self.rng.random_range(100..=1500u64);
                sim.set_link_max_message_latency(name(a), name(b), Duration::from_millis(ms));
                self.active.push(Active::Latency(a, b));
                history.fault(
                    now,
                    format_args!("latency {} <-> {} up to {ms} ms", name(a), name(b)),
                );
            }
            5 => {
                let (a, b) = self.pair(n);
                let rate = self.rng.random_range(1..=20u32) as f64 / 1000.0;
                sim.set_link_fail_rate(name(a), name(b), rate);
                self.active.push(Active::Loss(a, b));
                history.fault(
                    now,
                    format_args!("loss {} <-> {} rate {rate}", name(a), name(b)),
                );
            }
            6 => {
                let v = self.rng.random_range(0..n);
                let quick = self.quick_restarts;
                self.crash(sim, nodes, v, now, history, quick);
            }
            7 => {
                let v = self.rng.random_range(0..n);
                let by = self.rng.random_range(-300_000i64..=300_000) * 1_000_000;
                nodes[v].clock.step_wall(by);
                history.fault(
                    now,
                    format_args!("clock {} wall jumps {} ms", name(v), by / 1_000_000),
                );
            }
            8 => {
                let v = self.rng.random_range(0..n);
                let ppm = self.rng.random_range(-MAX_DRIFT_PPM..=MAX_DRIFT_PPM);
                nodes[v].clock.set_drift_ppm(Duration::from_nanos(now), ppm);
                history.fault(now, format_args!("clock {} drifts {ppm} ppm", name(v)));
            }
            _ => {
                let v = self.rng.random_range(0..n);
                let back = self.rng.random_range(1..=60_000i64) * 1_000_000;
                nodes[v].clock.step_wall(-back);
                history.fault(
                    now,
                    format_args!("clock {} wall steps back {} ms", name(v), back / 1_000_000),
                );
            }
        }
    }

    /// Crashes node `v` (restarted from its disk at the next heal, or after 1-350 ms if
    /// `quick`).
    fn crash(
        &mut self,
        sim: &mut Sim<'_>,
        nodes: &[Arc<NodeHandle>],
        v: usize,
        now: u64,
        history: &mut History,
        quick: bool,
    ) {
        let name = nodes[v].name.clone();
        let led = nodes[v]
            .service()
            .and_then(|s| s.cluster().map(|c| c.led_shards()))
            .unwrap_or_default();
        for &g in &led {
            *history.leader_crashes.entry(u64::from(g)).or_default() += 1;
            if !quick {
                self.awaiting.push((u64::from(g), nodes[v].id, now));
            }
        }
        sim.crash(name.clone());
        nodes[v].forget();
        nodes[v].down.store(true, Ordering::SeqCst);
        self.active.push(Active::Crashed(v));
        history.fault(now, format_args!("crash {name} (leading shards {led:?})"));
        if quick {
            let (lo, hi) = QUICK_RESTART_MS;
            let ms = self.rng.random_range(lo..=hi);
            self.restart_at = Some((v, now + ms * 1_000_000));
        }
    }

    /// Heals every fault in force (restarting a crashed node from its disk).
    pub fn heal(
        &mut self,
        sim: &mut Sim<'_>,
        nodes: &[Arc<NodeHandle>],
        now: u64,
        history: &mut History,
    ) {
        // The shards still awaiting a leader at the end of the run: the liveness check
        // after healing judges them.
        self.awaiting.clear();
        if self.active.is_empty() {
            return;
        }
        let name = |i: usize| nodes[i].name.clone();
        for a in std::mem::take(&mut self.active) {
            match a {
                Active::Partition(x, y) => sim.repair(name(x), name(y)),
                Active::OneWay(x, y) => sim.repair_oneway(name(x), name(y)),
                Active::Hold(x, y) => sim.release(name(x), name(y)),
                Active::Latency(x, y) => {
                    sim.set_link_max_message_latency(name(x), name(y), MAX_LATENCY)
                }
                Active::Loss(x, y) => sim.set_link_fail_rate(name(x), name(y), 0.0),
                Active::Crashed(v) => restart(sim, nodes, v, now, history),
                Active::Stalled(v) => nodes[v].stall.store(false, Ordering::SeqCst),
            }
        }
        self.restart_at = None;
        self.stall_end = None;
        history.event(now, "nemesis heal");
    }
}

/// Restarts crashed node `v` from its disk.
fn restart(
    sim: &mut Sim<'_>,
    nodes: &[Arc<NodeHandle>],
    v: usize,
    now: u64,
    history: &mut History,
) {
    nodes[v].down.store(false, Ordering::SeqCst);
    sim.bounce(nodes[v].name.clone());
    history.event(now, format_args!("nemesis restart {}", nodes[v].name));
}

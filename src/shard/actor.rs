//! One ractor actor per shard, under a supervisor.
//!
//! The shard actor is the only writer of its shard's state: it takes one batch of commands
//! per message (a connection's pipelined checks for this shard arrive together), stamps the
//! batch with one shard time from the `Clock` seam, applies it and answers every command
//! exactly once through the reply port.
//!
//! The state lives outside the actor (in its [`Slot`]) so that a crashed actor — a panic in
//! a handler — is restarted by the supervisor on the same state, continuing the same shard
//! time: a crash never hands out fresh allowances. The failure is logged and counted.
//!
//! Each shard's queue is bounded: a caller must hold one of [`QUEUE_BOUND`] permits while
//! its batch is queued or running, and waits at most the shard timeout for one.
//!
//! Hand-off: callers put their batch in the shard's lane (a short mutex-guarded queue) and
//! poke the actor with one `Drain` message only if it is not already scheduled. The actor
//! drains everything queued at once and applies it as ONE batch with one shard time, then
//! answers each caller through its own oneshot. Under load many connections' batches share
//! one actor activation (a ractor message costs a task wake-up, a select over the actor's
//! ports and a catch_unwind); with no load it adds no delay.

use super::command::{Applied, Batch, Command};
use super::lane::Lane;
use super::state::{Bounds, ShardState};
use crate::clock::{ShardTime, SharedClock};
use crate::metrics::Metrics;
use crate::service::ShardStatus;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};

/// Batches that may wait for or run in one shard at once.
pub const QUEUE_BOUND: usize = 1024;

/// One caller's batch waiting in a shard's lane.
struct Pending {
    commands: Vec<Command>,
    reply: oneshot::Sender<Vec<Applied>>,
}

/// Messages to a shard actor.
pub enum ShardMsg {
    /// Apply everything waiting in the lane.
    Drain,
    /// Test hook: panic inside the handler, to exercise supervision.
    #[doc(hidden)]
    Crash,
    /// Test hook: the actor answers nothing for this long (a stuck shard).
    #[doc(hidden)]
    Stall(std::time::Duration),
}

/// Everything about one shard that outlives its actor.
struct Slot {
    id: u32,
    actor: RwLock<Option<ActorRef<ShardMsg>>>,
    state: Arc<Mutex<ShardState>>,
    permits: Semaphore,
    /// Batches handed to the actor, drained together (and whether a `Drain` is on its way).
    lane: Lane<Pending>,
    keys: AtomicU64,
    time: AtomicU64,
    restarts: AtomicU64,
    /// This shard's series of the keys and queue-depth gauges, looked up once (a labelled
    /// lookup hashes the label on every call).
    keys_gauge: prometheus::IntGauge,
    depth_gauge: prometheus::IntGauge,
}

impl Slot {
    /// The shard's current actor, if one is running.
    fn actor(&self) -> Option<ActorRef<ShardMsg>> {
        self.actor.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn lock(state: &Mutex<ShardState>) -> MutexGuard<'_, ShardState> {
    // A panic while applying leaves the state as far as it got; keep serving it rather than
    // forgetting it (forgetting would grant fresh allowances).
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct ShardActor;

impl ShardRun {
    /// Applies commands as one batch at one shard time, and publishes the shard's stats.
    fn apply(&mut self, commands: Vec<Command>) -> Vec<Applied> {
        let batch = Batch {
            time: self.time.now(),
            commands,
            later: Vec::new(),
            epoch: 0,
        };
        let results = {
            let mut state = lock(&self.slot.state);
            let results = state.apply(&batch);
            self.slot.keys.store(state.len() as u64, Ordering::Relaxed);
            results
        };
        self.slot.time.store(batch.time, Ordering::Relaxed);
        self.slot
            .keys_gauge
            .set(self.slot.keys.load(Ordering::Relaxed) as i64);
        results
    }
}

struct ShardArgs {
    slot: Arc<Slot>,
    clock: SharedClock,
}

struct ShardRun {
    slot: Arc<Slot>,
    time: ShardTime,
}

impl Actor for ShardActor {
    type Msg = ShardMsg;
    type State = ShardRun;
    type Arguments = ShardArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ShardMsg>,
        args: ShardArgs,
    ) -> Result<ShardRun, ActorProcessingErr> {
        let base = lock(&args.slot.state).time();
        // A predecessor may have died with batches in the lane and the flag set: drain them.
        args.slot.lane.mark_scheduled();
        myself.cast(ShardMsg::Drain)?;
        Ok(ShardRun {
            time: ShardTime::new(args.clock, base),
            slot: args.slot,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ShardMsg>,
        msg: ShardMsg,
        run: &mut ShardRun,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ShardMsg::Drain => {
                // Clears the flag first: a batch queued after this point sends a new Drain.
                let pending = run.slot.lane.begin_drain();
                if pending.is_empty() {
                    return Ok(());
                }
                let mut lengths = Vec::with_capacity(pending.len());
                let mut replies = Vec::with_capacity(pending.len());
                let mut commands = Vec::new();
                for p in pending {
                    lengths.push(p.commands.len());
                    replies.push(p.reply);
                    commands.extend(p.commands);
                }
                let mut results = run.apply(commands).into_iter();
                for (n, reply) in lengths.into_iter().zip(replies) {
                    // A caller that timed out is gone; its answer is dropped.
                    let _ = reply.send(results.by_ref().take(n).collect());
                }
            }
            ShardMsg::Crash => panic!("shard {} crashed on purpose (test hook)", run.slot.id),
            ShardMsg::Stall(d) => tokio::time::sleep(d).await,
        }
        Ok(())
    }
}

struct Supervisor;

struct SupervisorState {
    slots: Arc<Vec<Arc<Slot>>>,
    clock: SharedClock,
    metrics: Metrics,
    stopping: Arc<AtomicBool>,
}

impl Supervisor {
    async fn spawn_shard(
        myself: &ActorRef<()>,
        sup: &SupervisorState,
        slot: &Arc<Slot>,
    ) -> Result<(), ActorProcessingErr> {
        let args = ShardArgs {
            slot: slot.clone(),
            clock: sup.clock.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, ShardActor, args, myself.get_cell()).await?;
        *slot.actor.write().unwrap_or_else(|p| p.into_inner()) = Some(actor);
        Ok(())
    }
}

impl Actor for Supervisor {
    type Msg = ();
    type State = SupervisorState;
    type Arguments = SupervisorState;

    async fn pre_start(
        &self,
        myself: ActorRef<()>,
        sup: SupervisorState,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        for slot in sup.slots.iter() {
            Self::spawn_shard(&myself, &sup, slot).await?;
        }
        Ok(sup)
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<()>,
        event: SupervisionEvent,
        sup: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        if sup.stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
        let failed = sup
            .slots
            .iter()
            .find(|s| s.actor().is_some_and(|a| a.get_id() == cell.get_id()));
        if let Some(slot) = failed.cloned() {
            tracing::error!(shard = slot.id, reason = %why, "shard actor failed; restarting it on its state");
            sup.metrics.shard_restarts.inc();
            slot.restarts.fetch_add(1, Ordering::Relaxed);
            Self::spawn_shard(&myself, sup, &slot).await?;
            // `stop` may have run since the check above. It sets the flag BEFORE it stops the
            // actors it finds in the slots, and the new actor is in its slot now: so either
            // `stop` saw the new actor and stops it, or this check sees the flag.
            // (tests/loom_shutdown.rs models this.)
            if sup.stopping.load(Ordering::SeqCst) {
                if let Some(a) = slot.actor() {
                    a.stop(None);
                }
            }
        }
        Ok(())
    }
}

/// Why a shard could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("shard {0} is overloaded (its queue stayed full for the shard timeout)")]
    Overloaded(u32),
    #[error("shard {0} is restarting")]
    Restarting(u32),
    /// A cluster node that was removed from the shard's group: it decides nothing of it
    /// any more, and its clients are to use the members.
    #[error("this node was removed from the cluster (shard {0}): send to a member")]
    Removed(u32),
}

/// The running shards of a node.
pub struct Shards {
    slots: Arc<Vec<Arc<Slot>>>,
    supervisor: ActorRef<()>,
    stopping: Arc<AtomicBool>,
    timeout: Duration,
}

impl Shards {
    /// Starts `count` shard actors, each holding at most `bounds.max_keys` keys.
    pub async fn start(
        count: u32,
        bounds: Bounds,
        clock: SharedClock,
        metrics: Metrics,
        timeout: Duration,
    ) -> Result<Shards, String> {
        let slots: Arc<Vec<Arc<Slot>>> = Arc::new(
            (0..count.max(1))
                .map(|id| {
                    Arc::new(Slot {
                        id,
                        actor: RwLock::new(None),
                        state: Arc::new(Mutex::new(ShardState::new(bounds))),
                        permits: Semaphore::new(QUEUE_BOUND),
                        lane: Lane::new(),
                        keys: AtomicU64::new(0),
                        time: AtomicU64::new(0),
                        restarts: AtomicU64::new(0),
                        keys_gauge: metrics.keys.with_label_values(&[&id.to_string()]),
                        depth_gauge: metrics.queue_depth.with_label_values(&[&id.to_string()]),
                    })
                })
                .collect(),
        );
        let stopping = Arc::new(AtomicBool::new(false));
        let sup = SupervisorState {
            slots: slots.clone(),
            clock,
            metrics: metrics.clone(),
            stopping: stopping.clone(),
        };
        let (supervisor, _) = Actor::spawn(None, Supervisor, sup)
            .await
            .map_err(|e| format!("cannot start the shard supervisor: {e}"))?;
        Ok(Shards {
            slots,
            supervisor,
            stopping,
            timeout,
        })
    }

    pub fn count(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Applies `commands` on `shard` as one batch. Waits at most the shard timeout for a place
    /// in the queue; the caller bounds the wait for the answer.
    pub async fn apply(
        &self,
        shard: u32,
        commands: Vec<Command>,
    ) -> Result<Vec<Applied>, ShardError> {
        let slot = &self.slots[shard as usize % self.slots.len()];
        // A free place is taken without arming a timer; a full queue is waited on for at most
        // the shard timeout.
        let _permit = match slot.permits.try_acquire() {
            Ok(p) => p,
            Err(_) => tokio::time::timeout(self.timeout, slot.permits.acquire())
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or(ShardError::Overloaded(slot.id))?,
        };
        let depth = (QUEUE_BOUND - slot.permits.available_permits()) as i64;
        slot.depth_gauge.set(depth);
        let actor = slot.actor().ok_or(ShardError::Restarting(slot.id))?;
        let n = commands.len();
        let (reply, answer) = oneshot::channel();
        if slot.lane.push(Pending { commands, reply }) && actor.cast(ShardMsg::Drain).is_err() {
            // The actor we read is gone. Its successor drains the lane when it starts, but it
            // may have started (and drained) before our push: wake the successor once it is
            // in the slot, for up to ~100 ms; only then give the wake-up back.
            let mut woken = false;
            for _ in 0..50 {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                let current = slot.actor();
                if let Some(a) = current {
                    if a.get_id() != actor.get_id() && a.cast(ShardMsg::Drain).is_ok() {
                        woken = true;
                        break;
                    }
                }
            }
            if !woken {
                slot.lane.wake_failed();
            }
        }
        // No timer here: the caller bounds the whole call (see `Service::check_many`), so a
        // pipeline fanned out over many shards arms one timer, not one per shard.
        let result = match answer.await {
            Ok(results) if results.len() == n => Ok(results),
            _ => Err(ShardError::Restarting(slot.id)),
        };
        slot.depth_gauge
            .set((QUEUE_BOUND - slot.permits.available_permits()) as i64 - 1);
        result
    }

    /// Every shard's status.
    pub fn status(&self) -> Vec<ShardStatus> {
        self.slots
            .iter()
            .map(|s| ShardStatus {
                shard: s.id,
                keys: s.keys.load(Ordering::Relaxed),
                queue_depth: (QUEUE_BOUND - s.permits.available_permits()) as u64,
                shard_time_ns: s.time.load(Ordering::Relaxed),
                restarts: s.restarts.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Test hook: makes a shard's actor panic.
    #[doc(hidden)]
    pub fn crash(&self, shard: u32) {
        let slot = &self.slots[shard as usize % self.slots.len()];
        if let Some(a) = slot.actor() {
            let _ = a.cast(ShardMsg::Crash);
        }
    }

    /// Test hook: every shard's actor answers nothing for `d`.
    #[doc(hidden)]
    pub fn stall(&self, d: std::time::Duration) {
        for slot in self.slots.iter() {
            if let Some(a) = slot.actor() {
                let _ = a.cast(ShardMsg::Stall(d));
            }
        }
    }

    /// Stops every shard actor (no restarts from here on). The flag is set first, then every
    /// actor found in the slots is stopped (ractor does not stop a supervisor's linked
    /// children with it); a restart racing this stops its own new actor (see the supervisor).
    pub async fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for slot in self.slots.iter() {
            if let Some(a) = slot.actor() {
                a.stop(None);
            }
        }
        self.supervisor.stop(None);
    }
}

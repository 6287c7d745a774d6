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

use super::command::{Applied, Batch, Command};
use super::state::{Bounds, ShardState};
use crate::clock::{ShardTime, SharedClock};
use crate::metrics::Metrics;
use crate::service::ShardStatus;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Batches that may wait for or run in one shard at once.
pub const QUEUE_BOUND: usize = 1024;

/// Messages to a shard actor.
pub enum ShardMsg {
    Apply(Vec<Command>, RpcReplyPort<Vec<Applied>>),
    /// Test hook: panic inside the handler, to exercise supervision.
    #[doc(hidden)]
    Crash,
}

/// Everything about one shard that outlives its actor.
struct Slot {
    id: u32,
    actor: RwLock<Option<ActorRef<ShardMsg>>>,
    state: Arc<Mutex<ShardState>>,
    permits: Semaphore,
    keys: AtomicU64,
    time: AtomicU64,
    restarts: AtomicU64,
}

fn lock(state: &Mutex<ShardState>) -> MutexGuard<'_, ShardState> {
    // A panic while applying leaves the state as far as it got; keep serving it rather than
    // forgetting it (forgetting would grant fresh allowances).
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct ShardActor;

struct ShardArgs {
    slot: Arc<Slot>,
    clock: SharedClock,
    metrics: Metrics,
}

struct ShardRun {
    slot: Arc<Slot>,
    time: ShardTime,
    metrics: Metrics,
    label: String,
}

impl Actor for ShardActor {
    type Msg = ShardMsg;
    type State = ShardRun;
    type Arguments = ShardArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ShardMsg>,
        args: ShardArgs,
    ) -> Result<ShardRun, ActorProcessingErr> {
        let base = lock(&args.slot.state).time();
        Ok(ShardRun {
            label: args.slot.id.to_string(),
            time: ShardTime::new(args.clock, base),
            slot: args.slot,
            metrics: args.metrics,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ShardMsg>,
        msg: ShardMsg,
        run: &mut ShardRun,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ShardMsg::Apply(commands, reply) => {
                let batch = Batch {
                    time: run.time.now(),
                    commands,
                };
                let results = {
                    let mut state = lock(&run.slot.state);
                    let results = state.apply(&batch);
                    run.slot.keys.store(state.len() as u64, Ordering::Relaxed);
                    results
                };
                run.slot.time.store(batch.time, Ordering::Relaxed);
                run.metrics
                    .keys
                    .with_label_values(&[&run.label])
                    .set(run.slot.keys.load(Ordering::Relaxed) as i64);
                // The caller may have timed out and gone; its answer is then dropped.
                let _ = reply.send(results);
            }
            ShardMsg::Crash => panic!("shard {} crashed on purpose (test hook)", run.slot.id),
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
            metrics: sup.metrics.clone(),
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
        let failed = sup.slots.iter().find(|s| {
            s.actor
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|a| a.get_id() == cell.get_id())
        });
        if let Some(slot) = failed.cloned() {
            tracing::error!(shard = slot.id, reason = %why, "shard actor failed; restarting it on its state");
            sup.metrics.shard_restarts.inc();
            slot.restarts.fetch_add(1, Ordering::Relaxed);
            Self::spawn_shard(&myself, sup, &slot).await?;
        }
        Ok(())
    }
}

/// Why a shard could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("shard {0} is overloaded (its queue stayed full for the shard timeout)")]
    Overloaded(u32),
    #[error("shard {0} did not answer within the shard timeout")]
    Timeout(u32),
    #[error("shard {0} is restarting")]
    Restarting(u32),
}

/// The running shards of a node.
pub struct Shards {
    slots: Arc<Vec<Arc<Slot>>>,
    supervisor: ActorRef<()>,
    stopping: Arc<AtomicBool>,
    timeout: Duration,
    metrics: Metrics,
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
                        keys: AtomicU64::new(0),
                        time: AtomicU64::new(0),
                        restarts: AtomicU64::new(0),
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
            metrics,
        })
    }

    pub fn count(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Applies `commands` on `shard` as one batch, waiting at most the shard timeout.
    pub async fn apply(
        &self,
        shard: u32,
        commands: Vec<Command>,
    ) -> Result<Vec<Applied>, ShardError> {
        let slot = &self.slots[shard as usize % self.slots.len()];
        let _permit = tokio::time::timeout(self.timeout, slot.permits.acquire())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(ShardError::Overloaded(slot.id))?;
        let depth = (QUEUE_BOUND - slot.permits.available_permits()) as i64;
        let label = slot.id.to_string();
        self.metrics
            .queue_depth
            .with_label_values(&[&label])
            .set(depth);
        let actor = slot
            .actor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(ShardError::Restarting(slot.id))?;
        let n = commands.len();
        let result = match actor
            .call(|reply| ShardMsg::Apply(commands, reply), Some(self.timeout))
            .await
        {
            Ok(CallResult::Success(results)) if results.len() == n => Ok(results),
            Ok(CallResult::Timeout) => Err(ShardError::Timeout(slot.id)),
            _ => Err(ShardError::Restarting(slot.id)),
        };
        self.metrics
            .queue_depth
            .with_label_values(&[&label])
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
        if let Some(a) = slot
            .actor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = a.cast(ShardMsg::Crash);
        }
    }

    /// Stops every shard actor (no restarts from here on).
    pub async fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.supervisor.stop(None);
    }
}

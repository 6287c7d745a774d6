//! Forwarded checks, in batches under load: a caller forwarding to a peer (strict and fast
//! apart) sends at once, in a call of its own, while fewer than [`MAX_IN_FLIGHT`] calls to
//! that peer are out; past that it waits, and when the next call ends, every caller
//! waiting then goes in one [`PeerRequest::ForwardMany`] (up to [`MAX_COMMANDS`] commands
//! and about [`MAX_BYTES`]). So a light load costs no wait and no extra task, and a burst
//! of forwards is a few calls, not one per check: the peer transport's bound on bulk calls
//! running at once (`rpc::is_bulk`) then counts batches. A waiting caller waits for the
//! first of those calls to end. Strict and fast checks apart: a fast check's answer never
//! waits for a strict one's commit in the same reply. (A sender task that took the queue
//! after a yield for every forward cost strict checks about 5% of their throughput at a
//! light load, for batches of one or two: docs/benchmarks.md.)
//!
//! The peer decides each item as it would a call of its own (`Cluster::decide_forwarded`),
//! and the reply carries each item's answer. A member of an older build refuses the variant
//! unread (decided nothing); the items then go one call each, as it reads them.

use super::rpc::{
    ask, CallError, ForwardAnswer, ForwardError, ForwardItem, PeerRequest, PeerResponse, Transport,
};
use super::types::{GroupId, NodeId};
use crate::clock::SharedClock;
use crate::limiter::Nanos;
use crate::shard::command::Command;
use prometheus::IntCounter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// Most commands in one call (more wait for the next, which goes at once).
pub const MAX_COMMANDS: usize = 4096;
/// About the most bytes of keys and request ids in one call, well below the peer frame cap.
pub const MAX_BYTES: usize = 4 << 20;

/// What a forwarded item came to at its sender.
pub type Outcome = Result<ForwardAnswer, CallError>;

struct Waiting {
    group: GroupId,
    commands: Vec<Command>,
    /// This node's monotonic ns: not to be decided later.
    deadline: Nanos,
    reply: oneshot::Sender<Outcome>,
}

/// Most calls with forwarded checks out to one peer (strict or fast) at once, by default
/// (`ClusterConfig::forward_in_flight`): below it a caller sends at once; at it, callers
/// wait for the next call to end, and then go together in one.
pub const MAX_IN_FLIGHT: usize = 32;

/// The callers forwarding to one peer (strict or fast).
#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// Calls out now.
    in_flight: usize,
}

impl Queue {
    /// A call to send now, in a slot it takes, if there is a slot and anyone waits: the
    /// waiting callers, up to what one call carries.
    fn start(&mut self, max_in_flight: usize) -> Option<Vec<Waiting>> {
        if self.waiting.is_empty() || self.in_flight >= max_in_flight {
            return None;
        }
        let (mut commands, mut bytes, mut take) = (0, 0, 0);
        for w in &self.waiting {
            let size = approx_bytes(&w.commands);
            let over = commands + w.commands.len() > MAX_COMMANDS || bytes + size > MAX_BYTES;
            if take > 0 && over {
                break;
            }
            (commands, bytes, take) = (commands + w.commands.len(), bytes + size, take + 1);
        }
        let rest = self.waiting.split_off(take);
        self.in_flight += 1;
        Some(std::mem::replace(&mut self.waiting, rest))
    }

    /// [`Queue::start`] while there are slots and callers waiting.
    fn start_all(&mut self, max_in_flight: usize) -> Vec<Vec<Waiting>> {
        std::iter::from_fn(|| self.start(max_in_flight)).collect()
    }
}

/// How a caller's checks go.
enum Going {
    /// In a call of their own, in the slot taken for it.
    Now(Vec<Command>),
    /// Queued: their answer comes here, and these calls are to be sent now.
    Queued(oneshot::Receiver<Outcome>, Vec<Vec<Waiting>>),
}

/// A call's slot among [`MAX_IN_FLIGHT`]: given back when the call ends (or its caller
/// goes), and then the callers waiting go in the next call.
struct Slot(Arc<Forwarder>, (NodeId, bool));

impl Drop for Slot {
    fn drop(&mut self) {
        let Slot(forwarder, key) = self;
        let next = {
            let mut queues = forwarder.queues();
            let Some(queue) = queues.get_mut(key) else {
                return;
            };
            queue.in_flight -= 1;
            queue.start_all(forwarder.max_in_flight)
        };
        for batch in next {
            forwarder.spawn_call(*key, batch);
        }
    }
}

pub struct Forwarder {
    transport: Arc<dyn Transport>,
    clock: SharedClock,
    /// Longest wait for a call's answer.
    timeout: Duration,
    /// Calls out to one peer (strict or fast) past which callers wait ([`MAX_IN_FLIGHT`]).
    max_in_flight: usize,
    /// Commands sent, each attempt (`quorate_forwarded_checks_total`).
    forwarded: IntCounter,
    /// Calls that carried them (`quorate_forward_calls_total`).
    calls: IntCounter,
    /// By peer and consistency (fast or not). An entry stays when its peer is idle: peers
    /// are few, and a forward at a light load then costs no map insert.
    queues: Mutex<HashMap<(NodeId, bool), Queue>>,
}

/// The whole microseconds from `now` to `deadline` (this node's monotonic ns), none if
/// it has passed: an item is sent with them, and not at all without.
fn within_us(deadline: Nanos, now: Nanos) -> Option<u64> {
    Some(deadline.saturating_sub(now) / 1_000).filter(|&us| us > 0)
}

/// The answer to a caller whose deadline passed before its item was sent: not decided.
fn late() -> Outcome {
    let late = ForwardError::Unavailable("the caller's deadline passed".into());
    Ok(ForwardAnswer::Decided(Err(late)))
}

/// A rough size of `commands` on the wire, to keep a call well below the frame cap.
fn approx_bytes(commands: &[Command]) -> usize {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    commands
        .iter()
        .map(|c| {
            64 + match c {
                Command::Check {
                    key, request_id, ..
                }
                | Command::Refund {
                    key, request_id, ..
                } => key.len() + text(request_id),
                Command::Evict => 0,
            }
        })
        .sum()
}

impl Forwarder {
    pub fn new(
        transport: Arc<dyn Transport>,
        clock: SharedClock,
        timeout: Duration,
        max_in_flight: usize,
        forwarded: IntCounter,
        calls: IntCounter,
    ) -> Forwarder {
        Forwarder {
            transport,
            clock,
            timeout,
            max_in_flight: max_in_flight.max(1),
            forwarded,
            calls,
            queues: Mutex::default(),
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<(NodeId, bool), Queue>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `commands` for `group` to `to` (believed to lead it), to be decided by
    /// `deadline` (this node's monotonic ns), and waits for the answer: at once in a call of
    /// its own while fewer than [`MAX_IN_FLIGHT`] calls to `to` are out, else in the next
    /// call with the others waiting then.
    pub async fn forward(
        self: &Arc<Self>,
        to: NodeId,
        group: GroupId,
        commands: Vec<Command>,
        fast: bool,
        deadline: Nanos,
    ) -> Outcome {
        let key = (to, fast);
        let queued = {
            let mut queues = self.queues();
            let queue = queues.entry(key).or_default();
            if queue.waiting.is_empty() && queue.in_flight < self.max_in_flight {
                queue.in_flight += 1;
                Going::Now(commands)
            } else {
                let (reply, answer) = oneshot::channel();
                queue.waiting.push(Waiting {
                    group,
                    commands,
                    deadline,
                    reply,
                });
                Going::Queued(answer, queue.start_all(self.max_in_flight))
            }
        };
        let (answer, batches) = match queued {
            Going::Queued(answer, batches) => (answer, batches),
            // A slot and no one waiting: at once, in a call of its own from the caller's
            // task (if the caller goes, so does only its call).
            Going::Now(commands) => {
                let _slot = Slot(self.clone(), key);
                let Some(within_us) = within_us(deadline, self.clock.monotonic()) else {
                    return late();
                };
                let item = ForwardItem {
                    group,
                    commands,
                    within_us,
                };
                return self.forward_one(to, item, fast).await;
            }
        };
        // Sent from tasks of their own, which no caller's going stops; with no slot free,
        // by the next call to end.
        for batch in batches {
            self.spawn_call(key, batch);
        }
        // A sender always answers, or drops the reply when it cannot (its runtime stopping).
        answer.await.unwrap_or_else(|_| {
            Err(CallError::Unreachable(
                to,
                "the forward's sender stopped".into(),
            ))
        })
    }

    /// Sends `batch` from a task of its own, in the slot taken for it.
    fn spawn_call(self: &Arc<Self>, key: (NodeId, bool), batch: Vec<Waiting>) {
        let me = self.clone();
        let call = async move {
            let _slot = Slot(me.clone(), key);
            me.call(key.0, key.1, batch).await;
        };
        // Outside a runtime (it is stopping) the batch is dropped: each caller's answer
        // says its sender stopped.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(call);
        }
    }

    /// Sends `batch` as one call and gives each caller its item's answer.
    async fn call(self: Arc<Self>, to: NodeId, fast: bool, batch: Vec<Waiting>) {
        let now = self.clock.monotonic();
        let (mut items, mut replies) = (Vec::new(), Vec::new());
        for w in batch {
            let Some(within_us) = within_us(w.deadline, now) else {
                let _ = w.reply.send(late());
                continue;
            };
            self.forwarded.inc_by(w.commands.len() as u64);
            items.push(ForwardItem {
                group: w.group,
                commands: w.commands,
                within_us,
            });
            replies.push(w.reply);
        }
        if items.is_empty() {
            return;
        }
        self.calls.inc();
        let request = PeerRequest::ForwardMany { fast, items };
        let answer = ask(&*self.transport, to, &request, self.timeout).await;
        let items = match request {
            PeerRequest::ForwardMany { items, .. } => items,
            _ => Vec::new(),
        };
        match answer {
            Ok(PeerResponse::ForwardMany(answers)) if answers.len() == replies.len() => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
            }
            Ok(PeerResponse::Refused(_)) => {
                // A member of an older build cannot read the batch: it refused it unread.
                // Each item on its own, as that member reads them.
                let one = |item| self.forward_one(to, item, fast);
                let answers = futures::future::join_all(items.into_iter().map(one)).await;
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(answer);
                }
            }
            Ok(other) => {
                let why = format!("unexpected answer {other:?}");
                for reply in replies {
                    let unknown = ForwardError::Unknown(why.clone());
                    let _ = reply.send(Ok(ForwardAnswer::Decided(Err(unknown))));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// One item in a call of its own, with its deadline (`ForwardWithin`), or without it
    /// (`Forward`) to a member that refuses that unread too.
    async fn forward_one(&self, to: NodeId, item: ForwardItem, fast: bool) -> Outcome {
        self.forwarded.inc_by(item.commands.len() as u64);
        self.calls.inc();
        let request = PeerRequest::ForwardWithin {
            group: item.group,
            commands: item.commands,
            fast,
            within_us: item.within_us,
        };
        let mut answer = ask(&*self.transport, to, &request, self.timeout).await;
        if let (Ok(PeerResponse::Refused(_)), PeerRequest::ForwardWithin { commands, .. }) =
            (&answer, request)
        {
            self.forwarded.inc_by(commands.len() as u64);
            self.calls.inc();
            let request = PeerRequest::Forward {
                group: item.group,
                commands,
                fast,
            };
            answer = ask(&*self.transport, to, &request, self.timeout).await;
        }
        match answer? {
            PeerResponse::Forward(result) => Ok(ForwardAnswer::Decided(result)),
            PeerResponse::Removed => Ok(ForwardAnswer::Removed),
            other => Ok(ForwardAnswer::Decided(Err(ForwardError::Unknown(format!(
                "unexpected answer {other:?}"
            ))))),
        }
    }
}

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

/// Most calls with forwarded checks out to one peer (strict or fast) at once (the
/// simulation's `Hooks::forward_in_flight` sets fewer): below it a caller sends at once; at
/// it, callers wait for the next call to end, and then go together in one.
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

/// A waiting caller's reply and the time it has left at `now`, if its item is to be sent:
/// not if the caller stopped waiting (its check answered otherwise: the shard's
/// `on_unavailable` at the end of its wait; or its client gone), so that it is not decided
/// after it was answered; nor if its deadline passed (answered [`late`] here).
fn still_to_send(
    reply: oneshot::Sender<Outcome>,
    deadline: Nanos,
    now: Nanos,
) -> Option<(oneshot::Sender<Outcome>, u64)> {
    if reply.is_closed() {
        return None;
    }
    match within_us(deadline, now) {
        Some(us) => Some((reply, us)),
        None => {
            let _ = reply.send(late());
            None
        }
    }
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
        let Some(within_us) = within_us(deadline, self.clock.monotonic()) else {
            return late();
        };
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
            let Some((reply, within_us)) = still_to_send(w.reply, w.deadline, now) else {
                continue;
            };
            self.forwarded.inc_by(w.commands.len() as u64);
            items.push(ForwardItem {
                group: w.group,
                commands: w.commands,
                within_us,
            });
            replies.push((reply, w.deadline));
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
                for ((reply, _), answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
            }
            Ok(PeerResponse::Refused(_)) => {
                // A member of an older build cannot read the batch: it refused it unread.
                // Each item on its own, as that member reads them, with the time its caller
                // has left now, a round trip later.
                let now = self.clock.monotonic();
                let me = &self;
                let one = |(mut item, (reply, deadline)): (ForwardItem, _)| async move {
                    let (reply, within_us) = still_to_send(reply, deadline, now)?;
                    item.within_us = within_us;
                    reply.send(me.forward_one(to, item, fast).await).ok()
                };
                futures::future::join_all(items.into_iter().zip(replies).map(one)).await;
            }
            Ok(other) => {
                let why = format!("unexpected answer {other:?}");
                for (reply, _) in replies {
                    let unknown = ForwardError::Unknown(why.clone());
                    let _ = reply.send(Ok(ForwardAnswer::Decided(Err(unknown))));
                }
            }
            Err(e) => {
                for (reply, _) in replies {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::raft::rpc::{decode, encode};
    use futures::future::BoxFuture;

    /// A leader that decides every forwarded item (with no results), records how many items
    /// each call carried and the time left `ForwardWithin`s carried, and answers a call
    /// only when let through its gate (shut at first; a call takes one permit). With
    /// `refuse_many`, it refuses `ForwardMany` as an older build does.
    struct Leader {
        calls: Mutex<Vec<usize>>,
        within: Mutex<Vec<u64>>,
        gate: Arc<tokio::sync::Semaphore>,
        refuse_many: bool,
    }

    impl Default for Leader {
        fn default() -> Self {
            Leader {
                calls: Mutex::default(),
                within: Mutex::default(),
                gate: Arc::new(tokio::sync::Semaphore::new(0)),
                refuse_many: false,
            }
        }
    }

    impl Transport for Leader {
        fn call(
            &self,
            _to: NodeId,
            body: Vec<u8>,
            _timeout: Duration,
        ) -> BoxFuture<'static, Result<Vec<u8>, CallError>> {
            let answer = match decode::<PeerRequest>(&body) {
                Ok(PeerRequest::ForwardWithin { within_us, .. }) => {
                    self.calls.lock().unwrap().push(1);
                    self.within.lock().unwrap().push(within_us);
                    PeerResponse::Forward(Ok(Vec::new()))
                }
                Ok(PeerRequest::ForwardMany { items, .. }) if self.refuse_many => {
                    self.calls.lock().unwrap().push(items.len());
                    PeerResponse::Refused("unknown variant".into())
                }
                Ok(PeerRequest::ForwardMany { items, .. }) => {
                    self.calls.lock().unwrap().push(items.len());
                    let decided = |_| ForwardAnswer::Decided(Ok(Vec::new()));
                    PeerResponse::ForwardMany(items.iter().map(decided).collect())
                }
                other => panic!("a forward expected, not {other:?}"),
            };
            let gate = self.gate.clone();
            Box::pin(async move {
                if let Ok(pass) = gate.acquire().await {
                    pass.forget();
                }
                Ok(encode(&answer))
            })
        }
    }

    /// A forwarder to `leader` with one call out at most, its clock at 0.
    fn forwarder(leader: &Arc<Leader>) -> (Arc<Forwarder>, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(0));
        let counter = || IntCounter::new("c", "c").unwrap();
        let transport: Arc<dyn Transport> = leader.clone();
        let forwarder = Forwarder::new(
            transport,
            clock.clone(),
            Duration::from_secs(10),
            1,
            counter(),
            counter(),
        );
        (Arc::new(forwarder), clock)
    }

    /// A forwarder to `leader` (its clock at 0) with its one call out, held at the gate:
    /// the next callers wait.
    async fn one_out(
        leader: &Arc<Leader>,
    ) -> (
        Arc<Forwarder>,
        Arc<ManualClock>,
        tokio::task::JoinHandle<Outcome>,
    ) {
        let (forwarder, clock) = forwarder(leader);
        let first = spawn(&forwarder);
        settle().await;
        (forwarder, clock, first)
    }

    /// A check forwarded to node 2 from a task of its own, to be decided within a second.
    fn spawn(forwarder: &Arc<Forwarder>) -> tokio::task::JoinHandle<Outcome> {
        let forwarder = forwarder.clone();
        tokio::spawn(async move {
            let deadline = 1_000_000_000;
            forwarder
                .forward(2, 0, vec![Command::Evict], false, deadline)
                .await
        })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn decided(outcome: Outcome) -> bool {
        matches!(outcome, Ok(ForwardAnswer::Decided(Ok(_))))
    }

    #[tokio::test]
    async fn callers_waiting_for_a_call_go_together_in_the_next() {
        let leader = Arc::new(Leader::default());
        let (forwarder, _, first) = one_out(&leader).await;
        let waiting: Vec<_> = (0..10).map(|_| spawn(&forwarder)).collect();
        settle().await;
        assert_eq!(
            *leader.calls.lock().unwrap(),
            [1],
            "one call out, the rest wait"
        );
        leader.gate.add_permits(100);
        assert!(decided(first.await.unwrap()));
        for w in waiting {
            assert!(decided(w.await.unwrap()));
        }
        assert_eq!(*leader.calls.lock().unwrap(), [1, 10]);
        assert_eq!((forwarder.calls.get(), forwarder.forwarded.get()), (2, 11));
    }

    #[tokio::test]
    async fn a_waiting_caller_that_left_is_not_sent() {
        let leader = Arc::new(Leader::default());
        let (forwarder, _, first) = one_out(&leader).await;
        let (left, stays) = (spawn(&forwarder), spawn(&forwarder));
        settle().await;
        left.abort();
        settle().await;
        leader.gate.add_permits(100);
        assert!(decided(first.await.unwrap()));
        assert!(decided(stays.await.unwrap()));
        assert_eq!(
            *leader.calls.lock().unwrap(),
            [1, 1],
            "the caller that left went"
        );
    }

    #[tokio::test]
    async fn a_waiting_caller_whose_deadline_passed_is_answered_and_not_sent() {
        let leader = Arc::new(Leader::default());
        let (forwarder, clock, first) = one_out(&leader).await;
        let late = spawn(&forwarder);
        settle().await;
        clock.advance(1_000_000_000);
        leader.gate.add_permits(100);
        assert!(decided(first.await.unwrap()));
        let answer = late.await.unwrap();
        assert!(
            matches!(
                answer,
                Ok(ForwardAnswer::Decided(Err(ForwardError::Unavailable(_))))
            ),
            "{answer:?}"
        );
        assert_eq!(*leader.calls.lock().unwrap(), [1]);
    }

    #[tokio::test]
    async fn a_batch_an_older_build_refused_goes_one_by_one_with_the_time_left_then() {
        let leader = Arc::new(Leader {
            refuse_many: true,
            ..Leader::default()
        });
        let (forwarder, clock, first) = one_out(&leader).await;
        let waiting = spawn(&forwarder);
        settle().await;
        leader.gate.add_permits(1);
        assert!(decided(first.await.unwrap()));
        settle().await;
        // The batch is out (at the gate); 0.4 s pass before the refusal comes back.
        clock.advance(400_000_000);
        leader.gate.add_permits(100);
        assert!(decided(waiting.await.unwrap()));
        assert_eq!(
            *leader.calls.lock().unwrap(),
            [1, 1, 1],
            "a batch, then alone"
        );
        assert_eq!(*leader.within.lock().unwrap(), [1_000_000, 600_000]);
    }
}

//! Loom model of the cluster proposer's lane and reply table (`src/raft/replies.rs`, used
//! by `raft/cluster.rs`'s `propose` and `propose_loop`): callers reserve room and queue
//! themselves while the proposer takes them as entries, answers fast callers early from
//! its speculative state, and hands each entry's table to a completion task (a thread
//! here) that answers the rest with the entry's outcome.
//! The open entry of a full pipeline (several takes, each a part answered early, joined
//! by `Replies::append`; fast callers only, `ProposerLane::take_fast`, until the pipeline
//! has room) is modelled too, and so is the lane closing when the proposer
//! stops (`ProposerLane::close`) while callers queue themselves.
//! Properties, for each outcome (commits, fails after submission, not the leader): every
//! caller is answered exactly once; a strict caller is answered "admitted" only if its
//! entry committed, and then with its own part of the results; the queued-commands
//! counter returns to zero; after a close, every caller was either taken by it or refused
//! (none stranded), and the fast-caller count returns to zero.
//! Run: `scripts/loom` (or `RUSTFLAGS="--cfg loom" cargo test --release --test loom_proposer`).
#![cfg(loom)]

use loom::sync::{Arc, Mutex};
use loom::thread;
use quorate::raft::replies::{ProposerLane, Replies, Waiting};

/// What a caller was told: its results (command ids) or an error.
type Answer = Result<Vec<u32>, &'static str>;

/// One caller's reply handle: every answer it got.
type Inbox = Arc<Mutex<Vec<Answer>>>;

struct Caller {
    /// Its command ids: `id * 10 + i`.
    commands: Vec<u32>,
    fast: bool,
    inbox: Inbox,
}

impl Waiting for Caller {
    fn commands(&self) -> usize {
        self.commands.len()
    }

    fn fast(&self) -> bool {
        self.fast
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    Commits,
    Fails,
    NotLeader,
}

fn send(inbox: Inbox, answer: Answer) {
    inbox.lock().unwrap().push(answer);
}

/// Caller `id` (fast if 0) with `n` commands (ids `id * 10 + i`), its room reserved.
fn reserved(lane: &ProposerLane<Caller>, id: usize, n: usize, inbox: Inbox) -> Caller {
    assert!(lane.reserve(n as u64, 100));
    Caller {
        commands: (0..n as u32).map(|i| id as u32 * 10 + i).collect(),
        fast: id == 0,
        inbox,
    }
}

/// Callers 0 (fast) and 1 (strict) of `lens` commands, each reserving room and queuing
/// itself on a thread of its own: their inboxes and threads.
fn queue_two(
    lane: &Arc<ProposerLane<Caller>>,
    lens: [usize; 2],
) -> (Vec<Inbox>, Vec<thread::JoinHandle<()>>) {
    let inboxes: Vec<Inbox> = (0..2).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let callers = (0..2)
        .map(|id| {
            let (lane, inbox) = (lane.clone(), inboxes[id].clone());
            let n = lens[id];
            thread::spawn(move || {
                let caller = reserved(&lane, id, n, inbox);
                assert!(lane.push(caller).is_ok(), "the lane is open");
            })
        })
        .collect();
    (inboxes, callers)
}

/// Two callers (one fast, one strict, `lens` commands each) and the proposer, which takes at
/// most `max` commands per entry; every entry ends with `outcome`. With `open`, the
/// proposer gathers ONE entry from its takes (the open entry of a full pipeline): each take
/// is a part, its fast callers answered early, its table appended to the entry's
/// (`Replies::append`); the entry ends once both callers are in it.
fn model(outcome: Outcome, max: usize, lens: [usize; 2]) {
    model_with(outcome, max, lens, false)
}

fn model_with(outcome: Outcome, max: usize, lens: [usize; 2], open: bool) {
    loom::model(move || {
        let lane = Arc::new(ProposerLane::<Caller>::new());
        let (inboxes, callers) = queue_two(&lane, lens);
        // The proposer: take entries until both callers are taken.
        let mut taken = 0;
        let mut completions = Vec::new();
        let mut entry: Option<(Replies<Inbox>, Vec<u32>)> = None;
        while taken < 2 {
            let pending = lane.take(max);
            if pending.is_empty() {
                thread::yield_now();
                continue;
            }
            taken += pending.len();
            let mut replies = Replies::with_capacity(pending.len());
            let mut commands = Vec::new();
            for c in pending {
                replies.add(c.commands.len(), c.fast, c.inbox);
                commands.extend(c.commands);
            }
            if open {
                // A part: answered early now, ended with the whole entry below.
                replies.answer_early(commands.clone(), send);
                match &mut entry {
                    Some((all, all_commands)) => {
                        all.append(replies);
                        all_commands.extend(commands);
                    }
                    None => entry = Some((replies, commands)),
                }
                continue;
            }
            if outcome == Outcome::NotLeader {
                replies.complete(Err("not the leader"), send);
                continue;
            }
            // Submitted: fast callers are answered from the speculative state (here the same
            // results the log would give).
            replies.answer_early(commands.clone(), send);
            completions.push(thread::spawn(move || {
                let result = match outcome {
                    Outcome::Commits => Ok(commands),
                    _ => Err("lost"),
                };
                replies.complete(result, send);
            }));
        }
        if let Some((replies, commands)) = entry {
            match outcome {
                // Abandoned: the answered-early keep their answers, the rest are told.
                Outcome::NotLeader => replies.complete(Err("not the leader"), send),
                _ => completions.push(thread::spawn(move || {
                    let result = match outcome {
                        Outcome::Commits => Ok(commands),
                        _ => Err("lost"),
                    };
                    replies.complete(result, send);
                })),
            }
        }
        for h in callers.into_iter().chain(completions) {
            h.join().unwrap();
        }
        assert_eq!(lane.queued(), 0, "the queued-commands counter drifted");
        assert_answered_once(&inboxes, lens, outcome);
    });
}

/// Caller 0 (fast) and caller 1 (strict), of `lens` commands: each answered exactly once,
/// with its own part of the results; the strict one "admitted" only if the entry committed.
fn assert_answered_once(inboxes: &[Inbox], lens: [usize; 2], outcome: Outcome) {
    for (id, inbox) in inboxes.iter().enumerate() {
        let answers = inbox.lock().unwrap();
        assert_eq!(
            answers.len(),
            1,
            "caller {id} answered {} times",
            answers.len()
        );
        if let Ok(results) = &answers[0] {
            let own: Vec<u32> = (0..lens[id] as u32).map(|i| id as u32 * 10 + i).collect();
            assert_eq!(results, &own, "caller {id} got another caller's results");
            let strict = id == 1;
            assert!(
                !strict || outcome == Outcome::Commits,
                "strict caller {id} admitted for an entry that did not commit"
            );
        }
    }
}

#[test]
fn each_caller_answered_once_with_its_part_when_the_entry_commits() {
    model(Outcome::Commits, 8, [2, 1]);
}

#[test]
fn each_caller_answered_once_and_strict_ones_not_admitted_when_the_entry_fails() {
    model(Outcome::Fails, 8, [2, 1]);
}

#[test]
fn each_caller_answered_once_when_this_node_is_not_the_leader() {
    model(Outcome::NotLeader, 8, [2, 1]);
}

#[test]
fn callers_split_over_entries_are_each_answered_once() {
    // At most 2 commands per entry: the two callers never share one.
    model(Outcome::Commits, 2, [2, 1]);
    model(Outcome::Fails, 2, [2, 1]);
}

#[test]
fn an_entry_gathered_in_parts_answers_each_caller_once_with_its_part() {
    // The open entry: the callers may arrive in one take or two; either way one entry.
    model_with(Outcome::Commits, 8, [2, 1], true);
    model_with(Outcome::Fails, 8, [2, 1], true);
    model_with(Outcome::NotLeader, 8, [2, 1], true);
}

/// The open entry of a full pipeline takes only fast callers (`ProposerLane::take_fast`):
/// a strict caller there would wait for the pipeline past its deadline. Then the pipeline
/// has room and the proposer takes the rest (`take`) into the same entry. Whatever the
/// order the two callers queue in: `take_fast` never takes the strict caller, and leaves
/// it queued for `take`; every caller is answered once; the counts return to zero.
fn fast_first(outcome: Outcome) {
    loom::model(move || {
        let lane = Arc::new(ProposerLane::<Caller>::new());
        let (inboxes, callers) = queue_two(&lane, [1, 1]);
        let (mut replies, mut commands) = (Replies::with_capacity(2), Vec::new());
        let mut fast_taken = false;
        let mut taken = 0;
        while taken < 2 {
            let pending = if fast_taken {
                lane.take(8)
            } else {
                lane.take_fast(8)
            };
            if pending.is_empty() {
                thread::yield_now();
                continue;
            }
            for c in pending {
                assert!(fast_taken || c.fast, "take_fast took a strict caller");
                fast_taken = fast_taken || c.fast;
                taken += 1;
                let mut part = Replies::with_capacity(1);
                part.add(c.commands.len(), c.fast, c.inbox);
                part.answer_early(c.commands.clone(), send);
                replies.append(part);
                commands.extend(c.commands);
            }
        }
        assert!(lane.is_empty() && !lane.any_fast() && !lane.any_strict());
        assert_eq!(lane.queued(), 0, "the queued-commands counter drifted");
        let result = match outcome {
            Outcome::Commits => Ok(commands),
            _ => Err("lost"),
        };
        replies.complete(result, send);
        for h in callers {
            h.join().unwrap();
        }
        assert_answered_once(&inboxes, [1, 1], outcome);
    });
}

#[test]
fn an_open_entry_takes_fast_callers_and_leaves_strict_ones_queued() {
    fast_first(Outcome::Commits);
    fast_first(Outcome::Fails);
}

/// The proposer stops while two callers queue themselves: each caller is either taken by
/// `close` (and told) or refused by `push` (and answers itself), never left in a lane no one
/// will take from; the fast-caller count and the queued-commands counter return to zero.
#[test]
fn a_closed_lane_strands_no_caller() {
    loom::model(|| {
        let lane = Arc::new(ProposerLane::<Caller>::new());
        let inboxes: Vec<Inbox> = (0..2).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
        let callers: Vec<_> = (0..2)
            .map(|id| {
                let (lane, inbox) = (lane.clone(), inboxes[id].clone());
                // Two commands and one: a refusal must release the caller's own count.
                let n = 2 - id;
                thread::spawn(move || {
                    let caller = reserved(&lane, id, n, inbox);
                    if let Err(refused) = lane.push(caller) {
                        send(refused.inbox, Err("refused"));
                    }
                })
            })
            .collect();
        for c in lane.close() {
            send(c.inbox, Err("the proposer stopped"));
        }
        for h in callers {
            h.join().unwrap();
        }
        // Whatever is still queued now was stranded: nobody takes from a closed lane.
        assert!(lane.is_empty(), "a caller was queued after the lane closed");
        assert!(!lane.any_fast(), "the fast-caller count drifted");
        assert_eq!(lane.queued(), 0, "the queued-commands counter drifted");
        for (id, inbox) in inboxes.iter().enumerate() {
            let n = inbox.lock().unwrap().len();
            assert_eq!(n, 1, "caller {id} answered {n} times");
        }
    });
}

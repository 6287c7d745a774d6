//! The proposer's lane and reply table: who is answered what, exactly once.
//!
//! Callers [`ProposerLane::reserve`] room and [`ProposerLane::push`] themselves; the
//! proposer [`ProposerLane::take`]s a run of them into a log entry (an open entry takes
//! several runs, joined by [`Replies::append`]) and files their reply handles in a
//! [`Replies`] table. Fast callers may be answered early from the leader's
//! speculative state ([`Replies::answer_early`]); [`Replies::complete`] then answers every
//! caller not yet answered with its part of the committed result, or with the error (the
//! entry failed, was lost, or this node is not the leader). A strict caller is answered
//! only by `complete`, so never "admitted" for an entry that did not commit.
//! `tests/loom_proposer.rs` checks both over every interleaving of callers and proposer.

use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

/// What the lane needs to know of a caller. Both answers must stay the same while the
/// caller is queued: the lane's counts are kept from them.
pub trait Waiting {
    /// How many commands it carries.
    fn commands(&self) -> usize;
    /// Whether it may be answered before its entry commits (a fast caller).
    fn fast(&self) -> bool;
}

/// The lane's callers, how many of them are fast, and whether the proposer has gone.
struct Queue<P> {
    callers: Vec<P>,
    fast: usize,
    closed: bool,
}

/// Callers waiting for the proposer, and how many commands they carry.
pub struct ProposerLane<P> {
    queue: Mutex<Queue<P>>,
    /// Commands reserved (queued or about to be): bounds the lane without locking it.
    queued: AtomicU64,
}

impl<P: Waiting> Default for ProposerLane<P> {
    fn default() -> Self {
        ProposerLane::new()
    }
}

impl<P: Waiting> ProposerLane<P> {
    pub fn new() -> ProposerLane<P> {
        ProposerLane {
            queue: Mutex::new(Queue {
                callers: Vec::new(),
                fast: 0,
                closed: false,
            }),
            queued: AtomicU64::new(0),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue<P>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves room for `n` commands; false (nothing reserved) if more than `bound` are
    /// already queued.
    pub fn reserve(&self, n: u64, bound: u64) -> bool {
        if self.queued.fetch_add(n, Ordering::Relaxed) > bound {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Queues a caller that reserved its room; gives it back (its room released) if the
    /// lane is closed: no proposer will take it.
    pub fn push(&self, caller: P) -> Result<(), P> {
        let mut q = self.queue();
        if q.closed {
            drop(q);
            self.queued
                .fetch_sub(caller.commands() as u64, Ordering::Relaxed);
            return Err(caller);
        }
        q.fast += usize::from(caller.fast());
        q.callers.push(caller);
        Ok(())
    }

    /// Whether no caller waits in the lane.
    pub fn is_empty(&self) -> bool {
        self.queue().callers.is_empty()
    }

    /// Callers waiting in the lane.
    pub fn len(&self) -> usize {
        self.queue().callers.len()
    }

    /// Whether a fast caller waits in the lane.
    pub fn any_fast(&self) -> bool {
        self.queue().fast > 0
    }

    /// Commands reserved and not yet taken.
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Takes waiting callers from the lane, up to about `max` commands (at least one
    /// caller), in arrival order.
    pub fn take(&self, max: usize) -> Vec<P> {
        let mut q = self.queue();
        if q.callers.is_empty() {
            return Vec::new();
        }
        let mut count = 0;
        let mut fast = 0;
        let mut split = 0;
        for p in q.callers.iter() {
            if split > 0 && count + p.commands() > max {
                break;
            }
            count += p.commands();
            fast += usize::from(p.fast());
            split += 1;
        }
        let rest = q.callers.split_off(split);
        let taken = std::mem::replace(&mut q.callers, rest);
        q.fast -= fast;
        self.queued.fetch_sub(count as u64, Ordering::Relaxed);
        taken
    }

    /// How many callers from the head of the lane fit in `max` commands, strict ones too.
    fn fitting(q: &Queue<P>, max: usize) -> usize {
        let mut count = 0usize;
        q.callers
            .iter()
            .take_while(|p| {
                count = count.saturating_add(p.commands());
                count <= max
            })
            .count()
    }

    /// Takes the fast callers among those at the head of the lane that fit in `max`
    /// commands, strict ones counted too, in arrival order; the strict callers stay, in their
    /// order. For an entry that is not proposed yet (a full pipeline): a fast caller is
    /// answered at once, from the speculative state, while a strict caller taken into it
    /// would wait for the pipeline however long (past its deadline: decided after its caller
    /// was answered). Counted, the strict callers queued before the fast ones taken keep
    /// their room in the entry, so a stream of fast callers cannot fill every entry ahead of
    /// them. Takes nothing (unlike [`ProposerLane::take`]) if no fast caller fits.
    pub fn take_fast(&self, max: usize) -> Vec<P> {
        let mut q = self.queue();
        let fit = Self::fitting(&q, max);
        if q.fast == 0 || fit == 0 {
            return Vec::new();
        }
        let rest = q.callers.split_off(fit);
        let head = std::mem::take(&mut q.callers);
        let (taken, kept): (Vec<P>, Vec<P>) = head.into_iter().partition(|p| p.fast());
        q.callers = kept;
        q.callers.extend(rest);
        q.fast -= taken.len();
        let released: usize = taken.iter().map(|p| p.commands()).sum();
        self.queued.fetch_sub(released as u64, Ordering::Relaxed);
        taken
    }

    /// Whether [`ProposerLane::take_fast`] would take a caller now.
    pub fn fast_fits(&self, max: usize) -> bool {
        let q = self.queue();
        let fit = Self::fitting(&q, max);
        q.fast > 0 && q.callers[..fit].iter().any(|p| p.fast())
    }

    /// Whether a strict caller waits in the lane.
    pub fn any_strict(&self) -> bool {
        let q = self.queue();
        q.callers.len() > q.fast
    }

    /// The proposer is gone: takes every caller still waiting, and refuses later ones.
    pub fn close(&self) -> Vec<P> {
        self.queue().closed = true;
        self.take(usize::MAX)
    }
}

/// The reply handles of one entry's callers, in the entry's command order.
pub struct Replies<R> {
    lengths: Vec<usize>,
    /// May be answered from the speculative state before the entry commits.
    early: Vec<bool>,
    /// `None` once answered.
    replies: Vec<Option<R>>,
    /// Callers not answered yet.
    unanswered: usize,
}

impl<R> Replies<R> {
    pub fn with_capacity(n: usize) -> Replies<R> {
        Replies {
            lengths: Vec::with_capacity(n),
            early: Vec::with_capacity(n),
            replies: Vec::with_capacity(n),
            unanswered: 0,
        }
    }

    /// Files a caller whose `len` commands come next in the entry.
    pub fn add(&mut self, len: usize, early: bool, reply: R) {
        self.lengths.push(len);
        self.early.push(early);
        self.replies.push(Some(reply));
        self.unanswered += 1;
    }

    /// Files `other`'s callers after this table's: their commands follow in the entry.
    pub fn append(&mut self, other: Replies<R>) {
        self.lengths.extend(other.lengths);
        self.early.extend(other.early);
        self.replies.extend(other.replies);
        self.unanswered += other.unanswered;
    }

    /// Callers filed.
    pub fn len(&self) -> usize {
        self.replies.len()
    }

    /// Whether no caller is filed.
    pub fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }

    /// Whether every caller has been answered (early): none waits for the commit.
    pub fn all_answered(&self) -> bool {
        self.unanswered == 0
    }

    /// Whether any caller may be answered early.
    pub fn any_early(&self) -> bool {
        self.early.iter().any(|e| *e)
    }

    /// Answers the callers that may be answered early with their part of `results` (one
    /// result per command of the entry); the others wait for [`Replies::complete`].
    pub fn answer_early<A, E>(
        &mut self,
        results: Vec<A>,
        mut send: impl FnMut(R, Result<Vec<A>, E>),
    ) {
        let mut it = results.into_iter();
        for ((n, early), reply) in self.lengths.iter().zip(&self.early).zip(&mut self.replies) {
            let part: Vec<A> = it.by_ref().take(*n).collect();
            if *early {
                if let Some(r) = reply.take() {
                    self.unanswered -= 1;
                    send(r, Ok(part));
                }
            }
        }
    }

    /// Answers every caller not answered early: with its part of the committed results, or
    /// with the error.
    pub fn complete<A, E: Clone>(
        self,
        outcome: Result<Vec<A>, E>,
        mut send: impl FnMut(R, Result<Vec<A>, E>),
    ) {
        match outcome {
            Ok(results) => {
                let mut it = results.into_iter();
                for (n, reply) in self.lengths.into_iter().zip(self.replies) {
                    let part: Vec<A> = it.by_ref().take(n).collect();
                    if let Some(r) = reply {
                        send(r, Ok(part));
                    }
                }
            }
            Err(why) => {
                for r in self.replies.into_iter().flatten() {
                    send(r, Err(why.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ProposerLane, Replies, Waiting};

    /// (name, commands, fast)
    struct C(&'static str, usize, bool);

    impl Waiting for C {
        fn commands(&self) -> usize {
            self.1
        }
        fn fast(&self) -> bool {
            self.2
        }
    }

    fn names(cs: &[C]) -> Vec<&'static str> {
        cs.iter().map(|c| c.0).collect()
    }

    /// `take_fast` (an open entry without pipeline room) passes strict callers over but
    /// counts their commands, keeps the fast callers' order, and takes nothing past the
    /// first caller that does not fit; what it leaves is taken by `take` in arrival order,
    /// counts intact.
    #[test]
    fn take_fast_leaves_strict_callers_in_order() {
        let lane = ProposerLane::new();
        let callers = [
            C("s1", 1, false),
            C("f1", 3, true),
            C("s2", 2, false),
            C("f2", 2, true),
            C("f3", 1, true),
        ];
        for c in callers {
            assert!(lane.reserve(c.1 as u64, 100));
            assert!(lane.push(c).is_ok());
        }
        assert!(lane.fast_fits(4) && !lane.fast_fits(3));
        assert_eq!(
            names(&lane.take_fast(4)),
            ["f1"],
            "s1 and f1 fit, s2 does not"
        );
        assert_eq!(lane.queued(), 6);
        // s1 and s2 keep their room: f2 fits only after them.
        assert!(lane.take_fast(4).is_empty() && !lane.fast_fits(4));
        assert_eq!(names(&lane.take_fast(5)), ["f2"]);
        assert_eq!(names(&lane.take_fast(8)), ["f3"]);
        assert!(!lane.fast_fits(8) && lane.any_strict());
        assert!(lane.take_fast(8).is_empty() && !lane.any_fast());
        assert_eq!(names(&lane.take(8)), ["s1", "s2"]);
        assert_eq!(lane.queued(), 0);
        assert!(!lane.any_strict());
    }

    /// `all_answered` is what holds a fast-only entry back (`fast_linger`): it must turn
    /// true only once every caller filed, appended ones included, has its answer.
    #[test]
    fn all_answered_counts_callers_filed_and_answered_early() {
        let mut sent = Vec::new();
        let mut r: Replies<u32> = Replies::with_capacity(2);
        assert!(r.all_answered(), "no caller waits on an empty entry");
        r.add(1, true, 1);
        r.add(2, false, 2);
        assert!(!r.all_answered());
        r.answer_early(vec!['a', 'b', 'c'], |to, a: Result<Vec<char>, ()>| {
            sent.push((to, a))
        });
        assert_eq!(sent, vec![(1, Ok(vec!['a']))]);
        assert!(
            !r.all_answered(),
            "caller 2 is strict: it waits for the commit"
        );
        let mut fast: Replies<u32> = Replies::with_capacity(1);
        fast.add(1, true, 3);
        fast.answer_early(vec!['d'], |to, a: Result<Vec<char>, ()>| sent.push((to, a)));
        assert!(fast.all_answered());
        fast.add(1, true, 4);
        assert!(
            !fast.all_answered(),
            "a caller filed after the early answers waits"
        );
        let mut only_fast: Replies<u32> = Replies::with_capacity(1);
        only_fast.add(1, true, 5);
        only_fast.answer_early(vec!['e'], |to, a: Result<Vec<char>, ()>| sent.push((to, a)));
        let mut joined: Replies<u32> = Replies::with_capacity(0);
        joined.append(only_fast);
        assert!(joined.all_answered());
        joined.append(r);
        assert!(
            !joined.all_answered(),
            "appending a waiting caller is counted"
        );
        // Answering twice does not count twice.
        joined.answer_early(vec!['x', 'y', 'z', 'w'], |to, a: Result<Vec<char>, ()>| {
            sent.push((to, a))
        });
        assert!(!joined.all_answered());
    }
}

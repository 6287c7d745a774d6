//! Loom model of the shard lane hand-off (`src/shard/lane.rs`, used by `shard/actor.rs`):
//! callers push a batch and wake the actor only if no wake-up is pending; the actor handles
//! one drain per wake-up. Property: every pushed batch is drained exactly once and none is
//! left in the lane once every wake-up has been handled.
//! Run: `scripts/loom` (or `RUSTFLAGS="--cfg loom" cargo test --release --test loom_lane`).
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use quorate::shard::lane::Lane;

/// Wake-ups sent (the `Drain` messages in the actor's mailbox) and callers finished.
struct Mailbox {
    sent: AtomicUsize,
    callers_done: AtomicUsize,
}

fn callers_and_one_drainer(callers: usize) {
    loom::model(move || {
        let lane = Arc::new(Lane::<usize>::new());
        let mailbox = Arc::new(Mailbox {
            sent: AtomicUsize::new(0),
            callers_done: AtomicUsize::new(0),
        });
        let handles: Vec<_> = (0..callers)
            .map(|id| {
                let (lane, mailbox) = (lane.clone(), mailbox.clone());
                thread::spawn(move || {
                    if lane.push(id) {
                        mailbox.sent.fetch_add(1, Ordering::SeqCst);
                    }
                    mailbox.callers_done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        // The actor: one drain per message, until every caller is done and every message
        // handled (then nothing can arrive any more).
        let mut answered = vec![0; callers];
        let mut handled = 0;
        loop {
            let done = mailbox.callers_done.load(Ordering::SeqCst);
            if handled < mailbox.sent.load(Ordering::SeqCst) {
                handled += 1;
                for id in lane.begin_drain() {
                    answered[id] += 1;
                }
            } else if done == callers {
                break;
            } else {
                thread::yield_now();
            }
        }
        for h in handles {
            h.join().unwrap();
        }
        let left = lane.begin_drain();
        assert_eq!(
            answered,
            vec![1; callers],
            "a batch stranded or drained twice (handled {handled}, sent {}, left {left:?})",
            mailbox.sent.load(Ordering::SeqCst)
        );
    });
}

#[test]
fn every_pushed_batch_is_drained_exactly_once() {
    callers_and_one_drainer(2);
}

#[test]
fn three_callers_every_batch_is_drained_exactly_once() {
    callers_and_one_drainer(3);
}

//! Loom model of the limiter's ownership design: there is no atomic limiter cell; a key's
//! state is owned by its shard and decided under the shard's lock (`shard/state.rs` behind
//! `Mutex<ShardState>` in `shard/actor.rs`). Property: two threads deciding one key never
//! both take its last token. Negative control: the same decision split into load, decide
//! on a copy, store back (the lost-update a lock-free cell must avoid with compare-and-swap)
//! is seen by loom to admit twice.
//! Run: `scripts/loom` (or `RUSTFLAGS="--cfg loom" cargo test --release --test loom_limiter`).
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use quorate::limiter::{Algorithm, KeyState, Limit, Outcome, SECOND};

/// Two threads each ask for one unit of a token bucket holding one token.
fn two_threads_one_token(decide: fn(&Limit, &Mutex<KeyState>) -> Outcome) {
    loom::model(move || {
        let limit = Limit::new(Algorithm::TokenBucket, 1, SECOND, 1).unwrap();
        let state = Arc::new(Mutex::new(limit.new_state()));
        let admitted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (limit, state, admitted) = (limit.clone(), state.clone(), admitted.clone());
                thread::spawn(move || {
                    if decide(&limit, &state) == Outcome::Allowed {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            admitted.load(Ordering::SeqCst),
            1,
            "the last token taken twice"
        );
    });
}

/// As the shard does: decide on the state while holding its lock.
fn under_the_lock(limit: &Limit, state: &Mutex<KeyState>) -> Outcome {
    limit.decide(&mut state.lock().unwrap(), 0, 1).outcome
}

/// The broken split: read the state, decide on a copy, write the copy back.
fn load_then_store(limit: &Limit, state: &Mutex<KeyState>) -> Outcome {
    let mut copy = state.lock().unwrap().clone();
    let outcome = limit.decide(&mut copy, 0, 1).outcome;
    *state.lock().unwrap() = copy;
    outcome
}

#[test]
fn two_threads_never_both_take_the_last_token() {
    two_threads_one_token(under_the_lock);
}

/// Negative control: passes only if loom finds the double admission.
#[test]
fn negative_control_load_then_store_admits_twice() {
    let caught = std::panic::catch_unwind(|| two_threads_one_token(load_then_store)).is_err();
    assert!(caught, "loom did not catch the load-then-store split");
}

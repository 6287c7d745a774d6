//! Loom model of the shard supervisor's `stopping` flag (`shard/actor.rs`): `Shards::stop`
//! sets the flag, then stops every actor it finds in the shards' slots; the supervisor,
//! handling a shard's failure, restarts the shard unless the flag is set, puts the new actor
//! in its slot, then checks the flag again and stops the new actor if it is set. Property:
//! a restart racing `stop` never leaves a running actor behind (ractor does not stop a
//! supervisor's linked children with it, so nobody else would).
//!
//! The negative control is the protocol before this fix (check the flag once, then
//! restart): loom finds a restarted actor that nobody stops.
//! Run: `scripts/loom` (or `RUSTFLAGS="--cfg loom" cargo test --release --test loom_shutdown`).
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// A shard actor as the model sees it: stopped or not.
#[derive(Default)]
struct Actor {
    stopped: AtomicBool,
}

fn crash_racing_stop(recheck: bool) {
    loom::model(move || {
        let stopping = Arc::new(AtomicBool::new(false));
        let slot: Arc<Mutex<Option<Arc<Actor>>>> = Arc::new(Mutex::new(None));
        let supervisor = {
            let (stopping, slot) = (stopping.clone(), slot.clone());
            thread::spawn(move || {
                // handle_supervisor_evt(ActorFailed)
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                // spawn_shard: the new actor goes into its slot.
                let actor = Arc::new(Actor::default());
                *slot.lock().unwrap() = Some(actor.clone());
                if recheck && stopping.load(Ordering::SeqCst) {
                    actor.stopped.store(true, Ordering::SeqCst);
                }
            })
        };
        // Shards::stop
        stopping.store(true, Ordering::SeqCst);
        let found = slot.lock().unwrap().clone();
        if let Some(a) = found {
            a.stopped.store(true, Ordering::SeqCst);
        }
        supervisor.join().unwrap();
        let left = slot.lock().unwrap().clone();
        if let Some(a) = left {
            assert!(
                a.stopped.load(Ordering::SeqCst),
                "a shard restarted during stop() is left running"
            );
        }
    });
}

#[test]
fn a_crash_racing_stop_leaves_no_actor_running() {
    crash_racing_stop(true);
}

/// Negative control: without the second check, loom finds the actor left running.
#[test]
fn negative_control_without_the_recheck_an_actor_is_left_running() {
    let caught = std::panic::catch_unwind(|| crash_racing_stop(false)).is_err();
    assert!(
        caught,
        "loom found no actor left running without the re-check"
    );
}

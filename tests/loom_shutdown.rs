//! Loom model of the shard supervisor's `stopping` flag (`shard/actor.rs`): `Shards::stop`
//! sets it, then stops the supervisor; the supervisor, handling a shard's failure, restarts
//! the shard unless the flag is set. The question: can a stop racing a crash restart the
//! shard after `stop` returned? The flag is checked, then the restart happens (awaiting the
//! spawn), with nothing keeping `stop` out in between — so yes, and this model shows the
//! interleaving (load false; stop stores true and returns; restart). It is a real race of
//! the current code (see docs/verification.md); ractor does not stop linked children when
//! their supervisor stops, so such a shard actor lives on after `stop`.
//! Run: `scripts/loom` (or `RUSTFLAGS="--cfg loom" cargo test --release --test loom_shutdown`).
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The supervisor's check-then-restart against `stop`; asserts no restart starts after
/// `stop` returned.
fn crash_racing_stop() {
    loom::model(|| {
        let stopping = Arc::new(AtomicBool::new(false));
        let stop_returned = Arc::new(AtomicBool::new(false));
        let supervisor = {
            let (stopping, stop_returned) = (stopping.clone(), stop_returned.clone());
            thread::spawn(move || {
                // handle_supervisor_evt(ActorFailed)
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                // ... find the slot, then `spawn_shard(...).await`:
                assert!(
                    !stop_returned.load(Ordering::SeqCst),
                    "a shard restarted after stop() returned"
                );
            })
        };
        // Shards::stop
        stopping.store(true, Ordering::SeqCst);
        stop_returned.store(true, Ordering::SeqCst);
        supervisor.join().unwrap();
    });
}

/// Documents the race: passes while loom finds a restart after `stop`. When the supervisor
/// is fixed (e.g. `stop` waits for the supervisor to exit, or stops its children after it),
/// model the fix here and turn this into a positive test.
#[test]
fn a_crash_racing_stop_can_restart_the_shard_after_stop_returned() {
    let caught = std::panic::catch_unwind(crash_racing_stop).is_err();
    assert!(caught, "loom found no restart after stop: update the docs");
}

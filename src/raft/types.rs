//! The Raft type configuration shared by every shard group.
//!
//! A log entry's payload is a shard [`Batch`] (commands with their shard time) behind an
//! `Arc` ([`LogBatch`]); applying it answers one [`Applied`] per command. Node ids are
//! `u64`; a node's address is the peer address in [`openraft::BasicNode`].
//!
//! The async runtime is tokio's with one change, [`SeededRuntime`]: openraft draws election
//! timeouts from the runtime's `thread_rng`, and ours is seeded from the node's seed (the
//! OS in the binary, the simulation seed under turmoil) so a simulated run is reproducible.

use crate::shard::command::{Applied, Batch};
use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand08::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::future::Future;
use std::io::Cursor;
use std::time::Duration;

/// A log entry's payload. openraft clones entries as it moves them (each replication
/// stream, the apply of committed entries): behind an `Arc` a clone is a reference count,
/// where cloning the commands (a key string each) was 5% of a 3-node cluster's CPU under
/// pipelined load. serde writes an `Arc<T>` as its `T`: the log and the wire keep their
/// format.
pub type LogBatch = std::sync::Arc<Batch>;

/// What applying one batch answered, in the batch's order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applies(pub Vec<Applied>);

openraft::declare_raft_types!(
    /// quorate's Raft types.
    pub TypeConfig:
        D = LogBatch,
        R = Applies,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = SeededRuntime,
);

/// A node's id in the cluster (1-based in configs).
pub type NodeId = u64;
/// A Raft group's id: the shard number.
pub type GroupId = u64;

tokio::task_local! {
    /// The generator `SeededRuntime::thread_rng` draws from while a node starts its groups.
    static RAFT_RNG: RefCell<rand08::rngs::StdRng>;
}

/// Runs `start` (which creates the node's `Raft`s) with openraft's random draws taken from a
/// generator seeded by `seed`. openraft draws only when a `Raft` is created, inside `start`.
pub async fn with_raft_seed<F: Future>(seed: [u8; 32], start: F) -> F::Output {
    RAFT_RNG
        .scope(RefCell::new(rand08::rngs::StdRng::from_seed(seed)), start)
        .await
}

/// tokio's runtime, with `thread_rng` seeded from the node's seed (see
/// [`with_raft_seed`]); outside that scope it is seeded from the OS.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SeededRuntime;

impl AsyncRuntime for SeededRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = rand08::rngs::StdRng;
    type OneshotSender<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <TokioRuntime as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    // The one RNG openraft asks for: drawn from the node's seed (the OS's only outside it).
    // (rustfmt would move the seam-check marker off the signature line.)
    #[rustfmt::skip]
    fn thread_rng() -> Self::ThreadLocalRng { // allowed: openraft's hook, seeded by the node
        let mut seed = [0u8; 32];
        if RAFT_RNG
            .try_with(|rng| rng.borrow_mut().fill_bytes(&mut seed))
            .is_err()
        {
            seed = crate::net::os_seed();
        }
        rand08::rngs::StdRng::from_seed(seed)
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

//! What a shard applies: commands as data.
//!
//! A [`Batch`] carries its shard time and its commands, each with the full limit it is
//! decided by, so applying it needs nothing from the node it runs on: a replica replaying the
//! batch reaches the same state, whatever its own clock or policy file says. Encoded with
//! bincode 2 (the Raft log's format).

use crate::limiter::{Decision, Limit, Nanos};
use crate::policy::OnUnavailable;
use serde::{Deserialize, Serialize};

/// One change to a shard's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Spend `cost` of `limit` on `key` (the key already carries its limit's prefix).
    Check {
        key: String,
        limit: Limit,
        cost: u64,
        /// Idempotency: a second Check with the same id within the horizon returns the
        /// first decision and changes nothing.
        request_id: Option<String>,
        /// The answer for a new key when the shard is at its key cap.
        on_full: OnUnavailable,
    },
    /// Give back `cost` admitted at `admitted_at` (another limit of the same check denied).
    Refund {
        key: String,
        limit: Limit,
        cost: u64,
        admitted_at: Nanos,
    },
    /// Drop every key whose state is as if never seen.
    Evict,
}

impl Command {
    /// A check without a request id, as (key, limit, cost): its answer follows from the
    /// key's state and the time alone, so the cluster may answer a denial of it without
    /// the log (`ShardState::denials`, `raft::denials`).
    pub fn plain_check(&self) -> Option<(&str, &Limit, u64)> {
        match self {
            Command::Check {
                key,
                limit,
                cost,
                request_id: None,
                ..
            } => Some((key, limit, *cost)),
            _ => None,
        }
    }
}

/// Commands applied at one shard time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub time: Nanos,
    pub commands: Vec<Command>,
}

/// The result of one command, in the batch's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    Decided {
        decision: Decision,
        /// Answered from the idempotency table: nothing was consumed now.
        replayed: bool,
        /// Answered by `on_full` at the key cap, not by the algorithm.
        fallback: bool,
        /// The batch's shard time: what a refund of this admission names.
        at: Nanos,
    },
    Refunded,
    Evicted(u64),
}

/// bincode 2's standard configuration: varint integers, little endian.
fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

impl Batch {
    pub fn encode(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, config()).expect("a batch always encodes")
    }

    /// Decodes a batch; malformed bytes are an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Batch, String> {
        let (batch, used) =
            bincode::serde::decode_from_slice(bytes, config().with_limit::<{ 16 << 20 }>())
                .map_err(|e| e.to_string())?;
        if used != bytes.len() {
            return Err(format!(
                "{} trailing bytes after the batch",
                bytes.len() - used
            ));
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, SECOND};

    #[test]
    fn a_batch_survives_a_bincode_round_trip() {
        let limit = Limit::new(Algorithm::Gcra, 3, SECOND, 5).unwrap();
        let batch = Batch {
            time: 42,
            commands: vec![
                Command::Check {
                    key: "api:key:k".into(),
                    limit: limit.clone(),
                    cost: 2,
                    request_id: Some("r1#0".into()),
                    on_full: OnUnavailable::Allow,
                },
                Command::Refund {
                    key: "api:key:k".into(),
                    limit,
                    cost: 2,
                    admitted_at: 41,
                },
                Command::Evict,
            ],
        };
        assert_eq!(Batch::decode(&batch.encode()).unwrap(), batch);
    }

    #[test]
    fn garbage_bytes_decode_to_an_error_not_a_panic() {
        for bytes in [&b""[..], b"\xff\xff\xff\xff\xff\xff", b"\x01\x02\x03"] {
            assert!(Batch::decode(bytes).is_err());
        }
    }
}

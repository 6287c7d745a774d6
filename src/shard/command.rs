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
        /// The admission's request id (its item's): the shard gives an admission it
        /// remembers under the id back once, however often the refund comes (a retry of a
        /// denied check refunds its replayed admissions again), and from the time it was
        /// made; an id it does not hold gives nothing back.
        request_id: Option<String>,
        /// The epoch of the entry that made the admission ([`Batch::epoch`]). Without a
        /// request id, a refund applied in an entry of another epoch gives nothing back:
        /// the admission may have been a `fast` one that a failover lost, and crediting it
        /// to a state that never held it would admit more than the bound.
        epoch: u64,
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

/// Commands applied in order at their shard times: from the first command at `time`, and
/// from each of `later`'s indexes at its time. A leader whose pipeline is full gathers the
/// next entry from several takes of its lane, each decided (and its fast callers answered)
/// at the time of its take; `later` lets the log repeat those times exactly. Empty for a
/// batch taken at one time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub time: Nanos,
    pub commands: Vec<Command>,
    pub later: Vec<Part>,
    /// The leadership that proposed it: one leader process in one term
    /// (`Cluster::epoch`); 0 outside a cluster. Entries of one epoch form one append-only
    /// run of its leader's log, so an entry that commits commits every entry of its epoch
    /// before it: a refund without a request id gives back only an admission of its own
    /// entry's epoch, which the state then surely holds (see [`Command::Refund`]).
    pub epoch: u64,
}

/// Where a batch's shard time moves on: commands from index `from` are applied at `time`
/// (never earlier than the commands before them: apply keeps time monotonic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub from: u32,
    pub time: Nanos,
}

impl Batch {
    /// Commands all applied at `time`.
    pub fn at(time: Nanos, commands: Vec<Command>) -> Batch {
        Batch {
            time,
            commands,
            later: Vec::new(),
            epoch: 0,
        }
    }

    /// Appends `commands` taken at `time`: a part of its own when the time is past the
    /// batch's latest (an earlier time is taken as the latest: apply never turns back).
    pub fn push_part(&mut self, time: Nanos, commands: Vec<Command>) {
        if commands.is_empty() {
            return;
        }
        let latest = self.last_time();
        if time > latest {
            self.later.push(Part {
                from: self.commands.len() as u32,
                time,
            });
        }
        self.commands.extend(commands);
    }

    /// The shard time of the batch's last command (parts are pushed in time order).
    pub fn last_time(&self) -> Nanos {
        self.later.last().map_or(self.time, |p| p.time)
    }

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

/// The result of one command, in the batch's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    Decided {
        decision: Decision,
        /// Answered from the idempotency table: nothing was consumed now.
        replayed: bool,
        /// Answered by an `on_unavailable` rule, not by the algorithm, and why.
        fallback: Fallback,
        /// The shard time it was decided at (its part's; a replay's, the first
        /// decision's): what a refund of this admission names.
        at: Nanos,
        /// The epoch of the entry it was decided in ([`Batch::epoch`]; 0 when no entry
        /// decided it): what a refund of this admission names.
        epoch: u64,
    },
    Refunded,
    Evicted(u64),
    /// A check with a request id that its shard could not decide in time (no leader, no
    /// quorum, no answer), under `on_unavailable` `deny` or `local`: it, or an earlier attempt
    /// under its id, may have been applied. Never in a log entry's results; the service
    /// answers it as unavailable, so that the caller retries under the same id and gets the
    /// first answer (an `on_unavailable` denial would have it retry under a new id, and
    /// spend twice).
    Unknown,
}

/// Why an answer came from a policy's `on_unavailable` rule instead of its algorithm.
///
/// On the wire (a forwarded batch's answers) it is encoded as the `bool` it replaced was:
/// variant indexes are varints, so `No` and `KeyCap` are the bytes of `false` and `true`
/// (members of the two builds read each other's answers then; peer protocol 3 changed
/// `Applied` itself). `Unavailable` is made only by the member that answers the caller and
/// is never sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fallback {
    /// The algorithm decided.
    No,
    /// A new key met the shard's full key table (`--max-keys`): `on_full`'s answer.
    KeyCap,
    /// The shard could not decide in time (no leader, no quorum, no answer): the answer of
    /// `on_unavailable` on this member (`Cluster::fallback`).
    Unavailable,
}

impl Fallback {
    /// Whether the answer came from a rule rather than the algorithm.
    pub fn any(self) -> bool {
        self != Fallback::No
    }

    /// Its name in the sampled decision log.
    pub fn name(self) -> &'static str {
        match self {
            Fallback::No => "no",
            Fallback::KeyCap => "key_cap",
            Fallback::Unavailable => "unavailable",
        }
    }
}

/// bincode 2's standard configuration: varint integers, little endian.
fn config() -> bincode::config::Configuration {
    bincode::config::standard()
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
                    request_id: Some("r1#0".into()),
                    epoch: 7,
                },
                Command::Evict,
            ],
            later: vec![Part { from: 1, time: 43 }],
            epoch: 11,
        };
        assert_eq!(Batch::decode(&batch.encode()).unwrap(), batch);
    }

    #[test]
    fn a_part_taken_at_the_latest_time_joins_it() {
        let evict = || vec![Command::Evict];
        let mut batch = Batch::at(5, evict());
        batch.push_part(5, evict());
        assert!(batch.later.is_empty());
        batch.push_part(9, evict());
        batch.push_part(9, evict());
        batch.push_part(12, Vec::new());
        batch.push_part(7, evict());
        assert_eq!(batch.later, [Part { from: 2, time: 9 }]);
        assert_eq!((batch.commands.len(), batch.last_time()), (5, 9));
    }

    /// `Applied` with the `bool` that `Fallback` replaced (as members before it sent it).
    #[derive(Debug, Serialize, Deserialize)]
    enum OldApplied {
        Decided {
            decision: Decision,
            replayed: bool,
            fallback: bool,
            at: Nanos,
            epoch: u64,
        },
    }

    fn enc<T: Serialize>(value: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(value, config()).unwrap()
    }

    #[test]
    fn fallback_is_encoded_as_the_bool_it_replaced() {
        let decision = Decision::unavailable(7, false);
        for (new, old) in [(Fallback::No, false), (Fallback::KeyCap, true)] {
            let new = Applied::Decided {
                decision,
                replayed: false,
                fallback: new,
                at: 9,
                epoch: 3,
            };
            let old = OldApplied::Decided {
                decision,
                replayed: false,
                fallback: old,
                at: 9,
                epoch: 3,
            };
            assert_eq!(enc(&new), enc(&old), "{new:?}");
            let (read, _): (Applied, usize) =
                bincode::serde::decode_from_slice(&enc(&old), config()).unwrap();
            assert_eq!(read, new);
        }
        // The rule only the answering member makes is no bool: an older member refuses it.
        let unavailable = Applied::Decided {
            decision,
            replayed: false,
            fallback: Fallback::Unavailable,
            at: 9,
            epoch: 3,
        };
        let old: Result<(OldApplied, usize), _> =
            bincode::serde::decode_from_slice(&enc(&unavailable), config());
        assert!(old.is_err());
    }

    #[test]
    fn garbage_bytes_decode_to_an_error_not_a_panic() {
        for bytes in [&b""[..], b"\xff\xff\xff\xff\xff\xff", b"\x01\x02\x03"] {
            assert!(Batch::decode(bytes).is_err());
        }
    }
}

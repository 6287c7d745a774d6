//! What the protocols (RESP, HTTP, the client) ask of a node, and what it answers.
//! Plain data: the protocol layers only translate to and from these.

use crate::limiter::{Algorithm, Decision, Nanos};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// Which limit a check spends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LimitRef {
    /// A limit of the policy file, by name.
    Named(String),
    /// A limit given in the request; accepted only where the policy file allows inline
    /// limits (`[inline] allow = true`).
    Inline(InlineLimit),
}

/// A limit given in the request (also what `CL.THROTTLE` sends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlineLimit {
    pub algorithm: Algorithm,
    /// Units per period (the rate for the bucket algorithms).
    pub limit: u64,
    /// The period in nanoseconds.
    pub period_ns: Nanos,
    /// Capacity of the bucket algorithms; defaults to `limit`.
    #[serde(default)]
    pub burst: Option<u64>,
}

/// One limit to spend on one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckItem {
    pub limit: LimitRef,
    pub key: String,
    /// Units to spend; 0 peeks.
    #[serde(default = "one")]
    pub cost: u64,
}

fn one() -> u64 {
    1
}

/// A check of one or several limits, all-or-nothing: if any denies, none is consumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRequest {
    pub items: Vec<CheckItem>,
    /// A retry with the same id within the idempotency horizon gets the first answer and
    /// consumes nothing more.
    #[serde(default)]
    pub request_id: Option<String>,
}

/// The decision on one item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemDecision {
    /// The limit's name (`inline` for inline limits, `cl.throttle` for CL.THROTTLE).
    /// Borrowed for the built-in names: one allocation fewer per decision.
    pub limit: Cow<'static, str>,
    pub key: String,
    pub algorithm: Algorithm,
    /// The limit's period in nanoseconds (for `RateLimit-Policy` headers).
    pub period_ns: Nanos,
    /// Units per period: the window limit, or a bucket's refill rate (`RateLimit-Policy`'s
    /// quota; a bucket's capacity, `decision.limit`, can be larger).
    pub quota: u64,
    pub decision: Decision,
    /// A shadow limit decides and reports but always admits.
    pub shadow: bool,
    /// The answer came from `on_unavailable` (key cap reached), not from the algorithm.
    pub fallback: bool,
}

/// The answer to a [`CheckRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResponse {
    /// True when every item admitted (shadow items always count as admitting).
    pub allowed: bool,
    pub items: Vec<ItemDecision>,
}

impl CheckResponse {
    /// The wait before the whole check could succeed: the largest `retry_after` among the
    /// denying items (0 when allowed). `None` when an item can never succeed.
    pub fn retry_after(&self) -> Option<Nanos> {
        let mut wait = 0;
        for i in self
            .items
            .iter()
            .filter(|i| !i.shadow && !i.decision.allowed())
        {
            match i.decision.outcome {
                crate::limiter::Outcome::Never => return None,
                _ => wait = wait.max(i.decision.retry_after),
            }
        }
        Some(wait)
    }
}

/// At most `max` bytes of client input, printable in a one-line message (an error reply, a
/// log line): control characters become spaces.
pub fn shown(bytes: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(max)])
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Why a check was not decided. Rate limiting is a decision, not an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// Bad input: empty or oversized key, no items, too many items, cost overflow...
    /// (HTTP 400, a RESP error). Nothing was consumed.
    #[error("{0}")]
    InvalidInput(String),
    /// The named limit is not in the policy file (HTTP 400).
    #[error("unknown limit `{0}`; the policy file defines: {1}")]
    UnknownLimit(String, String),
    /// The node cannot decide now (shutting down, shard restarting) (HTTP 503).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The node was removed from the cluster (from the shard of an item): it decides
    /// nothing any more, and the caller is to use a member (HTTP 503, RESP `NOTMEMBER`).
    #[error("{0}")]
    NotMember(String),
}

impl From<crate::shard::actor::ShardError> for CheckError {
    fn from(e: crate::shard::actor::ShardError) -> Self {
        use crate::shard::actor::ShardError;
        match e {
            ShardError::Removed(_) => CheckError::NotMember(e.to_string()),
            ShardError::Overloaded(_) | ShardError::Restarting(_) => {
                CheckError::Unavailable(e.to_string())
            }
        }
    }
}

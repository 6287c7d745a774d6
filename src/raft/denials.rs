//! Denials a node learned from another node's leader, given again without asking it.
//!
//! A leader's denial says the same check would succeed only after `retry_after` if nothing
//! else consumed; until then the key's consumption can only grow (a refund is the one
//! exception, below), so the same check is denied again. A member that forwarded a check
//! and got a denial keeps it, and answers the same check (same key, limit and cost, no
//! request id) itself until four fifths of `retry_after` have passed since it SENT the
//! forward: the leader decided after that moment, so less shard time than that has passed
//! since, with a fifth to spare for the nodes' clocks running at different rates. A flood on
//! a hot key then stops at the member it reaches, instead of costing a forward each.
//!
//! Only denials are kept, so the cache can never admit anything. What it can do is deny a
//! check the leader would now admit: when the leader's denial was itself one the log would
//! not give (an in-flight refund; under `fast`, speculative entries a failover then lost);
//! when a refund (of an all-or-nothing check that another limit denied) gave back some of the
//! key's consumption after the denial was learned; when the policy changed (a reload clears
//! the cache); or when the nodes' clocks run more than a quarter apart. Each ends within the
//! denial's own `retry_after` (docs/semantics.md). The cache is bounded: when full, expired
//! entries are dropped, and if that frees less than a tenth, all of them.

use crate::limiter::{Decision, Limit, Nanos, Outcome};
use crate::shard::command::{Applied, Command, Fallback};
use std::sync::{Mutex, MutexGuard};

/// foldhash, as the shard tables (SipHash showed in profiles of the forwarding path). Its
/// seed differs per process and per map (addresses and time, not the OS's randomness):
/// foldhash claims only minimal resistance to chosen keys, the same trade as the shard
/// tables, and the map is bounded (`--denial-cache`).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Denials shorter than this are not kept: the next check would likely miss them anyway.
const MIN_RETRY: Nanos = 10_000_000;

struct Cached {
    limit: Limit,
    cost: u64,
    decision: Decision,
    /// When the forward that brought the denial was sent (this node's monotonic clock).
    asked_at: Nanos,
    /// Answered from the cache before this (this node's monotonic clock).
    until: Nanos,
}

pub struct DenialCache {
    map: Mutex<HashMap<String, Cached>>,
    max: usize,
}

impl DenialCache {
    pub fn new(max: usize) -> Self {
        DenialCache {
            map: Mutex::new(HashMap::default()),
            max,
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Cached>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answers to `commands` at `now`, if every one is a check without a request id that
    /// a kept denial covers; `None` otherwise (ask the leader).
    pub fn answer(&self, commands: &[Command], now: Nanos) -> Option<Vec<Applied>> {
        if self.max == 0 {
            return None;
        }
        let map = self.map();
        if map.is_empty() {
            return None;
        }
        let one = |command: &Command| {
            let (key, limit, cost) = command.plain_check()?;
            let c = map.get(key)?;
            if now >= c.until || c.cost != cost || c.limit != *limit {
                return None;
            }
            let elapsed = now.saturating_sub(c.asked_at);
            let decision = Decision {
                retry_after: c.decision.retry_after.saturating_sub(elapsed),
                reset_after: c.decision.reset_after.saturating_sub(elapsed),
                ..c.decision
            };
            Some(Applied::Decided {
                decision,
                replayed: false,
                fallback: Fallback::No,
                at: 0,
                epoch: 0,
            })
        };
        commands.iter().map(one).collect()
    }

    /// Keeps the leader's denials among `applied`, the answers to `commands` forwarded at
    /// `asked_at`; forgets an earlier denial of a key the leader has now admitted.
    pub fn learn(&self, commands: &[Command], applied: &[Applied], asked_at: Nanos) {
        if self.max == 0 {
            return;
        }
        let mut map = self.map();
        for (command, applied) in commands.iter().zip(applied) {
            let (
                Some((key, limit, cost)),
                Applied::Decided {
                    decision,
                    replayed: false,
                    fallback: Fallback::No,
                    ..
                },
            ) = (command.plain_check(), applied)
            else {
                continue;
            };
            if decision.outcome != Outcome::Denied || decision.retry_after < MIN_RETRY {
                if decision.allowed() && !map.is_empty() {
                    map.remove(key);
                }
                continue;
            }
            if map.len() >= self.max && !map.contains_key(key) {
                // Each full scan frees a tenth of the room at least, or everything: no
                // scan per insert under a flood of distinct keys.
                map.retain(|_, c| c.until > asked_at);
                if map.len() >= self.max - self.max / 10 {
                    map.clear();
                }
            }
            let until = asked_at.saturating_add(decision.retry_after / 5 * 4);
            let cached = Cached {
                limit: limit.clone(),
                cost,
                decision: *decision,
                asked_at,
                until,
            };
            map.insert(key.to_owned(), cached);
        }
    }

    /// Forgets every denial (the policies changed).
    pub fn clear(&self) {
        self.map().clear();
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, SECOND};
    use crate::policy::OnUnavailable;

    fn limit() -> Limit {
        Limit::new(Algorithm::FixedWindow, 2, SECOND, 2).unwrap()
    }

    fn check(key: &str, cost: u64, id: Option<&str>) -> Command {
        Command::Check {
            key: key.into(),
            limit: limit(),
            cost,
            request_id: id.map(Into::into),
            on_full: OnUnavailable::Deny,
        }
    }

    fn decided(outcome: Outcome, retry_after: Nanos, fallback: Fallback) -> Applied {
        Applied::Decided {
            decision: Decision {
                outcome,
                limit: 2,
                remaining: 0,
                reset_after: retry_after,
                retry_after,
                delay: 0,
            },
            replayed: false,
            fallback,
            at: 7,
            epoch: 0,
        }
    }

    #[test]
    fn a_denial_is_given_again_for_four_fifths_of_its_retry_after_and_no_longer() {
        let cache = DenialCache::new(100);
        let asked = 1_000 * SECOND;
        cache.learn(
            &[check("k", 1, None)],
            &[decided(Outcome::Denied, SECOND, Fallback::No)],
            asked,
        );
        let at = |t| cache.answer(&[check("k", 1, None)], t);
        let Some(answer) = at(asked + SECOND / 2) else {
            panic!("not answered from the cache");
        };
        let Applied::Decided { decision, .. } = &answer[0] else {
            panic!("{answer:?}");
        };
        assert_eq!(decision.outcome, Outcome::Denied);
        assert_eq!(decision.retry_after, SECOND / 2, "retry_after counts down");
        assert!(at(asked + SECOND / 5 * 4 - 1).is_some());
        assert_eq!(at(asked + SECOND / 5 * 4), None, "expired");
    }

    #[test]
    fn only_the_same_check_is_answered_and_only_leader_denials_are_kept() {
        let cache = DenialCache::new(100);
        let commands = [
            check("denied", 1, None),
            check("fallback", 1, None),
            check("short", 1, None),
            check("with_id", 1, Some("r")),
            check("admitted", 1, None),
        ];
        let applied = [
            decided(Outcome::Denied, SECOND, Fallback::No),
            decided(Outcome::Denied, SECOND, Fallback::KeyCap),
            decided(Outcome::Denied, MIN_RETRY - 1, Fallback::No),
            decided(Outcome::Denied, SECOND, Fallback::No),
            decided(Outcome::Allowed, 0, Fallback::No),
        ];
        cache.learn(&commands, &applied, 0);
        assert_eq!(cache.len(), 1);
        assert!(cache.answer(&[check("denied", 1, None)], 1).is_some());
        // Another cost, a request id, another limit, a check among others not covered.
        assert_eq!(cache.answer(&[check("denied", 2, None)], 1), None);
        assert_eq!(cache.answer(&[check("denied", 1, Some("x"))], 1), None);
        let other_limit = Command::Check {
            key: "denied".into(),
            limit: Limit::new(Algorithm::FixedWindow, 3, SECOND, 3).unwrap(),
            cost: 1,
            request_id: None,
            on_full: OnUnavailable::Deny,
        };
        assert_eq!(cache.answer(&[other_limit], 1), None);
        let pair = [check("denied", 1, None), check("admitted", 1, None)];
        assert_eq!(cache.answer(&pair, 1), None);
        // An admission of the key forgets its denial; so does a reload.
        cache.learn(
            &[check("denied", 1, None)],
            &[decided(Outcome::Allowed, 0, Fallback::No)],
            2,
        );
        assert!(cache.is_empty());
        cache.learn(&commands[..1], &applied[..1], 3);
        cache.clear();
        assert_eq!(cache.answer(&[check("denied", 1, None)], 4), None);
    }

    #[test]
    fn the_cache_stays_within_its_bound() {
        let cache = DenialCache::new(3);
        for (i, t) in [(0, 0), (1, 0), (2, 0), (3, 5 * SECOND), (4, 5 * SECOND)] {
            let key = format!("k{i}");
            cache.learn(
                &[check(&key, 1, None)],
                &[decided(Outcome::Denied, SECOND, Fallback::No)],
                t,
            );
            assert!(cache.len() <= 3);
        }
        // The three first expired by the time k3 came: dropped, k3 and k4 kept.
        assert_eq!(cache.len(), 2);
        assert!(cache.answer(&[check("k4", 1, None)], 5 * SECOND).is_some());
    }
}

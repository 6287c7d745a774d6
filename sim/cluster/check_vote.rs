//! Invariant: no node forgets or takes back a vote, and no leader stands on its own vote.
//!
//! openraft 0.9 (without `single-term-leader`) names a leader by its term AND node id, so a
//! term may have several leaders, and a node may vote for several candidates in a term,
//! each time for a higher-named one; entries carry their leader's (term, node), so logs still
//! match. Its safety rests on each node's vote only ever growing in the order (term, node,
//! committed), durably. Every vote a node's log store saves (reported once durable) or
//! finds on disk at start (`raft::hooks::Hooks::vote`) goes through [`Votes::record`], which
//! checks:
//! - per shard and node, each vote is at least the one before it, a restart included (one
//!   found at a start may have lost its `committed`: see [`Votes::record`]). A
//!   node that lost a saved vote (in a crash) could grant a lower-named candidate of a term
//!   it had already voted in, and two candidates could each count it toward a majority;
//! - a node that saves its own leadership (a committed vote for itself) was granted by
//!   enough other nodes for a majority of the cluster's first members (`--nodes`: one of
//!   3, two of 5, three of 7): that many other nodes' last votes are at least its own. A
//!   vote is never taken back, so a grant stays counted; a vote for a higher candidate is
//!   counted too, which only loosens the check. While a member is replaced the voters are
//!   one more, and their majority needs as many other votes or one more: still a lower bound.
//!
//! What this cannot see: a vote granted and then lost in a crash before the store reported
//! it (the restart's vote is then compared with an older one).

use super::history::secs;
use crate::limiter::Nanos;
use crate::raft::hooks::VoteSaved;
use crate::raft::{GroupId, NodeId};
use std::collections::BTreeMap;

#[derive(Debug)]
pub struct Votes {
    /// Other nodes' votes a leader needs: a majority of the first members, less its own.
    others_needed: usize,
    /// Per (shard, node): the last vote saved or restored.
    last: BTreeMap<(GroupId, NodeId), VoteSaved>,
    violations: Vec<String>,
    /// Votes reported saved, and restored at a start.
    pub saved: u64,
    pub restored: u64,
}

/// openraft's order of votes (`Vote`'s `PartialOrd` with its default, total, leader ids).
fn rank(v: &VoteSaved) -> (u64, NodeId, bool) {
    (v.term, v.leader, v.committed)
}

fn show(v: &VoteSaved) -> String {
    if v.term == 0 && !v.committed {
        return "none".into();
    }
    format!(
        "term {} {} n{}",
        v.term,
        if v.committed { "led by" } else { "for" },
        v.leader
    )
}

impl Default for Votes {
    /// For the default three members.
    fn default() -> Votes {
        Votes::new(3)
    }
}

impl Votes {
    /// The checker of a cluster of `members` voters from the start.
    pub fn new(members: usize) -> Votes {
        Votes {
            others_needed: members / 2,
            last: BTreeMap::new(),
            violations: Vec::new(),
            saved: 0,
            restored: 0,
        }
    }

    pub fn record(&mut self, at: Nanos, v: &VoteSaved) {
        if v.restored {
            self.restored += 1;
        } else {
            self.saved += 1;
        }
        if let Some(prev) = self.last.get(&(v.group, v.node)) {
            // A store may find a node's own vote no longer committed: it is handed to
            // openraft as not committed at a start (`NodeLog::group_after_snapshots`), and a
            // WAL compaction may write it so. Its term and node may not go back.
            let back = if v.restored && v.leader == v.node {
                (v.term, v.leader) < (prev.term, prev.leader)
            } else {
                rank(v) < rank(prev)
            };
            if back {
                let (what, when) = if v.restored {
                    ("restarted with", "it had saved")
                } else {
                    ("saved", "after")
                };
                self.violations.push(format!(
                    "{} n{} shard {} {what} a vote ({}) {when} {}: its vote went back",
                    secs(at),
                    v.node,
                    v.group,
                    show(v),
                    show(prev)
                ));
            }
        }
        if v.committed && v.leader == v.node && !v.restored {
            let granted = self
                .last
                .iter()
                .filter(|((group, node), other)| {
                    *group == v.group && *node != v.node && rank(other) >= (v.term, v.leader, false)
                })
                .count();
            if granted < self.others_needed {
                self.violations.push(format!(
                    "{} n{} leads shard {} in term {} with {granted} other node's vote(s) of \
                     the {} a majority needs",
                    secs(at),
                    v.node,
                    v.group,
                    v.term,
                    self.others_needed
                ));
            }
        }
        self.last.insert((v.group, v.node), *v);
    }
}

pub fn check(votes: &Votes) -> Vec<String> {
    super::first_ten(votes.violations.iter().cloned(), "vote violations")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(node: NodeId, term: u64, leader: NodeId, committed: bool) -> VoteSaved {
        VoteSaved {
            node,
            group: 3,
            term,
            leader,
            committed,
            restored: false,
        }
    }

    fn restored(v: VoteSaved) -> VoteSaved {
        VoteSaved {
            restored: true,
            ..v
        }
    }

    fn violations(votes: &[VoteSaved]) -> Vec<String> {
        violations_of(3, votes)
    }

    fn violations_of(members: usize, votes: &[VoteSaved]) -> Vec<String> {
        let mut v = Votes::new(members);
        for (i, x) in votes.iter().enumerate() {
            v.record(i as Nanos * 1_000_000, x);
        }
        check(&v)
    }

    #[test]
    fn elections_as_openraft_runs_them_are_clean() {
        // Term 2: n1 and n3 stand; n2 grants n1, then n3 (higher-named); n3 leads, and n1
        // learns it. n3 restarts and finds its vote.
        let clean = [
            vote(1, 2, 1, false),
            vote(3, 2, 3, false),
            vote(2, 2, 1, false),
            vote(2, 2, 3, false),
            vote(3, 2, 3, true),
            vote(2, 2, 3, true),
            vote(1, 2, 3, true),
            restored(vote(3, 2, 3, true)),
            restored(vote(3, 2, 3, false)),
            vote(1, 5, 1, false),
            vote(2, 5, 1, false),
            vote(1, 5, 1, true),
        ];
        assert_eq!(violations(&clean), Vec::<String>::new());
    }

    #[test]
    fn a_vote_taken_back_or_forgotten_and_a_lone_leader_are_each_seen() {
        let back = violations(&[vote(2, 4, 3, false), vote(2, 4, 1, false)]);
        assert!(
            back.len() == 1
                && back[0].contains("n2 shard 3 saved a vote (term 4 for n1) after term 4 for n3")
                && back[0].contains("its vote went back"),
            "{back:?}"
        );
        let forgot = violations(&[vote(2, 4, 1, false), restored(vote(2, 3, 3, true))]);
        assert!(
            forgot.len() == 1
                && forgot[0].contains("n2 shard 3 restarted with a vote (term 3 led by n3)")
                && forgot[0].contains("its vote went back"),
            "{forgot:?}"
        );
        let wiped = violations(&[vote(2, 4, 1, false), restored(vote(2, 0, 0, false))]);
        assert!(
            wiped.len() == 1
                && wiped[0].contains("restarted with a vote (none) it had saved term 4 for n1"),
            "{wiped:?}"
        );
        let uncommitted = violations(&[vote(2, 4, 1, true), vote(2, 4, 1, false)]);
        assert!(uncommitted[0].contains("went back"), "{uncommitted:?}");
        // Only a node's own vote may come back from disk no longer committed.
        let uncommitted = violations(&[vote(2, 4, 1, true), restored(vote(2, 4, 1, false))]);
        assert!(uncommitted[0].contains("went back"), "{uncommitted:?}");
        // n2's vote is for a lower-named candidate of term 7: it did not grant n3.
        let lone = violations(&[
            vote(2, 7, 1, false),
            vote(3, 7, 3, false),
            vote(3, 7, 3, true),
        ]);
        assert!(
            lone.len() == 1
                && lone[0].contains(
                    "n3 leads shard 3 in term 7 with 0 other node's vote(s) of the 1 a majority needs"
                ),
            "{lone:?}"
        );
    }

    #[test]
    fn a_leader_of_five_needs_two_other_votes() {
        // Term 4: n2 grants n3; n1 votes for itself (lower-named: not a grant of n3).
        let one_other = [
            vote(3, 4, 3, false),
            vote(2, 4, 3, false),
            vote(1, 4, 1, false),
            vote(3, 4, 3, true),
        ];
        assert_eq!(violations_of(3, &one_other), Vec::<String>::new());
        let five = violations_of(5, &one_other);
        assert!(
            five.len() == 1
                && five[0]
                    .contains("n3 leads shard 3 in term 4 with 1 other node's vote(s) of the 2"),
            "{five:?}"
        );
        // n4 grants it too: a majority of five.
        let mut two_others = one_other.to_vec();
        two_others.insert(3, vote(4, 4, 3, false));
        assert_eq!(violations_of(5, &two_others), Vec::<String>::new());
    }
}

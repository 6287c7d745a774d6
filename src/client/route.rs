//! Leader-aware routing for a client of several nodes ([`ClientConfig::routes_every`]).
//!
//! Every node answers every key, but a node that does not lead the key's shard forwards the
//! check to the leader and relays the answer: one more hop, and CPU on two nodes. A client
//! that knows where keys live sends each check to its shard's leader instead:
//! - When a call finds the map older than `routes_every` (or finds none), it starts a task
//!   that asks every node at once for `QR.ROUTES` (its own node id, the shard count, each
//!   shard's leader and term, the limits' key prefixes), each on a connection of its own;
//!   the call itself goes on with the map it has. The client keeps, per shard, the leader
//!   reported in the newest term, and the node id of each address it has heard from.
//! - A check goes to the client that prefers its first item's shard leader (one per node,
//!   each failing over to the others as [`Client::with_nodes`] does); anything it cannot
//!   place (no map yet, a leader unknown or not in the list, a limit the map does not name)
//!   goes to the first node up, as without routing.
//!
//! A stale map costs speed, never correctness: the node that gets a check it does not lead
//! forwards it, and a request id is remembered by the shard whichever node is asked.

use super::resp;
use super::{Client, ClientConfig, ClientError};
use crate::api::resp::frame::Frame;
use crate::net::Connector;
use crate::service::{inline_route, InlineLimit};
use crate::shard::route::{fnv1a, Sharding};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The routing part of a client of several nodes.
pub(super) struct Router<C: Connector> {
    /// `members[i]` prefers node `i`, then the others in list order.
    pub(super) members: Vec<Client<C>>,
    /// `probes[i]`: node `i` alone, one connection, for `QR.ROUTES` (shared with a refresh
    /// task, which holds nothing else of the client while it waits).
    probes: Arc<[Client<C>]>,
    every: Duration,
    map: RwLock<Option<Map>>,
    /// The node id each address answered with, by index, kept across refreshes: a leader
    /// whose own answer was missed in one round is still placed.
    ids: Mutex<Vec<Option<u64>>>,
    /// When the last refresh began (ns after the client's epoch); `u64::MAX`: never.
    refreshed: AtomicU64,
    /// Set while a refresh task exists; a guard the task owns clears it however the task
    /// ends (done, dropped unpolled or cancelled by a runtime shutting down, or panicked).
    refreshing: AtomicBool,
}

/// Where keys live, as the nodes last said.
#[derive(Debug)]
struct Map {
    shards: u32,
    sharding: Sharding,
    /// Per shard: the index (in the client's list) of its leader's node.
    leaders: Vec<Option<usize>>,
    /// Named limits: the hash of their storage-key prefix.
    prefixes: HashMap<String, u64>,
}

/// One node's `QR.ROUTES` answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Routes {
    pub node: u64,
    pub shards: u32,
    /// How the cluster spreads keys (a fifth element; a node without it shards by hash).
    pub sharding: Sharding,
    /// Per shard: its leader as the node knows it, and the term.
    pub leaders: Vec<(Option<u64>, u64)>,
    pub prefixes: Vec<(String, String)>,
}

/// The key a check is routed by.
pub(super) enum RouteKey<'a> {
    Named { limit: &'a str, key: &'a str },
    Inline { limit: InlineLimit, key: &'a str },
}

impl<C: Connector> Router<C> {
    pub(super) fn new(
        addrs: &[SocketAddr],
        connector: &C,
        config: &ClientConfig,
        every: Duration,
    ) -> Router<C> {
        let single = ClientConfig {
            routes_every: None,
            ..config.clone()
        };
        let members = (0..addrs.len())
            .map(|i| {
                let order = (0..addrs.len()).map(|k| addrs[(i + k) % addrs.len()]);
                let config = ClientConfig {
                    jitter_seed: config.jitter_seed.wrapping_add(i as u64),
                    ..single.clone()
                };
                Client::with_nodes(order, connector.clone(), config)
            })
            .collect();
        let probes = addrs
            .iter()
            .map(|&a| {
                // A refresh lasts as long as its slowest probe: bounded by `every` (at least
                // PROBE_FLOOR, so a short interval does not time every probe out).
                let config = ClientConfig {
                    connections: 1,
                    timeout: single.timeout.min(every.max(PROBE_FLOOR)),
                    ..single.clone()
                };
                Client::with_nodes([a], connector.clone(), config)
            })
            .collect();
        Router {
            members,
            probes,
            every,
            map: RwLock::new(None),
            ids: Mutex::new(vec![None; addrs.len()]),
            refreshed: AtomicU64::new(u64::MAX),
            refreshing: AtomicBool::new(false),
        }
    }

    /// The member client for `key` (its shard leader's node), or the first one.
    pub(super) fn member(&self, key: Option<RouteKey<'_>>) -> &Client<C> {
        let leader = key.and_then(|key| {
            let map = self.map.read().unwrap_or_else(|p| p.into_inner());
            let map = map.as_ref().filter(|m| m.shards > 0)?;
            let route = match key {
                // Under slot sharding the key alone places it, whatever its limit.
                RouteKey::Named { limit, key } => match map.sharding {
                    Sharding::Slots => map.sharding.route(0, key),
                    Sharding::Hash => map.sharding.route(*map.prefixes.get(limit)?, key),
                },
                RouteKey::Inline { limit, key } => inline_route(&limit, key, map.sharding),
            };
            let shard = map.sharding.shard(route, map.shards) as usize;
            map.leaders.get(shard).copied().flatten()
        });
        &self.members[leader.unwrap_or(0)]
    }

    /// True when a refresh should start now (`now`: ns after the client's epoch); the caller
    /// that gets true owns the refresh, and calls [`Router::release`] once it has ended.
    pub(super) fn due(&self, now: u64) -> bool {
        let last = self.refreshed.load(Ordering::Relaxed);
        let every = u64::try_from(self.every.as_nanos()).unwrap_or(u64::MAX);
        let stale = last == u64::MAX || now.saturating_sub(last) >= every;
        if stale
            && !self.refreshing.load(Ordering::Relaxed)
            && !self.refreshing.swap(true, Ordering::Acquire)
        {
            self.refreshed.store(now, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// True while a refresh is under way (tests).
    #[cfg(test)]
    pub(super) fn is_refreshing(&self) -> bool {
        self.refreshing.load(Ordering::Acquire)
    }

    /// The refresh [`Router::due`] granted has ended: the next may start when due.
    pub(super) fn release(&self) {
        self.refreshing.store(false, Ordering::Release);
    }

    /// The probes, for a refresh task ([`ask`], then [`Router::apply`]).
    pub(super) fn probes(&self) -> Arc<[Client<C>]> {
        self.probes.clone()
    }

    /// Replaces the map with one from `answers` ([`ask`]; kept as it was if no node
    /// answered).
    pub(super) fn apply(&self, answers: Vec<(usize, Routes)>) {
        let ids = {
            let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
            for (_, r) in &answers {
                // An id answers at one address: a node that moved to another address is no
                // longer placed at its old one.
                for id in ids.iter_mut() {
                    if *id == Some(r.node) {
                        *id = None;
                    }
                }
            }
            for (i, r) in &answers {
                ids[*i] = Some(r.node);
            }
            ids.clone()
        };
        if let Some(map) = merge(&answers, &ids) {
            *self.map.write().unwrap_or_else(|p| p.into_inner()) = Some(map);
        }
    }

    /// The shard count and each shard's leader's index in the client's list, once known.
    pub(super) fn known(&self) -> Option<(u32, Vec<Option<usize>>)> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.as_ref().map(|m| (m.shards, m.leaders.clone()))
    }
}

/// The shortest time a probe is given, whatever `routes_every` is.
const PROBE_FLOOR: Duration = Duration::from_millis(250);

/// Asks every probe for its node's routes at once; the answers, by index.
pub(super) async fn ask<C: Connector>(probes: &[Client<C>]) -> Vec<(usize, Routes)> {
    let asks = probes
        .iter()
        .map(|p| p.call(&[b"QR.ROUTES"], super::Resend::AnyMember));
    let replies = futures::future::join_all(asks).await;
    let mut answers = Vec::new();
    for (i, reply) in replies.into_iter().enumerate() {
        match reply.and_then(parse_routes) {
            Ok(r) => answers.push((i, r)),
            // A member of an older version does not know QR.ROUTES: its checks are not
            // routed, which costs a forward, so this is no warning.
            Err(e) => tracing::debug!(node = i, %e, "no routes from this node"),
        }
    }
    answers
}

/// One map from the nodes' answers (`(index in the client's list, answer)`) and the node id
/// each index answered with so far (`ids`): the shard count and prefixes of the first
/// answer, and per shard the leader reported in the newest term, if the client knows that
/// node's address.
fn merge(answers: &[(usize, Routes)], ids: &[Option<u64>]) -> Option<Map> {
    let (_, first) = answers.first()?;
    let index_of: HashMap<u64, usize> = ids
        .iter()
        .enumerate()
        .filter_map(|(i, id)| Some(((*id)?, i)))
        .collect();
    let leaders = (0..first.shards as usize)
        .map(|shard| {
            answers
                .iter()
                .filter(|(_, r)| r.shards == first.shards && r.sharding == first.sharding)
                .filter_map(|(_, r)| {
                    let (leader, term) = *r.leaders.get(shard)?;
                    Some((term, leader?))
                })
                .max()
                .and_then(|(_, leader)| index_of.get(&leader).copied())
        })
        .collect();
    let prefixes = first
        .prefixes
        .iter()
        .map(|(name, prefix)| (name.clone(), fnv1a(prefix.as_bytes())))
        .collect();
    Some(Map {
        shards: first.shards,
        sharding: first.sharding,
        leaders,
        prefixes,
    })
}

/// A `QR.ROUTES` reply.
pub(super) fn parse_routes(frame: Frame) -> Result<Routes, ClientError> {
    let bad = |what: &str| ClientError::Protocol(format!("QR.ROUTES: {what}"));
    let parts = match frame {
        Frame::Array(parts) => parts,
        Frame::Error(m) => return Err(resp::server_error(m)),
        _ => return Err(bad("not an array")),
    };
    let (sharding, parts) = match &parts[..] {
        [four @ .., Frame::Bulk(name)] if four.len() == 4 => (
            std::str::from_utf8(name)
                .ok()
                .and_then(Sharding::parse)
                .ok_or_else(|| bad("sharding is neither hash nor slots"))?,
            four,
        ),
        four => (Sharding::Hash, four),
    };
    let [Frame::Integer(node), Frame::Integer(shards), Frame::Array(leaders), Frame::Array(prefixes)] =
        parts
    else {
        return Err(bad("expected node, shards, leaders, prefixes[, sharding]"));
    };
    let node = u64::try_from(*node).map_err(|_| bad("negative node id"))?;
    let shards = u32::try_from(*shards).map_err(|_| bad("shard count out of range"))?;
    if leaders.len() != shards as usize {
        return Err(bad("one [leader, term] per shard expected"));
    }
    let leaders = leaders
        .iter()
        .map(|l| match l {
            Frame::Array(lt) => match &lt[..] {
                [leader, Frame::Integer(term)] => {
                    let leader = match leader {
                        Frame::Null => None,
                        Frame::Integer(id) => Some(u64::try_from(*id).ok()?),
                        _ => return None,
                    };
                    Some((leader, u64::try_from(*term).ok()?))
                }
                _ => None,
            },
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("a shard's entry is not [leader, term]"))?;
    let text = |f: &Frame| match f {
        Frame::Bulk(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        _ => None,
    };
    let prefixes = prefixes
        .chunks(2)
        .map(|pair| match pair {
            [name, prefix] => Some((text(name)?, text(prefix)?)),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("prefixes are not name, prefix pairs"))?;
    Ok(Routes {
        node,
        shards,
        sharding,
        leaders,
        prefixes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(node: u64, leaders: &[(Option<u64>, u64)]) -> Routes {
        Routes {
            node,
            shards: leaders.len() as u32,
            sharding: Sharding::Hash,
            leaders: leaders.to_vec(),
            prefixes: vec![("login".into(), "login:".into())],
        }
    }

    #[test]
    fn the_newest_term_names_each_shards_leader() {
        // Node 3 (index 2) still thinks node 1 leads shard 0 in term 4; node 2 (index 1) saw
        // node 2 elected in term 5. Shard 1: only node 3 knows a leader, node 9, which the
        // client has no address for.
        let answers = vec![
            (1, routes(2, &[(Some(2), 5), (None, 7)])),
            (2, routes(3, &[(Some(1), 4), (Some(9), 7)])),
            (0, routes(1, &[(None, 5), (None, 6)])),
        ];
        let ids = [Some(1), Some(2), Some(3)];
        let map = merge(&answers, &ids).unwrap();
        assert_eq!(map.shards, 2);
        assert_eq!(map.leaders, vec![Some(1), None]);
        assert_eq!(map.prefixes["login"], fnv1a(b"login:"));
        assert!(merge(&[], &ids).is_none());
        // Node 2 (index 1) did not answer this round, and node 3 names it shard 0's leader:
        // its id is known from an earlier round.
        let answers = vec![
            (2, routes(3, &[(Some(2), 5), (Some(9), 7)])),
            (0, routes(1, &[(None, 5), (None, 6)])),
        ];
        let map = merge(&answers, &ids).unwrap();
        assert_eq!(map.leaders, vec![Some(1), None]);
        // Never heard from: its shards go to the first node up.
        let map = merge(&answers, &[Some(1), None, Some(3)]).unwrap();
        assert_eq!(map.leaders, vec![None, None]);
    }

    #[test]
    fn a_node_that_answers_at_another_address_is_placed_there_only() {
        let addrs: Vec<SocketAddr> = (1..=3)
            .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
            .collect();
        let config = ClientConfig::default();
        let tcp = crate::net::tcp::TcpConnector;
        let router = Router::new(&addrs, &tcp, &config, Duration::from_secs(1));
        router.apply(vec![
            (0, routes(1, &[(Some(2), 3)])),
            (2, routes(2, &[(Some(2), 3)])),
        ]);
        assert_eq!(router.known(), Some((1, vec![Some(2)])));
        // Node 2 now answers at the second address (replaced there); the third is silent.
        router.apply(vec![(1, routes(2, &[(Some(2), 4)]))]);
        assert_eq!(router.known(), Some((1, vec![Some(1)])));
    }

    #[test]
    fn a_routes_reply_parses_and_a_malformed_one_is_refused() {
        let good = Frame::Array(vec![
            Frame::Integer(2),
            Frame::Integer(2),
            Frame::Array(vec![
                Frame::Array(vec![Frame::Integer(1), Frame::Integer(3)]),
                Frame::Array(vec![Frame::Null, Frame::Integer(0)]),
            ]),
            Frame::Array(vec![Frame::bulk("api"), Frame::bulk("api:")]),
        ]);
        let want = Routes {
            node: 2,
            shards: 2,
            sharding: Sharding::Hash,
            leaders: vec![(Some(1), 3), (None, 0)],
            prefixes: vec![("api".into(), "api:".into())],
        };
        assert_eq!(parse_routes(good.clone()).unwrap(), want);
        // A fifth element names the sharding; one the client does not know is refused.
        let with = |name: &str| {
            let Frame::Array(mut parts) = good.clone() else {
                unreachable!()
            };
            parts.push(Frame::bulk(name.to_string()));
            parse_routes(Frame::Array(parts))
        };
        assert_eq!(
            with("slots").unwrap(),
            Routes {
                sharding: Sharding::Slots,
                ..want
            }
        );
        assert!(matches!(with("ring"), Err(ClientError::Protocol(_))));
        let short = Frame::Array(vec![
            Frame::Integer(2),
            Frame::Integer(2),
            Frame::Array(vec![Frame::Array(vec![
                Frame::Integer(1),
                Frame::Integer(3),
            ])]),
            Frame::Array(vec![]),
        ]);
        assert!(matches!(parse_routes(short), Err(ClientError::Protocol(_))));
        assert!(matches!(
            parse_routes(Frame::Error("ERR unknown command 'QR.ROUTES'".into())),
            Err(ClientError::Server(_))
        ));
        assert!(parse_routes(Frame::Integer(1)).is_err());
    }
}

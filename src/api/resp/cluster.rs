//! `CLUSTER ...`: the Redis Cluster view of a cluster created with `sharding = "slots"`, so
//! that Redis Cluster clients and `redis-benchmark --cluster` send each key to its shard's
//! leader and skip the hop through a node that would forward it.
//!
//! Each shard owns a contiguous range of the 16384 hash slots (`crate::shard::route`), and
//! the node leading the shard is that range's master. There are no replicas in the view:
//! every member replicates every shard through Raft, and only the leader decides. Leaders
//! move (elections, rebalancing), and a client's view goes stale: nothing breaks, since every
//! node forwards what it does not lead, and no `MOVED` is ever sent. A client refreshes its
//! view when it reconnects; the cost of a stale one is the forward.

use super::command::ClusterCommand;
use super::frame::Frame;
use crate::raft::cluster::ClientNode;
use crate::service::Service;
use crate::shard::route::{key_slot, shard_slots, Sharding, SLOTS};
use std::fmt::Write;

/// What Redis answers when cluster support is off, and how to turn it on.
const DISABLED: &str = "This instance has cluster support disabled: this cluster shards keys \
by hash; a cluster created with sharding = \"slots\" (--sharding slots) answers CLUSTER for \
Redis Cluster clients";

/// The answer to a `CLUSTER` subcommand.
pub async fn answer(service: &Service, cmd: ClusterCommand) -> Frame {
    if let ClusterCommand::KeySlot(key) = &cmd {
        return Frame::Integer(key_slot(key) as i64);
    }
    if service.sharding() != Sharding::Slots {
        return Frame::err(DISABLED);
    }
    let view = View::of(service).await;
    match cmd {
        ClusterCommand::Nodes => Frame::bulk(view.nodes()),
        ClusterCommand::Slots => view.slots(),
        ClusterCommand::Info => Frame::bulk(view.info()),
        ClusterCommand::MyId => Frame::bulk(name(view.me)),
        ClusterCommand::KeySlot(_) => unreachable!("answered above"),
    }
}

/// A node's name in the view: its id as 40 hex digits, the length of a Redis node id.
fn name(id: u64) -> String {
    format!("{id:040x}")
}

/// The cluster as this node sees it now.
struct View {
    me: u64,
    nodes: Vec<ClientNode>,
    /// Slot ranges (inclusive) and the node leading them, adjacent ranges of one leader
    /// merged, in slot order. Shards without a known leader are missing.
    ranges: Vec<(u16, u16, u64)>,
}

impl View {
    async fn of(service: &Service) -> View {
        let Some(cluster) = service.cluster() else {
            // A single node leads every shard.
            return View {
                me: 0,
                nodes: vec![ClientNode {
                    id: 0,
                    resp: service.resp_addr().map(|a| (a.ip().to_string(), a.port())),
                    bus_port: 0,
                }],
                ranges: vec![(0, SLOTS - 1, 0)],
            };
        };
        let nodes = cluster.client_nodes().await;
        let leaders = cluster.leaders();
        let count = leaders.len() as u32;
        let mut ranges: Vec<(u16, u16, u64)> = Vec::new();
        for (shard, (leader, _term)) in leaders.into_iter().enumerate() {
            let (Some(leader), Some((start, end))) = (leader, shard_slots(shard as u32, count))
            else {
                continue;
            };
            match ranges.last_mut() {
                Some(last) if last.2 == leader && last.1 as u32 + 1 == start as u32 => last.1 = end,
                _ => ranges.push((start, end, leader)),
            }
        }
        View {
            me: cluster.node_id(),
            nodes,
            ranges,
        }
    }

    fn node(&self, id: u64) -> Option<&ClientNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// `CLUSTER NODES`: one line per member, as Redis writes them.
    fn nodes(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let mut flags = String::from(if n.id == self.me {
                "myself,master"
            } else {
                "master"
            });
            if n.resp.is_none() {
                flags.push_str(",noaddr");
            }
            // As Redis writes it: the bare IP (an IPv6 one too), a colon, the port.
            let addr = match &n.resp {
                Some((host, port)) => format!("{host}:{port}"),
                None => ":0".into(),
            };
            let _ = write!(
                out,
                "{} {addr}@{} {flags} - 0 0 0 {}",
                name(n.id),
                n.bus_port,
                if n.resp.is_some() {
                    "connected"
                } else {
                    "disconnected"
                },
            );
            for (start, end, _) in self.ranges.iter().filter(|r| r.2 == n.id) {
                if start == end {
                    let _ = write!(out, " {start}");
                } else {
                    let _ = write!(out, " {start}-{end}");
                }
            }
            out.push('\n');
        }
        out
    }

    /// `CLUSTER SLOTS`: `[start, end, [host, port, name]]` per range whose leader's address
    /// is known.
    fn slots(&self) -> Frame {
        Frame::Array(
            self.ranges
                .iter()
                .filter_map(|&(start, end, leader)| {
                    let (host, port) = self.node(leader)?.resp.as_ref()?;
                    Some(Frame::Array(vec![
                        Frame::Integer(start as i64),
                        Frame::Integer(end as i64),
                        Frame::Array(vec![
                            Frame::bulk(host.clone()),
                            Frame::Integer(*port as i64),
                            Frame::bulk(name(leader)),
                        ]),
                    ]))
                })
                .collect(),
        )
    }

    /// `CLUSTER INFO`: `ok` when every slot has a leader whose address is known.
    fn info(&self) -> String {
        let served: u32 = self
            .ranges
            .iter()
            .filter(|r| self.node(r.2).is_some_and(|n| n.resp.is_some()))
            .map(|r| (r.1 - r.0) as u32 + 1)
            .sum();
        let leaders: std::collections::BTreeSet<u64> = self.ranges.iter().map(|r| r.2).collect();
        format!(
            "cluster_enabled:1\r\ncluster_state:{}\r\ncluster_slots_assigned:{served}\r\n\
             cluster_slots_ok:{served}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:{}\r\n\
             cluster_known_nodes:{}\r\ncluster_size:{}\r\ncluster_current_epoch:0\r\n\
             cluster_my_epoch:0\r\n",
            if served == SLOTS as u32 { "ok" } else { "fail" },
            SLOTS as u32 - served,
            self.nodes.len(),
            leaders.len(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> View {
        let node = |id, resp: Option<(&str, u16)>| ClientNode {
            id,
            resp: resp.map(|(h, p)| (h.to_owned(), p)),
            bus_port: 7100 + id as u16,
        };
        View {
            me: 2,
            nodes: vec![
                node(1, Some(("10.0.0.1", 6380))),
                node(2, Some(("::1", 6381))),
                node(3, None),
            ],
            ranges: vec![(0, 5461, 1), (5462, 10922, 2), (10923, 16383, 3)],
        }
    }

    #[test]
    fn cluster_nodes_lines_are_what_redis_cluster_clients_parse() {
        let text = view().nodes();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "0000000000000000000000000000000000000001 10.0.0.1:6380@7101 master - 0 0 0 connected 0-5461",
                "0000000000000000000000000000000000000002 ::1:6381@7102 myself,master - 0 0 0 connected 5462-10922",
                "0000000000000000000000000000000000000003 :0@7103 master,noaddr - 0 0 0 disconnected 10923-16383",
            ]
        );
    }

    #[test]
    fn cluster_slots_lists_ranges_with_a_reachable_leader_and_info_says_fail_without() {
        let v = view();
        let Frame::Array(ranges) = v.slots() else {
            panic!("not an array")
        };
        assert_eq!(ranges.len(), 2, "{ranges:?}");
        assert_eq!(
            ranges[1],
            Frame::Array(vec![
                Frame::Integer(5462),
                Frame::Integer(10922),
                Frame::Array(vec![
                    Frame::bulk("::1"),
                    Frame::Integer(6381),
                    Frame::bulk(name(2)),
                ]),
            ])
        );
        let info = v.info();
        assert!(info.contains("cluster_state:fail\r\n"), "{info}");
        assert!(info.contains("cluster_slots_ok:10923\r\n"), "{info}");
        let all = View {
            nodes: vec![],
            ranges: vec![],
            ..view()
        };
        assert!(all.info().contains("cluster_slots_assigned:0\r\n"));
        let mut up = view();
        up.nodes[2].resp = Some(("10.0.0.3".into(), 6380));
        assert!(up
            .info()
            .contains("cluster_state:ok\r\ncluster_slots_assigned:16384\r\n"));
    }
}

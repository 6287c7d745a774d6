//! `--membership-faults`: an operator replaces a member, as docs/operations.md says, amid
//! the nemesis's other faults. A spare host runs a node started to join (`--join`, id
//! `nodes + 1`); once in a run the nemesis starts an "admin" client that sends
//! `POST /v1/admin/members` through the members' own HTTP API: first the add of the spare,
//! then the remove of a member (the victim), each sent again, through the next member other
//! than the victim, until it is answered 200 (an add sent again resumes or finds the node a
//! voter; a remove sent again after one that went through unanswered is refused with "is
//! not a member", taken as done). The removed node keeps running, outside every shard; the
//! checks after healing take the members as the changes left them.

use super::history::History;
use super::hosts::NodeHandle;
use super::workload::now;
use crate::net::turmoil::TurmoilConnector;
use crate::net::Connector;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where the replacement stands.
#[derive(Debug, Default, Clone)]
pub struct Replacement {
    /// The admin client was started (once per run).
    pub started: bool,
    /// The spare was added (its add answered 200).
    pub added: bool,
    /// The member removed (its remove answered 200), by index.
    pub removed: Option<usize>,
    /// The admin client finished (both changes answered 200).
    pub done: bool,
}

pub type Shared = Arc<Mutex<Replacement>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The nodes that are members once the changes are through: the first `members` nodes and
/// the spare if it was added, less the removed one.
pub fn members(nodes: &[Arc<NodeHandle>], members: usize, r: &Replacement) -> Vec<Arc<NodeHandle>> {
    nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| (*i < members || r.added) && Some(*i) != r.removed)
        .map(|(_, n)| n.clone())
        .collect()
}

/// One HTTP/1.1 `POST path` with a JSON body, over the simulated network: the status code
/// and the body, or why there was none.
async fn post(addr: SocketAddr, path: &str, body: &str) -> Result<(u16, String), String> {
    let mut s = TurmoilConnector
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let reply = String::from_utf8_lossy(&reply);
    let code = reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {reply:?}"))?;
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((code, body.trim().to_string()))
}

/// The admin client: adds node `spare`, then removes node `victim`, through the first
/// `members` nodes other than the victim in turn.
pub async fn replace(
    nodes: Vec<Arc<NodeHandle>>,
    members: usize,
    victim: usize,
    spare: usize,
    state: Shared,
    history: Arc<Mutex<History>>,
) -> turmoil::Result {
    let via: Vec<usize> = (0..members).filter(|&i| i != victim).collect();
    let add = format!(
        r#"{{"add": {{"id": {}, "addr": "{}"}}}}"#,
        nodes[spare].id,
        nodes[spare].peer_addr()
    );
    let remove = format!(r#"{{"remove": {{"id": {}}}}}"#, nodes[victim].id);
    for (what, body) in [("add", add), ("remove", remove)] {
        let mut attempt = 0usize;
        loop {
            let through = via[attempt % via.len()];
            // Well within the checks' windows after healing: a call stuck on a crashed host
            // must not outlast them (the next one resumes the change).
            let result = tokio::time::timeout(
                Duration::from_secs(15),
                post(nodes[through].http_addr(), "/v1/admin/members", &body),
            )
            .await
            .unwrap_or_else(|_| Err("no answer within 15 s".into()));
            let done = match &result {
                Ok((200, _)) => true,
                // A remove sent again after one that went through unanswered.
                Ok((_, b)) => what == "remove" && attempt > 0 && b.contains("is not a member"),
                Err(_) => false,
            };
            lock(&history).event(
                now(),
                format_args!(
                    "admin {what} ({body}) through {}: {}",
                    nodes[through].name,
                    match &result {
                        Ok((200, _)) => "200".to_string(),
                        Ok((code, b)) =>
                            format!("{code} {}", b.chars().take(240).collect::<String>()),
                        Err(e) => e.clone(),
                    }
                ),
            );
            if done {
                let mut s = lock(&state);
                if what == "add" {
                    s.added = true;
                } else {
                    s.removed = Some(victim);
                }
                break;
            }
            attempt += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    lock(&state).done = true;
    Ok(())
}

/// The shards that the removed node, if the replacement went through and it runs, does not
/// know it was removed from (it would answer their checks by forwarding, or by
/// `on_unavailable` once its view is stale, instead of refusing them).
pub fn unaware_of_removal(r: &Replacement, nodes: &[Arc<NodeHandle>]) -> Vec<crate::raft::GroupId> {
    let Some(i) = r.removed.filter(|_| r.done) else {
        return Vec::new();
    };
    let Some(c) = nodes[i].service().and_then(|s| s.cluster().cloned()) else {
        return Vec::new();
    };
    c.status_with(false)
        .iter()
        .filter(|g| !g.this_node_removed)
        .map(|g| g.shard)
        .collect()
}

/// Once healed and caught up: every member sees every shard's voters as exactly the members
/// (the spare a voter once added, no learner left behind, the removed node in no shard),
/// and, once the remove went through, the removed id in each shard's history.
pub fn check_voters(
    members: &[Arc<NodeHandle>],
    r: &Replacement,
    nodes: &[Arc<NodeHandle>],
) -> Vec<String> {
    let want: Vec<crate::raft::NodeId> = members.iter().map(|n| n.id).collect();
    let removed = r.removed.map(|i| nodes[i].id);
    let mut out = Vec::new();
    for n in members {
        let Some(c) = n.service().and_then(|s| s.cluster().cloned()) else {
            out.push(format!("{} is not running after healing", n.name));
            continue;
        };
        for g in c.status() {
            let forgot = removed.is_some_and(|id| !g.removed.contains(&id));
            if g.voters != want || !g.learners.is_empty() || forgot {
                out.push(format!(
                    "after the replacement {} sees shard {} with voters {:?}, learners {:?}, \
                     removed {:?}: want voters {want:?}{}",
                    n.name,
                    g.shard,
                    g.voters,
                    g.learners,
                    g.removed,
                    removed.map_or(String::new(), |id| format!(", {id} removed")),
                ));
            }
        }
    }
    out
}

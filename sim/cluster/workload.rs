//! The clients: each picks a key from a Zipf distribution over a few hundred keys and a
//! policy (strict and fast, token bucket, GCRA and sliding log; and a fast fixed window of
//! 100 ms, whose boundaries fall inside entries), sends a check of that one item (with
//! `--multi-item-clients`, half the time of two items drawn alike, all or nothing, and a
//! quarter of those without a request id) with a unique request id to a random node over
//! RESP, and records the operation —
//! invoked, then allowed, denied, failed or unknown — in the shared history. With
//! `--failover-clients` the client of that node knows the others too, moves to the next
//! one up when the node is down, and sends each check to its shard's leader once it has a
//! routing map (its history entry still names the node chosen first). With
//! `--retry-clients` a check whose outcome is unknown is sent again under the same request
//! id, after a pause, up to [`RETRIES`] times; the history records the last answer. With
//! `--fallback-clients` they also spend the limits that a node answers by itself
//! (`on_unavailable = "local"` or `"allow"`) when their shard cannot decide in time.

use super::history::{History, Item, Op, Outcome};
use super::hosts::NodeHandle;
use super::Options;
use crate::client::{Client, ClientConfig, ClientError};
use crate::net::turmoil::TurmoilConnector;
use crate::policy::{Consistency, OnUnavailable, PolicySet};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The policies the clients spend: every algorithm the checkers bound, strict and fast (the
/// fixed window fast only: its boundaries inside entries are what tests an entry's parts).
/// Limits are small so hot keys hit them all the time. The last three answer by
/// `on_unavailable = "local"` or `"allow"` when their shard cannot decide; clients spend them
/// only with `--fallback-clients` (each node's share of a `local` limit over 3 voters is
/// a third of it: 1 per second with a burst of 2, and 2 per 2 s; over 5, a fifth, at
/// least 1).
pub const POLICIES: &str = r#"
[limits.tb_strict]
algorithm = "token_bucket"
limit = 2
period = "1s"
burst = 4
consistency = "strict"

[limits.gcra_strict]
algorithm = "gcra"
limit = 2
period = "1s"
burst = 3
consistency = "strict"

[limits.log_strict]
algorithm = "sliding_log"
limit = 4
period = "2s"
consistency = "strict"

[limits.tb_fast]
algorithm = "token_bucket"
limit = 2
period = "1s"
burst = 4
consistency = "fast"

[limits.gcra_fast]
algorithm = "gcra"
limit = 2
period = "1s"
burst = 3
consistency = "fast"

[limits.log_fast]
algorithm = "sliding_log"
limit = 4
period = "2s"
consistency = "fast"

[limits.fw_fast]
algorithm = "fixed_window"
limit = 2
period = "100ms"
consistency = "fast"

[limits.tb_strict_local]
algorithm = "token_bucket"
limit = 3
period = "1s"
burst = 6
consistency = "strict"
on_unavailable = "local"

[limits.log_fast_local]
algorithm = "sliding_log"
limit = 6
period = "2s"
consistency = "fast"
on_unavailable = "local"

[limits.gcra_strict_allow]
algorithm = "gcra"
limit = 2
period = "1s"
burst = 3
consistency = "strict"
on_unavailable = "allow"
"#;

pub fn policies() -> PolicySet {
    PolicySet::from_toml(POLICIES).expect("the simulation's policies are valid")
}

/// Zipf(s) over `n` ranks, by inverse CDF.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n.max(1))
            .map(|k| {
                acc += 1.0 / (k as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.random();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// How many times a `--retry-clients` client sends a check again after an unknown outcome.
pub const RETRIES: u32 = 3;

/// Simulated nanoseconds since the simulation began (inside a host or client).
pub fn now() -> u64 {
    turmoil::sim_elapsed()
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One client's loop, until simulated time `stop_ns`.
pub async fn client(
    index: usize,
    opts: Options,
    nodes: Vec<Arc<NodeHandle>>,
    history: Arc<Mutex<History>>,
    stop_ns: u64,
) -> turmoil::Result {
    let mut rng = ChaCha8Rng::from_seed(super::derive(opts.seed, &format!("client-{index}")));
    let set = policies();
    let names: Vec<(String, bool)> = set
        .limits
        .keys()
        .filter(|n| {
            opts.fallback_clients
                || set
                    .get(n)
                    .is_some_and(|(_, o)| o.on_unavailable == OnUnavailable::Deny)
        })
        .map(|n| {
            let fast = set
                .get(n)
                .is_some_and(|(_, o)| o.consistency == Consistency::Fast);
            (n.clone(), fast)
        })
        .collect();
    let zipf = Zipf::new(opts.keys, 1.1);
    // Client `i` prefers node `i`: with failover clients it knows every node, the others
    // after it in turn; otherwise node `i` only.
    let clients: Vec<Client<TurmoilConnector>> = (0..nodes.len())
        .map(|i| {
            let config = ClientConfig {
                connections: 1,
                timeout: Duration::from_secs(4),
                jitter_seed: (index * 16 + i) as u64,
                down_for: Duration::from_secs(1),
                failback_after: Duration::from_secs(10),
                // Failover clients are what `Client::cluster` builds: routing to shard
                // leaders on, as by default.
                routes_every: opts.failover_clients.then_some(Duration::from_secs(1)),
            };
            let order = if opts.failover_clients {
                nodes.len()
            } else {
                1
            };
            let addrs = (0..order).map(|k| nodes[(i + k) % nodes.len()].resp_addr());
            Client::with_nodes(addrs, TurmoilConnector, config)
        })
        .collect();
    // Let the first elections settle before the first check.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut n = 0u64;
    while now() < stop_ns {
        let think = rng.random_range(opts.think_ms.0..=opts.think_ms.1);
        tokio::time::sleep(Duration::from_millis(think)).await;
        if now() >= stop_ns {
            break;
        }
        let mut items = Vec::with_capacity(2);
        let count = if opts.multi_item_clients && rng.random_bool(0.5) {
            2
        } else {
            1
        };
        while items.len() < count {
            let (policy, fast) = names[rng.random_range(0..names.len())].clone();
            let key = format!("k{}", zipf.sample(&mut rng));
            let item = Item { policy, key, fast };
            if !items.contains(&item) {
                items.push(item);
            }
        }
        // A quarter of the checks of two items go without a request id: their refunds are
        // kept to the leadership that admitted (`Command::Refund`'s epoch).
        let anonymous = count > 1 && rng.random_bool(0.25);
        let target = rng.random_range(0..nodes.len());
        let id = format!("c{index}-{n}");
        n += 1;
        let names_keys: Vec<(&str, &str, u64)> = items
            .iter()
            .map(|i| (i.policy.as_str(), i.key.as_str(), 1))
            .collect();
        let op = history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .invoke(Op {
                client: index,
                id: id.clone(),
                anonymous,
                items: items.clone(),
                node: nodes[target].id,
                invoked: now(),
                completed: None,
                outcome: Outcome::Pending,
            });
        let mut attempt = 0;
        let outcome = loop {
            let answer = clients[target]
                .check(&names_keys, (!anonymous).then_some(id.as_str()))
                .await;
            let outcome = match answer {
                Ok(a) if a.allowed => Outcome::Allowed,
                Ok(_) => Outcome::Denied,
                Err(ClientError::Connect(e)) => Outcome::Failed(format!("connect: {e}")),
                Err(ClientError::Server(e)) => Outcome::Failed(format!("server: {e}")),
                Err(e) => Outcome::Unknown(e.to_string()),
            };
            let again = matches!(outcome, Outcome::Unknown(_))
                && opts.retry_clients
                && !anonymous
                && attempt < RETRIES
                && now() < stop_ns;
            if !again {
                break outcome;
            }
            attempt += 1;
            // 0.1-1 s: the nemesis's faults last seconds, so some retries land during the
            // fault and some after it.
            let pause = rng.random_range(100..=1000);
            history.lock().unwrap_or_else(|p| p.into_inner()).retry(
                now(),
                format_args!("c{index} retry {id} ({attempt}) in {pause} ms"),
            );
            tokio::time::sleep(Duration::from_millis(pause)).await;
        };
        history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .complete(op, now(), outcome);
    }
    Ok(())
}

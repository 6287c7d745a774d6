//! Load from the Rust client against a cluster, for `scripts/bench-client`: three clients
//! (the sidecar applications of three members, client `i` preferring member `i`) with
//! `--tasks` calls in flight in all, each call one check of a random key; with `--routes on`
//! each client sends a check to its shard's leader, with `--routes off` to its own member,
//! which forwards what it does not lead. With `--ids on` each `QR.CHECK` carries a request id
//! of its own (32 hex digits, as a client's UUID), which every replica of the shard remembers
//! (docs/semantics.md). Prints one JSON line: decisions, seconds, decisions/s, p50 and p99
//! latency (ms), errors.
//!
//! ```text
//! cargo run --release --example client_load -- --addrs 127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382 --routes on
//! ```

use clap::{Parser, ValueEnum};
use quorate::client::{Client, ClientConfig};
use quorate::net::tcp::TcpConnector;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// `CL.THROTTLE key 15 30 60 1` (an inline GCRA limit, strict).
    Strict,
    /// `QR.CHECK fast_gcra key 1` (the same GCRA, `consistency = "fast"`).
    Fast,
    /// `QR.CHECK strict_gcra key 1` (the same GCRA by name, strict).
    StrictNamed,
}

#[derive(Debug, Parser)]
struct Args {
    /// The members' RESP addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    addrs: Vec<SocketAddr>,
    /// Send each check to its shard's leader (on) or to the client's own member (off).
    #[arg(long, value_parser = ["on", "off"])]
    routes: String,
    #[arg(long, value_enum, default_value = "strict")]
    kind: Kind,
    /// Give each check a request id of its own (`QR.CHECK` kinds only).
    #[arg(long, value_parser = ["on", "off"], default_value = "off")]
    ids: String,
    /// Calls in flight, over the three clients.
    #[arg(long, default_value_t = 51)]
    tasks: usize,
    /// Checks in all.
    #[arg(long, default_value_t = 60_000)]
    requests: usize,
    /// Keys drawn uniformly from this many.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Key prefix (a fresh one per run keeps runs from spending each other's allowance).
    #[arg(long, default_value = "load")]
    prefix: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let ids = args.ids == "on";
    if ids && args.kind == Kind::Strict {
        eprintln!("client_load: CL.THROTTLE takes no request id; use --kind strict-named");
        std::process::exit(2);
    }
    let n = args.addrs.len();
    let routes = (args.routes == "on").then_some(Duration::from_secs(1));
    let clients: Vec<Client> = (0..n)
        .map(|i| {
            let order = (0..n).map(|k| args.addrs[(i + k) % n]);
            let config = ClientConfig {
                connections: args.tasks.div_ceil(n).max(1),
                timeout: Duration::from_secs(10),
                jitter_seed: i as u64,
                down_for: Duration::from_secs(1),
                failback_after: Duration::from_secs(10),
                routes_every: routes,
            };
            Client::with_nodes(order, TcpConnector, config)
        })
        .collect();
    // With routing, start once every client has a map with every shard's leader.
    if routes.is_some() {
        let deadline = Instant::now() + Duration::from_secs(20);
        for c in &clients {
            while !c
                .routes()
                .is_some_and(|(_, leaders)| leaders.iter().all(Option::is_some))
            {
                if Instant::now() > deadline {
                    eprintln!("client_load: no routes after 20 s: {:?}", c.routes());
                    std::process::exit(1);
                }
                let _ = c.ping().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let per_task = args.requests.div_ceil(args.tasks.max(1));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..args.tasks.max(1) {
        let client = clients[t % n].clone();
        let prefix = args.prefix.clone();
        let (kind, keys) = (args.kind, args.keys.max(1));
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
            let mut latencies = Vec::with_capacity(per_task);
            let mut errors = 0u64;
            for i in 0..per_task {
                // xorshift64: cheap, and the same keys for both runs of a pair.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = format!("{prefix}:{}", rng % keys);
                // Unique per call: the task, the call and the run's prefix.
                let id =
                    ids.then(|| format!("{:016x}{:016x}", rng, (t as u64) ^ ((i as u64) << 20)));
                let id = id.as_deref();
                let at = Instant::now();
                let ok = match kind {
                    Kind::Strict => client.throttle(&key, 15, 30, 60, 1).await.is_ok(),
                    Kind::Fast => client.check(&[("fast_gcra", &key, 1)], id).await.is_ok(),
                    Kind::StrictNamed => {
                        client.check(&[("strict_gcra", &key, 1)], id).await.is_ok()
                    }
                };
                latencies.push(at.elapsed().as_micros() as u64);
                errors += u64::from(!ok);
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::with_capacity(per_task * tasks.len());
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.expect("a load task panicked");
        latencies.extend(l);
        errors += e;
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "{{\"decisions\":{},\"secs\":{:.3},\"per_sec\":{:.0},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"errors\":{}}}",
        latencies.len(),
        secs,
        latencies.len() as f64 / secs,
        at(0.5) as f64 / 1000.0,
        at(0.99) as f64 / 1000.0,
        errors
    );
}

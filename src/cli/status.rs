//! `quorate status`: every shard's leader, term, commit index and lag, as one node sees it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The node's HTTP address.
    #[arg(long, env = "QUORATE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// Print the raw JSON of /v1/admin/status instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Fetches `path` from a node with a plain HTTP/1.1 GET (one request, connection closed).
pub fn get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let unreachable = |e: std::io::Error| {
        format!("cannot reach the node at {addr} ({e}); is it running? (--http-addr)")
    };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(unreachable)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(unreachable)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(unreachable)?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(unreachable)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("node at {addr} sent a malformed HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "node at {addr} answered {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_string())
}

pub fn run(args: StatusArgs) -> Result<String, String> {
    let body = get(args.http_addr, "/v1/admin/status")?;
    if args.json {
        return Ok(body);
    }
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("status is not JSON: {e}"))?;
    let mut out = String::new();
    let Some(cluster) = v.get("cluster") else {
        out.push_str(&format!(
            "single node (not a cluster member): {} keys in {} shards\n",
            v["keys"],
            v["shards"].as_array().map_or(0, Vec::len)
        ));
        return Ok(out);
    };
    out.push_str(&format!("as seen by node {}\n", cluster["node_id"]));
    out.push_str("shard  state      leader  term  last_log  commit  applied  keys  lag\n");
    for g in cluster["groups"].as_array().into_iter().flatten() {
        let leader = g["leader"]
            .as_u64()
            .map_or("-".to_string(), |l| l.to_string());
        let lag = g["lag"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(id, n)| format!("{id}:{n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let n = |v: &serde_json::Value| v.as_u64().map_or("-".to_string(), |x| x.to_string());
        out.push_str(&format!(
            "{:>5}  {:<9}  {:>6}  {:>4}  {:>8}  {:>6}  {:>7}  {:>4}  {}\n",
            n(&g["shard"]),
            g["state"].as_str().unwrap_or("?"),
            leader,
            n(&g["term"]),
            n(&g["last_log_index"]),
            n(&g["commit_index"]),
            n(&g["applied_index"]),
            n(&g["keys"]),
            if lag.is_empty() { "-".into() } else { lag },
        ));
    }
    Ok(out)
}

//! `quorate members add|remove`: a membership change through any member's admin API
//! (`POST /v1/admin/members`), which carries it out shard by shard through each leader.

use super::status::{render, request, NoAnswer};
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct MembersArgs {
    #[command(subcommand)]
    pub change: Change,
    /// Any live member's HTTP address: it carries the change out through every shard's
    /// leader.
    #[arg(
        long,
        env = "QUORATE_HTTP_ADDR",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    pub http_addr: SocketAddr,
    /// How long to wait for the answer: an add returns once the new node has caught up with
    /// every shard (up to five write timeouts per shard) and votes in it.
    #[arg(long, default_value = "5m", value_parser = positive_duration, global = true)]
    pub wait: Duration,
    /// The members' admin token (their --admin-token), sent as `Authorization: Bearer`.
    #[arg(
        long,
        env = "QUORATE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true,
        value_parser = admin_token
    )]
    pub admin_token: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Change {
    /// Add a node under a new id. Start it first, with --join, an empty data directory and
    /// --peers naming the members and itself; it becomes a voter of every shard once it holds
    /// the shard's log.
    Add {
        /// The new node's id: above every id the cluster has had (ids are never reused).
        id: u64,
        /// Its peer address, HOST:PORT, as the members reach it (its --peer-addr).
        addr: String,
    },
    /// Remove a node from every shard: a failed member, or one to retire.
    Remove {
        /// The member's id.
        id: u64,
    },
}

/// A token as a node takes it (`quorate::config::check_admin_token`): no other could
/// match, and it goes into a header line.
fn admin_token(text: &str) -> Result<String, String> {
    quorate::config::check_admin_token(text).map(|()| text.to_string())
}

/// A duration above zero ("90s", "5m"): how long to wait.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("give a wait above zero, e.g. 90s or 5m".into()),
        Err(e) => Err(format!("{e} (e.g. 90s or 5m)")),
    }
}

/// The JSON body of the change.
fn body(change: &Change) -> String {
    let v = match change {
        Change::Add { id, addr } => serde_json::json!({ "add": { "id": id, "addr": addr } }),
        Change::Remove { id } => serde_json::json!({ "remove": { "id": id } }),
    };
    v.to_string()
}

/// Sends the change; returns what to print (what was done, then the shards' members as the
/// member asked sees them), or the member's refusal.
pub fn run(args: MembersArgs) -> Result<String, String> {
    let addr = args.http_addr;
    let (code, answer) = request(
        addr,
        "POST",
        "/v1/admin/members",
        Some(&body(&args.change)),
        args.wait,
        args.admin_token.as_deref(),
    )
    .map_err(|NoAnswer { why, maybe_acted }| {
        if maybe_acted {
            format!(
                "{why}: the change may be under way or done. See `quorate status` for each \
                 shard's members, and send the same change again to finish it (the shards \
                 already changed are skipped)"
            )
        } else {
            why
        }
    })?;
    let v: serde_json::Value = serde_json::from_str(&answer)
        .map_err(|_| format!("node at {addr} answered {code}: {answer}"))?;
    if code != 200 {
        let why = v["error"].as_str().unwrap_or(&answer);
        return Err(format!("node at {addr} refused the change ({code}): {why}"));
    }
    let done = match args.change {
        Change::Add { id, addr } => {
            format!("node {id} at {addr} added: it votes in every shard\n")
        }
        Change::Remove { id } => format!("node {id} removed from every shard\n"),
    };
    Ok(done + &render(&v["status"]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_is_the_body_the_admin_api_reads() {
        let add = Change::Add {
            id: 4,
            addr: "10.0.0.4:7100".into(),
        };
        let v: serde_json::Value = serde_json::from_str(&body(&add)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"add": {"id": 4, "addr": "10.0.0.4:7100"}})
        );
        let v: serde_json::Value = serde_json::from_str(&body(&Change::Remove { id: 1 })).unwrap();
        assert_eq!(v, serde_json::json!({"remove": {"id": 1}}));
    }

    #[test]
    fn a_wait_is_above_zero() {
        assert_eq!(positive_duration("90s"), Ok(Duration::from_secs(90)));
        assert!(positive_duration("0s").unwrap_err().contains("above zero"));
        assert!(positive_duration("soon").is_err());
    }
}

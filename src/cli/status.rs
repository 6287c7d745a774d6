//! `quorate status`: every shard's leader, term, commit index and lag, as one node sees it
//! (the lag of a shard it does not lead, as that shard's leader gives it).

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
    /// Also show each shard's digest of its applied state (`?digest=true`): equal on
    /// replicas at the same applied index. The node hashes every key for it (about 14 ms
    /// per 100,000 keys per shard), so not for routine polling.
    #[arg(long)]
    pub digest: bool,
}

/// Fetches `path` from a node with a plain HTTP/1.1 GET (one request, connection closed).
pub fn get(addr: SocketAddr, path: &str) -> Result<String, String> {
    match request(addr, "GET", path, None, Duration::from_secs(5), None).map_err(|e| e.why)? {
        (200, body) => Ok(body),
        (code, body) => Err(format!(
            "node at {addr} answered {code}: {}",
            first_line(&body)
        )),
    }
}

/// Why a request got no answer.
#[derive(Debug)]
pub struct NoAnswer {
    /// What to print.
    pub why: String,
    /// Whether the node may have acted on it: it was sent, and the answer did not come
    /// (in time, whole, or readable).
    pub maybe_acted: bool,
}

/// One plain HTTP/1.1 request to a node (`body`: JSON to POST), waiting up to `wait` for
/// each read of the answer; returns its status code and body. Any answer is `Ok`, refusals
/// included.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    wait: Duration,
    token: Option<&str>,
) -> Result<(u16, String), NoAnswer> {
    let unreachable = |e: std::io::Error| NoAnswer {
        why: format!("cannot reach the node at {addr} ({e}); is it running? (--http-addr)"),
        maybe_acted: false,
    };
    let sent = |why: String| NoAnswer {
        why,
        maybe_acted: true,
    };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(unreachable)?;
    s.set_read_timeout(Some(wait)).map_err(unreachable)?;
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        text += &format!("Authorization: Bearer {token}\r\n");
    }
    if let Some(b) = body {
        text += &format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        );
    }
    text += "\r\n";
    text += body.unwrap_or("");
    // One write (`write!` would make one per piece).
    s.write_all(text.as_bytes()).map_err(unreachable)?;
    let mut raw = String::new();
    // Sent: from here on the node may have acted on it, whatever happens to the answer.
    s.read_to_string(&mut raw).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => sent(format!(
            "the node at {addr} did not answer {method} {path} within {wait:?}"
        )),
        _ => sent(format!(
            "the answer of the node at {addr} to {method} {path} was cut off ({e})"
        )),
    })?;
    let malformed = || sent(format!("node at {addr} sent a malformed HTTP answer"));
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(malformed)?;
    let code = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(malformed)?;
    Ok((code, body.to_string()))
}

/// The first line of an answer's body (what a refusal says), for an error message.
fn first_line(body: &str) -> &str {
    body.lines().next().unwrap_or("")
}

pub fn run(args: StatusArgs) -> Result<String, String> {
    // Every shard's lag, from its leader (the node asks the other leaders).
    let path = if args.digest {
        "/v1/admin/status?digest=true"
    } else {
        "/v1/admin/status"
    };
    let with_lag = format!("{path}{}lag=true", if args.digest { "&" } else { "?" });
    let ask = |path: &str| {
        request(
            args.http_addr,
            "GET",
            path,
            None,
            Duration::from_secs(5),
            None,
        )
        .map_err(|e| e.why)
    };
    let (mut code, mut body) = ask(&with_lag)?;
    // A member of an older build knows no `lag` (400 `bad_query`): its status without it,
    // every shard's lag then on its leader's only (a rolling upgrade asks old members too).
    if code == 400 && body.contains("bad_query") {
        (code, body) = ask(path)?;
    }
    if code != 200 {
        return Err(format!(
            "node at {} answered {code}: {}",
            args.http_addr,
            first_line(&body)
        ));
    }
    if args.json {
        return Ok(body);
    }
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("status is not JSON: {e}"))?;
    Ok(render(&v))
}

/// The status table of `/v1/admin/status`'s JSON.
pub fn render(v: &serde_json::Value) -> String {
    let mut out = String::new();
    let Some(cluster) = v.get("cluster") else {
        out.push_str(&format!(
            "single node (not a cluster member): {} keys in {} shards\n",
            v["keys"],
            v["shards"].as_array().map_or(0, Vec::len)
        ));
        return out;
    };
    out.push_str(&format!("as seen by node {}\n", cluster["node_id"]));
    let groups = cluster["groups"].as_array().map_or(&[][..], Vec::as_slice);
    // The digest column when the answer has digests (`--digest`), before the lag: it has
    // one width, the lag does not.
    let digests = groups.iter().any(|g| g["digest"].is_string());
    out.push_str(&format!(
        "shard  state      leader  term  last_log  commit  applied  keys  members      {}lag\n",
        if digests { "digest            " } else { "" }
    ));
    for g in groups {
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
        let ids = |v: &serde_json::Value| {
            let ids: Vec<String> = v.as_array().into_iter().flatten().map(n).collect();
            ids.join(",")
        };
        // Voters, then learners (an add not finished: they do not vote) marked `+`.
        let mut members = ids(&g["voters"]);
        let learners = ids(&g["learners"]);
        if !learners.is_empty() {
            members = format!("{members} +{learners}");
        }
        let digest = match g["digest"].as_str() {
            Some(d) => format!("{d:<16}  "),
            None if digests => format!("{:<16}  ", "-"),
            None => String::new(),
        };
        out.push_str(&format!(
            "{:>5}  {:<9}  {:>6}  {:>4}  {:>8}  {:>6}  {:>7}  {:>4}  {:<11}  {digest}{}\n",
            n(&g["shard"]),
            if g["this_node_removed"] == true {
                "removed"
            } else {
                g["state"].as_str().unwrap_or("?")
            },
            leader,
            n(&g["term"]),
            n(&g["last_log_index"]),
            n(&g["commit_index"]),
            n(&g["applied_index"]),
            n(&g["keys"]),
            members,
            if lag.is_empty() { "-".into() } else { lag },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // The CLI is not node code (it runs outside the simulation): real sockets allowed.
    type Listener = std::net::TcpListener; // allowed

    /// A one-shot server on loopback: reads the request, answers `answer`, closes.
    fn serve_once(answer: &'static str) -> (SocketAddr, std::thread::JoinHandle<String>) {
        let (addr, server) = serve(vec![answer]);
        (
            addr,
            std::thread::spawn(move || server.join().unwrap().remove(0)),
        )
    }

    /// A server on loopback that takes one connection per answer, in turn: reads its
    /// request, answers, closes; gives the requests.
    fn serve(answers: Vec<&'static str>) -> (SocketAddr, std::thread::JoinHandle<Vec<String>>) {
        let listener = Listener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            answers
                .into_iter()
                .map(|answer| answer_one(&listener, answer))
                .collect()
        });
        (addr, server)
    }

    /// Takes one connection of `listener` (a test server's, as in [`serve`]) and answers it.
    fn answer_one(listener: &Listener, answer: &str) -> String {
        let (mut s, _) = listener.accept().unwrap();
        // The whole request (head, then Content-Length bytes): closing with some of it
        // unread would reset the connection.
        let mut request = Vec::new();
        let mut buf = [0; 4096];
        loop {
            let n = s.read(&mut buf).unwrap();
            request.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&request).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |n| n.parse().unwrap());
                if body.len() >= length {
                    s.write_all(answer.as_bytes()).unwrap();
                    return text;
                }
            }
            assert!(n > 0, "the request ended early: {text:?}");
        }
    }

    /// `quorate status` asks for every shard's lag; a member of an older build refuses the
    /// parameter (400 `bad_query`), and is asked again without it.
    #[test]
    fn status_asks_for_every_lag_and_again_without_it_of_an_older_member() {
        let status = "HTTP/1.1 200 OK\r\n\r\n{\"cluster\": {\"node_id\": 2, \"groups\": []}}";
        let args = |addr| StatusArgs {
            http_addr: addr,
            json: false,
            digest: false,
        };
        let (addr, server) = serve(vec![status]);
        assert!(run(args(addr)).unwrap().starts_with("as seen by node 2"));
        let sent = server.join().unwrap();
        assert!(
            sent[0].starts_with("GET /v1/admin/status?lag=true HTTP/1.1"),
            "{sent:?}"
        );
        let refused = "HTTP/1.1 400 Bad Request\r\n\r\n{\"error\":\"bad_query\"}";
        let (addr, server) = serve(vec![refused, status]);
        assert!(run(args(addr)).unwrap().starts_with("as seen by node 2"));
        let sent = server.join().unwrap();
        assert!(
            sent[1].starts_with("GET /v1/admin/status HTTP/1.1"),
            "{sent:?}"
        );
        let (addr, server) = serve(vec![refused, refused]);
        let e = run(StatusArgs {
            digest: true,
            ..args(addr)
        })
        .unwrap_err();
        assert!(e.contains("answered 400"), "{e}");
        let sent = server.join().unwrap();
        assert!(
            sent[0].starts_with("GET /v1/admin/status?digest=true&lag=true ")
                && sent[1].starts_with("GET /v1/admin/status?digest=true "),
            "{sent:?}"
        );
    }

    #[test]
    fn a_request_gives_the_answers_code_and_body_and_a_bad_answer_an_error() {
        let (addr, server) = serve_once("HTTP/1.1 400 Bad Request\r\n\r\n{\"error\":\"no\"}");
        let wait = Duration::from_secs(5);
        let got = request(addr, "POST", "/v1/x", Some("{}"), wait, None).unwrap();
        assert_eq!(got, (400, r#"{"error":"no"}"#.to_string()));
        let sent = server.join().unwrap();
        assert!(
            sent.starts_with("POST /v1/x HTTP/1.1\r\n")
                && sent.contains("Content-Length: 2\r\n")
                && sent.ends_with("\r\n\r\n{}"),
            "{sent:?}"
        );
        let (addr, server) = serve_once("HTTP/1.1 200 OK\r\n\r\nfine");
        assert_eq!(get(addr, "/v1/y").unwrap(), "fine");
        let sent = server.join().unwrap();
        assert!(!sent.contains("Content-Length"), "{sent:?}");
        for bad in ["HTTP/1.1 2", "HTTP/1.1 xyz\r\n\r\n", "SMTP ready\r\n\r\n"] {
            let (addr, server) = serve_once(bad);
            let e = request(addr, "GET", "/", None, wait, None).unwrap_err();
            assert!(
                e.why.contains("malformed") && e.maybe_acted,
                "{bad:?}: {e:?}"
            );
            server.join().unwrap();
        }
        let (addr, server) = serve_once("HTTP/1.1 503 Service Unavailable\r\n\r\nnot ready\n");
        assert_eq!(
            get(addr, "/readyz").unwrap_err(),
            format!("node at {addr} answered 503: not ready")
        );
        server.join().unwrap();
    }

    #[test]
    fn the_table_shows_each_shards_voters_and_learners() {
        let v = serde_json::json!({"cluster": {"node_id": 1, "groups": [
            {"shard": 0, "state": "Leader", "leader": 1, "term": 2, "last_log_index": 9,
             "commit_index": 9, "applied_index": 9, "keys": 4, "voters": [1, 2, 3],
             "learners": [4], "lag": {"2": 0, "3": 1}},
            {"shard": 1, "state": "Follower", "leader": null, "term": 2, "last_log_index": 5,
             "commit_index": 5, "applied_index": 5, "keys": 0, "voters": [1, 2, 3],
             "learners": [], "lag": {}},
        ]}});
        let out = render(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "as seen by node 1");
        assert!(lines[1].contains("members"), "{out}");
        assert!(
            lines[2].contains(" 1,2,3 +4 ") && lines[2].ends_with("2:0 3:1"),
            "{out}"
        );
        assert!(
            lines[3].contains(" 1,2,3 ") && !lines[3].contains('+'),
            "{out}"
        );
        assert!(lines[3].contains("      -  "), "no leader: {out}");
        assert!(!out.contains("digest"), "no digests asked for: {out}");
    }

    #[test]
    fn the_table_shows_digests_when_the_answer_has_them() {
        let group = |shard: u64, digest: Option<&str>| {
            let mut g = serde_json::json!({"shard": shard, "state": "Leader", "leader": 1,
                "term": 2, "last_log_index": 9, "commit_index": 9, "applied_index": 9,
                "keys": 4, "voters": [1, 2, 3], "learners": [], "lag": {"2": 0}});
            if let Some(d) = digest {
                g["digest"] = d.into();
            }
            g
        };
        let v = serde_json::json!({"cluster": {"node_id": 1, "groups": [
            group(0, Some("00ff00ff00ff00ff")), group(1, None),
        ]}});
        let out = render(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].ends_with("digest            lag"), "{out}");
        assert!(lines[2].ends_with(" 00ff00ff00ff00ff  2:0"), "{out}");
        assert!(lines[3].ends_with(" -                 2:0"), "{out}");
    }
}

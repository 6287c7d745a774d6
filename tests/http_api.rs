//! The HTTP API end to end: a real `Service` and `serve` on a loopback port, spoken to in
//! raw HTTP/1.1 bytes so that status lines and headers are checked exactly as a client,
//! a gateway or `curl` sees them.

use quorate::api::http::serve;
use quorate::clock::{ManualClock, SharedClock, SystemClock};
use quorate::config::NodeConfig;
use quorate::net::tcp::TcpListener;
use quorate::net::Listener;
use quorate::policy::PolicySet;
use quorate::service::Service;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(10);

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start() -> Server {
        Self::start_with(NodeConfig::default(), Arc::new(SystemClock::new())).await
    }

    async fn start_with(config: NodeConfig, clock: SharedClock) -> Server {
        let config = NodeConfig {
            http_addr: "127.0.0.1:0".parse().unwrap(),
            resp_addr: "127.0.0.1:0".parse().unwrap(),
            ..config
        };
        let service = Service::start(config, PolicySet::default_policies(), clock)
            .await
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, service, async {
            let _ = rx.await;
        }));
        Server {
            addr,
            stop: Some(tx),
            task,
        }
    }

    async fn send(&self, raw: &[u8]) -> Reply {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(raw).await.unwrap();
        read_reply(&mut s).await
    }

    async fn post(&self, path: &str, body: &str) -> Reply {
        self.send(post(path, body).as_bytes()).await
    }

    async fn get(&self, path: &str) -> Reply {
        self.send(get(path, "").as_bytes()).await
    }

    /// Stops the server and waits for `serve` to return.
    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("serve returns after shutdown")
            .unwrap()
            .unwrap();
    }
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: quorate\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn get(path: &str, headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: quorate\r\n{headers}Connection: close\r\n\r\n")
}

#[derive(Debug)]
struct Reply {
    status_line: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Reads one response: the head, then `Content-Length` bytes of body.
async fn read_reply(s: &mut TcpStream) -> Reply {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = tokio::time::timeout(WAIT, s.read(&mut chunk))
            .await
            .expect("a response in time")
            .unwrap();
        assert!(n > 0, "connection closed before a response: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap().to_string();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_string(), v.trim().to_string())
        })
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = tokio::time::timeout(WAIT, s.read(&mut chunk))
            .await
            .expect("the body in time")
            .unwrap();
        assert!(n > 0, "connection closed mid-body");
        body.extend_from_slice(&chunk[..n]);
    }
    Reply {
        status_line,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

/// True when the peer closes the connection (EOF or reset) within `WAIT`.
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(WAIT, s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

fn check(limit: &str, key: &str, cost: u64) -> String {
    json!({"checks": [{"limit": limit, "key": key, "cost": cost}]}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_is_200_until_the_limit_is_spent_then_429_with_retry_after_rounded_up() {
    let srv = Server::start().await;
    let first = srv.post("/v1/check", &check("login", "alice", 1)).await;
    assert_eq!(first.status_line, "HTTP/1.1 200 OK");
    assert_eq!(first.header("content-type"), Some("application/json"));
    assert_eq!(first.header("cache-control"), Some("no-store"));
    assert_eq!(first.header("ratelimit-policy"), Some("\"login\";q=5;w=60"));
    assert_eq!(first.header("ratelimit"), Some("\"login\";r=4;t=60"));
    assert_eq!(first.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("4"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(first.header("retry-after"), None);
    let body = first.json();
    assert_eq!(body["allowed"], json!(true));
    assert_eq!(body["retry_after_ms"], json!(0));
    assert_eq!(body["checks"][0]["limit"], json!("login"));
    assert_eq!(body["checks"][0]["key"], json!("alice"));
    assert_eq!(body["checks"][0]["algorithm"], json!("sliding_log"));
    assert_eq!(body["checks"][0]["outcome"], json!("allowed"));
    assert_eq!(body["checks"][0]["limit_value"], json!(5));
    assert_eq!(body["checks"][0]["remaining"], json!(4));

    for remaining in (0..4).rev() {
        let r = srv.post("/v1/check", &check("login", "alice", 1)).await;
        assert_eq!(r.status_line, "HTTP/1.1 200 OK");
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(&*remaining.to_string())
        );
    }

    let denied = srv.post("/v1/check", &check("login", "alice", 1)).await;
    assert_eq!(denied.status_line, "HTTP/1.1 429 Too Many Requests");
    assert_eq!(denied.header("cache-control"), Some("no-store"));
    let body = denied.json();
    assert_eq!(body["allowed"], json!(false));
    assert_eq!(body["retryable"], json!(true));
    assert_eq!(body["checks"][0]["outcome"], json!("denied"));
    let wait_ms = body["retry_after_ms"].as_u64().unwrap();
    let retry_after: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(
        retry_after,
        wait_ms.div_ceil(1000),
        "rounded up, never down"
    );
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(
        denied.header("ratelimit"),
        Some(&*format!("\"login\";r=0;t={retry_after}"))
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_of_several_limits_is_all_or_nothing() {
    let srv = Server::start().await;
    let both = json!({"checks": [
        {"limit": "login", "key": "bob"},
        {"limit": "password_reset_account", "key": "bob", "cost": 3}
    ]});
    let r = srv.post("/v1/check", &both.to_string()).await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"login\";q=5;w=60, \"password_reset_account\";q=3;w=3600")
    );
    assert_eq!(
        r.header("ratelimit"),
        Some("\"login\";r=4;t=60, \"password_reset_account\";r=0;t=3600")
    );
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));

    let again = json!({"checks": [
        {"limit": "login", "key": "bob"},
        {"limit": "password_reset_account", "key": "bob"}
    ]});
    let r = srv.post("/v1/check", &again.to_string()).await;
    assert_eq!(r.status_line, "HTTP/1.1 429 Too Many Requests");
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    let body = r.json();
    assert_eq!(body["checks"][1]["outcome"], json!("denied"));

    // The denied check consumed nothing on `login`: a peek still sees 4 left.
    let peek = srv.post("/v1/check", &check("login", "bob", 0)).await;
    assert_eq!(peek.status_line, "HTTP/1.1 200 OK");
    assert_eq!(peek.header("x-ratelimit-remaining"), Some("4"));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_can_never_succeed_is_429_without_retry_after_and_not_retryable() {
    let srv = Server::start().await;
    let r = srv.post("/v1/check", &check("login", "carol", 6)).await;
    assert_eq!(r.status_line, "HTTP/1.1 429 Too Many Requests");
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let body = r.json();
    assert_eq!(body["retryable"], json!(false));
    assert_eq!(body["retry_after_ms"], Value::Null);
    assert_eq!(body["checks"][0]["outcome"], json!("never"));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_check_form_and_inline_limits_are_accepted() {
    let srv = Server::start().await;
    let single = json!({"limit": "api", "key": "k1", "cost": 10}).to_string();
    let r = srv.post("/v1/check", &single).await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("190"));
    let inline = json!({"checks": [{"limit": {"algorithm": "token_bucket", "limit": 10,
        "period": "1s", "burst": 20}, "key": "x", "cost": 20}]});
    let r = srv.post("/v1/check", &inline.to_string()).await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    // The quota is the rate per period (10 per 1 s), not the capacity of 20.
    assert_eq!(r.header("ratelimit-policy"), Some("\"inline\";q=10;w=1"));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_413_before_it_is_sent() {
    let srv = Server::start().await;
    // Expect: 100-continue: the server answers from Content-Length, the body never goes.
    let head = "POST /v1/check HTTP/1.1\r\nHost: quorate\r\nContent-Type: application/json\r\n\
                Content-Length: 65537\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n";
    let r = srv.send(head.as_bytes()).await;
    assert_eq!(r.status_line, "HTTP/1.1 413 Payload Too Large");
    assert_eq!(r.json()["reason"], json!("body_too_large"));
    assert!(r.json()["error"].as_str().unwrap().contains("65536"));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_chunked_body_is_413() {
    let config = NodeConfig {
        max_body_bytes: 1024,
        ..NodeConfig::default()
    };
    let srv = Server::start_with(config, Arc::new(SystemClock::new())).await;
    let data = "x".repeat(2000);
    let raw = format!(
        "POST /v1/check HTTP/1.1\r\nHost: quorate\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n{:x}\r\n{data}\r\n0\r\n\r\n",
        data.len()
    );
    let r = srv.send(raw.as_bytes()).await;
    assert_eq!(r.status_line, "HTTP/1.1 413 Payload Too Large");
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_head_is_431() {
    let srv = Server::start().await;
    let big = format!("X-Big: {}\r\n", "b".repeat(17 * 1024));
    let r = srv.send(get("/healthz", &big).as_bytes()).await;
    assert_eq!(
        r.status_line,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let many: String = (0..70).map(|i| format!("X-H{i}: v\r\n")).collect();
    let r = srv.send(get("/healthz", &many).as_bytes()).await;
    assert_eq!(
        r.status_line,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_400_name_the_field_and_consume_nothing() {
    let srv = Server::start().await;
    let r = srv
        .post(
            "/v1/check",
            r#"{"checks": [{"limit": "login", "key": "dave""#,
        )
        .await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], json!("malformed_json"));

    let r = srv.post("/v1/check", &check("login", "", 1)).await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("`checks[0].key`"));

    let long = "k".repeat(513);
    let r = srv.post("/v1/check", &check("login", &long, 1)).await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], json!("key_too_long"));

    let r = srv
        .post(
            "/v1/check",
            r#"{"checks": [{"limit": "login", "key": "dave", "cost": -1}]}"#,
        )
        .await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("`checks[0].cost`"));

    let unknown = json!({"checks": [
        {"limit": "login", "key": "dave"},
        {"limit": "nope", "key": "dave"}
    ]});
    let r = srv.post("/v1/check", &unknown.to_string()).await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], json!("unknown_limit"));
    assert!(r.json()["error"].as_str().unwrap().contains("nope"));

    let many: Vec<Value> = (0..17)
        .map(|_| json!({"limit": "login", "key": "dave"}))
        .collect();
    let r = srv
        .post("/v1/check", &json!({ "checks": many }).to_string())
        .await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], json!("too_many_items"));

    let peek = srv.post("/v1/check", &check("login", "dave", 0)).await;
    assert_eq!(peek.status_line, "HTTP/1.1 200 OK");
    assert_eq!(peek.header("x-ratelimit-remaining"), Some("5"));

    let metrics = srv.get("/metrics").await.body;
    assert!(
        metrics.contains(r#"quorate_bad_requests_total{api="http",reason="malformed_json"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"quorate_bad_requests_total{api="http",reason="unknown_limit"} 1"#));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorize_answers_gateways_with_their_deny_status() {
    let srv = Server::start().await;
    let path = "/v1/authorize?limit=login&key=frank&deny_status=403";
    for remaining in (0..5).rev() {
        let r = srv.get(path).await;
        assert_eq!(r.status_line, "HTTP/1.1 200 OK");
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(&*remaining.to_string())
        );
        assert_eq!(r.header("ratelimit-policy"), Some("\"login\";q=5;w=60"));
    }
    let r = srv.get(path).await;
    assert_eq!(r.status_line, "HTTP/1.1 403 Forbidden");
    let retry_after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after));
    assert_eq!(r.header("cache-control"), Some("no-store"));

    // The default denial is 429; the key may come from a header; any method is accepted
    // (nginx's auth subrequest keeps the client's method).
    let r = srv.get("/v1/authorize?limit=login&key=frank").await;
    assert_eq!(r.status_line, "HTTP/1.1 429 Too Many Requests");
    let raw = get(
        "/v1/authorize?limit=login&key_header=X-Api-Key&cost=2",
        "X-Api-Key: gina\r\n",
    );
    let r = srv.send(raw.as_bytes()).await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("3"));
    let r = srv
        .post("/v1/authorize?limit=login&key=gina", "ignored")
        .await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("2"));

    let r = srv
        .get("/v1/authorize?limit=login&key=x&deny_status=500")
        .await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    let r = srv
        .get("/v1/authorize?limit=login&key_header=X-Missing")
        .await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorize_keys_x_forwarded_for_by_the_address_the_proxy_appended() {
    let srv = Server::start().await;
    let path = "/v1/authorize?limit=login&key_header=X-Forwarded-For";
    // A client that sends its own X-Forwarded-For, which the proxy appends to, cannot pick
    // a fresh key per request: the key is the rightmost address, so the 6th request of a
    // limit of 5 is denied.
    for i in 1..=6 {
        let raw = get(
            path,
            &format!("X-Forwarded-For: 10.0.0.{i}, 203.0.113.9\r\n"),
        );
        let r = srv.send(raw.as_bytes()).await;
        let expected = if i <= 5 {
            "HTTP/1.1 200 OK"
        } else {
            "HTTP/1.1 429 Too Many Requests"
        };
        assert_eq!(r.status_line, expected, "request {i}: {}", r.body);
        assert_eq!(r.json()["checks"][0]["key"], "203.0.113.9", "{}", r.body);
    }
    // Behind two proxies, key_hops=2 takes the address the outer one appended.
    let raw = get(
        &format!("{path}&key_hops=2"),
        "X-Forwarded-For: 10.0.0.1, 198.51.100.7, 192.0.2.1\r\n",
    );
    let r = srv.send(raw.as_bytes()).await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK", "{}", r.body);
    assert_eq!(r.json()["checks"][0]["key"], "198.51.100.7");
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorize_refuses_a_blank_or_listed_key_header_and_a_broken_escape() {
    let srv = Server::start().await;
    let path = "/v1/authorize?limit=login&key_header=X-Api-Key";
    let r = srv.send(get(path, "X-Api-Key:    \r\n").as_bytes()).await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], "empty_key");
    let error = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        error.starts_with("the `x-api-key` header (named by key_header) is empty"),
        "{error}"
    );
    let r = srv.send(get(path, "X-Api-Key: a, b\r\n").as_bytes()).await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], "invalid_field");

    // `%ZZ` is no escape: it is refused, not used as the key `%ZZ`.
    let r = srv.get("/v1/authorize?limit=login&key=%ZZ").await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], "bad_query", "{}", r.body);
    let r = srv.get("/v1/authorize?limit=login&key=a%2Fb").await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.json()["checks"][0]["key"], "a/b");
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_readiness_and_status_are_served() {
    let srv = Server::start().await;
    srv.post("/v1/check", &check("login", "hank", 1)).await;
    let m = srv.get("/metrics").await;
    assert_eq!(m.status_line, "HTTP/1.1 200 OK");
    assert_eq!(m.header("content-type"), Some("text/plain; version=0.0.4"));
    assert!(m.body.contains("quorate_decisions_total"), "{}", m.body);
    assert!(m
        .body
        .contains(r#"quorate_decision_latency_seconds_count{api="http"} 1"#));

    let h = srv.get("/healthz").await;
    assert_eq!(
        (h.status_line.as_str(), h.body.as_str()),
        ("HTTP/1.1 200 OK", "ok\n")
    );
    let r = srv.get("/readyz").await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");

    let s = srv.get("/v1/admin/status").await;
    assert_eq!(s.status_line, "HTTP/1.1 200 OK");
    let status = s.json();
    assert!(status["limits"]
        .as_array()
        .unwrap()
        .contains(&json!("login")));
    assert_eq!(status["version"], json!(env!("CARGO_PKG_VERSION")));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_reports_what_changed_or_why_not() {
    let srv = Server::start().await;
    let r = srv.post("/v1/admin/reload", "").await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    let report = r.json();
    assert_eq!(report["limits"], json!(6));
    assert_eq!(report["added"], json!([]));
    assert_eq!(report["removed"], json!([]));
    srv.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.toml");
    std::fs::write(&file, "[limits.x]\nalgorithm = \"magic\"\n").unwrap();
    let config = NodeConfig {
        policies: Some(file),
        ..NodeConfig::default()
    };
    let srv = Server::start_with(config, Arc::new(SystemClock::new())).await;
    let r = srv.post("/v1/admin/reload", "").await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], json!("reload_failed"));
    let still = srv.post("/v1/check", &check("login", "ivan", 1)).await;
    assert_eq!(still.status_line, "HTTP/1.1 200 OK");
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_gives_two_limits_overlapping_key_prefixes_is_refused_and_changes_nothing() {
    // The shipped policies plus a limit whose prefix `login:` is a prefix of `login`'s
    // `login:account:`: its key `account:eve` would be `login`'s key `eve`.
    let policies = |prefix: &str| {
        format!(
            "{}\n[limits.login_window]\nalgorithm = \"fixed_window\"\nlimit = 100\n\
             period = \"1m\"\nkey_prefix = \"{prefix}\"\n",
            include_str!("../quorate.toml")
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quorate.toml");
    std::fs::write(&file, policies("login:")).unwrap();
    let config = NodeConfig {
        policies: Some(file.clone()),
        ..NodeConfig::default()
    };
    let srv = Server::start_with(config, Arc::new(SystemClock::new())).await;
    let remaining = |r: Reply| {
        assert_eq!(r.status_line, "HTTP/1.1 200 OK", "{}", r.body);
        r.json()["checks"][0]["remaining"].clone()
    };
    for left in [4, 3] {
        let r = srv.post("/v1/check", &check("login", "eve", 1)).await;
        assert_eq!(remaining(r), json!(left));
    }

    let r = srv.post("/v1/admin/reload", "").await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request", "{}", r.body);
    let body = r.json();
    assert_eq!(body["reason"], json!("reload_failed"));
    let error = body["error"].as_str().unwrap();
    for part in [
        "`login`",
        "`login_window`",
        "\"login:\"",
        "\"login:account:\"",
        "not a prefix of another",
    ] {
        assert!(error.contains(part), "{part}: {error}");
    }
    // The old policies stay in force: `login` keeps its state and its limit of 5, and the
    // refused limit does not exist.
    let r = srv.post("/v1/check", &check("login", "eve", 1)).await;
    assert_eq!(remaining(r), json!(2));
    let r = srv
        .post("/v1/check", &check("login_window", "account:eve", 1))
        .await;
    assert_eq!(r.status_line, "HTTP/1.1 400 Bad Request");
    assert_eq!(r.json()["reason"], json!("unknown_limit"));
    let status = srv.get("/v1/admin/status").await.json();
    assert!(!status["limits"]
        .as_array()
        .unwrap()
        .contains(&json!("login_window")));

    // The same file with a prefix of its own is taken, and `login` still counts from 2.
    std::fs::write(&file, policies("login:window:")).unwrap();
    let r = srv.post("/v1/admin/reload", "").await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK", "{}", r.body);
    assert_eq!(r.json()["added"], json!(["login_window"]));
    let r = srv.post("/v1/check", &check("login", "eve", 1)).await;
    assert_eq!(remaining(r), json!(1));
    let r = srv
        .post("/v1/check", &check("login_window", "account:eve", 1))
        .await;
    assert_eq!(remaining(r), json!(99));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_are_404_and_wrong_methods_405_in_json() {
    let srv = Server::start().await;
    let r = srv.get("/v2/nothing").await;
    assert_eq!(r.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.json()["error"].as_str().unwrap().contains("/v1/check"));
    let r = srv.get("/v1/check").await;
    assert_eq!(r.status_line, "HTTP/1.1 405 Method Not Allowed");
    assert_eq!(r.json()["reason"], json!("method_not_allowed"));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_dated_by_the_node_clock() {
    // 784111777 s after the epoch: Sun, 06 Nov 1994 08:49:37 GMT.
    let clock = Arc::new(ManualClock::new(784_111_777 * 1_000_000_000));
    let srv = Server::start_with(NodeConfig::default(), clock).await;
    let r = srv.get("/healthz").await;
    assert_eq!(r.header("date"), Some("Sun, 06 Nov 1994 08:49:37 GMT"));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_closed_at_once_and_counted() {
    let config = NodeConfig {
        max_connections: 1,
        ..NodeConfig::default()
    };
    let srv = Server::start_with(config, Arc::new(SystemClock::new())).await;
    let mut held = TcpStream::connect(srv.addr).await.unwrap();
    held.write_all(b"GET /healthz HTTP/1.1\r\nHost: q\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_reply(&mut held).await.status_line, "HTTP/1.1 200 OK");

    let mut over = TcpStream::connect(srv.addr).await.unwrap();
    assert!(
        closed(&mut over).await,
        "the connection over the cap is closed"
    );

    // The held connection keeps working, and reports the refusal.
    held.write_all(b"GET /metrics HTTP/1.1\r\nHost: q\r\n\r\n")
        .await
        .unwrap();
    let m = read_reply(&mut held).await;
    assert!(m
        .body
        .contains(r#"quorate_connections_refused_total{api="http"} 1"#));
    assert!(m.body.contains(r#"quorate_connections{api="http"} 1"#));
    drop(held);

    // Once it is gone, its slot is free again.
    let mut ok = None;
    for _ in 0..100 {
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(get("/healthz", "").as_bytes()).await.unwrap();
        let mut first = [0u8; 12];
        if let Ok(Ok(12)) = tokio::time::timeout(WAIT, s.read_exact(&mut first)).await {
            ok = Some(first);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(&ok.expect("a slot frees up"), b"HTTP/1.1 200");
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let config = NodeConfig {
        idle_timeout: Duration::from_millis(200),
        ..NodeConfig::default()
    };
    let srv = Server::start_with(config, Arc::new(SystemClock::new())).await;
    let mut silent = TcpStream::connect(srv.addr).await.unwrap();
    assert!(closed(&mut silent).await);
    // A keep-alive connection idle after its request is closed too.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: q\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_reply(&mut s).await.status_line, "HTTP/1.1 200 OK");
    assert!(closed(&mut s).await);
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_accepting_and_finishes_the_request_in_flight() {
    let srv = Server::start().await;
    let addr = srv.addr;
    let body = check("login", "judy", 1);
    let (head, tail) = body.split_at(10);
    let mut in_flight = TcpStream::connect(addr).await.unwrap();
    let raw = format!(
        "POST /v1/check HTTP/1.1\r\nHost: q\r\nContent-Length: {}\r\n\r\n{head}",
        body.len()
    );
    in_flight.write_all(raw.as_bytes()).await.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: q\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_reply(&mut idle).await.status_line, "HTTP/1.1 200 OK");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let Server { stop, task, .. } = srv;
    let _ = stop.unwrap().send(());
    assert!(
        closed(&mut idle).await,
        "an idle connection is closed at shutdown"
    );
    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "no new connections after shutdown");
    assert!(!task.is_finished(), "a request is still in flight");

    in_flight.write_all(tail.as_bytes()).await.unwrap();
    let r = read_reply(&mut in_flight).await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert!(closed(&mut in_flight).await);
    tokio::time::timeout(WAIT, task)
        .await
        .expect("serve returns once drained")
        .unwrap()
        .unwrap();
}

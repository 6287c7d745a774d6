//! The real `quorate node` process on loopback: it starts with the default policies, answers
//! RESP and HTTP, reloads its policy file on SIGHUP without dropping state, refuses a bad
//! reload, and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct NodeProcess {
    child: Child,
    http: SocketAddr,
    resp: SocketAddr,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(policies: &std::path::Path) -> NodeProcess {
    start_with(policies, &[], "warn", Stdio::null())
}

/// [`start`] with more flags, a log filter (`QUORATE_LOG`) and where its log goes.
fn start_with(policies: &std::path::Path, extra: &[&str], log: &str, stderr: Stdio) -> NodeProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quorate"))
        .args([
            "node",
            "--http-addr",
            "127.0.0.1:0",
            "--resp-addr",
            "127.0.0.1:0",
        ])
        .arg("--policies")
        .arg(policies)
        .args(extra)
        .env("QUORATE_LOG", log)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("quorate starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "quorate node serving: HTTP http://127.0.0.1:PORT  RESP 127.0.0.1:PORT  (...)"
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = |label: &str| -> SocketAddr {
        let i = words
            .iter()
            .position(|w| *w == label)
            .unwrap_or_else(|| panic!("{line}"));
        words[i + 1].trim_start_matches("http://").parse().unwrap()
    };
    NodeProcess {
        http: at("HTTP"),
        resp: at("RESP"),
        child,
    }
}

fn resp(addr: SocketAddr, args: &[&str]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut frame = format!("*{}\r\n", args.len());
    for a in args {
        frame += &format!("${}\r\n{a}\r\n", a.len());
    }
    s.write_all(frame.as_bytes()).unwrap();
    let mut buf = vec![0; 4096];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: quorate\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn signal(node: &NodeProcess, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &node.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

const POLICIES: &str = "[limits.login]\nalgorithm = \"sliding_log\"\nlimit = 2\nperiod = \"1m\"\n\n[inline]\nallow = true\n";

#[test]
fn a_node_process_serves_resp_and_http_reloads_on_sighup_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quorate.toml");
    std::fs::write(&path, POLICIES).unwrap();
    let mut node = start(&path);

    assert_eq!(resp(node.resp, &["PING"]), "+PONG\r\n");
    assert_eq!(
        resp(node.resp, &["CL.THROTTLE", "user123", "15", "30", "60"]),
        "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n"
    );
    let body = r#"{"checks":[{"limit":"login","key":"alice"}]}"#;
    assert!(http(node.http, "POST", "/v1/check", body).starts_with("HTTP/1.1 200"));
    assert!(http(node.http, "POST", "/v1/check", body).starts_with("HTTP/1.1 200"));
    let denied = http(node.http, "POST", "/v1/check", body);
    assert!(denied.starts_with("HTTP/1.1 429"), "{denied}");

    // Raise the limit and SIGHUP: alice keeps her 2 spent and gets the 1 more the new limit allows.
    std::fs::write(&path, POLICIES.replace("limit = 2", "limit = 3")).unwrap();
    signal(&node, "-HUP");
    let mut reloaded = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(50));
        if http(node.http, "GET", "/metrics", "")
            .contains(r#"quorate_policy_reloads_total{result="ok"} 1"#)
        {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "SIGHUP reloaded the policies");
    assert!(http(node.http, "POST", "/v1/check", body).starts_with("HTTP/1.1 200"));
    assert!(http(node.http, "POST", "/v1/check", body).starts_with("HTTP/1.1 429"));

    // A broken file is refused over HTTP and changes nothing.
    std::fs::write(&path, "[limits.login]\nalgorithm = \"nope\"").unwrap();
    let refused = http(node.http, "POST", "/v1/admin/reload", "");
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    assert!(http(node.http, "POST", "/v1/check", body).starts_with("HTTP/1.1 429"));

    // `quorate check` through the Rust client: admitted exits 0, denied exits 1.
    let check = |key: &str| {
        Command::new(env!("CARGO_BIN_EXE_quorate"))
            .args(["check", "login", key, "--resp-addr", &node.resp.to_string()])
            .output()
            .unwrap()
    };
    let ok = check("carol");
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    assert!(
        String::from_utf8_lossy(&ok.stdout).starts_with("admitted login carol: 2 of 3 remaining")
    );
    let denied = check("alice");
    assert_eq!(denied.status.code(), Some(1), "{denied:?}");
    assert!(String::from_utf8_lossy(&denied.stdout)
        .contains("denied login alice: 0 of 3 remaining, retry after"));

    signal(&node, "-TERM");
    let status = node.child.wait().unwrap();
    assert!(status.success(), "graceful stop exits 0: {status:?}");
}

#[test]
fn a_bad_setting_is_refused_with_the_fix_and_exit_code_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_quorate"))
        .args(["node", "--shards", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`shards` must be at least 1"));
}

/// `--log-sample 1` logs every decision, with whether a rule answered instead of the
/// algorithm: here the key table's `on_full`, for a second key past `--max-keys 1`.
#[test]
fn sampled_decisions_are_logged_with_their_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("quorate.toml");
    std::fs::write(
        &policies,
        "[limits.t]\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\n",
    )
    .unwrap();
    let log_path = dir.path().join("node.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let node = start_with(
        &policies,
        &["--shards", "1", "--max-keys", "1", "--log-sample", "1"],
        "warn,quorate=info",
        Stdio::from(log),
    );
    let first = resp(node.resp, &["QR.CHECK", "t", "a", "1"]);
    let second = resp(node.resp, &["QR.CHECK", "t", "b", "1"]);
    assert!(
        first.starts_with("*") && second.starts_with("*"),
        "{first} {second}"
    );
    let decisions = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains(" decision ") || l.ends_with(" decision"))
            .map(str::to_string)
            .collect()
    };
    let started = std::time::Instant::now();
    let lines = loop {
        let lines = decisions(&std::fs::read_to_string(&log_path).unwrap());
        if lines.len() >= 2 || started.elapsed() > Duration::from_secs(5) {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].contains("allowed") && lines[0].contains("fallback=\"no\""),
        "{lines:#?}"
    );
    assert!(
        lines[1].contains("denied") && lines[1].contains("fallback=\"key_cap\""),
        "{lines:#?}"
    );
}

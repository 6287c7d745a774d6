//! A 3-node cluster of real `quorate node` processes on loopback, for the fault tests.
//!
//! Ports are picked free by binding port 0 and releasing it (a small race with other
//! programs, fine on a test machine); a restarted node keeps its ports and data directory.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const SECRET: &str = "test-cluster-secret-0123456789";

pub struct Member {
    pub id: u64,
    pub http: SocketAddr,
    pub resp: SocketAddr,
    pub peer: SocketAddr,
    pub dir: PathBuf,
    pub child: Option<Child>,
}

pub struct Cluster {
    pub members: Vec<Member>,
    pub policies: PathBuf,
    pub extra: Vec<String>,
    _dir: tempfile::TempDir,
}

/// A free port BELOW the ephemeral range: a restarted node must get its port back, and an
/// ephemeral port may meanwhile be taken as the local end of some outgoing connection.
fn free_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 20_000 + (std::process::id() % 400) * 25;
    loop {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 10_000;
        let port = 20_000 + (port - 20_000) % 12_000;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
}

impl Cluster {
    /// Starts `n` members with `policies` (TOML text) and extra `quorate node` flags.
    pub fn start(n: u64, policies: &str, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let policy_path = dir.path().join("policies.toml");
        std::fs::write(&policy_path, policies).unwrap();
        let members = (1..=n)
            .map(|id| Member {
                id,
                http: free_port(),
                resp: free_port(),
                peer: free_port(),
                dir: dir.path().join(format!("node-{id}")),
                child: None,
            })
            .collect();
        let mut c = Cluster {
            members,
            policies: policy_path,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            _dir: dir,
        };
        for i in 0..c.members.len() {
            c.spawn(i);
        }
        c.wait_ready(Duration::from_secs(30));
        c
    }

    fn peers(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.id, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The command that runs member `i` (0-based), on its ports and data directory; its
    /// stdout and stderr are the caller's to set.
    pub fn command(&self, i: usize) -> Command {
        let peers = self.peers();
        let m = &self.members[i];
        let mut command = Command::new(env!("CARGO_BIN_EXE_quorate"));
        command
            .arg("node")
            .args(["--id", &m.id.to_string(), "--peers", &peers])
            .args(["--http-addr", &m.http.to_string()])
            .args(["--resp-addr", &m.resp.to_string()])
            .arg("--data-dir")
            .arg(&m.dir)
            .arg("--policies")
            .arg(&self.policies)
            // `{dir}` in an extra flag is this member's data directory (a flag per member).
            .args(
                self.extra
                    .iter()
                    .map(|a| a.replace("{dir}", &m.dir.to_string_lossy())),
            )
            .env("QUORATE_CLUSTER_SECRET", SECRET)
            .env("QUORATE_LOG", "warn,quorate=info")
            // Not the developer's own, should it be exported: only a test's flag sets one.
            .env_remove("QUORATE_ADMIN_TOKEN");
        command
    }

    /// Starts member `i` (0-based) again, on its ports and data directory.
    pub fn spawn(&mut self, i: usize) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.members[i].dir.with_extension("log"))
            .unwrap();
        let child = self
            .command(i)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("quorate starts");
        let m = &mut self.members[i];
        m.child = Some(child);
        // The first stdout line says the node is serving.
        let mut line = String::new();
        let out = m.child.as_mut().unwrap().stdout.take().unwrap();
        BufReader::new(out).read_line(&mut line).unwrap();
        assert!(
            line.contains("serving"),
            "node {} did not start: {line}",
            m.id
        );
    }

    /// Starts a new member that joins the running cluster (`--join`); returns its index.
    /// It serves once a member adds it through `POST /v1/admin/members`.
    pub fn spawn_joining(&mut self) -> usize {
        let id = self.members.iter().map(|m| m.id).max().unwrap_or(0) + 1;
        let dir = self.members[0].dir.with_file_name(format!("node-{id}"));
        self.members.push(Member {
            id,
            http: free_port(),
            resp: free_port(),
            peer: free_port(),
            dir,
            child: None,
        });
        let i = self.members.len() - 1;
        self.extra.push("--join".into());
        self.spawn(i);
        self.extra.pop();
        i
    }

    pub fn log_of(&self, i: usize) -> String {
        std::fs::read_to_string(self.members[i].dir.with_extension("log")).unwrap_or_default()
    }

    /// Waits until every running member reports every shard with a leader.
    pub fn wait_ready(&self, limit: Duration) {
        let start = Instant::now();
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            loop {
                if http(m.http, "GET", "/readyz", "").starts_with("HTTP/1.1 200") {
                    break;
                }
                assert!(
                    start.elapsed() < limit,
                    "node {} not ready within {limit:?}",
                    m.id
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Sends `sig` to member `i`. For SIGSTOP it returns only once every thread of the
    /// process is stopped: kill(2) returns when the signal is queued, and on a busy machine
    /// a thread can run on for milliseconds (answer a peer, say) before its stop.
    pub fn signal(&self, i: usize, sig: i32) {
        let pid = self.members[i].child.as_ref().unwrap().id() as i32;
        // SAFETY: kill(2) on our own child.
        unsafe { libc_kill(pid, sig) };
        if sig == SIGSTOP {
            let started = Instant::now();
            while !all_threads_stopped(pid) {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "member {i} (pid {pid}) did not stop"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// kill -9: the process dies with whatever it had not written.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self, i: usize) -> bool {
        let Some(mut c) = self.members[i].child.take() else {
            return true;
        };
        unsafe { libc_kill(c.id() as i32, 15) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = c.try_wait() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The cluster status (JSON) as member `i` sees it.
    pub fn status(&self, i: usize) -> serde_json::Value {
        let r = http(
            self.members[i].http,
            "GET",
            "/v1/admin/status?digest=true",
            "",
        );
        let body = r.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
    }

    /// Which member leads shard `shard`, as member `i` sees it.
    pub fn leader_of(&self, i: usize, shard: u64) -> Option<u64> {
        self.status(i)["cluster"]["groups"][shard as usize]["leader"].as_u64()
    }

    /// How many shards each member leads, as member `i` sees it.
    pub fn leaders(&self, i: usize) -> Vec<Option<u64>> {
        self.status(i)["cluster"]["groups"]
            .as_array()
            .map(|g| g.iter().map(|x| x["leader"].as_u64()).collect())
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                // A stopped (SIGSTOP) child must be continued to die cleanly.
                unsafe { libc_kill(c.id() as i32, 18) };
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Whether every thread of `pid` is in state T (stopped), per /proc/PID/task/*/stat.
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // "pid (comm) S ...": the state follows the last ')'.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    })
}

pub const SIGSTOP: i32 = 19;
pub const SIGCONT: i32 = 18;

/// One HTTP/1.1 request; the raw answer ("" when the node cannot be reached).
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    http_within(addr, method, path, body, Duration::from_secs(10))
}

/// [`http`] with a longer wait for the answer (membership changes take seconds).
pub fn http_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    wait: Duration,
) -> String {
    http_with_headers(addr, method, path, "", body, wait)
}

/// [`http_within`] with more header lines (each ending in `\r\n`).
pub fn http_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
    wait: Duration,
) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    s.set_read_timeout(Some(wait)).unwrap();
    let _ = write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: quorate\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

pub fn policies_path(c: &Cluster) -> &Path {
    &c.policies
}

//! `quorate dev`: a local 3-node cluster as three child processes on loopback.
//!
//! Node i (1-based) serves HTTP on `http_base + i - 1`, RESP on `resp_base + i - 1` and peers
//! on `peer_base + i`, with its data in `<data-dir>/node-i`. Node 1 therefore answers on the
//! single node's default ports (HTTP 8080, RESP 6380). Ctrl-C (or SIGTERM to this process)
//! stops all three gracefully; if one exits on its own, the others are stopped too.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Where the nodes keep their data (node-1, node-2, node-3 under it).
    #[arg(long, env = "QUORATE_DEV_DATA_DIR", default_value = "data/dev")]
    pub data_dir: PathBuf,
    /// Policy file for all three [default: ./quorate.toml if present, else built-in].
    #[arg(long, env = "QUORATE_POLICIES")]
    pub policies: Option<PathBuf>,
    /// Number of nodes (3 tolerates one failure; 5 tolerates two).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub nodes: u16,
    /// First node's HTTP port; node i uses this + i - 1.
    #[arg(long, default_value_t = 8080)]
    pub http_base: u16,
    /// First node's RESP port; node i uses this + i - 1.
    #[arg(long, default_value_t = 6380)]
    pub resp_base: u16,
    /// Peer ports: node i uses this + i.
    #[arg(long, default_value_t = 7100)]
    pub peer_base: u16,
    /// Log filter passed to every node.
    #[arg(long, env = "QUORATE_LOG", default_value = "warn,quorate=info")]
    pub log: String,
}

/// Runs the cluster until Ctrl-C / SIGTERM or until a node exits. Returns an error message
/// when a node could not start or died.
pub fn run(args: DevArgs) -> Result<(), String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the quorate binary: {e}"))?;
    let port = |base: u16, off: u16| {
        base.checked_add(off)
            .ok_or_else(|| format!("port {base} + {off} overflows; choose a lower base port"))
    };
    // Every address first: a bad base port is refused before any node starts.
    let mut peers = Vec::new();
    let mut addrs = Vec::new();
    for i in 1..=args.nodes {
        peers.push(format!("{i}=127.0.0.1:{}", port(args.peer_base, i)?));
        addrs.push((
            format!("127.0.0.1:{}", port(args.http_base, i - 1)?),
            format!("127.0.0.1:{}", port(args.resp_base, i - 1)?),
        ));
    }
    let peers = peers.join(",");
    // A fresh secret per run: the nodes of this run share it through their environment.
    let secret: String = (0..32)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rand::random_range(0..36)]))
        .collect();
    let policies = args.policies.clone().or_else(|| {
        let p = PathBuf::from("quorate.toml");
        p.is_file().then_some(p)
    });
    let mut children: Vec<(u16, Child)> = Vec::new();
    // Before the first spawn: a signal from now on stops the nodes started so far.
    let stop = install_stop_flag();
    let parent = std::process::id();
    println!(
        "quorate dev: {} nodes, data under {}",
        args.nodes,
        args.data_dir.display()
    );
    for (i, (http, resp)) in (1..=args.nodes).zip(&addrs) {
        let dir = args.data_dir.join(format!("node-{i}"));
        let mut cmd = Command::new(&exe);
        cmd.arg("node")
            .args(["--id", &i.to_string(), "--peers", &peers])
            .args(["--http-addr", http, "--resp-addr", resp])
            .arg("--data-dir")
            .arg(&dir)
            .args(["--log", &args.log])
            .env("QUORATE_CLUSTER_SECRET", &secret);
        if let Some(p) = &policies {
            cmd.arg("--policies").arg(p);
        }
        // A node outlives no `quorate dev` (killed with SIGKILL, say): the kernel sends it
        // SIGTERM when dev exits.
        // SAFETY: between fork and exec the closure makes only async-signal-safe system
        // calls (prctl, getppid) and allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Dev exited before the prctl: nothing would tell this node.
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        if stop() {
            break;
        }
        match cmd.spawn() {
            Ok(child) => children.push((i, child)),
            Err(e) => {
                stop_all(&mut children);
                return Err(format!("cannot start node {i}: {e}"));
            }
        }
        println!(
            "  node {i}: HTTP http://{http}  RESP {resp}  data {}",
            dir.display()
        );
    }
    println!("Ctrl-C stops all {}.", args.nodes);
    let outcome = loop {
        if stop() {
            break Ok(());
        }
        if let Some(msg) = children.iter_mut().find_map(|(i, c)| match c.try_wait() {
            Ok(Some(status)) => Some(format!("node {i} exited ({status}); stopping the others")),
            _ => None,
        }) {
            break Err(msg);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stop_all(&mut children);
    outcome
}

/// SIGTERM to every child still running, then wait (SIGKILL after 10 s).
fn stop_all(children: &mut [(u16, Child)]) {
    for (_, c) in children.iter_mut() {
        if let Ok(None) = c.try_wait() {
            // SAFETY: kill(2) with a child's pid and a valid signal number has no memory effects.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        }
    }
    let started = std::time::Instant::now(); // seam: CLI only
    for (i, c) in children.iter_mut() {
        loop {
            match c.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if started.elapsed() > Duration::from_secs(10) => {
                    eprintln!("node {i} did not stop in 10 s; killing it");
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// A flag set by SIGINT, SIGTERM or SIGHUP (the terminal closed: the nodes, which take
/// SIGHUP as "reload the policy file", would otherwise run on).
fn install_stop_flag() -> impl Fn() -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    static STOP: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_signal(_: libc::c_int) {
        STOP.store(true, Ordering::SeqCst);
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_signal as *const () as libc::sighandler_t);
    }
    || STOP.load(Ordering::SeqCst)
}

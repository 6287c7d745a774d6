//! The `quorate` command line. Thin on purpose: it parses arguments (every flag also reads an
//! environment variable) and calls into the library; errors print as `error: ...` on stderr
//! with exit code 2 for bad input and 1 for failures to write output.

mod cli;

use clap::{Args, Parser, Subcommand};
use quorate::config::NodeOptions;
use quorate::sim::{self, Report, SimError};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc: the node allocates small, short-lived buffers per request; glibc's malloc took
/// about a fifth of a pipelined node's CPU in a profile (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (and the `quorate dev` members it
/// starts), before the runtime allocates much; as Redis does (`disable-thp yes`). mimalloc
/// asks for them on its arenas (`MADV_HUGEPAGE`), and each page it purges and touches again
/// then faults in as 2 MiB that the kernel zeroes: a third of a pipelined node's CPU in a
/// profile (docs/benchmarks.md, "Huge pages off"). False if the kernel refused (too old, or a
/// seccomp filter); the node then runs as before, only slower.
fn no_transparent_huge_pages() -> bool {
    #[cfg(target_os = "linux")]
    {
        let off: libc::c_ulong = 1;
        let unused: libc::c_ulong = 0;
        // SAFETY: PR_SET_THP_DISABLE reads integer arguments only and writes no memory of
        // ours; the kernel reads them as unsigned longs, so they are passed as such.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, off, unused, unused, unused) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

#[derive(Debug, Parser)]
#[command(
    name = "quorate",
    version,
    about = "A distributed, exact, durable rate limiter",
    long_about = "A distributed, exact, durable rate limiter.\n\n\
        Every flag can also be set with the environment variable shown in its help."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one quorate node: the RESP and HTTP APIs over sharded, actor-owned limiter state.
    #[command(long_about = "Run one quorate node.\n\n\
        Serves RESP (Redis protocol, with redis-cell's CL.THROTTLE) and HTTP/JSON. Settings come \
        from flags, their environment variables, a --config file (TOML, the same keys with \
        underscores), then the defaults, in that order. SIGHUP or POST /v1/admin/reload \
        re-reads the policy file without dropping state; Ctrl-C or SIGTERM stops gracefully.")]
    Node(Box<NodeArgs>),
    /// Start a local cluster: three node processes on loopback (Ctrl-C stops all three).
    #[command(
        long_about = "Start a local cluster: three node processes on loopback.\n\n\
        Node i serves HTTP on 8080 + i - 1, RESP on 6380 + i - 1 and peers on 7100 + i, with \
        its data in data/dev/node-i; node 1 answers on the single node's default ports. Every \
        node accepts every request and forwards it to the shard's leader. Ctrl-C or SIGTERM \
        stops all three; if one exits, the others are stopped too."
    )]
    Dev(cli::dev::DevArgs),
    /// Show every shard's Raft state (leader, term, commit index, lag) as one node sees it.
    Status(cli::status::StatusArgs),
    /// Add or remove a cluster member, through any member (POST /v1/admin/members).
    #[command(
        long_about = "Add or remove a cluster member, through any live member.\n\n\
        The member asked carries the change out shard by shard through each shard's leader \
        and answers once every shard has it: an add once the new node holds each shard's log \
        and votes in it. Ids are never reused. Prints the shards' members afterwards; exits 1 \
        with the member's reason when it refuses (docs/operations.md, \"Replacing a failed \
        member\")."
    )]
    Members(cli::members::MembersArgs),
    /// Exit 0 if the node is ready (/readyz answers 200), 1 if not: a container health check.
    #[command(
        long_about = "Exit 0 if the node is ready, 1 if not: a container health check.\n\n\
        Asks GET /readyz (every shard has a leader; --live asks /healthz, the process is up). \
        Reads QUORATE_HTTP_ADDR like the node, and asks an unspecified address (0.0.0.0:PORT) \
        on loopback, so `quorate health` needs no arguments inside the node's container."
    )]
    Health(cli::health::HealthArgs),
    /// Ask a running node whether KEY may spend COST of LIMIT now (exit 0 admitted, 1 denied).
    #[command(
        long_about = "Ask a running node whether KEY may spend COST of the named LIMIT now.\n\n\
        Spends the cost when admitted (use --peek to look without spending). Prints the \
        decision; exits 0 when admitted, 1 when denied, 2 on bad input or when the node \
        cannot be reached."
    )]
    Check(CheckArgs),
    /// Simulate workloads against the rate-limiting algorithms and compare what they admit.
    #[command(
        long_about = "Simulate workloads against the rate-limiting algorithms.\n\n\
            Every policy of a policy set sees the same arrivals, each key with its own state per \
            policy, cost 1 per request. The report gives, per policy, the requests allowed and \
            rejected, the allow rate, and max/window: the most requests admitted for one key in \
            any span as long as the policy's period.\n\n\
            Without --policies the comparison set is used: 10 per 1 s for fixed_window, \
            sliding_log and sliding_counter; token_bucket and gcra at 10/s with capacity 20."
    )]
    Sim(SimArgs),
}

#[derive(Debug, Args)]
struct NodeArgs {
    /// A config file (TOML) with any of the settings below; flags and env vars win over it.
    #[arg(long, env = "QUORATE_CONFIG")]
    config: Option<PathBuf>,
    /// Log filter, e.g. "info" or "quorate=debug" (RUST_LOG syntax).
    #[arg(long, env = "QUORATE_LOG", default_value = "info")]
    log: String,
    /// Worker threads of the node's async runtime (default: the CPUs this process may use).
    /// With one, the node runs a single-threaded runtime: no cross-thread wake-ups.
    #[arg(long, env = "QUORATE_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
    #[command(flatten)]
    options: NodeOptions,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The limit's name in the node's policy file.
    limit: String,
    /// The key to spend on (account, IP, API key...).
    key: String,
    /// Units to spend.
    #[arg(long, env = "QUORATE_COST", default_value_t = 1)]
    cost: u64,
    /// Look without spending (QR.PEEK).
    #[arg(long, env = "QUORATE_PEEK")]
    peek: bool,
    /// A request id: a retry with the same id gets the first answer and spends nothing more.
    #[arg(long, env = "QUORATE_REQUEST_ID")]
    request_id: Option<String>,
    /// The node's RESP address; or several members' addresses, comma-separated, tried in
    /// order (the first one up answers).
    #[arg(
        long,
        env = "QUORATE_RESP_ADDR",
        default_value = "127.0.0.1:6380",
        value_delimiter = ','
    )]
    resp_addr: Vec<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
struct SimArgs {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Replay arrival times from a trace file.
    #[command(long_about = "Replay arrival times from a trace file.\n\n\
        One arrival per line: SECONDS [KEY]. SECONDS is a non-negative decimal number of \
        seconds since the start of the trace (e.g. 0, 1.5, 0.000000001; at most 9 fractional \
        digits, read exactly), KEY an optional key (default \"-\"). Blank lines and lines \
        starting with # are skipped. Times must not decrease.")]
    Replay(ReplayArgs),
    /// Generate seeded Poisson arrivals and compare the algorithms on them.
    #[command(
        long_about = "Generate seeded Poisson arrivals and compare the algorithms on them.\n\n\
        Gaps are exponential with mean 1/RATE, drawn from a ChaCha8 generator seeded with \
        --seed, so the same arguments always give the same output. With the default \
        comparison set, --rate 6 (60% of the limit) shows window limiters rejecting Poisson \
        clumps that the bucket algorithms absorb."
    )]
    Poisson(PoissonArgs),
    /// The burst at the boundary: 20 requests within 2 ms around a 1 s window boundary.
    #[command(long_about = "The burst at the boundary.\n\n\
        One key sends 10 requests at 0.9990 .. 0.9999 s and 10 at 1.0000 .. 1.0009 s. Every \
        policy is 10 per 1 s; token_bucket and gcra use capacity 10 here (not 20) so all \
        algorithms can admit at most 10 at once. fixed_window admits all 20; sliding_log and \
        the buckets at most 10; sliding_counter, whose estimate is approximate, one more.")]
    Boundary(BoundaryArgs),
    /// Run the real cluster (3 nodes, or --nodes) in a deterministic simulation under faults,
    /// and check it.
    #[command(
        long_about = "Run the real cluster in a deterministic simulation under faults.\n\n\
        Each seed runs three nodes by default (--nodes, 3 to 7; each with its WAL, Raft \
        groups, peer transport and RESP API) on turmoil's \
        simulated network and clocks while clients send checks (Zipf over a few hundred \
        keys; strict and fast token bucket, GCRA and sliding log, and a fast fixed window) \
        and a nemesis partitions, delays, holds and drops links, crashes and restarts nodes, \
        and jumps, drifts and steps back clocks. Then it heals everything and checks: strict \
        limits never over-admit; fast ones stay within their bound; no acknowledged strict \
        admission is lost; replicas agree; every shard has a leader and admits again within a \
        bound. A run is a pure function of its seed: a failing seed is printed with the \
        command that reproduces it."
    )]
    Cluster(ClusterArgs),
}

#[derive(Debug, Args)]
struct ClusterArgs {
    /// How many seeds to run, from --seed on.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Simulated time of the workload and faults per seed (healing and checks follow):
    /// seconds (60) or a duration (2m).
    #[arg(long, default_value = "60", value_parser = parse_duration)]
    duration: u64,
    /// Shards (one Raft group each) per node.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Members of the cluster, 3 to 7: every one a voter of every shard.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// Clients that know every node and fail over between them (the Rust client's
    /// `Client::with_nodes`), instead of one client per node.
    #[arg(long)]
    failover_clients: bool,
    /// About half the faults are crashes, and a crashed node restarts after 1-350 ms,
    /// usually before the others' election timeout (a leader comes back a follower, with
    /// entries it proposed and did not commit), instead of at the nemesis's next heal.
    #[arg(long)]
    quick_restarts: bool,
    /// A check whose outcome is unknown (timeout, lost connection, TRYAGAIN) is sent again
    /// under the same request id, up to 3 more times.
    #[arg(long)]
    retry_clients: bool,
    /// Half the checks name two limits (all-or-nothing across shards: a denial refunds
    /// what the other item admitted).
    #[arg(long)]
    multi_item_clients: bool,
    /// Clients also spend limits whose on_unavailable is local or allow: nodes answer those
    /// by themselves when the shard cannot decide in time (checked: each node's local share).
    #[arg(long)]
    fallback_clients: bool,
    /// About a quarter of the nemesis's picks ask a shard's leader to hand its leadership
    /// to another node at once (as a rebalance or a removal does).
    #[arg(long)]
    handover_faults: bool,
    /// One more host runs a node started to join (`--join`); once in a run, the nemesis has
    /// an operator replace a member with it through the admin API (add node N+1, then
    /// remove a member), amid the other faults. The removed node keeps running.
    #[arg(long)]
    membership_faults: bool,
    /// Every node snapshots each shard every 50 entries or 4 KiB of them (instead of 20,000
    /// or 16 MiB), so restarted and lagging nodes install the leader's snapshots amid the
    /// faults.
    #[arg(long)]
    small_snapshots: bool,
    /// About a quarter of the nemesis's picks stall a shard leader's disk for 5-400 ms (it
    /// still replicates what it has not written), half of them ending in a crash with a
    /// restart 1-350 ms later.
    #[arg(long)]
    disk_stalls: bool,
    /// Every pick of the nemesis restarts the node it crashed last and crashes a shard's
    /// leader; the next waits until each shard it led has another leader. The summary gives
    /// the spread of those failover times (each is in the trace).
    #[arg(long)]
    crash_leaders: bool,
    /// How the nodes spread keys over shards: "hash" or "slots" (Redis Cluster's hash slots).
    #[arg(long, default_value = "hash", value_parser = parse_sharding)]
    sharding: quorate::shard::route::Sharding,
    /// Run without the nemesis (no faults).
    #[arg(long)]
    no_nemesis: bool,
    /// Run every seed again in a fresh process and require a byte-identical trace.
    #[arg(long)]
    twice: bool,
    /// Seeds run at once, each in a process of its own [default: the number of cores].
    #[arg(long)]
    jobs: Option<usize>,
    /// Run exactly one seed in this process and print its result as one JSON line (how a
    /// sweep runs each seed).
    #[arg(long, hide = true)]
    json: bool,
    /// Write the event trace of the (last) seed to this file.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Negative control: apply decides at the node's own clock instead of the batch time.
    #[arg(long, hide = true)]
    unsafe_apply_local_clock: bool,
    /// Negative control: strict checks are answered before their entry commits.
    #[arg(long, hide = true)]
    unsafe_answer_before_commit: bool,
    /// Negative control: the WAL acknowledges before syncing and a crash loses its writes.
    #[arg(long, hide = true)]
    unsafe_skip_fsync: bool,
    /// Negative control: the Raft log stores report votes saved without writing them.
    #[arg(long, hide = true)]
    unsafe_forget_votes: bool,
}

#[derive(Debug, Args)]
struct OutputArgs {
    /// Print {"results":[{"policy","algorithm","allowed","rejected",...}]} instead of a table.
    #[arg(long, env = "QUORATE_JSON")]
    json: bool,
    /// Also draw admitted and rejected requests over time, one panel per policy, to this SVG
    /// file.
    #[arg(long, env = "QUORATE_PLOT", value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct PolicyArgs {
    /// A TOML policy file ([limits.NAME] tables); default: the comparison set.
    #[arg(long, env = "QUORATE_POLICIES", value_name = "FILE")]
    policies: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// The trace: one `SECONDS [KEY]` per line.
    #[arg(long, env = "QUORATE_TRACE", value_name = "FILE")]
    trace: PathBuf,
    #[command(flatten)]
    policies: PolicyArgs,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Debug, Args)]
struct PoissonArgs {
    /// Arrivals per second, in total across all keys (each key sees RATE/KEYS).
    #[arg(
        long,
        env = "QUORATE_RATE",
        default_value_t = 6.0,
        allow_negative_numbers = true
    )]
    rate: f64,
    /// How long to generate arrivals for: seconds (60, 1.5) or a duration (10m, 1h).
    #[arg(long, env = "QUORATE_DURATION", default_value = "60", value_name = "SECONDS", value_parser = parse_duration, allow_negative_numbers = true)]
    duration: u64,
    /// Seed of the random generator; the same seed gives the same arrivals.
    #[arg(long, env = "QUORATE_SEED", default_value_t = 1)]
    seed: u64,
    /// Number of keys the arrivals are spread over, uniformly at random.
    #[arg(long, env = "QUORATE_KEYS", default_value_t = 1)]
    keys: u64,
    #[command(flatten)]
    policies: PolicyArgs,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Debug, Args)]
struct BoundaryArgs {
    #[command(flatten)]
    output: OutputArgs,
}

/// `hash` or `slots`.
fn parse_sharding(text: &str) -> Result<quorate::shard::route::Sharding, String> {
    quorate::shard::route::Sharding::parse(text.trim())
        .ok_or_else(|| format!("\"{text}\" is neither \"hash\" nor \"slots\""))
}

/// `60`, `1.5` (seconds, exact) or a humantime duration such as `10m`, to nanoseconds.
fn parse_duration(text: &str) -> Result<u64, String> {
    match sim::trace::parse_seconds(text.trim()) {
        Ok(ns) => Ok(ns),
        Err(_) => humantime::parse_duration(text.trim())
            .map_err(|_| {
                format!("\"{text}\" is not a duration: write a positive number of seconds (60, 1.5) or a duration such as 10m")
            })
            .and_then(|d| {
                u64::try_from(d.as_nanos()).map_err(|_| format!("\"{text}\" is too large"))
            }),
    }
}

/// The simulated time of the simulation that logs (a line logged outside one: "-"), so a
/// seed's log lines up with its trace.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(t) => write!(w, "{}.{:06}", t.as_secs(), t.subsec_micros()),
            None => write!(w, "-"),
        }
    }
}

/// Logs to stderr under `filter` (RUST_LOG syntax; `setting` names where it came from in the
/// error), in colour only on a terminal: log files and collectors get plain text. A
/// simulation's lines carry its simulated time.
fn init_log(filter: &str, setting: &str, simulated: bool) -> Result<(), CliError> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| CliError::Settings(format!("{setting} \"{filter}\": {e}")))?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if simulated {
        log.with_timer(SimTime).init();
    } else {
        log.init();
    }
    Ok(())
}
fn main() -> ExitCode {
    let thp_off = no_transparent_huge_pages();
    let cli = Cli::parse();
    match run(cli, thp_off) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Denied) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_bad_input() { 2 } else { 1 })
        }
    }
}

/// Why the command failed: a simulation error, bad settings, a node failure, or a failure
/// to write to stdout.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("{0}")]
    Settings(String),
    #[error("node: {0}")]
    Node(String),
    /// `quorate sim cluster` found seeds that break an invariant (exit code 1).
    #[error("{0} seed(s) violated an invariant")]
    Violations(usize),
    /// `quorate check` was answered "denied": not an error, but exit code 1.
    #[error("denied")]
    Denied,
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

impl CliError {
    fn is_bad_input(&self) -> bool {
        matches!(self, CliError::Settings(_))
            || matches!(self, CliError::Sim(e) if e.is_bad_input())
    }
}

/// `thp_off`: whether [`no_transparent_huge_pages`] succeeded (a node logs it once its
/// logging is up).
fn run(cli: Cli, thp_off: bool) -> Result<(), CliError> {
    match cli.command {
        Command::Node(args) => node::run(*args, thp_off),
        Command::Check(args) => check(args),
        Command::Dev(args) => cli::dev::run(args).map_err(CliError::Node),
        Command::Health(args) => {
            let text = cli::health::run(args).map_err(CliError::Node)?;
            print!("{text}");
            Ok(())
        }
        Command::Status(args) => {
            let text = cli::status::run(args).map_err(CliError::Node)?;
            print!("{text}");
            Ok(())
        }
        Command::Members(args) => {
            let text = cli::members::run(args).map_err(CliError::Node)?;
            print!("{text}");
            Ok(())
        }
        Command::Sim(args) => {
            // The nodes' own log, to stderr, for debugging a seed (e.g. "openraft=info").
            if let Ok(filter) = std::env::var("QUORATE_SIM_LOG") {
                init_log(&filter, "QUORATE_SIM_LOG", true)?;
            }
            let (report, output) = match args.scenario {
                Scenario::Replay(a) => (
                    sim::replay(
                        &a.trace,
                        a.policies.policies.as_deref(),
                        a.output.plot.is_some(),
                    )?,
                    a.output,
                ),
                Scenario::Poisson(a) => (
                    sim::poisson(&sim::PoissonOptions {
                        rate: a.rate,
                        duration: a.duration,
                        seed: a.seed,
                        keys: a.keys,
                        policies: a.policies.policies,
                        keep_times: a.output.plot.is_some(),
                    })?,
                    a.output,
                ),
                Scenario::Boundary(a) => (sim::boundary(), a.output),
                Scenario::Cluster(a) => return sim_cluster(a),
            };
            emit(&report, &output)
        }
    }
}

/// `quorate sim cluster`: a seed sweep of the cluster simulation; exit 1 on any violation.
fn sim_cluster(a: ClusterArgs) -> Result<(), CliError> {
    use sim::cluster::{sweep::sweep, Controls, Options};
    use std::io::IsTerminal;
    if a.shards == 0 || a.clients == 0 || a.seeds == 0 {
        return Err(CliError::Settings(
            "--seeds, --shards and --clients must be at least 1".into(),
        ));
    }
    if !(3..=7).contains(&a.nodes) {
        return Err(CliError::Settings(format!(
            "--nodes {}: the simulation runs 3 to 7 members (e.g. --nodes 5)",
            a.nodes
        )));
    }
    let base = Options {
        seed: a.seed,
        duration: std::time::Duration::from_nanos(a.duration),
        nodes: a.nodes,
        shards: a.shards,
        clients: a.clients,
        failover_clients: a.failover_clients,
        quick_restarts: a.quick_restarts,
        retry_clients: a.retry_clients,
        multi_item_clients: a.multi_item_clients,
        fallback_clients: a.fallback_clients,
        handover_faults: a.handover_faults,
        membership_faults: a.membership_faults,
        small_snapshots: a.small_snapshots,
        disk_stalls: a.disk_stalls,
        crash_leaders: a.crash_leaders,
        sharding: a.sharding,
        nemesis: !a.no_nemesis,
        controls: Controls {
            apply_local_clock: a.unsafe_apply_local_clock,
            answer_before_commit: a.unsafe_answer_before_commit,
            skip_fsync: a.unsafe_skip_fsync,
            forget_votes: a.unsafe_forget_votes,
        },
        ..Options::default()
    };
    if !cfg!(tokio_unstable) {
        eprintln!("warning: built without --cfg tokio_unstable: runs are not exactly reproducible (see .cargo/config.toml)");
    }
    // One seed, in this process: the first (and only) simulation of a process is exactly
    // its seed's run.
    if a.json || (a.seeds == 1 && !a.twice) {
        let report = sim::cluster::run(&base);
        if let Some(path) = &a.trace {
            std::fs::write(path, &report.history.trace)?;
        }
        let result = sim::cluster::sweep::SeedResult::of(&report);
        if a.json {
            println!(
                "{}",
                serde_json::to_string(&result).map_err(|e| CliError::Node(e.to_string()))?
            );
            return Ok(());
        }
        let mut one = sim::cluster::sweep::Sweep::default();
        one.add(result);
        print!("{}", one.summary(&base));
        return match one.failing.len() {
            0 => Ok(()),
            n => Err(CliError::Violations(n)),
        };
    }
    // More seeds: each in a child process of its own (sim/cluster/sweep.rs says why).
    let plan = sim::cluster::sweep::Plan {
        exe: std::env::current_exe()?,
        jobs: a.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        twice: a.twice,
        trace_last: a.trace.clone(),
        stop_at_first_failure: false,
    };
    let started = std::time::Instant::now(); // seam: the CLI's own progress timing
    let tty = std::io::stderr().is_terminal();
    let result = sweep(&base, a.seed, a.seeds, &plan, |done, r| {
        let line = format!(
            "[{done}/{}] seed {}: {} ops, {} faults, {} violations ({:.1} s)",
            a.seeds,
            r.seed,
            r.ops.invoked,
            r.faults,
            r.violations.len(),
            started.elapsed().as_secs_f64()
        );
        if tty {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    });
    if tty {
        eprintln!();
    }
    print!("{}", result.summary(&base));
    println!("wall time: {:.1} s", started.elapsed().as_secs_f64());
    if result.failing.is_empty() {
        Ok(())
    } else {
        Err(CliError::Violations(result.failing.len()))
    }
}

/// `quorate check`: one QR.CHECK (or QR.PEEK) through the Rust client.
fn check(args: CheckArgs) -> Result<(), CliError> {
    use quorate::client::{Client, ClientConfig, Wait};
    use quorate::net::tcp::TcpConnector;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Node(e.to_string()))?;
    let answer = runtime.block_on(async {
        // One check: a routing map would be fetched for nothing (the member asked
        // forwards the check to its shard's leader).
        let config = ClientConfig {
            routes_every: None,
            ..ClientConfig::default()
        };
        let client = Client::with_nodes(args.resp_addr.iter().copied(), TcpConnector, config);
        if args.peek {
            client.peek(&args.limit, &args.key).await
        } else {
            let items = [(args.limit.as_str(), args.key.as_str(), args.cost)];
            client.check(&items, args.request_id.as_deref()).await
        }
    });
    let answer = answer.map_err(|e| {
        let addrs: Vec<String> = args.resp_addr.iter().map(|a| a.to_string()).collect();
        CliError::Settings(format!("{}: {e}", addrs.join(",")))
    })?;
    for i in &answer.items {
        let wait = match i.retry_after {
            Wait::Now => String::new(),
            Wait::After(d) => format!(", retry after {:.3} s", d.as_secs_f64()),
            Wait::Never => ", never: the cost exceeds the limit's capacity".into(),
        };
        let fallback = if i.fallback {
            " (the limit's on_unavailable answer: its shard could not decide, or the node's \
             key cap is reached)"
        } else {
            ""
        };
        let shadow = if i.shadow {
            " (shadow limit: reported, denies nothing)"
        } else {
            ""
        };
        println!(
            "{} {} {}: {} of {} remaining{wait}{fallback}{shadow}",
            if i.allowed { "admitted" } else { "denied" },
            i.limit,
            i.key,
            i.remaining,
            i.capacity
        );
    }
    if answer.allowed {
        Ok(())
    } else {
        Err(CliError::Denied)
    }
}

fn emit(report: &Report, output: &OutputArgs) -> Result<(), CliError> {
    if let Some(path) = &output.plot {
        sim::plot::write_svg(report, path)?;
    }
    let text = if output.json {
        report.to_json() + "\n"
    } else {
        report.to_table()
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

mod node {
    //! `quorate node`: settings, logging, sockets and signals around `quorate::node`.

    use super::{CliError, NodeArgs};
    use quorate::clock::SystemClock;
    use quorate::config::NodeOptions;
    use quorate::net::tcp::TcpListener;
    use quorate::policy::PolicySet;
    use std::path::Path;
    use std::sync::Arc;

    pub fn run(args: NodeArgs, thp_off: bool) -> Result<(), CliError> {
        let file = match &args.config {
            Some(path) => NodeOptions::from_file(path).map_err(CliError::Settings)?,
            None => NodeOptions::default(),
        };
        let mut options = args.options.or(file);
        if options.policies.is_none() && Path::new("quorate.toml").is_file() {
            options.policies = Some("quorate.toml".into());
        }
        // A member without an id finds itself in --peers by its hostname (StatefulSet pods).
        if let (None, Some(peers)) = (options.id, &options.peers) {
            let members = quorate::config::parse_peers(peers).map_err(CliError::Settings)?;
            options.id = quorate::config::member_for_host(&members, &hostname());
        }
        let config = options.to_config().map_err(CliError::Settings)?;
        let ignored = options.ignored_without_peers();
        let policies = match &config.policies {
            Some(path) => PolicySet::load(path).map_err(|e| CliError::Settings(e.to_string()))?,
            None => PolicySet::default_policies(),
        };
        if let Some(dir) = &config.data_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                CliError::Settings(format!("cannot create data dir {}: {e}", dir.display()))
            })?;
        }
        crate::init_log(&args.log, "--log", false)?;
        if !ignored.is_empty() {
            tracing::warn!(
                ignored = ignored.join(", "),
                "no --peers: a single node, its state in memory; settings that only a cluster \
                 member reads are ignored (give --peers to run a member)"
            );
        }
        if !thp_off {
            tracing::debug!(
                "transparent huge pages stay on: the kernel refused PR_SET_THP_DISABLE"
            );
        }
        let threads = args.threads.map(usize::from).unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        let runtime = if threads == 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(threads);
            b
        }
        .enable_all()
        .build()
        .map_err(|e| CliError::Node(e.to_string()))?;
        runtime
            .block_on(serve(config, policies))
            .map_err(|e| CliError::Node(e.to_string()))
    }

    /// This machine's (container's, pod's) hostname, or "" if unknown.
    fn hostname() -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::env::var("HOSTNAME"))
            .map(|h| h.trim().to_string())
            .unwrap_or_default()
    }

    async fn serve(
        config: quorate::config::NodeConfig,
        policies: PolicySet,
    ) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let bind = |addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
        };
        let http = bind(config.http_addr).await?;
        let resp = bind(config.resp_addr).await?;
        let source = match &config.policies {
            Some(p) => p.display().to_string(),
            None => "built-in defaults".into(),
        };
        let clock = Arc::new(SystemClock::new());
        let member = config.cluster.as_ref().map(|c| (c.node_id, c.peer_addr));
        let node = match member {
            None => quorate::node::Node::start(config, policies, clock, http, resp).await?,
            Some((id, peer_addr)) => {
                let peer = bind(peer_addr).await?;
                tracing::info!(node = id, %peer_addr, "peer server listening");
                quorate::node::Node::start_member(
                    config,
                    policies,
                    clock,
                    http,
                    resp,
                    peer,
                    quorate::net::tcp::TcpConnector,
                    rand::random(),
                )
                .await?
            }
        };
        println!(
            "quorate node serving: HTTP http://{}  RESP {}  (policies: {source}; Ctrl-C stops)",
            node.http_addr(),
            node.resp_addr()
        );
        let mut hangup = signal(SignalKind::hangup())?;
        let mut terminate = signal(SignalKind::terminate())?;
        loop {
            tokio::select! {
                biased;
                _ = tokio::signal::ctrl_c() => break,
                _ = terminate.recv() => break,
                _ = hangup.recv() => {
                    // reload() logs the outcome and keeps the old policies on error.
                    let _ = node.service().reload();
                }
            }
        }
        node.stop().await
    }
}

//! The WAL's synced append, two ways side by side: `O_DIRECT` writes (the default,
//! `WalOptions::direct_io`) against page-cache writes, each followed by the same
//! `fdatasync`. One appender, each append awaited, so every append costs one sync: the
//! latency a strict decision waits for, and the CPU it costs the node.
//!
//! Run: `cargo bench --bench wal_sync` (`-- ROUNDS APPENDS BYTES`, default 5 2000 2048),
//! best pinned to one core (`taskset -c 0`) so the CPU figure is the one core's.
//! Alternates the two in each round (A B, then B A) in fresh logs in the same directory
//! (`$TMPDIR`), and prints per-append CPU (user + system, every thread of the process: the
//! writer thread does the I/O) and latency percentiles, medians over the rounds, and B / A.

use std::time::{Duration, Instant};

use quorate::wal::{Wal, WalOptions};

fn cpu() -> Duration {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

struct Run {
    cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
    direct_writes: u64,
}

fn run(rt: &tokio::runtime::Runtime, direct_io: bool, appends: usize, bytes: usize) -> Run {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = WalOptions {
        direct_io,
        ..WalOptions::default()
    };
    let (wal, _) = Wal::open_with(dir.path(), options).expect("the log opens");
    let payload = vec![0x5a; bytes];
    rt.block_on(async {
        // Warm-up: the first zero-filled room and the page cache.
        for _ in 0..50 {
            wal.append(1, 0, &payload).await.expect("append");
        }
        let mut lat = Vec::with_capacity(appends);
        let c0 = cpu();
        for _ in 0..appends {
            let t = Instant::now();
            wal.append(1, 0, &payload).await.expect("append");
            lat.push(t.elapsed());
        }
        let used = cpu() - c0;
        lat.sort();
        Run {
            cpu_us: used.as_secs_f64() * 1e6 / appends as f64,
            p50_us: lat[appends / 2].as_secs_f64() * 1e6,
            p99_us: lat[appends * 99 / 100].as_secs_f64() * 1e6,
            direct_writes: wal.direct_writes(),
        }
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; numbers are ours.
    let nums: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rounds = nums.first().copied().unwrap_or(5).max(1);
    let appends = nums.get(1).copied().unwrap_or(2000).max(100);
    let bytes = nums.get(2).copied().unwrap_or(2048).max(1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    println!("WAL synced append, {appends} appends of {bytes} B per run, {rounds} rounds");
    println!("side,round,cpu_us/append,p50_us,p99_us,direct_writes");
    let mut sides: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let r = run(&rt, side == 1, appends, bytes);
            let name = ["A page cache", "B O_DIRECT"][side];
            println!(
                "{name},{round},{:.1},{:.0},{:.0},{}",
                r.cpu_us, r.p50_us, r.p99_us, r.direct_writes
            );
            sides[side].push(r);
        }
    }
    if sides[1].iter().all(|r| r.direct_writes == 0) {
        println!("note: this file system refused O_DIRECT; B appended through the page cache too");
    }
    println!("\nmedians (B / A):");
    for (label, f) in [
        ("CPU us per append", (|r: &Run| r.cpu_us) as fn(&Run) -> f64),
        ("p50 latency us", |r: &Run| r.p50_us),
        ("p99 latency us", |r: &Run| r.p99_us),
    ] {
        let a = median(sides[0].iter().map(f).collect());
        let b = median(sides[1].iter().map(f).collect());
        println!("  {label:20} A {a:8.1}   B {b:8.1}   {:.2}x", b / a);
    }
}

//! ns per decision: each quorate algorithm on one hot key and on 1M keys in a map, next to
//! the `governor` crate's direct and keyed GCRA limiters measured in the same run.
//!
//! Both sides get the same work per iteration: advance a fake clock by a fixed step (100 ns,
//! so a 1-per-100 ns limit admits steadily: the "admit" cases) or not at all (the key is
//! exhausted and every request is denied: the "deny" cases), then decide once.
//! Run with `cargo bench --bench decide`; `scripts/bench-core` turns the results into the
//! table in docs/benchmarks.md.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use quorate::limiter::{gcra, Algorithm, Decision, Limit};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

const STEP: u64 = 100;

/// Folds every field of a decision into one word, so that the benchmark consumes all of it
/// (nothing can be optimised away) yet hands `black_box` a word, as governor's side does
/// with its `bool` — boxing the whole 48-byte struct would time a stack copy instead.
#[inline(always)]
fn digest(d: Decision) -> u64 {
    d.remaining ^ d.reset_after ^ d.retry_after ^ d.delay ^ d.limit ^ d.allowed() as u64
}
const BURST: u64 = 1_000;
const KEYS: u64 = 1_000_000;

/// 1 unit per 100 ns, burst 1000, for every algorithm (windows: 1000 per 100 us).
fn quorate_limit(alg: Algorithm) -> Limit {
    match alg {
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingCounter => {
            Limit::new(alg, BURST, BURST * STEP, BURST).unwrap()
        }
        _ => Limit::new(alg, 1, STEP, BURST).unwrap(),
    }
}

fn governor_quota() -> Quota {
    Quota::with_period(Duration::from_nanos(STEP))
        .unwrap()
        .allow_burst(NonZeroU32::new(BURST as u32).unwrap())
}

/// A fixed pseudo-random key sequence (xorshift), the same for every contender.
fn key_sequence(n: usize) -> Vec<u64> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % KEYS
        })
        .collect()
}

fn hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_key");
    for (mode, step) in [("admit", STEP), ("deny", 0)] {
        for alg in Algorithm::ALL {
            let l = quorate_limit(alg);
            let mut s = l.new_state();
            let mut now = 1_000_000_000u64;
            g.bench_function(BenchmarkId::new(alg.name(), mode), |b| {
                b.iter(|| {
                    now += step;
                    black_box(digest(l.decide(&mut s, now, 1)))
                })
            });
        }
        // The GCRA called directly, without the enum dispatch: governor's shape.
        let p = gcra::Policy::new(1, STEP, BURST).unwrap();
        let mut s = gcra::State::default();
        let mut now = 1_000_000_000u64;
        g.bench_function(BenchmarkId::new("gcra_direct", mode), |b| {
            b.iter(|| {
                now += step;
                black_box(digest(gcra::decide(&mut s, &p, now, 1)))
            })
        });
        let clock = FakeRelativeClock::default();
        let gov = RateLimiter::direct_with_clock(governor_quota(), clock.clone());
        let by = Duration::from_nanos(step);
        g.bench_function(BenchmarkId::new("governor_direct", mode), |b| {
            b.iter(|| {
                clock.advance(by);
                black_box(gov.check().is_ok())
            })
        });
    }
    g.finish();
}

fn million_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("1m_keys");
    let keys = key_sequence(1 << 20);
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let l = quorate_limit(alg);
        let mut map: HashMap<u64, quorate::limiter::KeyState> = HashMap::new();
        let mut now = 1_000_000_000u64;
        for &k in &keys {
            now += STEP;
            l.decide(map.entry(k).or_insert_with(|| l.new_state()), now, 1);
        }
        let mut i = 0;
        g.bench_function(BenchmarkId::new(alg.name(), "hashmap"), |b| {
            b.iter(|| {
                i = (i + 1) & (keys.len() - 1);
                now += STEP;
                let s = map.entry(keys[i]).or_insert_with(|| l.new_state());
                black_box(digest(l.decide(s, now, 1)))
            })
        });
    }
    {
        let p = gcra::Policy::new(1, STEP, BURST).unwrap();
        let mut map: HashMap<u64, gcra::State> = HashMap::new();
        let mut now = 1_000_000_000u64;
        for &k in &keys {
            now += STEP;
            gcra::decide(map.entry(k).or_default(), &p, now, 1);
        }
        let mut i = 0;
        g.bench_function(BenchmarkId::new("gcra_direct", "hashmap"), |b| {
            b.iter(|| {
                i = (i + 1) & (keys.len() - 1);
                now += STEP;
                black_box(digest(gcra::decide(
                    map.entry(keys[i]).or_default(),
                    &p,
                    now,
                    1,
                )))
            })
        });
    }
    let clock = FakeRelativeClock::default();
    let by = Duration::from_nanos(STEP);
    let dash = RateLimiter::dashmap_with_clock(governor_quota(), clock.clone());
    let hash = RateLimiter::hashmap_with_clock(governor_quota(), clock.clone());
    for &k in &keys {
        let _ = dash.check_key(&k);
        let _ = hash.check_key(&k);
    }
    let mut i = 0;
    g.bench_function(BenchmarkId::new("governor_keyed", "dashmap"), |b| {
        b.iter(|| {
            i = (i + 1) & (keys.len() - 1);
            clock.advance(by);
            black_box(dash.check_key(&keys[i]).is_ok())
        })
    });
    g.bench_function(BenchmarkId::new("governor_keyed", "hashmap"), |b| {
        b.iter(|| {
            i = (i + 1) & (keys.len() - 1);
            clock.advance(by);
            black_box(hash.check_key(&keys[i]).is_ok())
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = hot_key, million_keys
}
criterion_main!(benches);

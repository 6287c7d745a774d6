//! ns per check applied to a shard's state (`ShardState::apply`, what every replica runs for
//! every committed entry): checks without a request id, next to the same checks with one
//! (the shard then remembers each id's decision, and for an admission its key's digest, cost
//! and time, so that a retry spends nothing more and a refund names its admission).
//!
//! Each iteration applies one batch of [`BATCH`] GCRA checks on keys drawn from [`KEYS`]
//! (xorshift), shard time 1 ms later than the batch before, so that most checks are admitted
//! and the id table is full, as under steady load of 100k checks/s: at its cap of 100,000
//! ids (a second of this load; the horizon is a minute), forgetting the oldest as it goes.
//! The batch is built and dropped outside the timing (the keys' and ids' strings are the
//! request's own in a node). Run with `cargo bench --bench apply`.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use quorate::limiter::{Algorithm, Limit, SECOND};
use quorate::policy::OnUnavailable;
use quorate::shard::command::{Batch, Command};
use quorate::shard::state::{Bounds, ShardState};

const MILLISECOND: u64 = SECOND / 1000;
const BATCH: usize = 100;
const KEYS: u64 = 5_000;

fn bounds() -> Bounds {
    Bounds {
        max_keys: 1_000_000,
        idempotency_horizon: 60 * SECOND,
        max_request_ids: 100_000,
    }
}

/// A batch of checks on pseudo-random keys, with a request id each if `ids`.
struct Batches {
    limit: Limit,
    x: u64,
    n: u64,
    ids: bool,
}

impl Batches {
    fn new(ids: bool) -> Self {
        Batches {
            // 100 per second per key, burst 10: a key drawn every ~50 batches (50 ms) admits.
            limit: Limit::new(Algorithm::Gcra, 100, SECOND, 10).unwrap(),
            x: 0x9E37_79B9_7F4A_7C15,
            n: 0,
            ids,
        }
    }

    fn next(&mut self) -> Batch {
        self.n += 1;
        let commands = (0..BATCH)
            .map(|i| {
                self.x ^= self.x << 13;
                self.x ^= self.x >> 7;
                self.x ^= self.x << 17;
                Command::Check {
                    key: format!("api:user:{}", self.x % KEYS),
                    limit: self.limit.clone(),
                    cost: 1,
                    request_id: self.ids.then(|| format!("req-{}-{i}#0", self.n)),
                    on_full: OnUnavailable::Deny,
                }
            })
            .collect();
        Batch {
            time: self.n * MILLISECOND,
            commands,
            later: Vec::new(),
            epoch: 1,
        }
    }
}

fn apply(c: &mut Criterion) {
    let mut g = c.benchmark_group("apply");
    g.throughput(Throughput::Elements(BATCH as u64));
    for (name, ids) in [("no_request_id", false), ("request_id", true)] {
        let mut batches = Batches::new(ids);
        let mut state = ShardState::new(bounds());
        // Warm up to the steady state: every key present, the id table full.
        for _ in 0..2_000 {
            state.apply(&batches.next());
        }
        g.bench_function(name, |b| {
            b.iter_batched(
                || batches.next(),
                // The batch goes out with the results: both are dropped outside the timing.
                |batch| {
                    let applied = state.apply(&batch);
                    (batch, black_box(applied))
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// A snapshot's image of a shard of [`IMAGE_KEYS`] keys, and the copies of its state a
/// member takes: what the state machine's lock is held for (no entry of the shard applies
/// meanwhile) and what is done off it. Per image or copy, not per key.
///
/// - `pending`: what a snapshot takes under the lock ([`ShardState::pending_image`]);
/// - `keys`: the image's encoding, done by the snapshot's build while the shard applies on;
/// - `clone`: a fast leader's speculative state, seeded with a copy under the lock;
/// - `apply_after_clone`: a batch of [`BATCH`] checks applied to a state whose key table a
///   copy still shares (each part a check changes is copied first);
/// - `digest`: what `/v1/admin/status?digest=true` computes per shard, under the lock;
/// - `100000_ids_*`: `pending`, `clone` and `apply_after_clone` of a shard whose request id
///   table is full (its parts are shared as the key table's are).
fn image(c: &mut Criterion) {
    let mut g = c.benchmark_group("image");
    g.sample_size(10);
    let limit = Limit::new(Algorithm::Gcra, 100, SECOND, 10).unwrap();
    let mut state = ShardState::new(bounds());
    for chunk in 0..IMAGE_KEYS / BATCH as u64 {
        let commands = (0..BATCH as u64)
            .map(|i| Command::Check {
                key: format!("api:user:{}", chunk * BATCH as u64 + i),
                limit: limit.clone(),
                cost: 1,
                request_id: None,
                on_full: OnUnavailable::Deny,
            })
            .collect();
        state.apply(&Batch {
            time: chunk * MILLISECOND,
            commands,
            later: Vec::new(),
            epoch: 1,
        });
    }
    g.bench_function(format!("{IMAGE_KEYS}_keys_pending"), |b| {
        b.iter(|| black_box(state.pending_image()))
    });
    g.bench_function(format!("{IMAGE_KEYS}_keys"), |b| {
        b.iter(|| black_box(state.image()))
    });
    g.bench_function(format!("{IMAGE_KEYS}_keys_clone"), |b| {
        b.iter(|| black_box(state.share()))
    });
    let mut batches = Batches::new(false);
    batches.n = IMAGE_KEYS / BATCH as u64;
    g.bench_function(format!("{IMAGE_KEYS}_keys_apply_after_clone"), |b| {
        b.iter_batched(
            || (state.share(), batches.next()),
            // The copy (with the parts it copied), the batch and the results are dropped
            // outside the timing.
            |(mut copy, batch)| {
                let applied = copy.apply(&batch);
                (copy, batch, black_box(applied))
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function(format!("{IMAGE_KEYS}_keys_digest"), |b| {
        b.iter(|| black_box(state.digest()))
    });
    // A shard with its id table full (100,000 ids, the default cap) and 5,000 keys.
    let mut batches = Batches::new(true);
    let mut ids = ShardState::new(bounds());
    for _ in 0..2_000 {
        ids.apply(&batches.next());
    }
    g.bench_function("100000_ids_pending", |b| {
        b.iter(|| black_box(ids.pending_image()))
    });
    g.bench_function("100000_ids_clone", |b| b.iter(|| black_box(ids.share())));
    g.bench_function("100000_ids_apply_after_clone", |b| {
        b.iter_batched(
            || (ids.share(), batches.next()),
            |(mut copy, batch)| {
                let applied = copy.apply(&batch);
                (copy, batch, black_box(applied))
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// Keys of the shard [`image`] encodes.
const IMAGE_KEYS: u64 = 100_000;

criterion_group!(benches, apply, image);
criterion_main!(benches);

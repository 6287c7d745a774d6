//! Bytes of state per key for each algorithm: `size_of` of the state, and the real heap
//! cost per key of a `HashMap<u64, KeyState>` holding 1M keys, measured with a counting
//! global allocator (so map overhead, load factor and the sliding log's ring are included).
//! Prints a markdown table; `scripts/bench-core` copies it into docs/benchmarks.md.

use quorate::limiter::{
    fixed_window, gcra, leaky_queue, sliding_counter, sliding_log, token_bucket, Algorithm,
    KeyState, Limit, SECOND,
};
use quorate::policy::OnUnavailable;
use quorate::shard::command::{Batch, Command};
use quorate::shard::state::{Bounds, ShardState};
use std::collections::HashMap;

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static A: counting_alloc::Counting = counting_alloc::Counting;

const KEYS: u64 = 1_000_000;

fn main() {
    let sizes = [
        (
            Algorithm::FixedWindow,
            std::mem::size_of::<fixed_window::State>(),
        ),
        (
            Algorithm::SlidingLog,
            std::mem::size_of::<sliding_log::State>(),
        ),
        (
            Algorithm::SlidingCounter,
            std::mem::size_of::<sliding_counter::State>(),
        ),
        (
            Algorithm::TokenBucket,
            std::mem::size_of::<token_bucket::State>(),
        ),
        (Algorithm::Gcra, std::mem::size_of::<gcra::State>()),
        (
            Algorithm::LeakyQueue,
            std::mem::size_of::<leaky_queue::State>(),
        ),
    ];
    println!("| algorithm | size_of state (B) | heap per key, 1M keys in HashMap<u64, KeyState> (B) | same, typed HashMap<u64, State> (B) |");
    println!("|---|---:|---:|---:|");
    for (alg, size) in sizes {
        // Limit 10 per second; each key takes one request, so the sliding log holds one entry.
        let l = Limit::new(alg, 10, SECOND, 10).unwrap();
        let base = counting_alloc::live();
        let mut map: HashMap<u64, KeyState> = HashMap::new();
        for k in 0..KEYS {
            let s = map.entry(k).or_insert_with(|| l.new_state());
            l.decide(s, k, 1);
        }
        let enum_bytes = (counting_alloc::live() - base) as f64 / KEYS as f64;
        drop(map);
        let typed = typed_bytes(alg);
        println!(
            "| {} | {} | {:.1} | {:.1} |",
            alg.name(),
            size,
            enum_bytes,
            typed
        );
    }
    println!();
    println!(
        "size_of::<KeyState>() = {} B",
        std::mem::size_of::<KeyState>()
    );
    println!();
    shard_table();
}

/// Heap bytes per key of a shard's state as a node holds it (`ShardState`: the key table
/// with each key's string, its limit and its state), 1M keys each admitted once through
/// `ShardState::apply`, for two key shapes.
fn shard_table() {
    let limit = Limit::new(Algorithm::Gcra, 10, SECOND, 10).unwrap();
    type KeyOf = fn(u64) -> String;
    let keys: [(&str, KeyOf); 3] = [
        ("`user:N` (6-11 B)", |k| format!("user:{k}")),
        ("`tenant:acme-corp:user:N` (23-28 B)", |k| {
            format!("tenant:acme-corp:user:{k}")
        }),
        // The longest key `--max-key-len` allows by default: a key flood's worst case.
        ("512 B", |k| format!("{k:0>512}")),
    ];
    println!(
        "A shard's state as a node holds it (`ShardState`: the key table with each key's \
         string, its limit and its state), 1M GCRA keys each admitted once through \
         `ShardState::apply`, heap bytes per key as the allocator was asked for them (its own \
         rounding not counted):"
    );
    println!();
    println!("| shard state, 1M GCRA keys | heap per key (B) |");
    println!("|---|---:|");
    for (name, key) in keys {
        let base = counting_alloc::live();
        let mut state = ShardState::new(Bounds {
            max_keys: KEYS,
            idempotency_horizon: 60 * SECOND,
            max_request_ids: 1,
        });
        for (n, chunk) in (0..KEYS).collect::<Vec<_>>().chunks(1_000).enumerate() {
            let commands = chunk
                .iter()
                .map(|&k| Command::Check {
                    key: key(k),
                    limit: limit.clone(),
                    cost: 1,
                    request_id: None,
                    on_full: OnUnavailable::Deny,
                })
                .collect();
            state.apply(&Batch {
                time: n as u64,
                commands,
                later: Vec::new(),
                epoch: 1,
            });
        }
        assert_eq!(state.len() as u64, KEYS);
        let bytes = (counting_alloc::live() - base) as f64 / KEYS as f64;
        drop(state);
        println!("| {name} | {bytes:.1} |");
    }
}

/// Heap bytes per key for a map of the algorithm's own state type.
fn typed_bytes(alg: Algorithm) -> f64 {
    fn measure<S: Default>(mut touch: impl FnMut(&mut S, u64)) -> f64 {
        let base = counting_alloc::live();
        let mut map: HashMap<u64, S> = HashMap::new();
        for k in 0..KEYS {
            touch(map.entry(k).or_default(), k);
        }
        let b = (counting_alloc::live() - base) as f64 / KEYS as f64;
        drop(map);
        b
    }
    match alg {
        Algorithm::FixedWindow => {
            let p = fixed_window::Policy::new(10, SECOND).unwrap();
            measure(|s, k| {
                fixed_window::decide(s, &p, k, 1);
            })
        }
        Algorithm::SlidingLog => {
            let p = sliding_log::Policy::new(10, SECOND).unwrap();
            measure(|s, k| {
                sliding_log::decide(s, &p, k, 1);
            })
        }
        Algorithm::SlidingCounter => {
            let p = sliding_counter::Policy::new(10, SECOND).unwrap();
            measure(|s, k| {
                sliding_counter::decide(s, &p, k, 1);
            })
        }
        Algorithm::TokenBucket => {
            let p = token_bucket::Policy::new(10, SECOND, 10).unwrap();
            measure(|s, k| {
                token_bucket::decide(s, &p, k, 1);
            })
        }
        Algorithm::Gcra => {
            let p = gcra::Policy::new(10, SECOND, 10).unwrap();
            measure(|s, k| {
                gcra::decide(s, &p, k, 1);
            })
        }
        Algorithm::LeakyQueue => {
            let p = leaky_queue::Policy::new(10, SECOND, 10).unwrap();
            measure(|s, k| {
                leaky_queue::decide(s, &p, k, 1);
            })
        }
    }
}

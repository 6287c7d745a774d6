//! Bytes of state per key for each algorithm: `size_of` of the state, and the real heap
//! cost per key of a `HashMap<u64, KeyState>` holding 1M keys, measured with a counting
//! global allocator (so map overhead, load factor and the sliding log's ring are included).
//! Prints a markdown table; `scripts/bench-core` copies it into docs/benchmarks.md.

use quorate::limiter::{
    fixed_window, gcra, leaky_queue, sliding_counter, sliding_log, token_bucket, Algorithm,
    KeyState, Limit, SECOND,
};
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

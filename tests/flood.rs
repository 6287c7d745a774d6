//! A flood of 1M distinct keys against a node capped at 100k keys: the key count stops at the
//! cap, every refused new key is counted, old keys keep working, and the live heap stays
//! bounded (measured by a counting allocator, not estimated).

use quorate::clock::ManualClock;
use quorate::config::NodeConfig;
use quorate::policy::PolicySet;
use quorate::service::{CheckItem, CheckRequest, LimitRef, Service};
use std::sync::Arc;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static A: counting_alloc::Counting = counting_alloc::Counting;

const CAP: u64 = 100_000;
const FLOOD: usize = 1_000_000;
/// Generous for 100k keys (about 200 B each with the table), far below 1M keys' need.
const HEAP_BOUND: usize = 64 << 20;

fn check(key: String) -> CheckRequest {
    CheckRequest {
        items: vec![CheckItem {
            limit: LimitRef::Named("api".into()),
            key,
            cost: 1,
        }],
        request_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_a_million_new_keys_stays_under_the_key_cap_and_the_memory_bound() {
    let config = NodeConfig {
        max_keys: CAP,
        ..NodeConfig::default()
    };
    let clock = Arc::new(ManualClock::new(0));
    let s = Service::start(config, PolicySet::default_policies(), clock)
        .await
        .unwrap();
    let before = counting_alloc::live();
    for batch in 0..FLOOD / 1000 {
        let reqs = (0..1000)
            .map(|i| check(format!("flood-{batch}-{i}")))
            .collect();
        for answer in s.check_many(reqs).await {
            answer.unwrap();
        }
    }
    let grown = counting_alloc::live().saturating_sub(before);
    let status = s.status();
    println!(
        "keys held: {}, heap grown: {} MiB",
        status.keys,
        grown >> 20
    );
    assert_eq!(status.keys, CAP, "every shard filled its share and no more");
    let refused = format!("quorate_key_cap_rejections_total {}", FLOOD as u64 - CAP);
    assert!(s.metrics().render().contains(&refused));
    assert!(grown < HEAP_BOUND, "heap grew {grown} bytes for {CAP} keys");
    // A key admitted before the cap was reached still gets its own limit.
    assert!(s.check(check("flood-0-0".into())).await.unwrap().allowed);
}

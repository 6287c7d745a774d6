//! The node's decision path end to end, below the protocols: real shard actors, a manual clock.

use quorate::clock::ManualClock;
use quorate::config::NodeConfig;
use quorate::limiter::{Outcome, SECOND};
use quorate::policy::PolicySet;
use quorate::service::{CheckError, CheckItem, CheckRequest, InlineLimit, LimitRef, Service};
use std::sync::Arc;

const POLICIES: &str = r#"
[limits.account]
algorithm = "token_bucket"
limit = 1
period = "1s"
burst = 2

[limits.ip]
algorithm = "fixed_window"
limit = 3
period = "1m"

[limits.trial]
algorithm = "fixed_window"
limit = 1
period = "1m"
shadow = true

[limits.open]
algorithm = "gcra"
limit = 1
period = "1s"
on_unavailable = "allow"
"#;

/// A node whose policies come from a file (POLICIES), to rewrite and reload; the directory
/// holding it lives as long as the returned guard.
async fn start_with_policy_file() -> (Service, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quorate.toml");
    std::fs::write(&path, POLICIES).unwrap();
    let config = NodeConfig {
        policies: Some(path.clone()),
        ..NodeConfig::default()
    };
    let (s, _) = start(config).await;
    (s, path, dir)
}

async fn start(config: NodeConfig) -> (Service, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(0));
    let policies = PolicySet::from_toml(POLICIES).unwrap();
    let service = Service::start(config, policies, clock.clone())
        .await
        .unwrap();
    (service, clock)
}

fn item(limit: &str, key: &str, cost: u64) -> CheckItem {
    CheckItem {
        limit: LimitRef::Named(limit.into()),
        key: key.into(),
        cost,
    }
}

fn req(items: Vec<CheckItem>) -> CheckRequest {
    CheckRequest {
        items,
        request_id: None,
    }
}

async fn remaining(s: &Service, limit: &str, key: &str) -> u64 {
    s.check(req(vec![item(limit, key, 0)])).await.unwrap().items[0]
        .decision
        .remaining
}

#[tokio::test]
async fn a_check_of_several_limits_consumes_nothing_when_one_denies() {
    let (s, _) = start(NodeConfig::default()).await;
    // Spend the account's two tokens, then ask for account AND ip: the account denies.
    assert!(
        s.check(req(vec![item("account", "alice", 2)]))
            .await
            .unwrap()
            .allowed
    );
    let r = s
        .check(req(vec![
            item("ip", "10.0.0.1", 1),
            item("account", "alice", 1),
        ]))
        .await
        .unwrap();
    assert!(!r.allowed);
    assert!(
        r.items[0].decision.allowed(),
        "ip admitted on its own shard first"
    );
    assert_eq!(remaining(&s, "ip", "10.0.0.1").await, 3, "and was refunded");
}

/// A check of several items one of which can never pass (its cost is above its limit's
/// capacity: `never`, whatever its key's state) spends nothing on the others: they are only
/// peeked at, so nothing is admitted and nothing needs refunding. Before, they were admitted
/// and then refunded: the key table kept the keys, and a check decided between the
/// admission and its refund (here, the next check of the same call, in the same batch on
/// the ip's shard) saw the reservation and was denied. With a request id the items are
/// admitted and refunded as any denied check's (a retry's may be replays, which only a refund
/// under the id gives back): the key has its whole window again. An impossible item of a
/// shadow limit (which never denies) does not count.
#[tokio::test]
async fn a_check_with_an_item_that_can_never_pass_spends_nothing() {
    let (s, _) = start(NodeConfig::default()).await;
    // The account's capacity (burst) is 2: a cost of 3 can never pass.
    let never = |ip: &str, request_id: Option<&str>| CheckRequest {
        items: vec![item("ip", ip, 2), item("account", "erin", 3)],
        request_id: request_id.map(Into::into),
    };
    let r = s.check(never("10.0.0.5", None)).await.unwrap();
    assert!(!r.allowed);
    assert_eq!(r.items[1].decision.outcome, Outcome::Never);
    assert!(r.items[0].decision.allowed(), "{r:?}");
    assert_eq!(r.items[0].decision.remaining, 3, "the ip's window as it is");
    assert_eq!(
        s.status().keys,
        0,
        "a key was stored: something was admitted"
    );
    // The next check in the same call gets the ip's whole window.
    let answers = s
        .check_many(vec![
            never("10.0.0.5", None),
            req(vec![item("ip", "10.0.0.5", 3)]),
        ])
        .await;
    assert!(!answers[0].as_ref().unwrap().allowed);
    assert!(
        answers[1].as_ref().unwrap().allowed,
        "denied by the reservation of a check that could never pass"
    );
    assert_eq!(remaining(&s, "ip", "10.0.0.5").await, 0);
    // With a request id, and its retry.
    for _ in 0..2 {
        let r = s.check(never("10.0.0.6", Some("n1"))).await.unwrap();
        assert!(!r.allowed);
        assert_eq!(r.items[1].decision.outcome, Outcome::Never);
        assert_eq!(remaining(&s, "ip", "10.0.0.6").await, 3);
    }
    // A retry under an id whose earlier attempt admitted the item that now can never pass
    // (a reload lowered the capacity below its cost) gets that admission replayed: the check
    // passes, and its other items must be charged.
    let (reloaded, path, _dir) = start_with_policy_file().await;
    let with_id = |items| CheckRequest {
        items,
        request_id: Some("n2".into()),
    };
    let first = reloaded
        .check(with_id(vec![item("account", "frank", 2)]))
        .await;
    assert!(first.unwrap().allowed);
    std::fs::write(&path, POLICIES.replace("burst = 2", "burst = 1")).unwrap();
    assert_eq!(reloaded.reload().unwrap().changed, ["account"]);
    let retry = with_id(vec![item("account", "frank", 2), item("ip", "10.0.0.8", 1)]);
    let r = reloaded.check(retry).await.unwrap();
    assert!(r.allowed, "{r:?}");
    assert_eq!(
        remaining(&reloaded, "ip", "10.0.0.8").await,
        2,
        "admitted without charging the ip (it was only peeked at)"
    );
    // A shadow item that can never pass does not make the check one: the ip is spent.
    let r = s
        .check(req(vec![item("ip", "10.0.0.7", 1), item("trial", "t", 2)]))
        .await
        .unwrap();
    assert!(r.allowed && r.items[1].shadow, "{r:?}");
    assert_eq!(r.items[1].decision.outcome, Outcome::Never);
    assert_eq!(remaining(&s, "ip", "10.0.0.7").await, 2);
}

/// A retry of a check whose first attempt admitted one item and never had the other decided
/// (its shard failed; here, the first attempt did not name it) gets the admission replayed
/// from the request id; when the retry is denied, that replayed admission is refunded — once,
/// however many denied retries follow (the refund names the id, and the shard gives an
/// admission under an id back once).
#[tokio::test]
async fn a_denied_retry_refunds_the_admission_it_replays_once() {
    let (s, _) = start(NodeConfig::default()).await;
    assert!(
        s.check(req(vec![item("account", "carol", 2)]))
            .await
            .unwrap()
            .allowed
    );
    let with_id = |items| {
        let mut r = req(items);
        r.request_id = Some("r1".into());
        r
    };
    let first = s
        .check(with_id(vec![item("ip", "10.0.0.9", 1)]))
        .await
        .unwrap();
    assert!(first.allowed);
    assert_eq!(remaining(&s, "ip", "10.0.0.9").await, 2);
    let retry = || with_id(vec![item("ip", "10.0.0.9", 1), item("account", "carol", 1)]);
    let denied = s.check(retry()).await.unwrap();
    assert!(!denied.allowed && denied.items[0].decision.allowed());
    assert_eq!(
        remaining(&s, "ip", "10.0.0.9").await,
        3,
        "the replayed admission was not refunded"
    );
    // Spend one unit of the ip's window, then deny the retry twice more: no more back.
    assert!(
        s.check(req(vec![item("ip", "10.0.0.9", 1)]))
            .await
            .unwrap()
            .allowed
    );
    for _ in 0..2 {
        assert!(!s.check(retry()).await.unwrap().allowed);
    }
    assert_eq!(
        remaining(&s, "ip", "10.0.0.9").await,
        2,
        "a refund under the id gave back twice"
    );
}

#[tokio::test]
async fn the_items_of_a_check_land_on_different_shards() {
    let (s, _) = start(NodeConfig::default()).await;
    // The all-or-nothing test above only means something if the keys are on two shards.
    assert_ne!(s.shard_of("ip:10.0.0.1"), s.shard_of("account:alice"));
}

#[tokio::test]
async fn a_retried_request_id_returns_the_first_answer_and_consumes_once() {
    let (s, _) = start(NodeConfig::default()).await;
    let mut r = req(vec![item("account", "bob", 1)]);
    r.request_id = Some("retry-1".into());
    let first = s.check(r.clone()).await.unwrap();
    let again = s.check(r).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(remaining(&s, "account", "bob").await, 1);
}

/// A request id names one check: under an id already used, a check of another key, limit
/// or cost is decided afresh and remembered for itself, not given the first check's answer.
/// Before, a shard replayed an id's first answer for any check under it: admitted, nothing
/// spent, for any key on that shard, with the other limit's figures.
#[tokio::test]
async fn a_request_id_reused_for_another_check_gets_no_replay_of_the_first() {
    let (s, _) = start(NodeConfig::default()).await;
    let with_id = |limit: &str, key: &str, cost| {
        let mut r = req(vec![item(limit, key, cost)]);
        r.request_id = Some("reused".into());
        r
    };
    assert!(s.check(with_id("account", "bob", 1)).await.unwrap().allowed);
    // Keys enough that some share bob's shard, whatever the shard count.
    let others: Vec<String> = (0..16).map(|i| format!("other-{i}")).collect();
    let mut first = Vec::new();
    for key in &others {
        first.push(s.check(with_id("account", key, 1)).await.unwrap());
        assert_eq!(
            remaining(&s, "account", key).await,
            1,
            "{key} spent nothing"
        );
    }
    // Another limit, another cost (2 of bob's 1 left: denied, as a replay would not be).
    let ip = s.check(with_id("ip", "bob", 1)).await.unwrap();
    assert_eq!(
        ip.items[0].decision.limit, 3,
        "answered with the ip limit's figures"
    );
    assert_eq!(remaining(&s, "ip", "bob").await, 2);
    assert!(!s.check(with_id("account", "bob", 2)).await.unwrap().allowed);
    // Each check's own retry replays its own answer and spends nothing more.
    for (key, answer) in others.iter().zip(&first) {
        assert_eq!(&s.check(with_id("account", key, 1)).await.unwrap(), answer);
        assert_eq!(remaining(&s, "account", key).await, 1);
    }
    assert_eq!(s.check(with_id("ip", "bob", 1)).await.unwrap(), ip);
    assert_eq!(remaining(&s, "ip", "bob").await, 2);
    assert_eq!(remaining(&s, "account", "bob").await, 1);
}

#[tokio::test]
async fn pipelined_checks_are_answered_once_each_in_order() {
    let (s, _) = start(NodeConfig::default()).await;
    let reqs: Vec<_> = (0..5).map(|_| req(vec![item("ip", "pipe", 1)])).collect();
    let answers = s.check_many(reqs).await;
    let allowed: Vec<bool> = answers
        .iter()
        .map(|a| a.as_ref().unwrap().allowed)
        .collect();
    assert_eq!(allowed, [true, true, true, false, false]);
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_no_state() {
    let (s, _) = start(NodeConfig::default()).await;
    let long = "k".repeat(NodeConfig::default().max_key_len + 1);
    for bad in [
        req(vec![]),
        req(vec![item("ip", "", 1)]),
        req(vec![item("ip", &long, 1)]),
        req(vec![item("ip", "x", 1), item("nope", "x", 1)]),
        req((0..17).map(|_| item("ip", "x", 1)).collect()),
    ] {
        let e = s.check(bad).await.unwrap_err();
        assert!(
            matches!(
                e,
                CheckError::InvalidInput(_) | CheckError::UnknownLimit(..)
            ),
            "{e}"
        );
    }
    assert_eq!(remaining(&s, "ip", "x").await, 3);
    assert_eq!(s.status().keys, 0);
}

#[tokio::test]
async fn a_shadow_limit_decides_and_counts_but_always_admits() {
    let (s, _) = start(NodeConfig::default()).await;
    for _ in 0..3 {
        let r = s.check(req(vec![item("trial", "t", 1)])).await.unwrap();
        assert!(r.allowed);
    }
    let r = s.check(req(vec![item("trial", "t", 1)])).await.unwrap();
    assert_eq!(r.items[0].decision.outcome, Outcome::Denied);
    assert!(r.items[0].shadow && r.allowed);
    assert!(s
        .metrics()
        .render()
        .contains(r#"quorate_decisions_total{outcome="shadow_denied",policy="trial"}"#));
}

#[tokio::test]
async fn at_the_key_cap_new_keys_get_the_failure_answer_and_old_keys_keep_working() {
    let config = NodeConfig {
        max_keys: 16,
        shards: 16,
        ..NodeConfig::default()
    };
    let (s, _) = start(config).await;
    // One key per shard fills every shard's share of the cap.
    let mut held = Vec::new();
    for i in 0..2000 {
        let key = format!("k{i}");
        let r = s.check(req(vec![item("ip", &key, 1)])).await.unwrap();
        if r.allowed {
            held.push(key);
        } else {
            assert!(r.items[0].fallback);
        }
    }
    assert_eq!(held.len(), 16);
    assert_eq!(s.status().keys, 16);
    assert!(
        s.check(req(vec![item("ip", &held[0], 1)]))
            .await
            .unwrap()
            .allowed
    );
    // `on_unavailable = "allow"` admits new keys at the cap.
    let r = s
        .check(req(vec![item("open", "new-key", 1)]))
        .await
        .unwrap();
    assert!(r.allowed && r.items[0].fallback);
    assert!(s
        .metrics()
        .render()
        .contains("quorate_key_cap_rejections_total 1985"));
}

#[tokio::test]
async fn keys_whose_state_is_as_if_never_seen_are_evicted_and_no_others() {
    let (s, clock) = start(NodeConfig::default()).await;
    s.check(req(vec![item("account", "a", 2)])).await.unwrap();
    s.check(req(vec![item("ip", "b", 1)])).await.unwrap();
    clock.advance(2 * SECOND);
    // The bucket refilled (fresh); the minute window still counts 1.
    assert_eq!(s.evict().await, 1);
    assert_eq!(s.status().keys, 1);
    assert_eq!(remaining(&s, "ip", "b").await, 2);
}

#[tokio::test]
async fn a_crashed_shard_actor_is_restarted_on_its_state_and_counted() {
    let (s, _) = start(NodeConfig::default()).await;
    s.check(req(vec![item("ip", "c", 2)])).await.unwrap();
    let shard = s.shard_of("ip:c");
    s.crash_shard(shard);
    let mut restarted = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        if s.status().shards[shard as usize].restarts == 1 {
            restarted = true;
            break;
        }
    }
    assert!(restarted, "the supervisor restarted the shard");
    assert_eq!(
        remaining(&s, "ip", "c").await,
        1,
        "state survived the crash"
    );
    assert!(s
        .metrics()
        .render()
        .contains("quorate_shard_restarts_total 1"));
}

#[tokio::test]
async fn inline_limits_follow_the_policy_file() {
    let (s, _) = start(NodeConfig::default()).await;
    let inline = CheckItem {
        limit: LimitRef::Inline(InlineLimit {
            algorithm: quorate::limiter::Algorithm::Gcra,
            limit: 30,
            period_ns: 60 * SECOND,
            burst: Some(16),
        }),
        key: "user123".into(),
        cost: 1,
    };
    // POLICIES has no [inline] table: inline limits are refused.
    let e = s.check(req(vec![inline.clone()])).await.unwrap_err();
    assert!(e.to_string().contains("[inline] allow = true"), "{e}");
    let clock = Arc::new(ManualClock::new(0));
    let s = Service::start(NodeConfig::default(), PolicySet::default_policies(), clock)
        .await
        .unwrap();
    let r = s.check(req(vec![inline])).await.unwrap();
    assert_eq!(
        (r.items[0].decision.limit, r.items[0].decision.remaining),
        (16, 15)
    );
}

#[tokio::test]
async fn a_reload_keeps_state_and_an_invalid_file_changes_nothing() {
    let (s, path, _dir) = start_with_policy_file().await;
    s.check(req(vec![item("ip", "r", 2)])).await.unwrap();
    std::fs::write(&path, POLICIES.replace("limit = 3", "limit = 5")).unwrap();
    let report = s.reload().unwrap();
    assert_eq!(report.changed, ["ip"]);
    assert_eq!(remaining(&s, "ip", "r").await, 3, "5 - 2 already spent");
    std::fs::write(&path, "[limits.broken]\nalgorithm = \"x\"").unwrap();
    assert!(s.reload().is_err());
    assert_eq!(s.policies().limits.len(), 4);
}

/// An alert on `rate(...) > 0` sees the first event after a restart only if the series was
/// exported at 0 before it: a series that appeared at its first increment starts at 1.
#[tokio::test]
async fn a_fresh_node_exports_its_refusal_and_unavailable_counters_at_zero() {
    let (s, _) = start(NodeConfig::default()).await;
    let metrics = s.metrics().render();
    let mut series = vec![
        r#"quorate_unavailable_answers_total{answer="allow"}"#.to_string(),
        r#"quorate_unavailable_answers_total{answer="deny"}"#.into(),
        r#"quorate_unavailable_answers_total{answer="local"}"#.into(),
        r#"quorate_unavailable_answers_total{answer="unknown"}"#.into(),
        r#"quorate_connections_refused_total{api="http"}"#.into(),
        r#"quorate_connections_refused_total{api="resp"}"#.into(),
        r#"quorate_removed_node_refusals_total{kind="forward"}"#.into(),
        r#"quorate_removed_node_refusals_total{kind="vote"}"#.into(),
        r#"quorate_snapshot_chunks_refused_total{why="gap"}"#.into(),
        r#"quorate_snapshot_chunks_refused_total{why="no_stream"}"#.into(),
        r#"quorate_bad_requests_total{api="resp",reason="unknown_command"}"#.into(),
        r#"quorate_bad_requests_total{api="http",reason="unauthorized"}"#.into(),
    ];
    // And every other reason either API refuses with.
    for (api, reasons) in quorate::metrics::BAD_REQUEST_REASONS {
        for reason in *reasons {
            series.push(format!(
                r#"quorate_bad_requests_total{{api="{api}",reason="{reason}"}}"#
            ));
        }
    }
    for name in series {
        assert!(
            metrics.lines().any(|l| l == format!("{name} 0")),
            "{name} is not exported at 0:\n{metrics}"
        );
    }
}

//! `quorate::client::Client` against a node served in-process on loopback.

use quorate::api::resp::serve;
use quorate::client::retry::RetryPolicy;
use quorate::client::{Client, ClientConfig, ClientError, Wait};
use quorate::clock::SystemClock;
use quorate::config::NodeConfig;
use quorate::net::tcp::{TcpConnector, TcpListener};
use quorate::net::Listener;
use quorate::policy::PolicySet;
use quorate::service::Service;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// The default policies plus `fast`: 1 per 300 ms, so retries are quick to test.
fn policies() -> PolicySet {
    let mut text = include_str!("../quorate.toml").to_string();
    text.push_str(
        "\n[limits.fast]\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"300ms\"\nburst = 1\n",
    );
    PolicySet::from_toml(&text).unwrap()
}

async fn node(tweak: impl FnOnce(&mut NodeConfig)) -> SocketAddr {
    node_on("127.0.0.1:0".parse().unwrap(), tweak).await
}

/// A node whose RESP listener is on `addr`.
async fn node_on(addr: SocketAddr, tweak: impl FnOnce(&mut NodeConfig)) -> SocketAddr {
    let mut config = NodeConfig {
        http_addr: "127.0.0.1:0".parse().unwrap(),
        resp_addr: "127.0.0.1:0".parse().unwrap(),
        ..NodeConfig::default()
    };
    tweak(&mut config);
    let service = Service::start(config, policies(), Arc::new(SystemClock::new()))
        .await
        .unwrap();
    let listener = TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, service, std::future::pending()));
    addr
}

fn client(addr: SocketAddr, connections: usize) -> Client {
    Client::with_connector(
        addr,
        TcpConnector,
        ClientConfig {
            connections,
            timeout: Duration::from_secs(2),
            jitter_seed: 7,
            down_for: Duration::from_secs(1),
            failback_after: Duration::from_secs(10),
            routes_every: None,
        },
    )
}

#[tokio::test]
async fn ping_answers_without_the_service() {
    let c = client(node(|_| {}).await, 1);
    c.ping().await.unwrap();
}

#[tokio::test]
async fn check_spends_all_or_nothing_and_peek_spends_nothing() {
    let c = client(node(|_| {}).await, 2);
    let a = c.check(&[("login", "alice", 5)], None).await.unwrap();
    assert!(a.allowed);
    assert_eq!(a.wait, Wait::Now);
    assert_eq!((a.items[0].capacity, a.items[0].remaining), (5, 0));
    assert_eq!(a.items[0].reset_after, Duration::from_secs(60));

    let denied = c
        .check(&[("api", "alice", 1), ("login", "alice", 1)], None)
        .await
        .unwrap();
    assert!(!denied.allowed);
    let Wait::After(wait) = denied.wait else {
        panic!("expected a wait, got {:?}", denied.wait)
    };
    assert!(
        wait > Duration::from_secs(59) && wait <= Duration::from_secs(60),
        "{wait:?}"
    );
    assert_eq!(denied.items[1].limit, "login");
    assert!(!denied.items[1].allowed);

    let peek = c.peek("api", "alice").await.unwrap();
    assert_eq!(
        peek.items[0].remaining, 200,
        "api was not spent by the denied check"
    );
}

#[tokio::test]
async fn a_cost_that_can_never_fit_waits_never() {
    let c = client(node(|_| {}).await, 1);
    let a = c.check(&[("login", "bob", 6)], None).await.unwrap();
    assert_eq!((a.allowed, a.wait), (false, Wait::Never));
}

#[tokio::test]
async fn throttle_gives_redis_cell_answers() {
    let c = client(node(|_| {}).await, 1);
    let t = c.throttle("user123", 15, 30, 60, 1).await.unwrap();
    assert!(!t.limited);
    assert_eq!((t.limit, t.remaining, t.retry_after), (16, 15, None));
    assert_eq!(t.reset_after, Duration::from_secs(2));
    let t = c.throttle("user123", 15, 30, 60, 15).await.unwrap();
    assert_eq!((t.limited, t.remaining), (false, 0));
    let t = c.throttle("user123", 15, 30, 60, 1).await.unwrap();
    assert!(t.limited);
    assert_eq!(t.retry_after, Some(Duration::from_secs(2)));
}

#[tokio::test]
async fn server_errors_are_typed_and_not_retryable() {
    let c = client(node(|_| {}).await, 1);
    let e = c.check(&[("nope", "k", 1)], None).await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Server(m) if m.starts_with("ERR unknown limit")),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    let e = c.throttle("k", 15, 0, 60, 1).await.unwrap_err();
    assert_eq!(
        e,
        ClientError::Server("ERR count must be a positive integer".into())
    );
    // The connection survived the error replies.
    c.ping().await.unwrap();
}

#[tokio::test]
async fn check_with_retry_waits_the_nodes_retry_after_then_succeeds() {
    let c = client(node(|_| {}).await, 1);
    assert!(c.check(&[("fast", "k", 1)], None).await.unwrap().allowed);
    let policy = RetryPolicy {
        max_attempts: 3,
        base: Duration::from_millis(10),
        cap: Duration::from_secs(1),
        max_total: Duration::from_secs(2),
    };
    let started = Instant::now();
    let a = c
        .check_with_retry(&[("fast", "k", 1)], Some("retry-1"), &policy)
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(a.allowed, "{a:?}");
    assert!(
        took >= Duration::from_millis(250),
        "retried before the node's wait: {took:?}"
    );
    assert!(
        took < Duration::from_millis(900),
        "waited far longer than needed: {took:?}"
    );
}

#[tokio::test]
async fn check_with_retry_gives_up_when_the_wait_is_beyond_the_cap() {
    let c = client(node(|_| {}).await, 1);
    assert!(c.check(&[("fast", "g", 1)], None).await.unwrap().allowed);
    let policy = RetryPolicy {
        max_attempts: 5,
        base: Duration::from_millis(10),
        cap: Duration::from_millis(50),
        max_total: Duration::from_secs(1),
    };
    let started = Instant::now();
    let a = c
        .check_with_retry(&[("fast", "g", 1)], None, &policy)
        .await
        .unwrap();
    assert!(!a.allowed);
    assert!(matches!(a.wait, Wait::After(_)));
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "it should not have waited"
    );
}

#[tokio::test]
async fn check_with_retry_does_not_retry_what_can_never_succeed() {
    let c = client(node(|_| {}).await, 1);
    let a = c
        .check_with_retry(&[("fast", "n", 2)], None, &RetryPolicy::default())
        .await
        .unwrap();
    assert_eq!(a.wait, Wait::Never);
}

#[tokio::test]
async fn a_connection_the_node_closed_as_idle_is_replaced_transparently() {
    let addr = node(|c| c.idle_timeout = Duration::from_millis(100)).await;
    let c = client(addr, 1);
    c.ping().await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    c.ping().await.unwrap();
    let t = c.throttle("idle", 15, 30, 60, 1).await.unwrap();
    assert_eq!(t.remaining, 15);
}

#[tokio::test]
async fn a_node_that_never_answers_times_out_and_the_next_call_reconnects() {
    let addr = silent_node().await;
    let c = Client::with_connector(
        addr,
        TcpConnector,
        ClientConfig {
            connections: 1,
            timeout: Duration::from_millis(200),
            jitter_seed: 1,
            down_for: Duration::from_secs(1),
            failback_after: Duration::from_secs(10),
            routes_every: None,
        },
    );
    let started = Instant::now();
    assert_eq!(
        c.ping().await,
        Err(ClientError::Timeout(Duration::from_millis(200)))
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(ClientError::Timeout(Duration::ZERO).is_retryable());
    assert!(matches!(c.ping().await, Err(ClientError::Timeout(_))));
}

#[tokio::test]
async fn nothing_listening_is_a_retryable_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = client(addr, 1).ping().await.unwrap_err();
    assert!(matches!(e, ClientError::Connect(_)), "{e:?}");
    assert!(e.is_retryable());
}

#[tokio::test]
async fn many_concurrent_calls_share_a_small_pool() {
    let c = client(node(|_| {}).await, 3);
    let calls = (0..50).map(|i| {
        let c = c.clone();
        tokio::spawn(async move { c.throttle(&format!("pool-{}", i % 5), 100, 1, 60, 1).await })
    });
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap().unwrap());
    }
    assert!(answers.iter().all(|a| !a.limited));
    let mut remaining: Vec<u64> = answers.iter().map(|a| a.remaining).collect();
    remaining.sort_unstable();
    // 5 keys x 10 calls each: remaining 100..=91 per key.
    let want: Vec<u64> = (91..=100).flat_map(|r| [r; 5]).collect();
    assert_eq!(remaining, want);
}

/// A listener whose connections answer each read with `reply(bytes read)`, if any.
async fn fake_node(reply: fn(&[u8]) -> Option<&'static [u8]>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut listener = listener;
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1024];
                while let Ok(n @ 1..) = s.read(&mut buf).await {
                    let Some(answer) = reply(&buf[..n]) else {
                        continue;
                    };
                    if tokio::io::AsyncWriteExt::write_all(&mut s, answer)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// A listener that accepts and reads but never replies.
async fn silent_node() -> SocketAddr {
    fake_node(|_| None).await
}

/// A loopback address nothing listens on (now).
async fn refusing_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    listener.local_addr().unwrap()
}

fn client_of(nodes: &[SocketAddr], timeout: Duration, down_for: Duration) -> Client {
    client_failing_back(nodes, timeout, down_for, Duration::from_millis(300))
}

fn client_failing_back(
    nodes: &[SocketAddr],
    timeout: Duration,
    down_for: Duration,
    failback_after: Duration,
) -> Client {
    Client::with_nodes(
        nodes.iter().copied(),
        TcpConnector,
        ClientConfig {
            connections: 1,
            timeout,
            jitter_seed: 7,
            down_for,
            failback_after,
            // These tests are about failover between nodes; routing is tested on a real
            // cluster (tests/cluster_process.rs).
            routes_every: None,
        },
    )
}

/// Each node here is a node of its own (no cluster), so the remaining allowance of a key
/// tells which node answered.
#[tokio::test]
async fn a_client_of_several_nodes_uses_the_next_while_the_first_refuses_and_returns_to_it() {
    let first = refusing_addr().await;
    let second = node(|_| {}).await;
    // A failback of 1 s leaves a slow machine most of a second between the two checks
    // below that tell "not yet" from "back".
    let c = client_failing_back(
        &[first, second],
        Duration::from_secs(2),
        Duration::from_millis(100),
        Duration::from_secs(1),
    );
    // The first node refuses: the call goes to the second at once, and so does the next.
    assert_eq!(c.throttle("fo", 15, 30, 60, 1).await.unwrap().remaining, 15);
    assert_eq!(c.throttle("fo", 15, 30, 60, 1).await.unwrap().remaining, 14);
    // The first node starts (and is no longer passed over: `down_for` is 100 ms); once the
    // connection to the second is `failback_after` old, the client goes back to the first
    // (a fresh bucket there).
    node_on(first, |_| {}).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Not before: the connection to the second node is younger than 1 s.
    assert_eq!(c.throttle("fo", 15, 30, 60, 1).await.unwrap().remaining, 13);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(c.throttle("fo", 15, 30, 60, 1).await.unwrap().remaining, 15);
    assert_eq!(c.throttle("fo", 15, 30, 60, 1).await.unwrap().remaining, 14);
}

#[tokio::test]
async fn a_node_that_stops_answering_is_passed_over_after_one_timeout() {
    // The first node accepts and reads but never replies (a paused or wedged process).
    let first = silent_node().await;
    let second = node(|_| {}).await;
    let timeout = Duration::from_millis(300);
    let c = client_of(&[first, second], timeout, Duration::from_secs(30));
    // Sent and unanswered: the outcome is unknown, so the error is the caller's to retry
    // (with a request id); the client itself does not resend it.
    assert_eq!(
        c.throttle("stuck", 15, 30, 60, 1).await,
        Err(ClientError::Timeout(timeout))
    );
    // The next calls go to the second node.
    assert_eq!(
        c.throttle("stuck", 15, 30, 60, 1).await.unwrap().remaining,
        15
    );
    assert_eq!(
        c.throttle("stuck", 15, 30, 60, 1).await.unwrap().remaining,
        14
    );
}

#[tokio::test]
async fn every_node_down_is_one_connect_error_naming_each() {
    let (a, b) = (refusing_addr().await, refusing_addr().await);
    let c = client_of(&[a, b], Duration::from_secs(2), Duration::from_secs(30));
    for _ in 0..2 {
        // Down nodes are still tried when no node is up.
        let e = c.ping().await.unwrap_err();
        let ClientError::Connect(m) = &e else {
            panic!("{e:?}")
        };
        assert!(
            m.contains(&a.to_string()) && m.contains(&b.to_string()),
            "{m}"
        );
        assert!(e.is_retryable());
    }
    let none = client_of(&[], Duration::from_secs(2), Duration::from_secs(30));
    assert_eq!(
        none.ping().await,
        Err(ClientError::Connect("no node address given".into()))
    );
}

/// A node that read a request and closed the connection without an answer may have decided
/// it (it crashed after its commit, say): the request is sent again only to the same node,
/// never to another one, where it would be spent twice.
#[tokio::test]
async fn a_request_the_node_read_then_dropped_is_not_sent_to_another_node() {
    let second = node(|_| {}).await;
    let c = through_a_node_that_drops_its_next_request(second).await;
    let e = c.throttle("twice", 15, 30, 60, 1).await.unwrap_err();
    assert!(matches!(e, ClientError::Io(_)), "{e:?}");
    // Nothing was spent on the second node.
    let peek = client(second, 1)
        .throttle("twice", 15, 30, 60, 0)
        .await
        .unwrap();
    assert_eq!(peek.remaining, 16);
}

/// A client of two nodes, `second` and before it one that answers one PING on one
/// connection (which the client has pooled: the PING is sent here), then reads the next
/// request, closes the connection without an answer and stops listening (it crashed after
/// reading it).
async fn through_a_node_that_drops_its_next_request(second: SocketAddr) -> Client {
    let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut listener = listener;
        let (mut s, _) = listener.accept().await.unwrap();
        drop(listener);
        let mut buf = vec![0u8; 1024];
        let _ = s.read(&mut buf).await;
        tokio::io::AsyncWriteExt::write_all(&mut s, b"+PONG\r\n")
            .await
            .unwrap();
        let _ = s.read(&mut buf).await;
    });
    let c = client_of(
        &[addr, second],
        Duration::from_secs(2),
        Duration::from_secs(30),
    );
    c.ping().await.unwrap();
    c
}

/// Sends a check of `alice` with a request id through `c` (whose first node will not
/// decide it), and asserts that it was admitted, on `second`.
async fn goes_to(c: &Client, second: SocketAddr) {
    let a = c
        .check(&[("login", "alice", 1)], Some("r-1"))
        .await
        .unwrap();
    assert!(a.allowed, "{a:?}");
    let peek = client(second, 1).peek("login", "alice").await.unwrap();
    assert_eq!(peek.items[0].remaining, 4, "decided on the second node");
}

/// The other side: a check with a request id that a node read and dropped goes on to the
/// next node within the same call, since a cluster answers a repeated id with its first
/// answer whichever member is asked. A check without an id does not, also one of a limit
/// named `ID`, the id keyword's name (as `CL.THROTTLE` above).
#[tokio::test]
async fn a_check_with_a_request_id_the_node_read_then_dropped_goes_to_the_next_node() {
    let second = node(|_| {}).await;
    let c = through_a_node_that_drops_its_next_request(second).await;
    goes_to(&c, second).await;

    let c = through_a_node_that_drops_its_next_request(second).await;
    let e = c.check(&[("ID", "alice", 1)], None).await.unwrap_err();
    assert!(matches!(e, ClientError::Io(_)), "{e:?}");
}

/// A node removed from its cluster answers PING, and every other request with
/// `-NOTMEMBER` (as `quorate node` does once it knows of its removal).
async fn removed_node() -> SocketAddr {
    fake_node(|read| {
        Some(if read.windows(4).any(|w| w == b"PING") {
            b"+PONG\r\n"
        } else {
            b"-NOTMEMBER this node was removed from the cluster (shard 0): send to a member\r\n"
        })
    })
    .await
}

/// A removed node's refusal: the node is passed over; a check with a request id goes on
/// to the next node within the call, one without is answered with the error (it could
/// have been decided in part) and the next call goes to the next node.
#[tokio::test]
async fn a_removed_node_is_passed_over() {
    let (removed, second) = (removed_node().await, node(|_| {}).await);
    let of_both = || {
        client_of(
            &[removed, second],
            Duration::from_secs(2),
            Duration::from_secs(30),
        )
    };
    let c = of_both();
    c.ping().await.unwrap();
    goes_to(&c, second).await;

    let c = of_both();
    c.ping().await.unwrap();
    let e = c.check(&[("login", "bob", 1)], None).await.unwrap_err();
    assert!(
        matches!(&e, ClientError::NotMember(m) if m.contains("removed")) && e.is_retryable(),
        "{e:?}"
    );
    let b = c.check(&[("login", "bob", 1)], None).await.unwrap();
    assert_eq!(b.items[0].remaining, 4, "{b:?}");
    // A client of that node alone gets the error, every time.
    let alone = client(removed, 1);
    for _ in 0..2 {
        let e = alone.check(&[("login", "carol", 1)], Some("r-2")).await;
        assert!(matches!(e, Err(ClientError::NotMember(_))), "{e:?}");
    }
}

#[tokio::test]
async fn a_node_at_its_connection_cap_passes_the_call_to_the_next() {
    let first = node(|c| c.max_connections = 1).await;
    let second = node(|_| {}).await;
    // Another client holds the first node's only connection.
    let other = client(first, 1);
    other.ping().await.unwrap();
    let c = client_of(
        &[first, second],
        Duration::from_secs(2),
        Duration::from_secs(30),
    );
    assert_eq!(
        c.throttle("cap", 15, 30, 60, 1).await.unwrap().remaining,
        15
    );
    assert_eq!(
        c.throttle("cap", 15, 30, 60, 1).await.unwrap().remaining,
        14
    );
    // The first node's bucket is untouched.
    assert_eq!(
        other
            .throttle("cap", 15, 30, 60, 1)
            .await
            .unwrap()
            .remaining,
        15
    );
    // A client of that node alone is told to try again (nothing was decided).
    let e = client(first, 1).ping().await.unwrap_err();
    assert!(
        matches!(e, ClientError::Unavailable(_)) && e.is_retryable(),
        "{e:?}"
    );
}

//! The peer transport over real loopback sockets: correlation, timeouts, reconnects,
//! authentication and hostile input.

use futures::future::join_all;
use futures::FutureExt;
use quorate::net::tcp::{TcpConnector, TcpListener};
use quorate::net::{Connector, Listener};
use quorate::peer::frame::{Frame, Kind};
use quorate::peer::handshake::{self, MAGIC, VERSION};
use quorate::peer::{Handler, Nonces, PeerConfig, PeerError, PeerServer, PeerStats, Peers};
use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[path = "support/sockets.rs"]
mod sockets;

/// Records the largest single allocation, to show an announced frame size is never allocated.
struct Largest;
static LARGEST: AtomicUsize = AtomicUsize::new(0);
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        System.realloc(p, l, new)
    }
}
#[global_allocator]
static ALLOC: Largest = Largest;

const SECRET: &[u8] = b"a 32-byte cluster secret (test).";
const SERVER: u64 = 2;
const CLIENT: u64 = 1;
const LONG: Duration = Duration::from_secs(10);

fn cfg(id: u64, secret: &[u8]) -> PeerConfig {
    let mut c = PeerConfig::new(id, secret.to_vec());
    c.handshake_timeout = Duration::from_secs(1);
    c.handler_timeout = Duration::from_secs(5);
    c.ping_interval = Duration::from_millis(100);
    c.idle_timeout = Duration::from_secs(1);
    c.reconnect_backoff_min = Duration::from_millis(20);
    c.reconnect_backoff_max = Duration::from_millis(100);
    c
}

/// Replies `"{from}:{body}"`, sleeping first for as many milliseconds as a body starting with
/// `sleep N ` asks; counts every invocation.
fn handler(calls: Arc<AtomicU64>) -> Handler {
    Arc::new(move |from, body: Vec<u8>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let text = String::from_utf8(body).map_err(|e| e.to_string())?;
            if let Some(rest) = text.strip_prefix("sleep ") {
                let ms: u64 = rest.split(' ').next().unwrap().parse().unwrap();
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if text == "panic" {
                panic!("the test handler was asked to panic");
            }
            if text == "fail" {
                return Err("asked to fail".to_string());
            }
            Ok(format!("{from}:{text}").into_bytes())
        }
        .boxed()
    })
}

struct Server {
    addr: SocketAddr,
    stats: Arc<PeerStats>,
    calls: Arc<AtomicU64>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(cfg: PeerConfig) -> Server {
        Server::start_on("127.0.0.1:0".parse().unwrap(), cfg).await
    }

    async fn start_on(addr: SocketAddr, cfg: PeerConfig) -> Server {
        let listener = TcpListener::bind(addr).await.unwrap();
        Server::serve(listener, cfg, Nonces::from_seed([7; 32]), |s| s)
    }

    /// A server (made what `attach` makes of it) serving on `listener`, counting its calls.
    fn serve(
        listener: TcpListener,
        cfg: PeerConfig,
        nonces: Nonces,
        attach: impl FnOnce(PeerServer) -> PeerServer,
    ) -> Server {
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let server = attach(PeerServer::new(cfg, handler(calls.clone()), nonces));
        let stats = server.stats();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(listener, async move {
            let _ = stopped.await;
        }));
        Server {
            addr,
            stats,
            calls,
            stop: Some(stop),
            task,
        }
    }

    async fn kill(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }
}

fn peers(cfg: PeerConfig, server: SocketAddr) -> Peers<TcpConnector> {
    Peers::new(
        cfg,
        TcpConnector,
        [(SERVER, server)],
        Nonces::from_seed([1; 32]),
    )
    .unwrap()
}

fn get(c: &AtomicU64) -> u64 {
    PeerStats::get(c)
}

/// Waits until `cond` holds, up to five seconds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_call_gets_its_handlers_reply_and_the_handler_learns_the_caller() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    assert_eq!(p.call(SERVER, b"hi".to_vec(), LONG).await.unwrap(), b"1:hi");
    assert_eq!(
        p.call(SERVER, b"fail".to_vec(), LONG).await,
        Err(PeerError::Remote {
            peer: SERVER,
            message: "asked to fail".into()
        })
    );
    assert_eq!(s.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_calls_share_one_connection_and_each_gets_its_own_reply() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    // Varied sleeps make the replies come back out of order.
    let calls = (0..1000u32).map(|i| {
        let p = p.clone();
        async move {
            let body = format!("sleep {} #{i}", (i * 7919) % 50);
            let reply = p.call(SERVER, body.clone().into_bytes(), LONG).await;
            (body, reply)
        }
    });
    for (body, reply) in join_all(calls).await {
        assert_eq!(reply.unwrap(), format!("1:{body}").into_bytes());
    }
    assert_eq!(get(&s.stats.authenticated), 1, "one connection for all");
    assert_eq!(s.calls.load(Ordering::SeqCst), 1000);
}

#[tokio::test]
async fn a_call_to_a_slow_handler_times_out_and_the_connection_serves_the_next_call() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    let t = Duration::from_millis(200);
    assert_eq!(
        p.call(SERVER, b"sleep 3000 ".to_vec(), t).await,
        Err(PeerError::Timeout {
            peer: SERVER,
            after: t
        })
    );
    assert_eq!(
        p.call(SERVER, b"quick".to_vec(), t).await.unwrap(),
        b"1:quick"
    );
    assert_eq!(
        get(&s.stats.authenticated),
        1,
        "the timeout kept the connection"
    );
}

#[tokio::test]
async fn a_handler_running_past_the_servers_limit_is_answered_as_a_remote_error() {
    let mut c = cfg(SERVER, SECRET);
    c.handler_timeout = Duration::from_millis(100);
    let s = Server::start(c).await;
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    match p.call(SERVER, b"sleep 2000 ".to_vec(), LONG).await {
        Err(PeerError::Remote { message, .. }) => assert!(message.contains("did not finish")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_panicking_handler_is_answered_as_a_remote_error_and_the_server_goes_on() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    match p.call(SERVER, b"panic".to_vec(), LONG).await {
        Err(PeerError::Remote { message, .. }) => assert!(message.contains("panicked")),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.call(SERVER, b"ok".to_vec(), LONG).await.unwrap(), b"1:ok");
}

#[tokio::test]
async fn pending_calls_fail_when_the_server_dies_then_fail_fast_then_work_after_restart() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let addr = s.addr;
    let p = peers(cfg(CLIENT, SECRET), addr);
    let pending: Vec<_> = (0..5)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move { p.call(SERVER, b"sleep 60000 ".to_vec(), LONG).await })
        })
        .collect();
    let calls = s.calls.clone();
    until("the handlers to start", || {
        calls.load(Ordering::SeqCst) == 5
    })
    .await;
    s.kill().await;
    for call in pending {
        let r = tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .expect("a pending call ends when its connection dies")
            .unwrap();
        assert_eq!(r, Err(PeerError::ConnectionLost { peer: SERVER }));
    }
    // Down: each call fails at once rather than waiting out its timeout.
    for _ in 0..3 {
        let r = tokio::time::timeout(
            Duration::from_millis(500),
            p.call(SERVER, b"x".to_vec(), LONG),
        )
        .await
        .expect("fails fast");
        assert!(matches!(r, Err(PeerError::Unreachable { .. })), "{r:?}");
    }
    let s = Server::start_on(addr, cfg(SERVER, SECRET)).await;
    let mut answered = None;
    for _ in 0..100 {
        match p.call(SERVER, b"again".to_vec(), LONG).await {
            Ok(r) => {
                answered = Some(r);
                break;
            }
            Err(PeerError::Unreachable { .. }) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(answered.expect("reconnected after the restart"), b"1:again");
    assert_eq!(get(&s.stats.authenticated), 1);
}

#[tokio::test]
async fn a_client_with_the_wrong_secret_is_refused_and_never_reaches_the_handler() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let p = peers(cfg(CLIENT, b"not the cluster secret, at all"), s.addr);
    let r = p.call(SERVER, b"x".to_vec(), LONG).await;
    assert!(matches!(r, Err(PeerError::Auth { .. })), "{r:?}");
    let stats = s.stats.clone();
    until("the failure to be counted", || {
        get(&stats.handshake_failures) == 1
    })
    .await;
    assert_eq!(get(&s.stats.authenticated), 0);
    assert_eq!(s.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_server_with_the_wrong_secret_is_refused_by_the_client() {
    let s = Server::start(cfg(SERVER, b"not the cluster secret, at all")).await;
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    let r = p.call(SERVER, b"x".to_vec(), LONG).await;
    assert!(matches!(r, Err(PeerError::Auth { .. })), "{r:?}");
    assert_eq!(s.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_peer_without_the_secret_cannot_get_a_request_handled_by_guessing_the_proof() {
    // Speaks the protocol by hand, sends a wrong proof, then a request anyway.
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let mut sock = TcpConnector.connect(s.addr).await.unwrap();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&VERSION.to_be_bytes());
    hello.extend_from_slice(&CLIENT.to_be_bytes());
    // No data id (16 zero bytes), then the nonce.
    hello.extend_from_slice(&[0; 16]);
    hello.extend_from_slice(&[9; 32]);
    sock.write_all(&hello).await.unwrap();
    // magic, version, id, data id, nonce, MAC.
    let mut reply = [0u8; 4 + 2 + 8 + 16 + 32 + 32];
    sock.read_exact(&mut reply).await.unwrap();
    // A proof of zeros (its MAC and its knock), then a frame.
    let mut attack = vec![0u8; 32 + 8];
    Frame::new(Kind::Request, 1, b"x".to_vec()).encode_into(&mut attack);
    let _ = sock.write_all(&attack).await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), sock.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the server closes the connection");
    assert!(rest.is_empty(), "no acceptance, no reply: {rest:?}");
    let stats = s.stats.clone();
    until("the failure to be counted", || {
        get(&stats.handshake_failures) == 1
    })
    .await;
    assert_eq!(s.calls.load(Ordering::SeqCst), 0);
    assert_eq!(get(&s.stats.authenticated), 0);
}

#[tokio::test]
async fn an_oversized_frame_closes_its_connection_without_allocating_and_others_go_on() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let mut sock = TcpConnector.connect(s.addr).await.unwrap();
    handshake::client(&mut sock, &cfg(CLIENT, SECRET), SERVER, [3; 32], 0)
        .await
        .unwrap();
    sock.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    sock.write_all(&[Kind::Request as u8, 0, 0, 0, 0, 0, 0, 0, 1])
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_millis(500), sock.read_to_end(&mut rest)).await;
    assert!(
        LARGEST.load(Ordering::Relaxed) < 1 << 30,
        "largest allocation {}",
        LARGEST.load(Ordering::Relaxed)
    );
    assert!(read.is_ok(), "closed at once, not after the idle timeout");
    assert!(rest.is_empty());
    assert_eq!(get(&s.stats.protocol_errors), 1);
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    assert_eq!(
        p.call(SERVER, b"still".to_vec(), LONG).await.unwrap(),
        b"1:still"
    );
    assert_eq!(s.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn another_protocol_before_the_handshake_is_closed() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let mut sock = TcpConnector.connect(s.addr).await.unwrap();
    sock.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_millis(500), sock.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "closed at once, not after the handshake timeout"
    );
    assert!(rest.is_empty());
    assert_eq!(get(&s.stats.handshake_failures), 1);
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_handshake_timeout() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let mut sock = TcpConnector.connect(s.addr).await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), sock.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "an unauthenticated peer cannot hold a connection"
    );
    assert_eq!(get(&s.stats.handshake_failures), 1);
}

/// A host without the secret that opens connections and never authenticates holds at most
/// `max_handshakes_per_addr` of the server's slots: the peers still get in.
#[tokio::test]
async fn connections_that_never_authenticate_from_one_address_keep_no_peer_out() {
    let mut c = cfg(SERVER, SECRET);
    c.max_connections = 6;
    c.max_handshakes_per_addr = 4;
    c.handshake_timeout = Duration::from_secs(5);
    let s = Server::start(c).await;
    // Twenty silent connections from 127.0.0.2 (another loopback address than the peer's).
    let mut silent = Vec::new();
    for _ in 0..20 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        silent.push(socket.connect(s.addr).await.unwrap());
    }
    let stats = s.stats.clone();
    until("the connections past four to be refused", || {
        get(&stats.handshakes_refused) == 16
    })
    .await;
    // The refused ones are closed at once, the four others wait in the handshake.
    let mut closed = 0;
    for sock in &mut silent {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0)) =
            tokio::time::timeout(Duration::from_millis(50), sock.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 16);
    // A peer (from 127.0.0.1) takes a fifth slot of six and is served.
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    assert_eq!(p.call(SERVER, b"hi".to_vec(), LONG).await.unwrap(), b"1:hi");
    assert_eq!(get(&s.stats.connections_rejected), 0);
    assert_eq!(get(&s.stats.authenticated), 1);
}

#[tokio::test]
async fn a_peer_claiming_the_servers_own_id_or_an_unknown_id_is_refused() {
    let mut c = cfg(SERVER, SECRET);
    c.members = Some(Arc::from(vec![1, 2, 3]));
    let s = Server::start(c).await;
    for claimed in [SERVER, 9] {
        let p = peers(cfg(claimed, SECRET), s.addr);
        let r = p.call(SERVER, b"x".to_vec(), LONG).await;
        assert_eq!(
            r,
            Err(PeerError::Refused { peer: SERVER }),
            "claiming {claimed}"
        );
    }
    assert_eq!(get(&s.stats.handshake_failures), 2);
    assert_eq!(s.calls.load(Ordering::SeqCst), 0);
    // A member is let in.
    let p = peers(cfg(3, SECRET), s.addr);
    assert_eq!(p.call(SERVER, b"x".to_vec(), LONG).await.unwrap(), b"3:x");
}

#[tokio::test]
async fn a_node_at_the_wrong_address_is_not_trusted_as_the_one_dialed() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let p = Peers::new(
        cfg(CLIENT, SECRET),
        TcpConnector,
        [(3, s.addr)],
        Nonces::from_seed([1; 32]),
    )
    .unwrap();
    let r = p.call(3, b"x".to_vec(), LONG).await;
    assert!(matches!(r, Err(PeerError::Auth { peer: 3, .. })), "{r:?}");
    assert_eq!(s.calls.load(Ordering::SeqCst), 0);
}

/// `n` calls of `body` to the server, each in a task of its own.
fn spawn_calls(
    p: &Peers<TcpConnector>,
    n: usize,
    body: &'static [u8],
) -> Vec<JoinHandle<Result<Vec<u8>, PeerError>>> {
    (0..n)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move { p.call(SERVER, body.to_vec(), LONG).await })
        })
        .collect()
}

#[tokio::test]
async fn calls_beyond_the_in_flight_limit_fail_as_overloaded() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let mut c = cfg(CLIENT, SECRET);
    c.max_in_flight = 2;
    let p = peers(c, s.addr);
    let slow = spawn_calls(&p, 2, b"sleep 500 ");
    let calls = s.calls.clone();
    until("both slow calls to run", || {
        calls.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(
        p.call(SERVER, b"x".to_vec(), LONG).await,
        Err(PeerError::Overloaded {
            peer: SERVER,
            limit: 2
        })
    );
    for c in slow {
        c.await.unwrap().unwrap();
    }
    // The slots are free again.
    p.call(SERVER, b"x".to_vec(), LONG).await.unwrap();
}

#[tokio::test]
async fn requests_beyond_the_servers_concurrency_are_answered_busy() {
    let mut c = cfg(SERVER, SECRET);
    c.max_concurrent_requests = 1;
    let s = Server::start(c).await;
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    let slow = {
        let p = p.clone();
        tokio::spawn(async move { p.call(SERVER, b"sleep 500 ".to_vec(), LONG).await })
    };
    let calls = s.calls.clone();
    until("the slow call to run", || calls.load(Ordering::SeqCst) == 1).await;
    assert_eq!(
        p.call(SERVER, b"x".to_vec(), LONG).await,
        Err(PeerError::Busy { peer: SERVER })
    );
    slow.await.unwrap().unwrap();
    assert_eq!(get(&s.stats.busy), 1);
}

/// Bulk here: the slow requests (a node's forwarded checks in a cluster).
fn sleepy(body: &[u8]) -> bool {
    body.starts_with(b"sleep")
}

#[tokio::test]
async fn bulk_requests_cannot_take_the_servers_room_for_the_others() {
    let mut c = cfg(SERVER, SECRET);
    c.max_concurrent_requests = 3;
    c.max_bulk_requests = 2;
    c.is_bulk = Some(sleepy);
    let s = Server::start(c).await;
    let p = peers(cfg(CLIENT, SECRET), s.addr);
    let slow = spawn_calls(&p, 3, b"sleep 2000 ");
    let (calls, stats) = (s.calls.clone(), s.stats.clone());
    until(
        "two slow requests to run and the third to be answered busy",
        || calls.load(Ordering::SeqCst) == 2 && get(&stats.busy) == 1,
    )
    .await;
    // The slow ones still run: a request that is not bulk has room.
    assert_eq!(
        p.call(SERVER, b"x".to_vec(), LONG).await.unwrap(),
        format!("{CLIENT}:x").into_bytes()
    );
    let mut busy = 0;
    for c in slow {
        match c.await.unwrap() {
            Ok(_) => {}
            Err(PeerError::Busy { peer: SERVER }) => busy += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(busy, 1);
}

#[tokio::test]
async fn bulk_calls_beyond_their_share_of_the_in_flight_limit_fail_as_overloaded() {
    let s = Server::start(cfg(SERVER, SECRET)).await;
    let mut c = cfg(CLIENT, SECRET);
    c.max_in_flight = 3;
    c.max_bulk_in_flight = 2;
    c.is_bulk = Some(sleepy);
    let p = peers(c, s.addr);
    let slow = spawn_calls(&p, 2, b"sleep 1000 ");
    let calls = s.calls.clone();
    until("both slow calls to run", || {
        calls.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(
        p.call(SERVER, b"sleep 0 ".to_vec(), LONG).await,
        Err(PeerError::Overloaded {
            peer: SERVER,
            limit: 2
        })
    );
    // A call that is not bulk still has room.
    p.call(SERVER, b"x".to_vec(), LONG).await.unwrap();
    for c in slow {
        c.await.unwrap().unwrap();
    }
    // The bulk share is free again.
    p.call(SERVER, b"sleep 0 ".to_vec(), LONG).await.unwrap();
}

#[test]
fn bulk_limits_must_leave_room_for_the_other_requests() {
    let mut c = cfg(CLIENT, SECRET);
    assert!(c.validate().is_ok());
    c.is_bulk = Some(sleepy);
    assert!(c.validate().is_ok());
    c.max_bulk_requests = c.max_concurrent_requests;
    let e = c.validate().unwrap_err();
    assert!(e.contains("max_bulk_requests"), "{e}");
    c.max_bulk_requests = 1;
    c.max_bulk_in_flight = 0;
    assert!(c.validate().is_err());
    c.is_bulk = None;
    assert!(
        c.validate().is_ok(),
        "without bulk requests the limits do not apply"
    );
}

#[tokio::test]
async fn a_body_over_the_frame_limit_is_refused_before_sending() {
    let mut c = cfg(CLIENT, SECRET);
    c.max_frame = 1024;
    // Nothing listens there: the refusal happens before any dial.
    let p = peers(c, "127.0.0.1:9".parse().unwrap());
    let r = p.call(SERVER, vec![0; 1024], LONG).await;
    assert!(
        matches!(r, Err(PeerError::TooLarge { len: 1024, .. })),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_connection_that_goes_silent_fails_its_calls_after_the_idle_timeout() {
    // A fake server that authenticates, then neither reads nor answers: a partition.
    let mut listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        handshake::server(&mut sock, &cfg(SERVER, SECRET), [5; 32], |_| false)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(sock);
    });
    let p = peers(cfg(CLIENT, SECRET), addr);
    let r = tokio::time::timeout(Duration::from_secs(5), p.call(SERVER, b"x".to_vec(), LONG))
        .await
        .expect("the idle timeout (1 s) ends the call, not the call's 10 s timeout");
    assert_eq!(r, Err(PeerError::ConnectionLost { peer: SERVER }));
    fake.abort();
}

#[test]
fn the_config_debug_output_hides_the_secret() {
    let text = format!("{:?}", cfg(1, SECRET));
    assert!(!text.contains("cluster secret"), "{text}");
    assert!(text.contains("<32 bytes>"), "{text}");
}

/// A whole node's transport: its `Peers` and its server, attached, on a listener of its own.
struct Node {
    peers: Peers<TcpConnector>,
    server: Server,
}

impl Node {
    /// Node `id` on `listener`, knowing `others` (id, peer address).
    fn start(id: u64, listener: TcpListener, others: &[(u64, SocketAddr)]) -> Node {
        let peers = Peers::new(
            cfg(id, SECRET),
            TcpConnector,
            others.iter().copied(),
            Nonces::from_seed([id as u8; 32]),
        )
        .unwrap();
        let nonces = Nonces::from_seed([id as u8 + 100; 32]);
        let server = Server::serve(listener, cfg(id, SECRET), nonces, |s| s.with_peers(&peers));
        Node { peers, server }
    }

    async fn call(&self, to: u64, body: &str) -> Result<Vec<u8>, PeerError> {
        self.peers.call(to, body.as_bytes().to_vec(), LONG).await
    }
}

async fn bind() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_pair_shares_one_connection_for_calls_both_ways() {
    let ((l1, a1), (l2, a2)) = (bind().await, bind().await);
    let one = Node::start(1, l1, &[(2, a2)]);
    let two = Node::start(2, l2, &[(1, a1)]);
    // The higher id first: it knocks, and node 1 dials it back. Its call is still running
    // when node 1 first calls node 2: had node 2 dialed a connection of its own, it would go
    // once node 1's arrived, failing the call.
    let two = Arc::new(two);
    let slow = {
        let two = two.clone();
        tokio::spawn(async move { two.call(1, "sleep 300 hello").await })
    };
    let handled = one.server.calls.clone();
    until("node 1 to run node 2's call", || get(&handled) == 1).await;
    assert_eq!(one.call(2, "hi").await.unwrap(), b"1:hi");
    assert_eq!(slow.await.unwrap().unwrap(), b"2:sleep 300 hello");
    let both = (0..200).map(|i| {
        let (from, to) = if i % 2 == 0 { (&one, 2) } else { (&*two, 1) };
        async move { (from.call(to, &format!("n{i}")).await, i) }
    });
    for (r, i) in join_all(both).await {
        let from = if i % 2 == 0 { 1 } else { 2 };
        assert_eq!(r.unwrap(), format!("{from}:n{i}").into_bytes());
    }
    assert_eq!(get(&one.server.calls), 101);
    assert_eq!(get(&two.server.calls), 101);
    // Node 2 accepted node 1's connection; node 1 accepted only the knock.
    assert_eq!(get(&two.server.stats.authenticated), 1);
    assert_eq!(get(&two.server.stats.dialed_back), 0);
    assert_eq!(get(&one.server.stats.authenticated), 1);
    assert_eq!(get(&one.server.stats.dialed_back), 1);
    let ports = [a1.port(), a2.port()];
    until("the knock's socket to close", || {
        sockets::established_to(&ports) == 1
    })
    .await;
    assert_eq!(sockets::established_to(&[a2.port()]), 1, "node 1 dialed it");
    // Still one after idle pings.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sockets::established_to(&ports), 1);
}

/// Stops `node` (its server and its connections) and starts node `id` afresh at `addr`.
async fn restart(node: Node, id: u64, addr: SocketAddr, others: &[(u64, SocketAddr)]) -> Node {
    node.server.kill().await;
    drop(node.peers);
    Node::start(id, TcpListener::bind(addr).await.unwrap(), others)
}

/// Calls until answered, through the errors of a peer that is reconnecting.
async fn answered(from: &Node, to: u64, body: &str) -> Vec<u8> {
    for _ in 0..100 {
        match from.call(to, body).await {
            Ok(r) => return r,
            Err(PeerError::Unreachable { .. } | PeerError::ConnectionLost { .. }) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("node {to} never answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_either_node_of_a_pair_restarts_calls_go_both_ways_on_one_new_connection() {
    let ((l1, a1), (l2, a2)) = (bind().await, bind().await);
    let ports = [a1.port(), a2.port()];
    let mut one = Node::start(1, l1, &[(2, a2)]);
    let mut two = Node::start(2, l2, &[(1, a1)]);
    assert_eq!(one.call(2, "a").await.unwrap(), b"1:a");
    assert_eq!(two.call(1, "b").await.unwrap(), b"2:b");
    // The higher id restarts, and calls first: it knocks (naming no connection: it has
    // taken none), and node 1, whose connection to the old node 2 ended with it, dials the
    // new one.
    two = restart(two, 2, a2, &[(1, a1)]).await;
    assert_eq!(answered(&two, 1, "c").await, b"2:c");
    assert_eq!(answered(&one, 2, "d").await, b"1:d");
    until("one connection", || sockets::established_to(&ports) == 1).await;
    assert_eq!(get(&two.server.stats.authenticated), 1);
    // The lower id restarts; node 2 calls first.
    one = restart(one, 1, a1, &[(2, a2)]).await;
    assert_eq!(answered(&two, 1, "e").await, b"2:e");
    assert_eq!(answered(&one, 2, "f").await, b"1:f");
    until("one connection", || sockets::established_to(&ports) == 1).await;
    assert_eq!(get(&one.server.stats.dialed_back), 1);
    // Node 2's handler answered "d" and "f", node 1's "e" (since its restart).
    assert_eq!((get(&two.server.calls), get(&one.server.calls)), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_node_whose_server_is_not_up_are_refused_as_not_acted_on() {
    let ((l1, a1), (l2, a2)) = (bind().await, bind().await);
    let two = Node::start(2, l2, &[(1, a1)]);
    // Node 1's Peers dial node 2 before node 1's server runs (a member's groups start
    // before its server): node 2's calls on that connection are refused, not failed.
    let peers = Peers::new(
        cfg(1, SECRET),
        TcpConnector,
        [(2, a2)],
        Nonces::from_seed([1; 32]),
    )
    .unwrap();
    assert_eq!(
        peers.call(2, b"x".to_vec(), LONG).await.unwrap(),
        b"1:x".to_vec()
    );
    let r = two.call(1, "early").await;
    assert_eq!(r, Err(PeerError::Busy { peer: 1 }));
    // Its server up, the same connection answers.
    let nonces = Nonces::from_seed([101; 32]);
    let one = Node {
        server: Server::serve(l1, cfg(1, SECRET), nonces, |s| s.with_peers(&peers)),
        peers,
    };
    assert_eq!(two.call(1, "now").await.unwrap(), b"2:now");
    assert_eq!(
        get(&one.server.stats.authenticated),
        0,
        "no knock was needed"
    );
    // Its server stopped, that connection goes with it: node 2's calls find nobody (not
    // a refusal from a node that is still there, nor a failure after acting).
    one.server.kill().await;
    let r = answered_or(&two, 1).await;
    assert!(matches!(r, PeerError::Unreachable { .. }), "{r:?}");
}

/// The first error of a call that is not the loss of a connection (which a retry follows).
async fn answered_or(from: &Node, to: u64) -> PeerError {
    for _ in 0..100 {
        match from.call(to, "x").await {
            Err(PeerError::ConnectionLost { .. }) => {}
            Err(e) => return e,
            Ok(r) => panic!("answered: {r:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("every call lost its connection");
}

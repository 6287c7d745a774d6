//! The RESP API end to end: a node served in-process on loopback, spoken to in raw bytes,
//! every reply checked byte by byte where it is deterministic.

use bytes::BytesMut;
use quorate::api::resp::decode::parse_reply;
use quorate::api::resp::{serve, Frame, Limits};
use quorate::clock::{ManualClock, SharedClock, SystemClock};
use quorate::config::NodeConfig;
use quorate::net::tcp::TcpListener;
use quorate::net::Listener;
use quorate::policy::PolicySet;
use quorate::service::Service;
use quorate::shard::route::Sharding;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(5);

struct Node {
    addr: SocketAddr,
    service: Service,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Node {
    async fn start(tweak: impl FnOnce(&mut NodeConfig)) -> Node {
        Node::start_with(PolicySet::default_policies(), tweak).await
    }

    async fn start_with(policies: PolicySet, tweak: impl FnOnce(&mut NodeConfig)) -> Node {
        Node::start_on(policies, Arc::new(SystemClock::new()), tweak).await
    }

    async fn start_on(
        policies: PolicySet,
        clock: SharedClock,
        tweak: impl FnOnce(&mut NodeConfig),
    ) -> Node {
        let mut config = NodeConfig {
            http_addr: "127.0.0.1:0".parse().unwrap(),
            resp_addr: "127.0.0.1:0".parse().unwrap(),
            ..NodeConfig::default()
        };
        tweak(&mut config);
        let service = Service::start(config, policies, clock).await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, service.clone(), async {
            let _ = stopped.await;
        }));
        Node {
            addr,
            service,
            stop: Some(stop),
            task,
        }
    }

    async fn connect(&self) -> Raw {
        Raw {
            stream: TcpStream::connect(self.addr).await.unwrap(),
            buf: BytesMut::new(),
        }
    }

    fn bad_requests(&self, reason: &str) -> u64 {
        self.service
            .metrics()
            .bad_requests
            .with_label_values(&["resp", reason])
            .get()
    }
}

/// A client speaking raw bytes.
struct Raw {
    stream: TcpStream,
    buf: BytesMut,
}

impl Raw {
    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Reads until at least `n` bytes are buffered (or the peer closes).
    async fn fill(&mut self, n: usize) {
        while self.buf.len() < n {
            let read = tokio::time::timeout(WAIT, self.stream.read_buf(&mut self.buf))
                .await
                .expect("reply within 5 s")
                .unwrap_or(0);
            if read == 0 {
                break;
            }
        }
    }

    /// The next bytes must be exactly `want`.
    async fn expect(&mut self, want: &[u8]) {
        self.fill(want.len()).await;
        let got = self.buf.split_to(self.buf.len().min(want.len()));
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(want),
            "reply differs"
        );
    }

    /// Sends `request`, expects exactly `reply`.
    async fn roundtrip(&mut self, request: &str, reply: &str) {
        self.send(request.as_bytes()).await;
        self.expect(reply.as_bytes()).await;
    }

    /// The next reply, decoded.
    async fn frame(&mut self) -> Frame {
        let limits = Limits::from_max_frame_bytes(1 << 20);
        loop {
            if let Some(f) = parse_reply(&mut self.buf, &limits).unwrap() {
                return f;
            }
            let before = self.buf.len();
            self.fill(before + 1).await;
            assert!(
                self.buf.len() > before,
                "connection closed before a whole reply"
            );
        }
    }

    /// The server must close the connection, having sent nothing more.
    async fn expect_closed(&mut self) {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(WAIT, self.stream.read_to_end(&mut rest))
            .await
            .expect("closed within 5 s");
        // A reset after the close is a close too.
        let _ = read;
        assert!(
            self.buf.is_empty() && rest.is_empty(),
            "unexpected bytes before close: {:?}{:?}",
            self.buf,
            String::from_utf8_lossy(&rest)
        );
    }
}

/// A request as an array of bulk strings, as redis-cli sends it.
fn cmd(line: &str) -> String {
    let args: Vec<&str> = line.split(' ').collect();
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    out
}

fn throttle_reply(limited: u8, limit: u64, remaining: u64, retry: i64, reset: u64) -> String {
    format!("*5\r\n:{limited}\r\n:{limit}\r\n:{remaining}\r\n:{retry}\r\n:{reset}\r\n")
}

fn int(f: &Frame) -> i64 {
    match f {
        Frame::Integer(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

fn array(f: Frame) -> Vec<Frame> {
    match f {
        Frame::Array(items) => items,
        other => panic!("not an array: {other:?}"),
    }
}

// ---- Rate limiting (these need the real service) ----

#[tokio::test]
async fn cl_throttle_answers_exactly_like_redis_cell_until_limited() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(
        &cmd("CL.THROTTLE user123 15 30 60"),
        "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n",
    )
    .await;
    for i in 2..=16u64 {
        let want = throttle_reply(0, 16, 16 - i, -1, 2 * i);
        c.roundtrip(&cmd("CL.THROTTLE user123 15 30 60"), &want)
            .await;
    }
    // The burst is spent: limited, retry after one emission interval (2 s), reset after 32 s.
    c.roundtrip(
        &cmd("CL.THROTTLE user123 15 30 60"),
        &throttle_reply(1, 16, 0, 2, 32),
    )
    .await;
}

#[tokio::test]
async fn cl_throttle_as_an_inline_command_answers_the_same() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(
        "CL.THROTTLE inline-key 15 30 60\r\n",
        "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n",
    )
    .await;
    c.roundtrip(
        "cl.throttle inline-key 15 30 60 2\n",
        &throttle_reply(0, 16, 13, -1, 6),
    )
    .await;
}

#[tokio::test]
async fn a_quantity_above_the_burst_is_limited_with_retry_minus_one() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(
        &cmd("CL.THROTTLE big 15 30 60 17"),
        &throttle_reply(1, 16, 16, -1, 0),
    )
    .await;
    // Nothing was spent.
    c.roundtrip(
        &cmd("CL.THROTTLE big 15 30 60 16"),
        &throttle_reply(0, 16, 0, -1, 32),
    )
    .await;
}

#[tokio::test]
async fn quantity_zero_peeks_without_spending() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(
        &cmd("CL.THROTTLE p 15 30 60 0"),
        &throttle_reply(0, 16, 16, -1, 0),
    )
    .await;
    c.roundtrip(
        &cmd("CL.THROTTLE p 15 30 60"),
        &throttle_reply(0, 16, 15, -1, 2),
    )
    .await;
    c.roundtrip(
        &cmd("CL.THROTTLE p 15 30 60 0"),
        &throttle_reply(0, 16, 15, -1, 2),
    )
    .await;
}

#[tokio::test]
async fn cl_throttle_errors_name_the_argument_and_keep_the_connection() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(
        &cmd("CL.THROTTLE k 15 0 60"),
        "-ERR count must be a positive integer\r\n",
    )
    .await;
    c.roundtrip(
        &cmd("CL.THROTTLE k 15 30 0"),
        "-ERR period must be a positive integer (seconds)\r\n",
    )
    .await;
    c.roundtrip(
        &cmd("CL.THROTTLE k -1 30 60"),
        "-ERR max_burst must be an integer from 0 to 9223372036854775806\r\n",
    )
    .await;
    c.roundtrip(
        &cmd("CL.THROTTLE k 15 30 60 x"),
        "-ERR quantity must be a non-negative integer\r\n",
    )
    .await;
    c.roundtrip(
        &cmd("CL.THROTTLE k 15"),
        "-ERR wrong number of arguments for 'cl.throttle' command\r\n",
    )
    .await;
    c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    assert_eq!(node.bad_requests("invalid_argument"), 4);
    assert_eq!(node.bad_requests("wrong_arity"), 1);
}

#[tokio::test]
async fn cl_throttle_refused_by_the_policy_file_is_an_err_reply() {
    let policies = PolicySet::from_toml(
        "[limits.api]\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod = \"1s\"\n\n[inline]\nallow = false\n",
    )
    .unwrap();
    let node = Node::start_with(policies, |_| {}).await;
    let mut c = node.connect().await;
    c.send(cmd("CL.THROTTLE k 15 30 60").as_bytes()).await;
    match c.frame().await {
        Frame::Error(m) => assert!(m.starts_with("ERR "), "{m}"),
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(node.bad_requests("invalid_input"), 1);
}

#[tokio::test]
async fn qr_check_is_all_or_nothing() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    // login: 5 per minute, exact rolling window. Spend all 5 at once.
    c.roundtrip(
        &cmd("QR.CHECK login alice 5"),
        "*3\r\n:1\r\n:-1\r\n*9\r\n$5\r\nlogin\r\n$5\r\nalice\r\n:1\r\n:5\r\n:0\r\n:-1\r\n:60000\r\n:0\r\n:0\r\n",
    )
    .await;
    // api would admit, login denies: the whole check is denied...
    c.send(cmd("QR.CHECK api alice 1 login alice 1").as_bytes())
        .await;
    let reply = array(c.frame().await);
    assert_eq!(reply.len(), 4);
    assert_eq!(int(&reply[0]), 0);
    assert_eq!(
        int(&reply[1]),
        60,
        "retry after the oldest login leaves the window"
    );
    let login = array(reply[3].clone());
    assert_eq!(login[0], Frame::bulk("login"));
    assert_eq!(int(&login[2]), 0);
    assert!((59_000..=60_000).contains(&int(&login[5])), "{login:?}");
    // ...and api was not spent.
    c.roundtrip(
        &cmd("QR.PEEK api alice"),
        "*3\r\n:1\r\n:-1\r\n*9\r\n$3\r\napi\r\n$5\r\nalice\r\n:1\r\n:200\r\n:200\r\n:-1\r\n:0\r\n:0\r\n:0\r\n",
    )
    .await;
}

#[tokio::test]
async fn an_item_answered_by_on_unavailable_is_marked_as_a_fallback() {
    // A key cap of one: the second key is answered by `login`'s `on_unavailable` (deny).
    let node = Node::start(|c| {
        c.max_keys = 1;
        c.shards = 1;
    })
    .await;
    let mut c = node.connect().await;
    for (key, allowed, fallback) in [("alice", 1, 0), ("bob", 0, 1)] {
        c.send(cmd(&format!("QR.CHECK login {key} 1")).as_bytes())
            .await;
        let reply = array(c.frame().await);
        let item = array(reply[2].clone());
        assert_eq!(item.len(), 9, "{item:?}");
        assert_eq!((int(&item[2]), int(&item[7])), (allowed, fallback), "{key}");
    }
}

/// A shadow limit's item says so (its ninth field): its denial is reported, and the check
/// admits; a limit that is not shadow says 0.
#[tokio::test]
async fn a_shadow_items_denial_is_marked_and_the_check_admits() {
    let policies = PolicySet::from_toml(
        "[limits.api]\nalgorithm = \"fixed_window\"\nlimit = 10\nperiod = \"1m\"\n\n\
         [limits.trial]\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1m\"\nshadow = true\n",
    )
    .unwrap();
    let node = Node::start_with(policies, |_| {}).await;
    let mut c = node.connect().await;
    // (check allowed, trial's allowed, trial's shadow flag, api's shadow flag)
    for want in [(1, 1, 1, 0), (1, 0, 1, 0)] {
        c.send(cmd("QR.CHECK trial alice 1 api alice 1").as_bytes())
            .await;
        let reply = array(c.frame().await);
        let (trial, api) = (array(reply[2].clone()), array(reply[3].clone()));
        assert_eq!((trial.len(), api.len()), (9, 9), "{reply:?}");
        let got = (int(&reply[0]), int(&trial[2]), int(&trial[8]), int(&api[8]));
        assert_eq!(got, want, "{reply:?}");
    }
}

#[tokio::test]
async fn qr_check_of_a_cost_that_can_never_fit_says_minus_two() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.send(cmd("QR.CHECK login bob 6").as_bytes()).await;
    let reply = array(c.frame().await);
    assert_eq!((int(&reply[0]), int(&reply[1])), (0, -2));
    assert_eq!(int(&array(reply[2].clone())[5]), -2);
}

#[tokio::test]
async fn a_cost_beyond_i64_is_a_check_and_one_beyond_u64_says_it_does_not_fit() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.send(cmd("QR.CHECK login bob 18446744073709551615").as_bytes())
        .await;
    let reply = array(c.frame().await);
    assert_eq!((int(&reply[0]), int(&reply[1])), (0, -2));
    c.send(cmd("CL.THROTTLE k 15 30 60 9223372036854775808").as_bytes())
        .await;
    let reply = array(c.frame().await);
    assert_eq!((int(&reply[0]), int(&reply[3])), (1, -1));
    c.roundtrip(
        &cmd("QR.CHECK login bob 18446744073709551616"),
        "-ERR cost of item 1 does not fit an unsigned 64-bit integer \
         (0 to 18446744073709551615)\r\n",
    )
    .await;
}

#[tokio::test]
async fn qr_check_with_an_unknown_limit_is_an_err_reply_naming_it() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.send(cmd("QR.CHECK nope k 1").as_bytes()).await;
    match c.frame().await {
        Frame::Error(m) => assert!(m.starts_with("ERR unknown limit `nope`"), "{m}"),
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(node.bad_requests("unknown_limit"), 1);
    // A name may be as long as any argument over RESP; the error (and the log line) shows
    // its first 128 bytes, with its line breaks as spaces.
    let long = format!("a\nb{}", "x".repeat(60_000));
    c.send(cmd(&format!("QR.CHECK {long} k 1")).as_bytes())
        .await;
    match c.frame().await {
        Frame::Error(m) => {
            let shown = format!("a b{}", "x".repeat(125));
            assert!(
                m.starts_with(&format!("ERR unknown limit `{shown}`;")),
                "{m}"
            );
            assert!(m.len() < 400, "{} bytes", m.len());
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_repeated_request_id_gets_the_first_answer_and_spends_nothing_more() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    let first =
        "*3\r\n:1\r\n:-1\r\n*9\r\n$5\r\nlogin\r\n$4\r\ncarl\r\n:1\r\n:5\r\n:4\r\n:-1\r\n:60000\r\n:0\r\n:0\r\n";
    c.roundtrip(&cmd("QR.CHECK ID r-1 login carl 1"), first)
        .await;
    c.send(cmd("QR.CHECK ID r-1 login carl 1").as_bytes()).await;
    let again = array(c.frame().await);
    assert_eq!(int(&again[0]), 1);
    c.send(cmd("QR.PEEK login carl").as_bytes()).await;
    let peek = array(c.frame().await);
    assert_eq!(int(&array(peek[2].clone())[4]), 4, "still 4 remaining");
}

#[tokio::test]
async fn a_hundred_pipelined_checks_in_one_write_get_a_hundred_replies_in_order() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    let one = cmd("CL.THROTTLE pipe 99 1 60");
    c.send(one.repeat(100).as_bytes()).await;
    let want: String = (1..=100u64)
        .map(|i| throttle_reply(0, 100, 100 - i, -1, 60 * i))
        .collect();
    c.expect(want.as_bytes()).await;
    let latency = node
        .service
        .metrics()
        .decision_latency
        .with_label_values(&["resp"])
        .get_sample_count();
    assert_eq!(latency, 100);
}

// ---- The protocol and connection commands (no decision needed) ----

#[tokio::test]
async fn a_hundred_pipelined_commands_in_one_write_get_a_hundred_replies_in_order() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    let mut request = String::new();
    let mut want = String::new();
    for i in 0..100 {
        if i % 2 == 0 {
            request.push_str(&cmd(&format!("ECHO m{i}")));
            want.push_str(&format!("${}\r\nm{i}\r\n", format!("m{i}").len()));
        } else {
            request.push_str("PING\r\n");
            want.push_str("+PONG\r\n");
        }
    }
    c.send(request.as_bytes()).await;
    c.expect(want.as_bytes()).await;
}

#[tokio::test]
async fn connection_commands_answer_as_redis_does() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    c.roundtrip(&cmd("ping hello"), "$5\r\nhello\r\n").await;
    c.roundtrip(&cmd("ECHO hi"), "$2\r\nhi\r\n").await;
    c.roundtrip("ECHO \"two words\"\r\n", "$9\r\ntwo words\r\n")
        .await;
    c.roundtrip(&cmd("SELECT 0"), "+OK\r\n").await;
    c.roundtrip(&cmd("SELECT 1"), "-ERR DB index is out of range\r\n")
        .await;
    c.roundtrip(&cmd("CLIENT SETNAME me"), "+OK\r\n").await;
    c.roundtrip(&cmd("CONFIG GET save"), "*2\r\n$4\r\nsave\r\n$0\r\n\r\n")
        .await;
    c.roundtrip(
        &cmd("CONFIG GET appendonly"),
        "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n",
    )
    .await;
    c.roundtrip(&cmd("CONFIG GET maxmemory"), "*0\r\n").await;
    // COMMAND lists each command with its key positions (Redis Cluster clients route by
    // them); COMMAND GETKEYS gives a command's keys.
    c.send(cmd("COMMAND").as_bytes()).await;
    let table = array(c.frame().await);
    assert!(
        table.contains(&Frame::Array(vec![
            Frame::bulk("cl.throttle"),
            Frame::Integer(-5),
            Frame::Array(vec![Frame::simple("write")]),
            Frame::Integer(1),
            Frame::Integer(1),
            Frame::Integer(1),
            Frame::Array(vec![]),
        ])),
        "{table:?}"
    );
    c.roundtrip(&cmd("COMMAND DOCS"), "*0\r\n").await;
    c.roundtrip(&cmd("COMMAND COUNT"), &format!(":{}\r\n", table.len()))
        .await;
    c.send(cmd("COMMAND INFO qr.peek nosuch").as_bytes()).await;
    let info = array(c.frame().await);
    assert_eq!(info[1], Frame::Null);
    assert_eq!(
        array(info[0].clone())[3..6],
        [Frame::Integer(2), Frame::Integer(2), Frame::Integer(1)]
    );
    c.roundtrip(
        &cmd("COMMAND GETKEYS QR.CHECK ID r1 login alice 1 login_ip 10.0.0.1 1"),
        "*2\r\n$5\r\nalice\r\n$8\r\n10.0.0.1\r\n",
    )
    .await;
    c.roundtrip(
        &cmd("COMMAND GETKEYS CL.THROTTLE k 15 30 60"),
        "*1\r\n$1\r\nk\r\n",
    )
    .await;
    c.roundtrip(
        &cmd("COMMAND GETKEYS PING"),
        "-ERR The command has no key arguments\r\n",
    )
    .await;
    c.roundtrip(
        &cmd("HELLO 4"),
        "-NOPROTO unsupported protocol version (quorate speaks 2 and 3)\r\n",
    )
    .await;
    c.send(cmd("HELLO 2").as_bytes()).await;
    let hello = array(c.frame().await);
    assert_eq!(
        &hello[..6],
        &[
            Frame::bulk("server"),
            Frame::bulk("quorate"),
            Frame::bulk("version"),
            Frame::bulk("7.0.0"),
            Frame::bulk("proto"),
            Frame::Integer(2),
        ]
    );
    assert_eq!(
        &hello[12..],
        &[
            Frame::bulk("quorate_version"),
            Frame::bulk(env!("CARGO_PKG_VERSION")),
        ]
    );
    c.roundtrip(&cmd("QUIT"), "+OK\r\n").await;
    c.expect_closed().await;
}

/// redis-py 8 sends `HELLO 3` on connecting and refuses a server that answers it with an
/// error; after it, nulls are `_` and maps `%`, and check replies are the same bytes.
#[tokio::test]
async fn hello_3_switches_the_connection_to_resp3_and_hello_2_back() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    let config_resp2 = "*2\r\n$4\r\nsave\r\n$0\r\n\r\n";
    let config_resp3 = "%1\r\n$4\r\nsave\r\n$0\r\n\r\n";
    // Before: RESP2.
    c.roundtrip(&cmd("CONFIG GET save"), config_resp2).await;
    c.roundtrip(&cmd("COMMAND INFO nosuch"), "*1\r\n$-1\r\n")
        .await;
    // The HELLO 3 reply is already RESP3: a map naming protocol 3.
    c.send(cmd("HELLO 3").as_bytes()).await;
    let Frame::Map(hello) = c.frame().await else {
        panic!("HELLO 3 answers a map")
    };
    assert!(
        hello.contains(&(Frame::bulk("proto"), Frame::Integer(3))),
        "{hello:?}"
    );
    assert!(hello.contains(&(Frame::bulk("server"), Frame::bulk("quorate"))));
    c.roundtrip(&cmd("CONFIG GET save"), config_resp3).await;
    c.roundtrip(&cmd("COMMAND INFO nosuch"), "*1\r\n_\r\n")
        .await;
    c.roundtrip(&cmd("COMMAND DOCS"), "%0\r\n").await;
    // A check answers the same bytes as in RESP2.
    c.roundtrip(
        &cmd("CL.THROTTLE resp3 15 30 60 1"),
        "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n",
    )
    .await;
    // HELLO without a version, and a refused one, leave the protocol as it is.
    c.send(cmd("HELLO").as_bytes()).await;
    let Frame::Map(hello) = c.frame().await else {
        panic!("HELLO answers a map in RESP3")
    };
    assert!(hello.contains(&(Frame::bulk("proto"), Frame::Integer(3))));
    c.send(cmd("HELLO 4").as_bytes()).await;
    assert!(matches!(c.frame().await, Frame::Error(e) if e.starts_with("NOPROTO")));
    c.roundtrip(&cmd("CONFIG GET save"), config_resp3).await;
    // In one pipelined batch, each reply is in the protocol in force at its request.
    let batch = [
        cmd("CONFIG GET save"),
        cmd("HELLO 2"),
        cmd("CONFIG GET save"),
    ]
    .concat();
    c.send(batch.as_bytes()).await;
    assert_eq!(
        c.frame().await,
        Frame::Map(vec![(Frame::bulk("save"), Frame::bulk(""))])
    );
    let hello = array(c.frame().await);
    assert_eq!(&hello[4..6], &[Frame::bulk("proto"), Frame::Integer(2)]);
    c.expect(config_resp2.as_bytes()).await;
    c.roundtrip(&cmd("COMMAND INFO nosuch"), "*1\r\n$-1\r\n")
        .await;
}

#[tokio::test]
async fn info_reports_the_versions_and_the_keyspace() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.send(cmd("INFO").as_bytes()).await;
    let Frame::Bulk(info) = c.frame().await else {
        panic!("INFO is a bulk string")
    };
    let info = String::from_utf8(info.to_vec()).unwrap();
    let head = format!(
        "# Server\r\nredis_version:7.0.0\r\nquorate_version:{}\r\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(info.starts_with(&head), "{info}");
    assert!(
        info.contains("\r\n# Clients\r\nconnected_clients:1\r\n"),
        "{info}"
    );
    assert!(info.contains("\r\n# Keyspace\r\nkeys:"), "{info}");
    assert!(info.contains("db0:keys="), "{info}");
    c.send(cmd("INFO nosuchsection").as_bytes()).await;
    assert_eq!(c.frame().await, Frame::bulk(""));
}

/// `QR.ROUTES` on a single node: node 0, its shard count, no leaders (nothing to route to),
/// and each named limit's key prefix; arguments are refused.
#[tokio::test]
async fn qr_routes_names_the_shards_and_the_key_prefixes() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.send(cmd("QR.ROUTES").as_bytes()).await;
    let parts = array(c.frame().await);
    assert_eq!(parts.len(), 4);
    assert_eq!(int(&parts[0]), 0);
    let shards = int(&parts[1]);
    assert_eq!(shards, node.service.shard_count() as i64);
    let leaders = array(parts[2].clone());
    assert_eq!(leaders.len() as i64, shards);
    assert!(leaders
        .iter()
        .all(|l| array(l.clone()) == vec![Frame::Null, Frame::Integer(0)]));
    let prefixes = array(parts[3].clone());
    let policies = node.service.policies();
    assert_eq!(prefixes.len(), policies.options.len() * 2);
    let login = prefixes
        .iter()
        .position(|f| *f == Frame::bulk("login"))
        .unwrap();
    assert_eq!(
        prefixes[login + 1],
        Frame::bulk(policies.options["login"].key_prefix.clone())
    );
    c.roundtrip(
        &cmd("QR.ROUTES now"),
        "-ERR wrong number of arguments for 'qr.routes' command\r\n",
    )
    .await;
}

#[tokio::test]
async fn cluster_commands_answer_under_slot_sharding_and_refuse_under_hash() {
    // Hash sharding (the default): KEYSLOT is a pure function and answers; the rest says
    // how to turn cluster support on, as Redis does when it is off.
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(&cmd("CLUSTER KEYSLOT foo"), ":12182\r\n").await;
    c.roundtrip(&cmd("CLUSTER KEYSLOT {user1000}.following"), ":3443\r\n")
        .await;
    c.send(cmd("CLUSTER NODES").as_bytes()).await;
    match c.frame().await {
        Frame::Error(m) => assert!(
            m.contains("cluster support disabled") && m.contains("--sharding slots"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    c.roundtrip(
        &cmd("CLUSTER RESET"),
        "-ERR unknown subcommand 'RESET'. Try CLUSTER NODES, SLOTS, INFO, MYID or KEYSLOT.\r\n",
    )
    .await;
    c.roundtrip(
        &cmd("CLUSTER"),
        "-ERR wrong number of arguments for 'cluster' command\r\n",
    )
    .await;
    c.roundtrip(&cmd("READONLY"), "+OK\r\n").await;
    c.send(cmd("QR.ROUTES").as_bytes()).await;
    assert_eq!(
        array(c.frame().await).len(),
        4,
        "a hash node adds no fifth element"
    );

    // Slot sharding: a single node leads every slot, at the address it serves.
    let node = Node::start(|c| c.sharding = Sharding::Slots).await;
    node.service.set_resp_addr(node.addr);
    let mut c = node.connect().await;
    let id = "0".repeat(40);
    c.roundtrip(&cmd("CLUSTER NODES"), &{
        let line = format!(
            "{id} {}@0 myself,master - 0 0 0 connected 0-16383\n",
            node.addr
        );
        format!("${}\r\n{line}\r\n", line.len())
    })
    .await;
    c.send(cmd("CLUSTER SLOTS").as_bytes()).await;
    assert_eq!(
        array(c.frame().await),
        vec![Frame::Array(vec![
            Frame::Integer(0),
            Frame::Integer(16383),
            Frame::Array(vec![
                Frame::bulk(node.addr.ip().to_string()),
                Frame::Integer(node.addr.port() as i64),
                Frame::bulk(id.clone()),
            ]),
        ])]
    );
    c.send(cmd("CLUSTER INFO").as_bytes()).await;
    match c.frame().await {
        Frame::Bulk(b) => {
            let text = String::from_utf8(b.to_vec()).unwrap();
            assert!(
                text.starts_with("cluster_enabled:1\r\ncluster_state:ok\r\n"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    c.roundtrip(&cmd("CLUSTER MYID"), &format!("$40\r\n{id}\r\n"))
        .await;
    c.send(cmd("QR.ROUTES").as_bytes()).await;
    let parts = array(c.frame().await);
    assert_eq!(parts.get(4), Some(&Frame::bulk("slots")));
    // Checks still work, keyed as before.
    c.roundtrip(
        &cmd("CL.THROTTLE {t}:a 0 1 60"),
        "*5\r\n:0\r\n:1\r\n:0\r\n:-1\r\n:60\r\n",
    )
    .await;
}

#[tokio::test]
async fn an_unknown_command_gets_redis_error_and_is_counted() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(
        "FLUSHALL now\r\n",
        "-ERR unknown command 'FLUSHALL', with args beginning with: 'now' \r\n",
    )
    .await;
    c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    assert_eq!(node.bad_requests("unknown_command"), 1);
}

/// The lines `tracing` writes on the test's thread (the runtime of a `#[tokio::test]` runs
/// the node's tasks there too).
#[derive(Clone, Default)]
struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn count(&self, pattern: &str) -> usize {
        self.text().lines().filter(|l| l.contains(pattern)).count()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;
    fn make_writer(&'a self) -> CapturedLog {
        self.clone()
    }
}

/// A client pipelining unknown commands once made a node write a log line for each (200,000
/// lines, 36 MB, in half a second). Each is still counted, but the log takes only a few a
/// second, then says how many it left out.
#[tokio::test]
async fn a_flood_of_bad_requests_is_counted_in_full_and_logged_at_a_bounded_rate() {
    use quorate::service::refusal_log::LINES_PER_SECOND;
    const FLOOD: usize = 2_000;
    let log = CapturedLog::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let clock = Arc::new(ManualClock::new(0));
    let node = Node::start_on(PolicySet::default_policies(), clock.clone(), |_| {}).await;
    let mut c = node.connect().await;
    let reply = "-ERR unknown command 'FOO', with args beginning with: \r\n";
    c.send("*1\r\n$3\r\nFOO\r\n".repeat(FLOOD).as_bytes()).await;
    c.expect(reply.repeat(FLOOD).as_bytes()).await;
    assert_eq!(node.bad_requests("unknown_command"), FLOOD as u64);
    // The node's clock stands still: all in one second.
    assert_eq!(log.count("bad request"), LINES_PER_SECOND as usize);
    clock.advance(1_000_000_000);
    c.roundtrip(&cmd("FOO"), reply).await;
    assert_eq!(node.bad_requests("unknown_command"), FLOOD as u64 + 1);
    assert_eq!(log.count("bad request"), LINES_PER_SECOND as usize + 1);
    let left_out = FLOOD - LINES_PER_SECOND as usize;
    assert_eq!(
        log.count(&format!("{left_out} refused requests were not logged")),
        1,
        "{}",
        log.text()
    );
}

#[tokio::test]
async fn a_frame_that_lies_about_its_length_is_refused_and_the_connection_closed() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(
        "*1\r\n$999999999\r\n",
        "-ERR Protocol error: bulk string too large (999999999 bytes, at most 65536)\r\n",
    )
    .await;
    c.expect_closed().await;
    assert_eq!(node.bad_requests("protocol"), 1);
}

#[tokio::test]
async fn a_bulk_string_over_max_frame_bytes_is_refused_and_one_at_the_limit_is_not() {
    let node = Node::start(|c| c.max_frame_bytes = 1024).await;
    let mut c = node.connect().await;
    let exact = "x".repeat(1024);
    c.roundtrip(
        &cmd(&format!("ECHO {exact}")),
        &format!("$1024\r\n{exact}\r\n"),
    )
    .await;
    c.roundtrip(
        &format!("*2\r\n$4\r\nECHO\r\n$1025\r\n{}", "y".repeat(100)),
        "-ERR Protocol error: bulk string too large (1025 bytes, at most 1024)\r\n",
    )
    .await;
    c.expect_closed().await;
}

#[tokio::test]
async fn an_inline_line_over_max_frame_bytes_is_refused() {
    let node = Node::start(|c| c.max_frame_bytes = 1024).await;
    let mut c = node.connect().await;
    c.roundtrip(
        &"z".repeat(2000),
        "-ERR Protocol error: too big inline request (at most 1024 bytes)\r\n",
    )
    .await;
    c.expect_closed().await;
}

#[tokio::test]
async fn malformed_frames_get_a_protocol_error_and_a_close() {
    let node = Node::start(|_| {}).await;
    let cases = [
        (
            "*abc\r\n",
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            "*1\r\n:1\r\n",
            "-ERR Protocol error: expected '$', got ':'\r\n",
        ),
        (
            "*2000\r\n",
            "-ERR Protocol error: too many elements in request (2000, at most 1024)\r\n",
        ),
        (
            "ECHO \"open\r\n",
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
    ];
    for (request, reply) in cases {
        let mut c = node.connect().await;
        c.roundtrip(request, reply).await;
        c.expect_closed().await;
    }
}

#[tokio::test]
async fn requests_before_a_protocol_error_are_answered_first() {
    let node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(
        "PING\r\n*1\r\n$4\r\nPING\r\n*x\r\nPING\r\n",
        "+PONG\r\n+PONG\r\n-ERR Protocol error: invalid multibulk length\r\n",
    )
    .await;
    c.expect_closed().await;
}

#[tokio::test]
async fn garbage_bytes_never_take_the_server_down() {
    let node = Node::start(|c| c.max_frame_bytes = 512).await;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let alphabet = b"*$:+-\r\n0123456789-abcXYZ \"'\\\x00\xff";
    for _ in 0..60 {
        let len = (next() % 300) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                let r = next();
                if r % 3 == 0 {
                    r as u8
                } else {
                    alphabet[(r as usize / 3) % alphabet.len()]
                }
            })
            .collect();
        let mut c = node.connect().await;
        c.send(&bytes).await;
        let _ = c.stream.shutdown().await;
        let mut rest = Vec::new();
        let done = tokio::time::timeout(WAIT, c.stream.read_to_end(&mut rest)).await;
        assert!(
            done.is_ok(),
            "the server neither answered nor closed for {bytes:?}"
        );
    }
    let mut c = node.connect().await;
    c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
}

#[tokio::test]
async fn a_client_over_max_connections_is_told_and_disconnected() {
    let node = Node::start(|c| c.max_connections = 2).await;
    let mut a = node.connect().await;
    let mut b = node.connect().await;
    a.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    b.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    let mut c = node.connect().await;
    c.expect(b"-ERR max number of clients reached\r\n").await;
    c.expect_closed().await;
    let refused = node
        .service
        .metrics()
        .connections_refused
        .with_label_values(&["resp"])
        .get();
    assert_eq!(refused, 1);
    // A slot frees when a client leaves.
    drop(a);
    let mut ok = false;
    for _ in 0..50 {
        let mut d = node.connect().await;
        d.send(cmd("PING").as_bytes()).await;
        d.fill(7).await;
        if d.buf.starts_with(b"+PONG\r\n") {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "a new client was admitted after one left");
}

#[tokio::test]
async fn the_connection_gauge_counts_open_connections() {
    let node = Node::start(|_| {}).await;
    let gauge = || {
        node.service
            .metrics()
            .connections
            .with_label_values(&["resp"])
            .get()
    };
    let mut c = node.connect().await;
    c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    assert_eq!(gauge(), 1);
    drop(c);
    for _ in 0..100 {
        if gauge() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the gauge stayed at {}", gauge());
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_idle_timeout() {
    let node = Node::start(|c| c.idle_timeout = Duration::from_millis(300)).await;
    let mut c = node.connect().await;
    c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    let started = std::time::Instant::now();
    c.expect_closed().await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "closed too early"
    );
}

#[tokio::test]
async fn a_connection_that_keeps_talking_outlives_idle_timeout_and_is_closed_once_quiet() {
    // The connection's one idle timer fires at its first deadline while the client is still
    // talking; it must move on, not close (and must still close once the client stops).
    let node = Node::start(|c| c.idle_timeout = Duration::from_millis(300)).await;
    let mut c = node.connect().await;
    for _ in 0..10 {
        // 1 s of traffic in all: more than three idle limits.
        c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    let quiet = std::time::Instant::now();
    c.expect_closed().await;
    let after = quiet.elapsed();
    assert!(
        after >= Duration::from_millis(250),
        "closed {after:?} after the last request"
    );
}

#[tokio::test]
async fn a_stuck_shard_gets_tryagain_after_the_call_timeout_on_a_long_lived_connection() {
    // The connection keeps one call timer across its calls (restarted per call, re-armed
    // lazily): a call must get the full timeout from its own start, however long ago the
    // timer was made or last fired, and calls before must not be cut short by it.
    let timeout = Duration::from_millis(200);
    let node = Node::start(|c| c.shard_timeout = timeout).await;
    let mut c = node.connect().await;
    let throttle = cmd("CL.THROTTLE stuck 100 100 60");
    for _ in 0..6 {
        // 0.6 s of calls: the timer fires, idle, between them.
        c.send(throttle.as_bytes()).await;
        assert!(matches!(c.frame().await, Frame::Array(_)));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.service.stall_shards(Duration::from_millis(800));
    let sent = std::time::Instant::now();
    c.send(throttle.as_bytes()).await;
    let reply = c.frame().await;
    let waited = sent.elapsed();
    match &reply {
        Frame::Error(e) => assert!(e.starts_with("TRYAGAIN") && e.contains("200ms"), "{e}"),
        other => panic!("a stuck shard answered {other:?}"),
    }
    assert!(
        waited >= Duration::from_millis(180) && waited < Duration::from_millis(700),
        "answered after {waited:?}, not after the 200 ms call timeout"
    );
    // Once the shard is back, the same connection is answered again.
    tokio::time::sleep(Duration::from_millis(700)).await;
    c.send(throttle.as_bytes()).await;
    assert!(matches!(c.frame().await, Frame::Array(_)));
}

#[tokio::test]
async fn a_half_sent_request_does_not_keep_a_connection_past_idle_timeout() {
    let node = Node::start(|c| c.idle_timeout = Duration::from_millis(300)).await;
    let mut c = node.connect().await;
    c.send(b"*2\r\n$4\r\nECHO\r\n$10\r\nabc").await;
    c.expect_closed().await;
}

#[tokio::test]
async fn shutdown_stops_accepting_closes_idle_connections_and_returns() {
    let mut node = Node::start(|_| {}).await;
    let mut c = node.connect().await;
    c.roundtrip(&cmd("PING"), "+PONG\r\n").await;
    node.stop.take().unwrap().send(()).unwrap();
    let served = tokio::time::timeout(WAIT, &mut node.task)
        .await
        .expect("serve returned within 5 s");
    assert!(served.unwrap().is_ok());
    c.expect_closed().await;
    assert!(
        TcpStream::connect(node.addr).await.is_err(),
        "still accepting"
    );
}

/// Not a check: serves a node on a fixed port for trying Redis tools by hand.
///
/// `QUORATE_RESP_PORT=6390 QUORATE_SERVE_SECS=60 cargo test --release --test resp_api --
/// --ignored --nocapture serves_a_node_for_redis_tools`, then e.g.
/// `redis-cli -p 6390 CL.THROTTLE k 15 30 60` or
/// `redis-benchmark -p 6390 -n 10000 -c 10 CL.THROTTLE key:__rand_int__ 15 30 60`.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn serves_a_node_for_redis_tools() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let port = env("QUORATE_RESP_PORT", 6390);
    let secs = env("QUORATE_SERVE_SECS", 60);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = NodeConfig {
        resp_addr: addr,
        ..NodeConfig::default()
    };
    let service = Service::start(
        config,
        PolicySet::default_policies(),
        Arc::new(SystemClock::new()),
    )
    .await
    .unwrap();
    let listener = TcpListener::bind(addr).await.unwrap();
    println!("serving RESP on {addr} for {secs} s");
    serve(
        listener,
        service,
        tokio::time::sleep(Duration::from_secs(secs)),
    )
    .await
    .unwrap();
}

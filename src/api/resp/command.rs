//! From a request's arguments to a typed command. Names are case-insensitive; every refusal
//! is a [`CommandError`] whose reply names the argument at fault.
//!
//! The rate-limiting commands:
//! - `CL.THROTTLE key max_burst count period [quantity]` — exactly redis-cell's: a GCRA limit
//!   of `count` per `period` seconds with capacity `max_burst + 1`, spending `quantity`
//!   (default 1; 0 peeks).
//! - `QR.CHECK [ID request-id] limit key cost [limit key cost ...]` — named limits of the
//!   policy file, all-or-nothing.
//! - `QR.PEEK limit key` — `QR.CHECK limit key 0`.
//! - `QR.ROUTES` — where keys live, for clients that send each key to its shard's leader
//!   (see [`super::info::routes`]).
//! - `CLUSTER NODES|SLOTS|INFO|MYID|KEYSLOT key` — the Redis Cluster view of a cluster
//!   created with `sharding = "slots"` (see [`super::cluster`]).
//!
//! And what redis-cli, redis-benchmark and client libraries send on connecting: `PING`,
//! `ECHO`, `QUIT`, `SELECT 0`, `CLIENT ...`, `HELLO [2|3]` (3 switches the connection to
//! RESP3), `COMMAND [INFO|DOCS|LIST|COUNT|GETKEYS]`, `READONLY`, `READWRITE`, `CONFIG GET`,
//! `INFO`.

use super::frame::{parse_int, Frame, Protocol};
use crate::limiter::{Algorithm, MAX_PERIOD, SECOND};
use crate::service::{shown, CheckItem, CheckRequest, InlineLimit, LimitRef};
use bytes::Bytes;

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Spends limits through the service; `reply` says how to write its answer.
    Check {
        request: CheckRequest,
        reply: CheckReply,
    },
    Ping(Option<Bytes>),
    Echo(Bytes),
    /// `+OK`, then the connection closes.
    Quit,
    /// `SELECT 0`: there is only one database.
    Select,
    /// `CLIENT ...`, `READONLY`, `READWRITE`: accepted and ignored (`+OK`).
    Client,
    /// `HELLO [2|3]`: the protocol to switch to (`None`: stay, and say which).
    Hello(Option<Protocol>),
    /// `COMMAND DOCS [name ...]`: an empty map (no docs).
    CommandList,
    /// `COMMAND`, `COMMAND INFO [name ...]` (all when none is named): each command's name,
    /// arity, flags and key positions, as Redis Cluster clients read them to find a
    /// command's keys (see [`super::info::COMMANDS`]).
    CommandInfo(Vec<Bytes>),
    /// `COMMAND LIST`: the commands' names.
    CommandNames,
    /// `COMMAND COUNT`: how many commands `COMMAND` lists.
    CommandCount,
    /// `COMMAND GETKEYS command [arg ...]`: the keys of that command.
    CommandGetKeys(Vec<Bytes>),
    /// `CONFIG GET param [param ...]`.
    ConfigGet(Vec<Bytes>),
    /// `INFO [section ...]`.
    Info(Vec<Bytes>),
    /// `QR.ROUTES`: this node's id, the shard count, each shard's leader, the limits' key
    /// prefixes.
    Routes,
    /// `CLUSTER subcommand`.
    Cluster(ClusterCommand),
}

/// The `CLUSTER` subcommands answered (see [`super::cluster`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterCommand {
    Nodes,
    Slots,
    Info,
    MyId,
    KeySlot(Bytes),
}

/// The reply shape of a check command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckReply {
    /// redis-cell's five integers.
    Throttle,
    /// quorate's array: verdict, wait, then one array per item.
    Check,
}

/// Why a request is not a valid command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandError {
    /// Not a command quorate knows. Carries Redis's whole message.
    Unknown(String),
    /// Wrong number of arguments for the (lower-case) command.
    Arity(&'static str),
    /// A bad argument; the message names it.
    Invalid(String),
    /// `HELLO` asked for a protocol other than RESP2 and RESP3.
    NoProto,
}

impl CommandError {
    /// The error reply's text: its kind (`ERR`, `NOPROTO`) and message.
    pub fn message(&self) -> String {
        match self {
            CommandError::Unknown(m) | CommandError::Invalid(m) => format!("ERR {m}"),
            CommandError::Arity(name) => {
                format!("ERR wrong number of arguments for '{name}' command")
            }
            CommandError::NoProto => {
                "NOPROTO unsupported protocol version (quorate speaks 2 and 3)".into()
            }
        }
    }

    /// The error reply.
    pub fn to_frame(&self) -> Frame {
        Frame::Error(self.message())
    }

    /// A short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            CommandError::Unknown(_) => "unknown_command",
            CommandError::Arity(_) => "wrong_arity",
            CommandError::Invalid(_) => "invalid_argument",
            CommandError::NoProto => "unsupported_protocol",
        }
    }
}

/// `CLUSTER subcommand [arg]`.
fn cluster(rest: &[&[u8]]) -> Result<Command, CommandError> {
    let Some((sub, args)) = rest.split_first() else {
        return Err(CommandError::Arity("cluster"));
    };
    let is = |n: &str| sub.eq_ignore_ascii_case(n.as_bytes());
    let bare = |c: ClusterCommand| match args {
        [] => Ok(Command::Cluster(c)),
        _ => Err(CommandError::Arity("cluster")),
    };
    if is("NODES") {
        bare(ClusterCommand::Nodes)
    } else if is("SLOTS") {
        bare(ClusterCommand::Slots)
    } else if is("INFO") {
        bare(ClusterCommand::Info)
    } else if is("MYID") {
        bare(ClusterCommand::MyId)
    } else if is("KEYSLOT") {
        match args {
            [key] => Ok(Command::Cluster(ClusterCommand::KeySlot(
                Bytes::copy_from_slice(key),
            ))),
            _ => Err(CommandError::Arity("cluster|keyslot")),
        }
    } else {
        Err(CommandError::Unknown(format!(
            "unknown subcommand '{}'. Try CLUSTER NODES, SLOTS, INFO, MYID or KEYSLOT.",
            shown(sub, 128)
        )))
    }
}

/// The longest period `CL.THROTTLE` accepts, in seconds (366 days).
pub const MAX_PERIOD_SECS: i64 = (MAX_PERIOD / SECOND) as i64;

/// Parses one request (never empty: the frame parser skips empty ones).
pub fn parse(args: &[&[u8]]) -> Result<Command, CommandError> {
    let Some(name) = args.first() else {
        return Err(CommandError::Unknown("empty command".into()));
    };
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    let rest = &args[1..];
    if is("CL.THROTTLE") {
        throttle(rest)
    } else if is("QR.CHECK") {
        check(rest)
    } else if is("QR.PEEK") {
        peek(rest)
    } else if is("QR.ROUTES") {
        match rest {
            [] => Ok(Command::Routes),
            _ => Err(CommandError::Arity("qr.routes")),
        }
    } else if is("CLUSTER") {
        cluster(rest)
    } else if is("READONLY") || is("READWRITE") {
        match rest {
            [] => Ok(Command::Client),
            _ => Err(CommandError::Arity(if is("READONLY") {
                "readonly"
            } else {
                "readwrite"
            })),
        }
    } else if is("PING") {
        match rest {
            [] => Ok(Command::Ping(None)),
            [m] => Ok(Command::Ping(Some(Bytes::copy_from_slice(m)))),
            _ => Err(CommandError::Arity("ping")),
        }
    } else if is("ECHO") {
        match rest {
            [m] => Ok(Command::Echo(Bytes::copy_from_slice(m))),
            _ => Err(CommandError::Arity("echo")),
        }
    } else if is("QUIT") {
        Ok(Command::Quit)
    } else if is("SELECT") {
        select(rest)
    } else if is("CLIENT") {
        match rest {
            [] => Err(CommandError::Arity("client")),
            _ => Ok(Command::Client),
        }
    } else if is("HELLO") {
        hello(rest)
    } else if is("COMMAND") {
        command(rest)
    } else if is("CONFIG") {
        config(rest)
    } else if is("INFO") {
        Ok(Command::Info(owned(rest)))
    } else {
        Err(unknown(name, rest))
    }
}

/// Arguments kept by a command (the request's bytes are the connection's).
fn owned(args: &[&[u8]]) -> Vec<Bytes> {
    args.iter().map(|a| Bytes::copy_from_slice(a)).collect()
}

/// Redis 7's message: `unknown command 'NAME', with args beginning with: 'a' 'b' `, each
/// part cut to 128 bytes.
fn unknown(name: &[u8], rest: &[&[u8]]) -> CommandError {
    let mut shown_args = String::new();
    for a in rest {
        if shown_args.len() >= 128 {
            break;
        }
        let room = 128 - shown_args.len();
        shown_args.push_str(&format!("'{}' ", shown(a, room)));
    }
    CommandError::Unknown(format!(
        "unknown command '{}', with args beginning with: {shown_args}",
        shown(name, 128)
    ))
}

/// `what` names the argument in the error; it is formatted only for an error.
fn text(arg: &[u8], what: impl std::fmt::Display) -> Result<String, CommandError> {
    std::str::from_utf8(arg)
        .map(str::to_owned)
        .map_err(|_| CommandError::Invalid(format!("{what} must be valid UTF-8")))
}

/// An integer argument within `min..=max`, or an error naming it with `expected`.
fn int(
    arg: &[u8],
    min: i64,
    max: i64,
    what: impl std::fmt::Display,
    expected: &str,
) -> Result<i64, CommandError> {
    parse_int(arg)
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| CommandError::Invalid(format!("{what} must be {expected}")))
}

/// A cost argument: a whole number from 0 to `u64::MAX`, the range HTTP accepts, so a cost
/// means the same over both APIs. A number too large says so rather than calling itself
/// negative.
fn unsigned(arg: &[u8], what: impl std::fmt::Display) -> Result<u64, CommandError> {
    if arg.is_empty() || !arg.iter().all(u8::is_ascii_digit) {
        return Err(CommandError::Invalid(format!(
            "{what} must be a non-negative integer"
        )));
    }
    // All digits, so the text is ASCII and a parse error can only be overflow.
    std::str::from_utf8(arg)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| {
            CommandError::Invalid(format!(
                "{what} does not fit an unsigned 64-bit integer (0 to {})",
                u64::MAX
            ))
        })
}

/// The inline limit of `CL.THROTTLE key max_burst count period`: a GCRA of `count` per
/// `period_secs` with capacity `max_burst + 1` (arguments already checked in range).
pub fn throttle_limit(max_burst: u64, count: u64, period_secs: u64) -> InlineLimit {
    InlineLimit {
        algorithm: Algorithm::Gcra,
        limit: count,
        period_ns: period_secs.saturating_mul(SECOND),
        burst: Some(max_burst.saturating_add(1)),
    }
}

/// `CL.THROTTLE key max_burst count period [quantity]`.
fn throttle(rest: &[&[u8]]) -> Result<Command, CommandError> {
    let (key, max_burst, count, period, quantity) = match rest {
        [k, b, c, p] => (k, b, c, p, None),
        [k, b, c, p, q] => (k, b, c, p, Some(q)),
        _ => return Err(CommandError::Arity("cl.throttle")),
    };
    let key = text(key, "key")?;
    // max_burst + 1 is replied as a RESP integer, so it must stay within i64.
    let max_burst = int(
        max_burst,
        0,
        i64::MAX - 1,
        "max_burst",
        "an integer from 0 to 9223372036854775806",
    )?;
    let count = int(count, 1, i64::MAX, "count", "a positive integer")?;
    let period_secs = int(
        period,
        1,
        i64::MAX,
        "period",
        "a positive integer (seconds)",
    )?;
    if period_secs > MAX_PERIOD_SECS {
        return Err(CommandError::Invalid(format!(
            "period must be at most {MAX_PERIOD_SECS} seconds (366 days)"
        )));
    }
    let quantity = match quantity {
        Some(q) => unsigned(q, "quantity")?,
        None => 1,
    };
    let limit = throttle_limit(max_burst as u64, count as u64, period_secs as u64);
    Ok(Command::Check {
        request: CheckRequest {
            items: vec![CheckItem {
                limit: LimitRef::Inline(limit),
                key,
                cost: quantity,
            }],
            request_id: None,
        },
        reply: CheckReply::Throttle,
    })
}

/// `QR.CHECK [ID request-id] limit key cost [limit key cost ...]`. A limit named `ID` still
/// works: the ID form is recognised only when the argument count fits it.
fn check(rest: &[&[u8]]) -> Result<Command, CommandError> {
    let (request_id, triples) = match rest {
        [id, request_id, triples @ ..]
            if id.eq_ignore_ascii_case(b"ID") && !triples.is_empty() && triples.len() % 3 == 0 =>
        {
            (Some(text(request_id, "request-id")?), triples)
        }
        triples if !triples.is_empty() && triples.len() % 3 == 0 => (None, triples),
        _ => return Err(CommandError::Arity("qr.check")),
    };
    let items = triples
        .chunks_exact(3)
        .enumerate()
        .map(|(i, t)| {
            let n = i + 1;
            Ok(CheckItem {
                limit: LimitRef::Named(text(t[0], format_args!("limit of item {n}"))?),
                key: text(t[1], format_args!("key of item {n}"))?,
                cost: unsigned(t[2], format_args!("cost of item {n}"))?,
            })
        })
        .collect::<Result<Vec<_>, CommandError>>()?;
    Ok(Command::Check {
        request: CheckRequest { items, request_id },
        reply: CheckReply::Check,
    })
}

/// `QR.PEEK limit key`.
fn peek(rest: &[&[u8]]) -> Result<Command, CommandError> {
    let [limit, key] = rest else {
        return Err(CommandError::Arity("qr.peek"));
    };
    let item = CheckItem {
        limit: LimitRef::Named(text(limit, "limit")?),
        key: text(key, "key")?,
        cost: 0,
    };
    Ok(Command::Check {
        request: CheckRequest {
            items: vec![item],
            request_id: None,
        },
        reply: CheckReply::Check,
    })
}

fn select(rest: &[&[u8]]) -> Result<Command, CommandError> {
    let [index] = rest else {
        return Err(CommandError::Arity("select"));
    };
    match parse_int(index) {
        Some(0) => Ok(Command::Select),
        Some(_) => Err(CommandError::Invalid("DB index is out of range".into())),
        None => Err(CommandError::Invalid(
            "value is not an integer or out of range".into(),
        )),
    }
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`: protocol 2 or 3. The options are
/// checked as Redis checks them (a malformed one refuses the whole command, so the protocol
/// does not change) and then ignored: quorate has no users or client names.
fn hello(rest: &[&[u8]]) -> Result<Command, CommandError> {
    let Some((version, mut options)) = rest.split_first() else {
        return Ok(Command::Hello(None));
    };
    let proto = match parse_int(version) {
        Some(2) => Protocol::Resp2,
        Some(3) => Protocol::Resp3,
        Some(_) => return Err(CommandError::NoProto),
        None => {
            return Err(CommandError::Invalid(
                "Protocol version is not an integer or out of range".into(),
            ))
        }
    };
    while let Some((option, rest)) = options.split_first() {
        let takes = if option.eq_ignore_ascii_case(b"AUTH") {
            2
        } else if option.eq_ignore_ascii_case(b"SETNAME") {
            1
        } else {
            0
        };
        if takes == 0 || rest.len() < takes {
            return Err(CommandError::Invalid(format!(
                "Syntax error in HELLO option '{}'",
                shown(option, 128)
            )));
        }
        options = &rest[takes..];
    }
    Ok(Command::Hello(Some(proto)))
}

fn command(rest: &[&[u8]]) -> Result<Command, CommandError> {
    let Some((sub, args)) = rest.split_first() else {
        return Ok(Command::CommandInfo(Vec::new()));
    };
    if sub.eq_ignore_ascii_case(b"COUNT") {
        Ok(Command::CommandCount)
    } else if sub.eq_ignore_ascii_case(b"DOCS") {
        Ok(Command::CommandList)
    } else if sub.eq_ignore_ascii_case(b"INFO") {
        Ok(Command::CommandInfo(owned(args)))
    } else if sub.eq_ignore_ascii_case(b"LIST") {
        Ok(Command::CommandNames)
    } else if sub.eq_ignore_ascii_case(b"GETKEYS") {
        if args.is_empty() {
            return Err(CommandError::Arity("command|getkeys"));
        }
        Ok(Command::CommandGetKeys(owned(args)))
    } else {
        Err(CommandError::Invalid(format!(
            "unknown subcommand '{}'. Try COMMAND HELP.",
            shown(sub, 128)
        )))
    }
}

fn config(rest: &[&[u8]]) -> Result<Command, CommandError> {
    match rest {
        [] => Err(CommandError::Arity("config")),
        [sub, params @ ..] if sub.eq_ignore_ascii_case(b"GET") => {
            if params.is_empty() {
                Err(CommandError::Arity("config|get"))
            } else {
                Ok(Command::ConfigGet(owned(params)))
            }
        }
        [sub, ..] => Err(CommandError::Invalid(format!(
            "unknown subcommand '{}'. Try CONFIG HELP.",
            shown(sub, 128)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: &str) -> Result<Command, CommandError> {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        parse(&args)
    }

    fn request(c: Command) -> CheckRequest {
        match c {
            Command::Check { request, .. } => request,
            other => panic!("not a check: {other:?}"),
        }
    }

    #[test]
    fn cl_throttle_is_an_inline_gcra_limit_with_capacity_max_burst_plus_one() {
        let c = p("cl.throttle user123 15 30 60").unwrap();
        assert!(matches!(
            c,
            Command::Check {
                reply: CheckReply::Throttle,
                ..
            }
        ));
        let r = request(c);
        assert_eq!(r.request_id, None);
        assert_eq!(
            r.items,
            vec![CheckItem {
                limit: LimitRef::Inline(InlineLimit {
                    algorithm: Algorithm::Gcra,
                    limit: 30,
                    period_ns: 60 * SECOND,
                    burst: Some(16),
                }),
                key: "user123".into(),
                cost: 1,
            }]
        );
    }

    #[test]
    fn cl_throttle_takes_an_optional_quantity_including_zero() {
        assert_eq!(
            request(p("CL.THROTTLE k 0 1 1 7").unwrap()).items[0].cost,
            7
        );
        assert_eq!(
            request(p("CL.THROTTLE k 0 1 1 0").unwrap()).items[0].cost,
            0
        );
    }

    #[test]
    fn costs_and_quantities_take_the_whole_u64_range_as_over_http() {
        let max = u64::MAX;
        for big in [max, 1 << 63] {
            let r = request(p(&format!("QR.CHECK login k {big}")).unwrap());
            assert_eq!(r.items[0].cost, big);
            let r = request(p(&format!("CL.THROTTLE k 0 1 1 {big}")).unwrap());
            assert_eq!(r.items[0].cost, big);
        }
        let fits_not = "does not fit an unsigned 64-bit integer (0 to 18446744073709551615)";
        assert_eq!(
            p("QR.CHECK login k 1 api k 18446744073709551616"),
            Err(CommandError::Invalid(format!("cost of item 2 {fits_not}")))
        );
        assert_eq!(
            p("CL.THROTTLE k 0 1 1 99999999999999999999999"),
            Err(CommandError::Invalid(format!("quantity {fits_not}")))
        );
        for bad in ["-1", "+1", "", "1.0", "-0"] {
            assert_eq!(
                parse(&[b"QR.CHECK", b"login", b"k", bad.as_bytes()]),
                Err(CommandError::Invalid(
                    "cost of item 1 must be a non-negative integer".into()
                )),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn cl_throttle_errors_name_the_bad_argument() {
        let cases = [
            ("CL.THROTTLE k x 30 60", "max_burst"),
            ("CL.THROTTLE k -1 30 60", "max_burst"),
            ("CL.THROTTLE k 9223372036854775807 30 60", "max_burst"),
            ("CL.THROTTLE k 15 0 60", "count"),
            ("CL.THROTTLE k 15 1.5 60", "count"),
            ("CL.THROTTLE k 15 30 0", "period"),
            ("CL.THROTTLE k 15 30 31622401", "period"),
            ("CL.THROTTLE k 15 30 60 -3", "quantity"),
        ];
        for (line, arg) in cases {
            match p(line) {
                Err(CommandError::Invalid(m)) => assert!(m.starts_with(arg), "{line}: {m}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        assert!(p("CL.THROTTLE k 15 30 31622400").is_ok());
    }

    #[test]
    fn cl_throttle_with_too_few_or_many_arguments_is_an_arity_error() {
        assert_eq!(
            p("CL.THROTTLE k 15 30"),
            Err(CommandError::Arity("cl.throttle"))
        );
        assert_eq!(
            p("CL.THROTTLE k 15 30 60 1 2"),
            Err(CommandError::Arity("cl.throttle"))
        );
        assert_eq!(
            CommandError::Arity("cl.throttle").to_frame(),
            Frame::Error("ERR wrong number of arguments for 'cl.throttle' command".into())
        );
    }

    #[test]
    fn qr_check_takes_triples_and_an_optional_request_id() {
        let r = request(p("QR.CHECK login alice 1 api k 2").unwrap());
        assert_eq!(r.request_id, None);
        assert_eq!(r.items.len(), 2);
        assert_eq!(r.items[1].limit, LimitRef::Named("api".into()));
        assert_eq!((r.items[1].key.as_str(), r.items[1].cost), ("k", 2));
        let r = request(p("qr.check id req-1 login alice 1").unwrap());
        assert_eq!(r.request_id.as_deref(), Some("req-1"));
        assert_eq!(r.items.len(), 1);
    }

    #[test]
    fn a_limit_named_id_is_still_a_limit() {
        let r = request(p("QR.CHECK ID alice 1").unwrap());
        assert_eq!(
            (r.request_id, r.items[0].limit.clone()),
            (None, LimitRef::Named("ID".into()))
        );
    }

    #[test]
    fn qr_check_refuses_incomplete_triples_and_bad_costs() {
        assert_eq!(
            p("QR.CHECK login alice"),
            Err(CommandError::Arity("qr.check"))
        );
        assert_eq!(p("QR.CHECK ID r1"), Err(CommandError::Arity("qr.check")));
        assert_eq!(
            p("QR.CHECK a k 1 b k x"),
            Err(CommandError::Invalid(
                "cost of item 2 must be a non-negative integer".into()
            ))
        );
    }

    #[test]
    fn qr_peek_is_a_check_of_cost_zero() {
        let r = request(p("QR.PEEK login alice").unwrap());
        assert_eq!(r.items[0].cost, 0);
        assert_eq!(p("QR.PEEK login"), Err(CommandError::Arity("qr.peek")));
    }

    #[test]
    fn keys_must_be_utf8() {
        let args: [&[u8]; 3] = [b"QR.PEEK", b"l", b"\xff"];
        assert_eq!(
            parse(&args),
            Err(CommandError::Invalid("key must be valid UTF-8".into()))
        );
    }

    #[test]
    fn connection_commands_parse() {
        assert_eq!(p("ping"), Ok(Command::Ping(None)));
        assert_eq!(
            p("PING hi"),
            Ok(Command::Ping(Some(Bytes::from_static(b"hi"))))
        );
        assert_eq!(p("ECHO x"), Ok(Command::Echo(Bytes::from_static(b"x"))));
        assert_eq!(p("ECHO"), Err(CommandError::Arity("echo")));
        assert_eq!(p("QUIT"), Ok(Command::Quit));
        assert_eq!(p("SELECT 0"), Ok(Command::Select));
        assert!(matches!(p("SELECT 1"), Err(CommandError::Invalid(_))));
        assert_eq!(p("CLIENT SETNAME x"), Ok(Command::Client));
        assert_eq!(p("HELLO"), Ok(Command::Hello(None)));
        assert_eq!(
            p("HELLO 2 SETNAME x"),
            Ok(Command::Hello(Some(Protocol::Resp2)))
        );
        assert_eq!(
            p("hello 3 AUTH default pw"),
            Ok(Command::Hello(Some(Protocol::Resp3)))
        );
        assert_eq!(
            p("HELLO 3 SETNAME app AUTH default pw"),
            Ok(Command::Hello(Some(Protocol::Resp3)))
        );
        // A malformed option refuses the whole command, as in Redis.
        for bad in [
            "HELLO 3 AUTH u",
            "HELLO 3 SETNAME",
            "HELLO 3 FOO",
            "HELLO 2 AUTH",
        ] {
            let Err(CommandError::Invalid(m)) = p(bad) else {
                panic!("{bad} accepted")
            };
            assert!(
                m.starts_with("Syntax error in HELLO option '"),
                "{bad}: {m}"
            );
        }
        assert_eq!(p("HELLO 4"), Err(CommandError::NoProto));
        assert_eq!(p("HELLO 1"), Err(CommandError::NoProto));
        assert!(matches!(p("HELLO three"), Err(CommandError::Invalid(_))));
        assert_eq!(
            CommandError::NoProto.to_frame(),
            Frame::Error("NOPROTO unsupported protocol version (quorate speaks 2 and 3)".into())
        );
        assert_eq!(p("COMMAND"), Ok(Command::CommandInfo(vec![])));
        assert_eq!(p("command docs"), Ok(Command::CommandList));
        assert_eq!(
            p("COMMAND INFO cl.throttle"),
            Ok(Command::CommandInfo(vec![Bytes::from_static(
                b"cl.throttle"
            )]))
        );
        assert_eq!(
            p("COMMAND GETKEYS"),
            Err(CommandError::Arity("command|getkeys"))
        );
        assert_eq!(p("COMMAND COUNT"), Ok(Command::CommandCount));
        assert_eq!(
            p("CONFIG GET save"),
            Ok(Command::ConfigGet(vec![Bytes::from_static(b"save")]))
        );
        assert_eq!(p("CONFIG GET"), Err(CommandError::Arity("config|get")));
        assert_eq!(p("INFO"), Ok(Command::Info(vec![])));
    }

    #[test]
    fn an_unknown_command_gets_redis_message_with_its_first_arguments() {
        assert_eq!(
            p("FOO a b").unwrap_err().to_frame(),
            Frame::Error("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ".into())
        );
        let long = format!("X {}", "y".repeat(300));
        match p(&long).unwrap_err() {
            CommandError::Unknown(m) => assert!(m.len() < 200, "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

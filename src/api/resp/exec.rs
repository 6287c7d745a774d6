//! One pipeline batch: every request a connection had buffered, answered in order with one
//! call to the service.
//!
//! The check commands of the batch (`CL.THROTTLE`, `QR.CHECK`, `QR.PEEK`) go to
//! [`Service::check_many`] together, so a connection's pipelined requests reach each shard as
//! one message; the other commands are answered on the spot, and each reply takes the place of
//! its request. A `QUIT` ends the batch (what follows it is not executed); a protocol error
//! ends it after the requests before it were answered, as in Redis.

use super::command::{self, CheckReply, Command};
use super::frame::{Batch, Frame, Protocol, ProtocolError};
use super::{encode, info, reply};
use crate::clock::LazyTimer;
use crate::service::{CheckRequest, Service};
use bytes::BytesMut;
use std::net::SocketAddr;

/// What to send back, and whether to close the connection after sending it.
pub struct BatchOutput {
    pub bytes: BytesMut,
    pub close: bool,
}

/// A reply known now, or one waiting for the service's answer to a check; each with the
/// protocol it is written in (a `HELLO` in the batch changes it for what follows).
enum Slot {
    Ready(Frame, Protocol),
    Check(CheckReply, Protocol),
}

/// What a connection keeps from batch to batch.
pub struct ConnState {
    /// The client's address, for the log of bad requests.
    pub peer: SocketAddr,
    /// The protocol the connection speaks, switched by `HELLO`.
    pub proto: Protocol,
    /// The connection's local handle on the RESP decision-latency histogram: a batch's
    /// observations reach the shared histogram with one flush (a handful of atomic adds, not
    /// three per decision). Owned here, not shared: `LocalHistogram` is not `Sync`, and a
    /// shared reference held across an await would make the connection's future not `Send`.
    pub latency: prometheus::local::LocalHistogram,
    /// The connection's timer for its calls to the service (see `LazyTimer`).
    pub calls: LazyTimer,
}

/// Answers `requests` in order, then `error` (if the parser stopped on one). `started` is the
/// service clock's reading when the requests arrived (the connection read it anyway, for its
/// idle timer); decision latencies run from it.
pub async fn run(
    service: &Service,
    requests: Batch,
    error: Option<ProtocolError>,
    conn: &mut ConnState,
    started: crate::limiter::Nanos,
) -> BatchOutput {
    let ConnState {
        peer,
        proto,
        latency,
        calls,
    } = conn;
    let peer = *peer;
    let mut slots = Vec::with_capacity(requests.len() + 1);
    let mut checks: Vec<CheckRequest> = Vec::with_capacity(requests.len());
    let mut close = false;
    let mut args = Vec::with_capacity(8);
    for i in 0..requests.len() {
        requests.args(i, &mut args);
        match command::parse(&args) {
            Ok(Command::Check { request, reply }) => {
                checks.push(request);
                slots.push(Slot::Check(reply, *proto));
            }
            Ok(Command::Cluster(c)) => {
                // May ask the other members for their addresses: not in `answer`.
                let reply = super::cluster::answer(service, c).await;
                slots.push(Slot::Ready(reply, *proto))
            }
            Ok(Command::Quit) => {
                slots.push(Slot::Ready(Frame::simple("OK"), *proto));
                close = true;
                break;
            }
            Ok(Command::Hello(switch)) => {
                // The reply is already in the protocol asked for, as Redis sends it.
                *proto = switch.unwrap_or(*proto);
                slots.push(Slot::Ready(info::hello(*proto), *proto));
            }
            Ok(other) => slots.push(Slot::Ready(answer(service, other), *proto)),
            Err(e) => {
                bad_request(service, peer, e.reason(), &e.message(), started);
                slots.push(Slot::Ready(e.to_frame(), *proto));
            }
        }
    }
    if let (Some(e), false) = (&error, close) {
        bad_request(service, peer, "protocol", &e.to_string(), started);
        slots.push(Slot::Ready(
            Frame::err(format!("Protocol error: {e}")),
            *proto,
        ));
        close = true;
    }

    let n_checks = checks.len();
    let mut answers = if checks.is_empty() {
        Vec::new()
    } else {
        service.check_many_timed(checks, calls, started).await
    }
    .into_iter();
    if n_checks > 0 {
        let elapsed = service.clock().monotonic().saturating_sub(started);
        for _ in 0..n_checks {
            latency.observe(elapsed as f64 / 1e9);
        }
        latency.flush();
    }

    // A CL.THROTTLE reply is about 30 bytes: one allocation for most batches.
    let mut bytes = BytesMut::with_capacity(slots.len() * 32);
    for slot in slots {
        let (frame, proto) = match slot {
            Slot::Ready(f, proto) => (f, proto),
            Slot::Check(kind, proto) => (
                match answers.next() {
                    Some(Ok(resp)) => {
                        reply::write_check_reply(kind, &resp, &mut bytes);
                        continue;
                    }
                    Some(Err(e)) => {
                        if let Some(reason) = reply::error_reason(&e) {
                            bad_request(service, peer, reason, &e.to_string(), started);
                        }
                        reply::check_error(&e)
                    }
                    None => Frame::err("internal error: the service gave no answer to this check"),
                },
                proto,
            ),
        };
        encode::encode_as(&frame, proto, &mut bytes);
    }
    BatchOutput { bytes, close }
}

/// The reply to a command that needs no decision.
fn answer(service: &Service, cmd: Command) -> Frame {
    match cmd {
        Command::Ping(None) => Frame::simple("PONG"),
        Command::Ping(Some(m)) | Command::Echo(m) => Frame::Bulk(m),
        Command::Select | Command::Client | Command::Quit => Frame::simple("OK"),
        Command::Hello(_) => Frame::err("internal error: HELLO outside its batch"),
        // A map in Redis (of each command's docs): quorate has none to give.
        Command::CommandList => Frame::Map(vec![]),
        Command::CommandInfo(names) => info::command_info(&names),
        Command::CommandNames => info::command_names(),
        Command::CommandCount => Frame::Integer(info::COMMANDS.len() as i64),
        Command::CommandGetKeys(args) => info::command_getkeys(&args),
        Command::ConfigGet(params) => info::config_get(&params),
        Command::Info(sections) => info::info(service, &sections),
        Command::Routes => info::routes(service),
        Command::Cluster(c) => Frame::err(format!("internal error: {c:?} outside its batch")),
        // Checks are answered with the batch, never here.
        Command::Check { .. } => Frame::err("internal error: check outside its batch"),
    }
}

/// Counts a refused request, and logs it unless the node has logged its share of refusals
/// this second (`Service::refused`). `now` is the batch's `started`: one clock reading per
/// batch, however many of its requests are refused.
fn bad_request(
    service: &Service,
    peer: SocketAddr,
    reason: &'static str,
    detail: &str,
    now: crate::limiter::Nanos,
) {
    if service.refused("resp", reason, now) {
        tracing::info!(api = "resp", %peer, reason, "bad request: {detail}");
    }
}

//! From the service's answers to RESP replies.
//!
//! `CL.THROTTLE` answers as redis-cell does, five integers:
//! `[limited (0|1), limit (max_burst + 1), remaining, retry_after s (-1 when allowed or when
//! the quantity can never fit), reset_after s]`, seconds rounded up so that waiting
//! `retry_after` always suffices.
//!
//! `QR.CHECK` and `QR.PEEK` answer `[allowed (1|0), retry_after s, item...]`, where
//! `retry_after` is -1 when allowed and -2 when some item can never succeed, and each item is
//! `[limit, key, allowed (1|0), limit, remaining, retry_after ms, reset_after ms, fallback
//! (1|0), shadow (1|0)]`: times in milliseconds rounded up, the item's `retry_after` again -1
//! when it admitted and -2 when it never can, `fallback` 1 when the answer came from the
//! limit's `on_unavailable` rule (key cap reached, or its shard could not decide in time),
//! not from its algorithm (HTTP's `fallback`), and `shadow` 1 for a shadow limit's item,
//! whose denial is reported but denies nothing (HTTP's `shadow`).
//!
//! Errors of the service become `-ERR ...`, except "unavailable", which is `-TRYAGAIN ...`
//! so that clients know a retry may succeed.

use super::command::CheckReply;
use super::encode;
use super::frame::Frame;
use crate::limiter::{ceil_secs, Nanos, Outcome};
use crate::service::{CheckError, CheckResponse, ItemDecision};
use bytes::BytesMut;

/// The reply to a decided check.
pub fn check_reply(kind: CheckReply, resp: &CheckResponse) -> Frame {
    match kind {
        CheckReply::Throttle => throttle(resp),
        CheckReply::Check => check(resp),
    }
}

/// The code of the error a removed cluster node answers checks with.
pub const NOT_MEMBER: &str = "NOTMEMBER";

/// The reply to a check the service refused to decide.
pub fn check_error(err: &CheckError) -> Frame {
    match err {
        CheckError::Unavailable(_) => Frame::Error(format!("TRYAGAIN {err}")),
        CheckError::NotMember(_) => Frame::Error(format!("{NOT_MEMBER} {err}")),
        CheckError::InvalidInput(_) | CheckError::UnknownLimit(..) => Frame::err(err),
    }
}

/// The metrics label of a refused check, or `None` when the request was not at fault.
pub fn error_reason(err: &CheckError) -> Option<&'static str> {
    match err {
        CheckError::InvalidInput(_) => Some("invalid_input"),
        CheckError::UnknownLimit(..) => Some("unknown_limit"),
        CheckError::Unavailable(_) | CheckError::NotMember(_) => None,
    }
}

/// Appends the reply to a decided check to `out`: the bytes of
/// `encode(&check_reply(kind, resp))`, written directly (a frame built per reply showed in
/// profiles of pipelined load; `check_reply` stays, as the tests' oracle).
pub fn write_check_reply(kind: CheckReply, resp: &CheckResponse, out: &mut BytesMut) {
    match kind {
        CheckReply::Throttle => match throttle_numbers(resp) {
            Some(numbers) => encode::integers(&numbers, out),
            None => encode::encode(&throttle(resp), out),
        },
        CheckReply::Check => {
            encode::array_header(2 + resp.items.len(), out);
            encode::integers_in_place(&[i64::from(resp.allowed), check_retry_after(resp)], out);
            for i in &resp.items {
                encode::array_header(ITEM_FIELDS, out);
                encode::bulk(i.limit.as_bytes(), out);
                encode::bulk(i.key.as_bytes(), out);
                encode::integers_in_place(&item_numbers(i), out);
            }
        }
    }
}

fn throttle(resp: &CheckResponse) -> Frame {
    match throttle_numbers(resp) {
        Some(numbers) => Frame::Array(numbers.into_iter().map(Frame::Integer).collect()),
        None => Frame::err("internal error: the check returned no decision"),
    }
}

/// `CL.THROTTLE`'s five integers, or `None` if the service returned no decision.
fn throttle_numbers(resp: &CheckResponse) -> Option<[i64; 5]> {
    let d = &resp.items.first()?.decision;
    let retry_after = match (resp.allowed, d.outcome) {
        (true, _) | (false, Outcome::Never) => -1,
        (false, _) => saturated(d.retry_after_secs()),
    };
    Some([
        i64::from(!resp.allowed),
        saturated(d.limit),
        saturated(d.remaining),
        retry_after,
        saturated(d.reset_after_secs()),
    ])
}

fn check(resp: &CheckResponse) -> Frame {
    let mut out = Vec::with_capacity(2 + resp.items.len());
    out.push(Frame::Integer(i64::from(resp.allowed)));
    out.push(Frame::Integer(check_retry_after(resp)));
    out.extend(resp.items.iter().map(item));
    Frame::Array(out)
}

/// A check's `retry_after` in seconds: -1 when allowed, -2 when some item never can be.
fn check_retry_after(resp: &CheckResponse) -> i64 {
    match (resp.allowed, resp.retry_after()) {
        (true, _) => -1,
        (false, None) => -2,
        (false, Some(ns)) => saturated(ceil_secs(ns)),
    }
}

fn item(i: &ItemDecision) -> Frame {
    let mut frames = vec![Frame::bulk(i.limit.to_string()), Frame::bulk(i.key.clone())];
    frames.extend(item_numbers(i).map(Frame::Integer));
    Frame::Array(frames)
}

/// Fields of an item of a `QR.CHECK` reply: its limit, key and [`item_numbers`].
const ITEM_FIELDS: usize = 9;

/// An item's numbers: allowed, limit, remaining, retry_after ms, reset_after ms, fallback,
/// shadow.
fn item_numbers(i: &ItemDecision) -> [i64; ITEM_FIELDS - 2] {
    let d = &i.decision;
    let retry_after = match d.outcome {
        Outcome::Allowed => -1,
        Outcome::Never => -2,
        Outcome::Denied => saturated(ceil_millis(d.retry_after)),
    };
    [
        i64::from(d.allowed()),
        saturated(d.limit),
        saturated(d.remaining),
        retry_after,
        saturated(ceil_millis(d.reset_after)),
        i64::from(i.fallback),
        i64::from(i.shadow),
    ]
}

/// An unsigned count as a RESP integer, saturated (as `Frame::uint`).
fn saturated(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Nanoseconds to whole milliseconds, rounded up.
pub fn ceil_millis(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::super::encode::to_bytes;
    use super::*;
    use crate::limiter::{Algorithm, Decision, SECOND};

    fn decision(
        outcome: Outcome,
        limit: u64,
        remaining: u64,
        retry: Nanos,
        reset: Nanos,
    ) -> Decision {
        Decision {
            outcome,
            limit,
            remaining,
            reset_after: reset,
            retry_after: retry,
            delay: 0,
        }
    }

    fn item(limit: &str, key: &str, d: Decision) -> ItemDecision {
        ItemDecision {
            limit: limit.to_owned().into(),
            key: key.into(),
            algorithm: Algorithm::Gcra,
            period_ns: 60 * SECOND,
            quota: 10,
            decision: d,
            shadow: false,
            fallback: false,
        }
    }

    fn wire(f: Frame) -> String {
        String::from_utf8(to_bytes(&f).to_vec()).unwrap()
    }

    #[test]
    fn a_throttle_reply_written_directly_is_the_frame_encoded() {
        for (allowed, outcome) in [
            (true, Outcome::Allowed),
            (false, Outcome::Denied),
            (false, Outcome::Never),
        ] {
            let resp = CheckResponse {
                allowed,
                items: vec![item(
                    "cl.throttle",
                    "k",
                    decision(outcome, u64::MAX, 7, 1_500_000_000, 2 * SECOND),
                )],
            };
            for kind in [CheckReply::Throttle, CheckReply::Check] {
                let mut direct = BytesMut::new();
                write_check_reply(kind, &resp, &mut direct);
                assert_eq!(
                    String::from_utf8(direct.to_vec()).unwrap(),
                    wire(check_reply(kind, &resp))
                );
            }
        }
        let two = CheckResponse {
            allowed: false,
            items: vec![
                item(
                    "login",
                    "alice",
                    decision(Outcome::Allowed, 5, 4, 0, SECOND),
                ),
                item(
                    "api",
                    "k\r\n",
                    decision(Outcome::Denied, 9, 0, 1, 3 * SECOND),
                ),
            ],
        };
        let mut direct = BytesMut::new();
        write_check_reply(CheckReply::Check, &two, &mut direct);
        assert_eq!(
            String::from_utf8(direct.to_vec()).unwrap(),
            wire(check_reply(CheckReply::Check, &two))
        );
        let empty = CheckResponse {
            allowed: false,
            items: vec![],
        };
        let mut direct = BytesMut::new();
        write_check_reply(CheckReply::Throttle, &empty, &mut direct);
        assert!(direct.starts_with(b"-ERR internal error"));
    }

    #[test]
    fn an_allowed_throttle_replies_like_redis_cell() {
        let resp = CheckResponse {
            allowed: true,
            items: vec![item(
                "cl.throttle",
                "user123",
                decision(Outcome::Allowed, 16, 15, 0, 2 * SECOND),
            )],
        };
        assert_eq!(
            wire(check_reply(CheckReply::Throttle, &resp)),
            "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n"
        );
    }

    #[test]
    fn a_limited_throttle_rounds_its_waits_up() {
        let resp = CheckResponse {
            allowed: false,
            items: vec![item(
                "cl.throttle",
                "k",
                decision(Outcome::Denied, 16, 0, 1, 31 * SECOND + 1),
            )],
        };
        assert_eq!(
            wire(check_reply(CheckReply::Throttle, &resp)),
            "*5\r\n:1\r\n:16\r\n:0\r\n:1\r\n:32\r\n"
        );
    }

    #[test]
    fn a_quantity_that_can_never_fit_is_limited_with_retry_minus_one() {
        let resp = CheckResponse {
            allowed: false,
            items: vec![item(
                "cl.throttle",
                "k",
                decision(Outcome::Never, 16, 16, 0, 0),
            )],
        };
        assert_eq!(
            wire(check_reply(CheckReply::Throttle, &resp)),
            "*5\r\n:1\r\n:16\r\n:16\r\n:-1\r\n:0\r\n"
        );
    }

    #[test]
    fn a_check_reply_lists_every_item_with_millisecond_waits() {
        let resp = CheckResponse {
            allowed: false,
            items: vec![
                item(
                    "api",
                    "k",
                    decision(Outcome::Allowed, 200, 199, 0, 10_000_001),
                ),
                item(
                    "login",
                    "k",
                    decision(Outcome::Denied, 5, 0, 1_500_000_001, 60 * SECOND),
                ),
            ],
        };
        assert_eq!(
            wire(check_reply(CheckReply::Check, &resp)),
            "*4\r\n:0\r\n:2\r\n\
             *9\r\n$3\r\napi\r\n$1\r\nk\r\n:1\r\n:200\r\n:199\r\n:-1\r\n:11\r\n:0\r\n:0\r\n\
             *9\r\n$5\r\nlogin\r\n$1\r\nk\r\n:0\r\n:5\r\n:0\r\n:1501\r\n:60000\r\n:0\r\n:0\r\n"
        );
    }

    #[test]
    fn an_item_answered_by_its_fallback_says_so() {
        let mut fell_back = item("login", "k", decision(Outcome::Allowed, 5, 5, 0, 0));
        fell_back.fallback = true;
        let resp = CheckResponse {
            allowed: true,
            items: vec![fell_back],
        };
        let reply = wire(check_reply(CheckReply::Check, &resp));
        assert!(reply.ends_with(":-1\r\n:0\r\n:1\r\n:0\r\n"), "{reply:?}");
        let mut direct = BytesMut::new();
        write_check_reply(CheckReply::Check, &resp, &mut direct);
        assert_eq!(&direct[..], reply.as_bytes());
    }

    /// A shadow limit's denial is reported, marked as shadow, and the check admits.
    #[test]
    fn a_shadow_items_denial_says_shadow_and_denies_nothing() {
        let mut shadow = item("login", "k", decision(Outcome::Denied, 5, 0, 1_000_000, 0));
        shadow.shadow = true;
        let resp = CheckResponse {
            allowed: true,
            items: vec![shadow],
        };
        let reply = wire(check_reply(CheckReply::Check, &resp));
        assert!(reply.starts_with("*3\r\n:1\r\n:-1\r\n*9\r\n"), "{reply:?}");
        assert!(
            reply.ends_with(":0\r\n:5\r\n:0\r\n:1\r\n:0\r\n:0\r\n:1\r\n"),
            "{reply:?}"
        );
        let mut direct = BytesMut::new();
        write_check_reply(CheckReply::Check, &resp, &mut direct);
        assert_eq!(&direct[..], reply.as_bytes());
    }

    #[test]
    fn a_check_that_can_never_succeed_says_minus_two() {
        let resp = CheckResponse {
            allowed: false,
            items: vec![item("login", "k", decision(Outcome::Never, 5, 5, 0, 0))],
        };
        assert_eq!(
            wire(check_reply(CheckReply::Check, &resp)),
            "*3\r\n:0\r\n:-2\r\n*9\r\n$5\r\nlogin\r\n$1\r\nk\r\n:0\r\n:5\r\n:5\r\n:-2\r\n:0\r\n:0\r\n:0\r\n"
        );
    }

    #[test]
    fn an_allowed_check_says_minus_one() {
        let resp = CheckResponse {
            allowed: true,
            items: vec![item(
                "login",
                "k",
                decision(Outcome::Allowed, 5, 4, 0, 60 * SECOND),
            )],
        };
        assert!(wire(check_reply(CheckReply::Check, &resp)).starts_with("*3\r\n:1\r\n:-1\r\n"));
    }

    #[test]
    fn service_errors_become_err_and_unavailable_becomes_tryagain() {
        assert_eq!(
            check_error(&CheckError::InvalidInput(
                "inline limits are disabled".into()
            )),
            Frame::Error("ERR inline limits are disabled".into())
        );
        assert_eq!(
            check_error(&CheckError::Unavailable("shutting down".into())),
            Frame::Error("TRYAGAIN unavailable: shutting down".into())
        );
        assert_eq!(error_reason(&CheckError::Unavailable("x".into())), None);
        // A removed node's refusal, from the shard's error (the Rust client reads the code).
        let removed = CheckError::from(crate::shard::actor::ShardError::Removed(2));
        assert_eq!(
            check_error(&removed),
            Frame::Error(
                "NOTMEMBER this node was removed from the cluster (shard 2): send to a member"
                    .into()
            )
        );
        assert_eq!(error_reason(&removed), None);
        assert_eq!(
            error_reason(&CheckError::UnknownLimit("x".into(), "a".into())),
            Some("unknown_limit")
        );
    }

    #[test]
    fn a_throttle_answer_without_items_is_an_error_not_a_panic() {
        let resp = CheckResponse {
            allowed: true,
            items: vec![],
        };
        assert!(matches!(
            check_reply(CheckReply::Throttle, &resp),
            Frame::Error(_)
        ));
    }
}

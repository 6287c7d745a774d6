//! The `RateLimit-Policy` and `RateLimit` header values of draft-ietf-httpapi-ratelimit-headers
//! (draft 10/11): Structured Field Lists of Strings with Integer parameters.
//!
//! Kept apart from the status mapping because the syntax has traps of its own: names must
//! become valid sf-strings (printable ASCII, `"` and `\` escaped), sf-integers stop at 15
//! digits, and windows are whole seconds (at least 1), so every number is clamped or rounded
//! up here rather than trusted.

use crate::limiter::{ceil_secs, Nanos, Outcome};
use crate::service::ItemDecision;

/// The largest sf-integer (RFC 9651 §3.3.1: at most 15 digits).
pub const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Longest policy name rendered into a header; longer names are cut (they stay whole in
/// the JSON body).
const MAX_NAME_CHARS: usize = 128;

/// A value as an sf-integer: clamped to 15 digits.
pub fn sf_integer(v: u64) -> u64 {
    v.min(SF_INTEGER_MAX)
}

/// A policy name as an sf-string. Characters an sf-string cannot hold (controls, non-ASCII)
/// become `_`, so any name yields a valid header.
pub fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len().min(MAX_NAME_CHARS) + 2);
    out.push('"');
    for c in name.chars().take(MAX_NAME_CHARS) {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

/// A period as the draft's window `w`: whole seconds, rounded up, at least 1 (the draft
/// allows no sub-second or zero window).
pub fn window_secs(period: Nanos) -> u64 {
    sf_integer(ceil_secs(period).max(1))
}

/// The draft's effective window `t` of one item: for an item that denies, the seconds
/// until it would admit (within them the client can use nothing); otherwise the seconds
/// until the key is back to its never-seen state. Rounded up.
pub fn effective_window_secs(item: &ItemDecision) -> u64 {
    let d = &item.decision;
    let ns = match d.outcome {
        Outcome::Denied => d.retry_after,
        Outcome::Allowed | Outcome::Never => d.reset_after,
    };
    sf_integer(ceil_secs(ns))
}

/// One `RateLimit-Policy` list member: `"name";q=QUOTA;w=PERIOD_SECONDS`, the quota being
/// the units per period (a bucket's rate, not its larger capacity).
pub fn policy_member(item: &ItemDecision) -> String {
    format!(
        "{};q={};w={}",
        sf_string(&item.limit),
        sf_integer(item.quota),
        window_secs(item.period_ns)
    )
}

/// One `RateLimit` list member: `"name";r=REMAINING;t=SECONDS`.
pub fn limit_member(item: &ItemDecision) -> String {
    format!(
        "{};r={};t={}",
        sf_string(&item.limit),
        sf_integer(item.decision.remaining),
        effective_window_secs(item)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Decision, SECOND};

    fn item(
        limit: &str,
        outcome: Outcome,
        remaining: u64,
        retry: Nanos,
        reset: Nanos,
    ) -> ItemDecision {
        ItemDecision {
            limit: limit.to_owned().into(),
            key: "k".into(),
            algorithm: Algorithm::SlidingLog,
            period_ns: 60 * SECOND,
            quota: 5,
            decision: Decision {
                outcome,
                limit: 5,
                remaining,
                reset_after: reset,
                retry_after: retry,
                delay: 0,
            },
            shadow: false,
            fallback: false,
        }
    }

    #[test]
    fn names_become_valid_sf_strings_whatever_they_contain() {
        assert_eq!(sf_string("login"), "\"login\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("é\n\t"), "\"___\"");
        assert_eq!(sf_string(&"x".repeat(1000)).len(), MAX_NAME_CHARS + 2);
    }

    #[test]
    fn integers_are_clamped_to_fifteen_digits() {
        assert_eq!(sf_integer(u64::MAX), SF_INTEGER_MAX);
        assert_eq!(sf_integer(7), 7);
    }

    #[test]
    fn windows_are_whole_seconds_rounded_up_and_never_zero() {
        assert_eq!(window_secs(1), 1);
        assert_eq!(window_secs(500_000_000), 1);
        assert_eq!(window_secs(SECOND), 1);
        assert_eq!(window_secs(SECOND + 1), 2);
        assert_eq!(window_secs(60 * SECOND), 60);
    }

    #[test]
    fn members_follow_the_draft_syntax() {
        let allowed = item("login", Outcome::Allowed, 3, 0, 40 * SECOND - 1);
        assert_eq!(policy_member(&allowed), "\"login\";q=5;w=60");
        // A bucket advertises its rate per period, not its (larger) capacity.
        let bucket = ItemDecision {
            quota: 100,
            period_ns: SECOND,
            ..allowed.clone()
        };
        assert_eq!(policy_member(&bucket), "\"login\";q=100;w=1");
        assert_eq!(limit_member(&allowed), "\"login\";r=3;t=40");
    }

    #[test]
    fn a_denying_item_reports_its_retry_time_as_the_effective_window() {
        let denied = item("login", Outcome::Denied, 0, 12 * SECOND + 1, 59 * SECOND);
        assert_eq!(limit_member(&denied), "\"login\";r=0;t=13");
    }
}

//! The decision-to-HTTP mapping: a pure function from the service's answer to status,
//! headers and body.
//!
//! It is pure so the rules that clients and gateways depend on are unit-tested without a
//! socket: a denial is 429 (or the gateway's `deny_status`), never 503; `Retry-After` is
//! rounded up, so waiting that long succeeds; a check that can never succeed has no
//! `Retry-After` and says `"retryable": false`; shadow limits decide but neither deny nor
//! show up in headers.

use super::headers::{limit_member, policy_member};
use crate::limiter::{ceil_secs, Algorithm, Nanos, Outcome};
use crate::service::{CheckError, CheckResponse, ItemDecision};
use axum::http::header::{HeaderName, HeaderValue, CACHE_CONTROL, RETRY_AFTER};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The body of a decision (`POST /v1/check`, `/v1/authorize`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecisionBody {
    /// True when every item admitted (shadow items always count as admitting).
    pub allowed: bool,
    /// Milliseconds (rounded up) before the whole check could succeed: 0 when allowed,
    /// `null` when it can never succeed.
    pub retry_after_ms: Option<u64>,
    /// Present on denials only: false when the check can never succeed (a cost above a
    /// limit's capacity), so retrying is pointless.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    /// Milliseconds (rounded up) an admitted request must wait before it starts (leaky-queue
    /// limits; the largest over the items). 0 otherwise.
    pub delay_ms: u64,
    pub checks: Vec<CheckBody>,
}

/// One item of a [`DecisionBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckBody {
    pub limit: String,
    pub key: String,
    pub algorithm: Algorithm,
    pub allowed: bool,
    /// `allowed`, `denied` (not now) or `never` (the cost exceeds the capacity).
    pub outcome: &'static str,
    /// The limit's capacity: the most one key can be granted at once.
    pub limit_value: u64,
    pub remaining: u64,
    pub reset_after_ms: u64,
    pub retry_after_ms: u64,
    pub delay_ms: u64,
    pub shadow: bool,
    /// The answer came from the limit's `on_unavailable` rule (key cap reached).
    pub fallback: bool,
}

/// Status, headers and body of one decision.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: DecisionBody,
}

impl IntoResponse for Rendered {
    fn into_response(self) -> Response {
        (self.status, self.headers, Json(self.body)).into_response()
    }
}

/// Nanoseconds to whole milliseconds, rounded up.
pub fn ceil_ms(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000)
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Allowed => "allowed",
        Outcome::Denied => "denied",
        Outcome::Never => "never",
    }
}

/// The item the `X-RateLimit-*` headers describe: among the non-shadow items, the denying
/// one (one that can never succeed first, then the longest wait; the first on ties), else
/// the one with the least remaining (the first on ties).
pub fn most_restrictive(items: &[ItemDecision]) -> Option<&ItemDecision> {
    let live = || items.iter().filter(|i| !i.shadow);
    live()
        .filter(|i| !i.decision.allowed())
        .rev()
        .max_by_key(|i| (i.decision.outcome == Outcome::Never, i.decision.retry_after))
        .or_else(|| live().min_by_key(|i| i.decision.remaining))
}

fn header_value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

/// Maps a decision to HTTP. Admitted: 200. Denied: `deny_status` (429 for `/v1/check`;
/// 401, 403 or 429 for `/v1/authorize`), with `Retry-After` in whole seconds rounded up (at
/// least 1) unless the check can never succeed.
pub fn render(resp: &CheckResponse, deny_status: StatusCode) -> Rendered {
    let mut headers = HeaderMap::new();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));

    let live: Vec<&ItemDecision> = resp.items.iter().filter(|i| !i.shadow).collect();
    if !live.is_empty() {
        let policy: Vec<String> = live.iter().map(|i| policy_member(i)).collect();
        let limit: Vec<String> = live.iter().map(|i| limit_member(i)).collect();
        if let Some(v) = header_value(&policy.join(", ")) {
            headers.insert(RATELIMIT_POLICY, v);
        }
        if let Some(v) = header_value(&limit.join(", ")) {
            headers.insert(RATELIMIT, v);
        }
    }
    if let Some(top) = most_restrictive(&resp.items) {
        let d = &top.decision;
        headers.insert(X_RATELIMIT_LIMIT, d.limit.into());
        headers.insert(X_RATELIMIT_REMAINING, d.remaining.into());
        headers.insert(X_RATELIMIT_RESET, ceil_secs(d.reset_after).into());
    }

    let wait = resp.retry_after();
    let status = if resp.allowed {
        StatusCode::OK
    } else {
        if let Some(ns) = wait {
            headers.insert(RETRY_AFTER, ceil_secs(ns).max(1).into());
        }
        deny_status
    };

    let delay = resp
        .items
        .iter()
        .filter(|i| !i.shadow && i.decision.allowed())
        .map(|i| i.decision.delay)
        .max()
        .unwrap_or(0);
    let body = DecisionBody {
        allowed: resp.allowed,
        retry_after_ms: if resp.allowed {
            Some(0)
        } else {
            wait.map(ceil_ms)
        },
        retryable: (!resp.allowed).then_some(wait.is_some()),
        delay_ms: if resp.allowed { ceil_ms(delay) } else { 0 },
        checks: resp.items.iter().map(check_body).collect(),
    };
    Rendered {
        status,
        headers,
        body,
    }
}

fn check_body(i: &ItemDecision) -> CheckBody {
    let d = &i.decision;
    CheckBody {
        limit: i.limit.to_string(),
        key: i.key.clone(),
        algorithm: i.algorithm,
        allowed: d.allowed(),
        outcome: outcome_name(d.outcome),
        limit_value: d.limit,
        remaining: d.remaining,
        reset_after_ms: ceil_ms(d.reset_after),
        retry_after_ms: ceil_ms(d.retry_after),
        delay_ms: ceil_ms(d.delay),
        shadow: i.shadow,
        fallback: i.fallback,
    }
}

/// How a [`CheckError`] is answered: status, the `reason` label of
/// `quorate_bad_requests_total`, and the message. Only `Unavailable` and `NotMember` are
/// 5xx.
pub fn error_status(err: &CheckError) -> (StatusCode, &'static str) {
    match err {
        CheckError::InvalidInput(_) => (StatusCode::BAD_REQUEST, "invalid_input"),
        CheckError::UnknownLimit(..) => (StatusCode::BAD_REQUEST, "unknown_limit"),
        CheckError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        CheckError::NotMember(_) => (StatusCode::SERVICE_UNAVAILABLE, "not_member"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, SECOND};

    fn item(limit: &str, outcome: Outcome, remaining: u64, retry: Nanos) -> ItemDecision {
        ItemDecision {
            limit: limit.to_owned().into(),
            key: "alice".into(),
            algorithm: Algorithm::SlidingLog,
            period_ns: 60 * SECOND,
            quota: 5,
            decision: Decision {
                outcome,
                limit: 5,
                remaining,
                reset_after: 40 * SECOND,
                retry_after: retry,
                delay: 0,
            },
            shadow: false,
            fallback: false,
        }
    }

    fn response(items: Vec<ItemDecision>) -> CheckResponse {
        let allowed = items.iter().all(|i| i.shadow || i.decision.allowed());
        CheckResponse { allowed, items }
    }

    fn header<'a>(r: &'a Rendered, name: &str) -> Option<&'a str> {
        r.headers.get(name).and_then(|v| v.to_str().ok())
    }

    const TOO_MANY: StatusCode = StatusCode::TOO_MANY_REQUESTS;

    #[test]
    fn an_admitted_check_is_200_with_the_ratelimit_headers_and_no_retry_after() {
        let r = render(
            &response(vec![item("login", Outcome::Allowed, 3, 0)]),
            TOO_MANY,
        );
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(header(&r, "ratelimit-policy"), Some("\"login\";q=5;w=60"));
        assert_eq!(header(&r, "ratelimit"), Some("\"login\";r=3;t=40"));
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("5"));
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("3"));
        assert_eq!(header(&r, "x-ratelimit-reset"), Some("40"));
        assert_eq!(header(&r, "cache-control"), Some("no-store"));
        assert_eq!(header(&r, "retry-after"), None);
        assert_eq!(r.body.retry_after_ms, Some(0));
        assert_eq!(r.body.retryable, None);
        assert_eq!(r.body.checks[0].outcome, "allowed");
    }

    #[test]
    fn a_denial_is_429_with_retry_after_rounded_up_never_down() {
        let resp = response(vec![item("login", Outcome::Denied, 0, 2 * SECOND + 1)]);
        let r = render(&resp, TOO_MANY);
        assert_eq!(r.status, TOO_MANY);
        assert_eq!(header(&r, "retry-after"), Some("3"));
        assert_eq!(header(&r, "cache-control"), Some("no-store"));
        assert_eq!(r.body.retry_after_ms, Some(2001));
        assert_eq!(r.body.retryable, Some(true));
        let r = render(
            &response(vec![item("login", Outcome::Denied, 0, 1)]),
            TOO_MANY,
        );
        assert_eq!(header(&r, "retry-after"), Some("1"));
        assert_eq!(r.body.retry_after_ms, Some(1));
    }

    #[test]
    fn a_denial_never_tells_the_client_to_retry_at_once() {
        let r = render(
            &response(vec![item("login", Outcome::Denied, 0, 0)]),
            TOO_MANY,
        );
        assert_eq!(header(&r, "retry-after"), Some("1"));
    }

    #[test]
    fn a_check_that_can_never_succeed_is_429_without_retry_after_and_not_retryable() {
        let resp = response(vec![
            item("login", Outcome::Denied, 0, 5 * SECOND),
            item("api", Outcome::Never, 5, 0),
        ]);
        let r = render(&resp, TOO_MANY);
        assert_eq!(r.status, TOO_MANY);
        assert_eq!(header(&r, "retry-after"), None);
        assert_eq!(r.body.retryable, Some(false));
        assert_eq!(r.body.retry_after_ms, None);
        assert_eq!(r.body.checks[1].outcome, "never");
        let json = serde_json::to_value(&r.body).unwrap();
        assert_eq!(json["retryable"], serde_json::json!(false));
        assert!(json["retry_after_ms"].is_null());
    }

    #[test]
    fn the_x_headers_describe_the_denying_item_else_the_least_remaining() {
        let resp = response(vec![
            item("a", Outcome::Allowed, 1, 0),
            item("b", Outcome::Denied, 4, 7 * SECOND),
            item("c", Outcome::Denied, 2, 9 * SECOND),
        ]);
        let r = render(&resp, TOO_MANY);
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
        assert_eq!(header(&r, "retry-after"), Some("9"));
        let resp = response(vec![
            item("a", Outcome::Allowed, 4, 0),
            item("b", Outcome::Allowed, 2, 0),
            item("c", Outcome::Allowed, 2, 0),
        ]);
        let r = render(&resp, TOO_MANY);
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
        assert_eq!(most_restrictive(&resp.items).unwrap().limit, "b");
    }

    #[test]
    fn every_item_is_one_member_of_the_ratelimit_lists() {
        let resp = response(vec![
            item("login", Outcome::Allowed, 4, 0),
            item("ip", Outcome::Denied, 0, 30 * SECOND),
        ]);
        let r = render(&resp, TOO_MANY);
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"login\";q=5;w=60, \"ip\";q=5;w=60")
        );
        assert_eq!(
            header(&r, "ratelimit"),
            Some("\"login\";r=4;t=40, \"ip\";r=0;t=30")
        );
    }

    #[test]
    fn shadow_items_never_deny_and_stay_out_of_the_headers() {
        let mut shadow = item("trial", Outcome::Denied, 0, 5 * SECOND);
        shadow.shadow = true;
        let resp = response(vec![shadow.clone(), item("login", Outcome::Allowed, 4, 0)]);
        let r = render(&resp, TOO_MANY);
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(header(&r, "ratelimit"), Some("\"login\";r=4;t=40"));
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("4"));
        assert!(r.body.checks[0].shadow && !r.body.checks[0].allowed);
        let r = render(&response(vec![shadow]), TOO_MANY);
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(header(&r, "ratelimit"), None);
        assert_eq!(header(&r, "x-ratelimit-limit"), None);
    }

    #[test]
    fn a_gateway_deny_status_replaces_429_and_keeps_retry_after() {
        let resp = response(vec![item("login", Outcome::Denied, 0, 1500 * 1_000_000)]);
        let r = render(&resp, StatusCode::FORBIDDEN);
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert_eq!(header(&r, "retry-after"), Some("2"));
    }

    #[test]
    fn an_admitted_leaky_queue_item_reports_its_delay() {
        let mut queued = item("shaping", Outcome::Allowed, 2, 0);
        queued.decision.delay = 250_000_001;
        let r = render(&response(vec![queued]), TOO_MANY);
        assert_eq!(r.body.delay_ms, 251);
        assert_eq!(r.body.checks[0].delay_ms, 251);
    }

    #[test]
    fn only_unavailable_and_not_member_are_server_errors() {
        let bad = CheckError::InvalidInput("x".into());
        let unknown = CheckError::UnknownLimit("x".into(), "login".into());
        let down = CheckError::Unavailable("x".into());
        let removed = CheckError::NotMember("x".into());
        assert_eq!(error_status(&bad).0, StatusCode::BAD_REQUEST);
        assert_eq!(error_status(&unknown).0, StatusCode::BAD_REQUEST);
        assert_eq!(error_status(&down).0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            error_status(&removed),
            (StatusCode::SERVICE_UNAVAILABLE, "not_member")
        );
    }

    #[test]
    fn milliseconds_are_rounded_up() {
        assert_eq!(ceil_ms(0), 0);
        assert_eq!(ceil_ms(1), 1);
        assert_eq!(ceil_ms(1_000_000), 1);
        assert_eq!(ceil_ms(1_000_001), 2);
        assert_eq!(ceil_ms(u64::MAX), u64::MAX.div_ceil(1_000_000));
    }
}

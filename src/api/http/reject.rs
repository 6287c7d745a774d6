//! Refusals: every 4xx (and the 503) is answered the same way — a JSON `{"error", "reason"}`
//! body that names the field and the fix, an `info` log line saying why (for a 4xx, at most
//! a few a second per node: see `service::refusal_log`), and a count in
//! `quorate_bad_requests_total{api="http",reason}` — so an operator can always tell why a
//! client was turned away, and `reason` stays a small fixed set of labels.

use crate::service::Service;
use axum::http::header::{CACHE_CONTROL, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// Longest piece of client input quoted back in an error message or a log line.
const MAX_QUOTE_CHARS: usize = 64;

/// A request refused before (or instead of) a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub status: StatusCode,
    /// The metric label: a fixed, small set of names.
    pub reason: &'static str,
    /// What was wrong and how to fix it.
    pub message: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    reason: &'a str,
}

impl Reject {
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Reject {
            status,
            reason,
            message: message.into(),
        }
    }

    /// A 400 Bad Request.
    pub fn bad(reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, reason, message)
    }

    /// Counts and logs the refusal (a 4xx unless the node has logged its share of them this
    /// second), and renders it.
    pub fn respond(self, service: &Service, route: &str) -> Response {
        if self.status.is_client_error() {
            let now = service.clock().monotonic();
            if service.refused("http", self.reason, now) {
                tracing::info!(
                    api = "http",
                    route,
                    status = self.status.as_u16(),
                    reason = self.reason,
                    "request refused: {}",
                    self.message
                );
            }
        } else {
            tracing::warn!(
                api = "http",
                route,
                status = self.status.as_u16(),
                reason = self.reason,
                "request not decided: {}",
                self.message
            );
        }
        self.into_response()
    }
}

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: &self.message,
            reason: self.reason,
        };
        let mut resp = (self.status, Json(body)).into_response();
        let headers = resp.headers_mut();
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// Client input quoted for a message: Rust-escaped (no control characters reach a log
/// line) and cut to a bounded length.
pub fn quote(text: &str) -> String {
    let mut cut: String = text.chars().take(MAX_QUOTE_CHARS).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_input_is_escaped_and_bounded() {
        assert_eq!(quote("a\nb"), "\"a\\nb\"");
        assert!(quote(&"x".repeat(10_000)).chars().count() < MAX_QUOTE_CHARS + 8);
    }

    async fn service() -> Service {
        let clock = std::sync::Arc::new(crate::clock::ManualClock::new(0));
        let config = crate::config::NodeConfig::default();
        let policies = crate::policy::PolicySet::default_policies();
        Service::start(config, policies, clock).await.unwrap()
    }

    #[tokio::test]
    async fn a_refusal_is_counted_under_its_reason() {
        let svc = service().await;
        let r = Reject::bad("empty_key", "`key` is empty").respond(&svc, "/v1/check");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let count = |reason| {
            svc.metrics()
                .bad_requests
                .with_label_values(&["http", reason])
                .get()
        };
        assert_eq!(count("empty_key"), 1);
        // Past the log's bound (the clock stands still: one second), each is still counted.
        for _ in 0..100 {
            Reject::bad("empty_key", "`key` is empty").respond(&svc, "/v1/check");
        }
        assert_eq!(count("empty_key"), 101);
    }

    #[test]
    fn unavailable_asks_for_a_retry_in_a_second() {
        let r = Reject::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "down").into_response();
        assert_eq!(r.headers()[RETRY_AFTER], "1");
    }
}

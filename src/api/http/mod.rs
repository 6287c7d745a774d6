//! The HTTP/JSON API: `POST /v1/check`, `/v1/authorize` for gateways, metrics, health and
//! admin endpoints (see docs/api.md and docs/openapi.yaml).
//!
//! One job per file, and the rules that clients depend on kept pure so they are tested
//! without sockets:
//! - `server` — the accept loop over the `net` seam: connection cap, timeouts, draining.
//! - `stall` — closes connections whose client stopped reading.
//! - `routes` — the router and the thin handlers.
//! - `body` — reading a body within the size and time bounds.
//! - `request` — the `/v1/check` JSON, validated into a `CheckRequest`.
//! - `authorize` — the `/v1/authorize` query, validated into a `CheckRequest`.
//! - `decision` — a decision to status, headers and body (pure).
//! - `headers` — the `RateLimit-Policy` / `RateLimit` structured fields (pure).
//! - `reject` — every refusal: JSON error, log line, metric.

pub mod authorize;
pub mod body;
pub mod decision;
pub mod headers;
pub mod reject;
pub mod request;
pub mod routes;
pub mod server;
pub mod stall;

pub use decision::{render, DecisionBody, Rendered};
pub use routes::router;
pub use server::serve;

//! The node's client-facing protocols. Each only translates between its wire format and the
//! [`Service`](crate::service::Service) types; every decision is made by the service, so the
//! two APIs cannot disagree.
//!
//! - `resp/` — the Redis protocol (RESP2, and RESP3 after `HELLO 3`): redis-cell's
//!   `CL.THROTTLE`, quorate's `QR.CHECK` and `QR.PEEK`, and enough of Redis's connection
//!   commands for redis-cli, redis-benchmark and client libraries.
//! - `http/` — HTTP/JSON.

pub mod http;
pub mod resp;

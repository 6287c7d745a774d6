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

/// The byte written as two hex digits at `i` of `text`, if there are two there: RESP's
/// inline `\xHH` escapes and HTTP's `%HH` query escapes.
pub(crate) fn hex_pair(text: &[u8], i: usize) -> Option<u8> {
    let digit = |b: u8| char::from(b).to_digit(16);
    let hi = digit(*text.get(i)?)?;
    let lo = digit(*text.get(i + 1)?)?;
    u8::try_from(hi * 16 + lo).ok()
}

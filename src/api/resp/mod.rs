//! The Redis protocol API (RESP2, and RESP3 after `HELLO 3`), so that Redis clients and
//! redis-cell users can use quorate unchanged: `CL.THROTTLE` answers exactly as redis-cell
//! does, `QR.CHECK` and `QR.PEEK` add named limits and all-or-nothing checks, and the
//! connection commands redis-cli and redis-benchmark send are answered.
//!
//! Layers, each in its own file: bytes to requests ([`frame`], [`inline`]), requests to
//! commands ([`command`]), a pipeline batch through the service ([`exec`]), answers to
//! replies ([`reply`], [`info`]), replies to bytes ([`encode`]); [`conn`] and [`server`] own
//! the sockets. [`decode`] reads replies, for the client and tests.

pub mod cluster;
pub mod command;
pub mod conn;
pub mod decode;
pub mod encode;
pub mod exec;
pub mod frame;
pub mod info;
pub mod inline;
pub mod reply;
pub mod server;

pub use frame::{parse_request, Frame, Limits, ProtocolError};
pub use server::serve;

//! Command-line tools around a node (not node code: they may use the real clock and
//! sockets directly).

pub mod dev;
pub mod health;
pub mod members;
pub mod status;

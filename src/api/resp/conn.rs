//! One client connection: read, answer every complete request buffered as one batch, write
//! the replies with one write, repeat.
//!
//! Bounded on every side: the read buffer never holds more than one request that is still
//! arriving (at most [`Limits::max_frame`]) plus one read; a batch is at most
//! [`MAX_BATCH`] requests; a client that sends nothing, or stops reading its replies, for
//! `idle_timeout` is disconnected. On shutdown a connection finishes the batch it is
//! answering and closes instead of reading more.

use super::exec::{self, ConnState};
use super::frame::{take_batch, Batch, Limits, Protocol, ProtocolError};
use crate::clock::LazyTimer;
use crate::net::Stream;
use crate::service::Service;
use bytes::BytesMut;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::broadcast;

/// Most requests answered as one batch (one `check_many` call, one write).
pub const MAX_BATCH: usize = 1024;

/// Most bytes read at once.
const READ_CHUNK: usize = 16 * 1024;

/// Whether the server has asked connections to stop (mini-redis's pattern: the server drops
/// the broadcast sender, and every receiver then sees `Closed`).
pub struct Shutdown {
    notify: broadcast::Receiver<()>,
}

impl Shutdown {
    pub fn new(notify: broadcast::Receiver<()>) -> Self {
        Shutdown { notify }
    }

    /// A check (true once the server has stopped: one atomic load) and the wait for that.
    /// A connection keeps the one wait for its whole life, so it is registered with the
    /// channel once, not once per read.
    fn split(self) -> (impl Fn() -> bool, impl std::future::Future<Output = ()>) {
        let check = self.notify.resubscribe();
        let mut notify = self.notify;
        (move || check.is_closed(), async move {
            let _ = notify.recv().await;
        })
    }
}

/// Serves one connection until the client leaves, misbehaves, idles or the server stops.
pub async fn handle<S: Stream>(
    mut stream: S,
    peer: SocketAddr,
    service: Service,
    shutdown: Shutdown,
) {
    let config = service.config();
    let limits = Limits::from_max_frame_bytes(config.max_frame_bytes);
    let cap = limits.max_frame.saturating_add(READ_CHUNK);
    // One idle timer and one call timer for the connection's life (see `LazyTimer`).
    let mut idle = LazyTimer::new(service.clock().clone(), config.idle_timeout);
    // RESP2 until the client sends `HELLO 3`.
    let mut conn = ConnState {
        peer,
        proto: Protocol::default(),
        latency: service
            .metrics()
            .decision_latency
            .with_label_values(&["resp"])
            .local(),
        calls: service.call_timer(),
    };
    let (stopping, stop) = shutdown.split();
    let mut stop = std::pin::pin!(stop);
    let mut buf = BytesMut::new();
    // When the last read completed (the clock reading its idle restart took), if no batch
    // has used it yet: requests it completed arrived then.
    let mut arrived = None;
    loop {
        if stopping() {
            return;
        }
        let (requests, error) = take_batch(&mut buf, &limits, MAX_BATCH);
        if !requests.is_empty() || error.is_some() {
            let started = arrived
                .take()
                .unwrap_or_else(|| service.clock().monotonic());
            let out = exec::run(&service, requests, error, &mut conn, started).await;
            let sent = idle
                .bound(async {
                    stream.write_all(&out.bytes).await?;
                    stream.flush().await
                })
                .await;
            if !matches!(sent, Some(Ok(()))) {
                tracing::debug!(api = "resp", %peer, "closing: the client is not reading its replies");
                return;
            }
            idle.restart();
            if out.close {
                let _ = idle.bound(stream.shutdown()).await;
                return;
            }
            continue;
        }
        // Only an incomplete request is buffered here, and the parser keeps it below
        // `max_frame`, so there is always room; the check is belt and braces.
        let room = cap.saturating_sub(buf.len()).min(READ_CHUNK);
        if room == 0 {
            let e = ProtocolError::FrameTooLarge {
                max: limits.max_frame,
            };
            let now = service.clock().monotonic();
            let out = exec::run(&service, Batch::default(), Some(e), &mut conn, now).await;
            let _ = idle.bound(stream.write_all(&out.bytes)).await;
            return;
        }
        buf.reserve(room);
        let mut limited = (&mut stream).take(room as u64);
        // The read first: a ready read does not poll the stop signal (a lock in the
        // broadcast channel, per read, in profiles); the loop's `stopping()` check above
        // still sees a shutdown between reads, and a waiting read still sees it here.
        let read = tokio::select! {
            biased;
            r = idle.bound(limited.read_buf(&mut buf)) => r,
            _ = &mut stop => return,
        };
        match read {
            Some(Ok(0)) => return,
            Some(Ok(_)) => {
                let now = service.clock().monotonic();
                idle.restart_at(now);
                arrived = Some(now);
            }
            Some(Err(e)) => {
                tracing::debug!(api = "resp", %peer, "closing: read failed: {e}");
                return;
            }
            None => {
                tracing::debug!(api = "resp", %peer, "closing: idle for {:?}", idle.limit());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_stops_at_quit_and_leaves_the_rest_unparsed() {
        let mut buf = BytesMut::from(&b"PING\r\nQUIT\r\nPING\r\n"[..]);
        let limits = Limits::from_max_frame_bytes(1024);
        let (requests, error) = take_batch(&mut buf, &limits, MAX_BATCH);
        assert_eq!(requests.len(), 2);
        assert!(error.is_none());
        assert_eq!(&buf[..], b"PING\r\n");
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_requests() {
        let mut buf = BytesMut::from("PING\r\n".repeat(MAX_BATCH + 5).as_bytes());
        let limits = Limits::from_max_frame_bytes(1024);
        assert_eq!(take_batch(&mut buf, &limits, MAX_BATCH).0.len(), MAX_BATCH);
        assert_eq!(take_batch(&mut buf, &limits, MAX_BATCH).0.len(), 5);
    }

    #[test]
    fn a_batch_keeps_the_requests_before_a_protocol_error() {
        let mut buf = BytesMut::from(&b"PING\r\n*x\r\n"[..]);
        let limits = Limits::from_max_frame_bytes(1024);
        let (requests, error) = take_batch(&mut buf, &limits, MAX_BATCH);
        assert_eq!(requests.len(), 1);
        assert_eq!(error, Some(ProtocolError::InvalidMultibulkLength));
    }
}

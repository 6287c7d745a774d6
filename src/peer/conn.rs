//! One authenticated peer connection, the same on both of its ends: it carries this node's
//! calls to the peer and the peer's calls to this node ([module docs](super), "Connections").
//!
//! A connection has one task that reads frames (replies to this node's calls go to the
//! pending table; the peer's requests go to the handler, concurrently and bounded, and their
//! answers back in completion order), writes queued frames in batches and, on the dialer's
//! end, pings. When it ends, every call still waiting on it gets `ConnectionLost`, exactly
//! once: a waiting call's reply sender lives in the pending table, and whoever removes it
//! (the reply, the connection's end, or the call giving up) is the only one who can use it.

use super::frame::{self, read_frame, Frame, FrameError, Kind};
use super::{Handler, NodeId, PeerConfig, PeerError, PeerStats};
use crate::net::Stream;
use arc_swap::ArcSwapOption;
use futures::FutureExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncRead, BufReader};
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tracing::warn;

/// Longest error message sent back to a caller; a handler's message is cut there.
const MAX_ERROR: usize = 4096;

pub(crate) type Reply = Result<Vec<u8>, PeerError>;

/// What answers the peers' requests on this node: the handler and the counters.
pub(crate) struct Serving {
    pub handler: Handler,
    pub stats: Arc<PeerStats>,
}

/// Where a connection finds what answers requests: looked up per request, so connections a
/// node dialed before its peer server started are answered once it has.
pub(crate) type ServingCell = Arc<ArcSwapOption<Serving>>;

/// Which end of the connection this node holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum End {
    /// This node dialed: it pings, and the connection closes once nothing on this node
    /// holds it (the peer's slot was dropped or replaced).
    Dialer,
    /// The peer dialed: the connection lives until the peer closes it, it goes silent, or
    /// the server shuts down.
    Acceptor,
}

/// A live connection as this node's callers see it.
pub(crate) struct Conn {
    /// Its id, the same on both ends ([`super::handshake::conn_id`]).
    pub id: u64,
    /// Frames for the connection's writer. Closed once the connection's task has ended.
    pub tx: mpsc::Sender<Frame>,
    pub pending: Arc<Pending>,
    close: Arc<Notify>,
}

impl Conn {
    /// Whether its task still runs.
    pub fn is_live(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Ends the connection (its waiting calls fail with `ConnectionLost`).
    pub fn close(&self) {
        self.close.notify_one();
    }
}

/// Calls waiting for replies on one connection. `None` once the connection has ended, so no
/// call can register on a connection that will never answer.
pub(crate) struct Pending {
    table: Mutex<Option<Table>>,
    next_id: AtomicU64,
}

/// The waiting calls by id, each with whether it is bulk ([`PeerConfig::is_bulk`]), and how
/// many are.
#[derive(Default)]
struct Table {
    waiting: BTreeMap<u64, (oneshot::Sender<Reply>, bool)>,
    bulk: usize,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<oneshot::Sender<Reply>> {
        let (waiter, bulk) = self.waiting.remove(&id)?;
        self.bulk -= usize::from(bulk);
        Some(waiter)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pending {
    /// Registers a call: at most `limit` wait at once, and of them at most `bulk_limit`
    /// bulk ones (`bulk_limit` is `Some` for a bulk call).
    pub fn register(
        self: &Arc<Self>,
        peer: NodeId,
        limit: usize,
        bulk_limit: Option<usize>,
    ) -> Result<(u64, oneshot::Receiver<Reply>, Waiting), PeerError> {
        let mut table = lock(&self.table);
        let Some(table) = table.as_mut() else {
            return Err(PeerError::Unreachable {
                peer,
                reason: "the connection just closed".into(),
            });
        };
        if table.waiting.len() >= limit {
            return Err(PeerError::Overloaded { peer, limit });
        }
        if let Some(limit) = bulk_limit {
            if table.bulk >= limit {
                return Err(PeerError::Overloaded { peer, limit });
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        table.waiting.insert(id, (tx, bulk_limit.is_some()));
        table.bulk += usize::from(bulk_limit.is_some());
        let waiting = Waiting {
            pending: self.clone(),
            id,
        };
        Ok((id, rx, waiting))
    }

    fn complete(&self, id: u64, reply: Reply) {
        let waiter = lock(&self.table).as_mut().and_then(|t| t.remove(id));
        // A reply for a call that gave up (timed out) finds nobody: dropped.
        if let Some(w) = waiter {
            let _ = w.send(reply);
        }
    }

    /// The connection ended: fail every waiting call, in id order.
    fn fail_all(&self, peer: NodeId) {
        let table = lock(&self.table).take().unwrap_or_default();
        for (_, (w, _)) in table.waiting {
            let _ = w.send(Err(PeerError::ConnectionLost { peer }));
        }
    }
}

/// Fails the calls still waiting on a connection when its task ends.
struct FailOnDrop(Arc<Pending>, NodeId);

impl Drop for FailOnDrop {
    fn drop(&mut self) {
        self.0.fail_all(self.1);
    }
}

/// A call's entry in the pending table; removed when the call ends, however it ends.
pub(crate) struct Waiting {
    pending: Arc<Pending>,
    id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.pending.table).as_mut() {
            t.remove(self.id);
        }
    }
}

/// Opens connection `id` to `peer` on an authenticated stream: its handle, and the future that
/// runs it until it ends (the dialer spawns it; the acceptor runs it in the server's task
/// for the connection). Requests from the peer go to `serving`'s handler; while there is
/// none they are answered `Busy` (refused, not acted on).
pub(crate) fn open<S: Stream>(
    stream: S,
    id: u64,
    peer: NodeId,
    cfg: &PeerConfig,
    serving: ServingCell,
    end: End,
) -> (
    Arc<Conn>,
    impl Future<Output = Result<(), FrameError>> + Send + 'static,
) {
    let (rd, wr) = tokio::io::split(stream);
    // Each call queues one frame after taking a pending slot and each request one answer
    // after taking a running slot, so this holds them all.
    let (tx, rx) = mpsc::channel(cfg.max_in_flight + cfg.max_concurrent_requests + 64);
    let pending = Arc::new(Pending {
        table: Mutex::new(Some(Table::default())),
        next_id: AtomicU64::new(1),
    });
    let close = Arc::new(Notify::new());
    let conn = Arc::new(Conn {
        id,
        tx: tx.clone(),
        pending: pending.clone(),
        close: close.clone(),
    });
    let cfg = cfg.clone();
    // The acceptor's end lives as long as the peer keeps it; the dialer's as long as this
    // node holds its handle.
    let weak = tx.downgrade();
    let dialer = end == End::Dialer;
    let keep = (!dialer).then_some(tx);
    let run = async move {
        let _keep = keep;
        // However the connection ends (the server's shutdown aborts this future), the calls
        // waiting on it fail.
        let _fail = FailOnDrop(pending.clone(), peer);
        // Dropped when the connection ends: tells its handlers to stop.
        let (_closed_tx, closed) = watch::channel(());
        let reader = Reader {
            peer,
            cfg: &cfg,
            pending: &pending,
            serving,
            tx: weak.clone(),
            closed,
        };
        // Bound, so the connection's futures are dropped before the guards above.
        let ended = tokio::select! {
            biased;
            () = close.notified() => Ok(()),
            r = reader.run(BufReader::new(rd)) => r,
            r = frame::write_loop(wr, rx, cfg.idle_timeout) => r.map_err(FrameError::Io),
            () = ping(weak, cfg.ping_interval), if dialer => Ok(()),
        };
        ended
    };
    (conn, run)
}

struct Reader<'a> {
    peer: NodeId,
    cfg: &'a PeerConfig,
    pending: &'a Pending,
    serving: ServingCell,
    tx: mpsc::WeakSender<Frame>,
    closed: watch::Receiver<()>,
}

impl Reader<'_> {
    async fn run<R: AsyncRead + Unpin>(self, mut rd: R) -> Result<(), FrameError> {
        let (cfg, peer) = (self.cfg, self.peer);
        let running = Arc::new(Semaphore::new(cfg.max_concurrent_requests));
        // Bulk requests hold a permit of both: at most `max_bulk_requests` of them run, and
        // the rest of `running` stays for the others.
        let bulk = cfg
            .is_bulk
            .map(|_| Arc::new(Semaphore::new(cfg.max_bulk_requests)));
        loop {
            let f = match read_frame(&mut rd, cfg.max_frame, cfg.idle_timeout).await {
                Ok(f) => f,
                Err(e) => {
                    if let (FrameError::TooLarge { .. } | FrameError::Malformed(_), Some(s)) =
                        (&e, self.serving.load_full())
                    {
                        PeerStats::bump(&s.stats.protocol_errors);
                    }
                    return Err(e);
                }
            };
            let reply = match f.kind {
                Kind::Pong => continue,
                Kind::Response => {
                    self.pending.complete(f.id, Ok(f.body));
                    continue;
                }
                Kind::Error => {
                    let message = String::from_utf8_lossy(&f.body).into_owned();
                    self.pending
                        .complete(f.id, Err(PeerError::Remote { peer, message }));
                    continue;
                }
                Kind::Busy => {
                    self.pending.complete(f.id, Err(PeerError::Busy { peer }));
                    continue;
                }
                Kind::Ping => Frame::new(Kind::Pong, f.id, Vec::new()),
                Kind::Request => match self.serving.load_full() {
                    // No handler (the node's peer server has not started, or has stopped):
                    // refused, so the caller knows it was not acted on.
                    None => Frame::new(Kind::Busy, f.id, Vec::new()),
                    Some(serving) => match permits(&f.body, cfg, &running, &bulk) {
                        Some(permit) => {
                            let Some(tx) = self.tx.upgrade() else {
                                return Ok(());
                            };
                            PeerStats::bump(&serving.stats.handled);
                            tokio::spawn(handle(
                                f,
                                peer,
                                serving.handler.clone(),
                                cfg.handler_timeout,
                                cfg.max_frame,
                                tx,
                                self.closed.clone(),
                                permit,
                            ));
                            continue;
                        }
                        None => {
                            PeerStats::bump(&serving.stats.busy);
                            Frame::new(Kind::Busy, f.id, Vec::new())
                        }
                    },
                },
            };
            let Some(tx) = self.tx.upgrade() else {
                return Ok(());
            };
            if tx.send(reply).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// The permits a request runs under: one of `running`, and for a bulk request one of
/// `bulk` too (see [`PeerConfig::is_bulk`]). `None`: the connection has no room for it.
fn permits(
    body: &[u8],
    cfg: &PeerConfig,
    running: &Arc<Semaphore>,
    bulk: &Option<Arc<Semaphore>>,
) -> Option<Permits> {
    let of_bulk = match (cfg.is_bulk, bulk) {
        (Some(is_bulk), Some(bulk)) if is_bulk(body) => {
            Some(bulk.clone().try_acquire_owned().ok()?)
        }
        _ => None,
    };
    Some((running.clone().try_acquire_owned().ok()?, of_bulk))
}

type Permits = (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>);

/// Runs the handler for one request, bounded in time, and queues its answer.
#[allow(clippy::too_many_arguments)]
async fn handle(
    req: Frame,
    from: NodeId,
    handler: Handler,
    limit: Duration,
    max: u32,
    tx: mpsc::Sender<Frame>,
    mut closed: watch::Receiver<()>,
    _permits: Permits,
) {
    // Calling the handler inside the future puts a panic in its synchronous part under
    // catch_unwind too.
    let run = AssertUnwindSafe(async move { handler(from, req.body).await }).catch_unwind();
    let outcome = tokio::select! {
        biased;
        // The connection is gone: nobody can receive the answer.
        _ = closed.changed() => return,
        r = tokio::time::timeout(limit, run) => r,
    };
    let reply = match outcome {
        Ok(Ok(Ok(body))) if frame::PREFIX + body.len() <= max as usize => {
            Frame::new(Kind::Response, req.id, body)
        }
        Ok(Ok(Ok(body))) => error(
            req.id,
            max,
            format!(
                "the reply of {} bytes exceeds max_frame ({max})",
                body.len()
            ),
        ),
        Ok(Ok(Err(msg))) => error(req.id, max, msg),
        Ok(Err(_panic)) => {
            warn!(from, "peer request handler panicked");
            error(req.id, max, "the handler panicked".into())
        }
        Err(_) => error(
            req.id,
            max,
            format!("the handler did not finish within {limit:?}"),
        ),
    };
    let _ = tx.send(reply).await;
}

fn error(id: u64, max_frame: u32, mut msg: String) -> Frame {
    let room = MAX_ERROR.min((max_frame as usize).saturating_sub(frame::PREFIX));
    if msg.len() > room {
        let mut cut = room;
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.truncate(cut);
    }
    Frame::new(Kind::Error, id, msg.into_bytes())
}

/// Pings until the connection is no longer used (every holder's sender gone).
async fn ping(tx: mpsc::WeakSender<Frame>, every: Duration) {
    let mut n = 0u64;
    loop {
        tokio::time::sleep(every).await;
        let Some(tx) = tx.upgrade() else { return };
        n += 1;
        if tx
            .send(Frame::new(Kind::Ping, n, Vec::new()))
            .await
            .is_err()
        {
            return;
        }
    }
}

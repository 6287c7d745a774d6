//! A running node: the service, its RESP and HTTP servers, and background eviction.
//!
//! [`run`] is the one entry point the binary, the integration tests and (later) the
//! simulation share: it takes the listeners and the clock as arguments, so the same code
//! runs on tokio sockets and on simulated ones.

use crate::clock::SharedClock;
use crate::config::NodeConfig;
use crate::net::{Connector, Listener};
use crate::policy::PolicySet;
use crate::service::Service;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A started node. Dropping it does not stop it; call [`Node::stop`].
pub struct Node {
    service: Service,
    http_addr: SocketAddr,
    resp_addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<io::Result<()>>>,
}

/// Resolves when `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

impl Node {
    /// Starts the shards, both servers and the eviction loop.
    pub async fn start<H: Listener, R: Listener>(
        config: NodeConfig,
        policies: PolicySet,
        clock: SharedClock,
        http: H,
        resp: R,
    ) -> io::Result<Node> {
        let service = Service::start(config, policies, clock)
            .await
            .map_err(io::Error::other)?;
        let (stop, rx) = watch::channel(false);
        Node::serve(service, http, resp, stop, rx, Vec::new())
    }

    /// Starts a cluster member (`config.cluster` must be set): opens the node's write-ahead
    /// log and snapshots under `data_dir`, starts every shard's Raft group, the peer server
    /// on `peer` and the client APIs. `seed` seeds the handshake nonces, a new data
    /// directory's id and the start's incarnation (from the OS in the binary, from the
    /// simulation seed under turmoil): it must differ at every start, or a wiped member
    /// would come back with its old data id.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_member<H: Listener, R: Listener, P: Listener, C: Connector>(
        config: NodeConfig,
        policies: PolicySet,
        clock: SharedClock,
        http: H,
        resp: R,
        peer: P,
        connector: C,
        seed: [u8; 32],
    ) -> io::Result<Node> {
        let (stop, rx) = watch::channel(false);
        let (service, peer_task) = crate::member::start(
            config,
            policies,
            clock,
            peer,
            connector,
            seed,
            stopped(rx.clone()),
        )
        .await?;
        Node::serve(service, http, resp, stop, rx, vec![peer_task])
    }

    fn serve<H: Listener, R: Listener>(
        service: Service,
        http: H,
        resp: R,
        stop: watch::Sender<bool>,
        rx: watch::Receiver<bool>,
        mut tasks: Vec<JoinHandle<io::Result<()>>>,
    ) -> io::Result<Node> {
        let http_addr = http.local_addr()?;
        let resp_addr = resp.local_addr()?;
        service.set_resp_addr(resp_addr);
        let eviction_interval = service.config().eviction_interval;
        tasks.extend([
            tokio::spawn(crate::api::http::serve(
                http,
                service.clone(),
                stopped(rx.clone()),
            )),
            tokio::spawn(crate::api::resp::serve(
                resp,
                service.clone(),
                stopped(rx.clone()),
            )),
            tokio::spawn(evict_periodically(
                service.clone(),
                eviction_interval,
                stopped(rx),
            )),
        ]);
        tracing::info!(%http_addr, %resp_addr, shards = service.status().shards.len(), "node serving");
        Ok(Node {
            service,
            http_addr,
            resp_addr,
            stop,
            tasks,
        })
    }

    pub fn service(&self) -> &Service {
        &self.service
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn resp_addr(&self) -> SocketAddr {
        self.resp_addr
    }

    /// Stops accepting, lets connections finish their current requests, stops the shards.
    /// A cluster member first hands the shards it leads to other members.
    pub async fn stop(self) -> io::Result<()> {
        if let Some(cluster) = self.service.cluster() {
            cluster.hand_over_all().await;
        }
        let _ = self.stop.send(true);
        let mut result = Ok(());
        for task in self.tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(e) => result = Err(io::Error::other(e)),
            }
        }
        self.service.shutdown().await;
        tracing::info!("node stopped");
        result
    }
}

/// Runs a node until `shutdown` resolves.
pub async fn run<H: Listener, R: Listener>(
    config: NodeConfig,
    policies: PolicySet,
    clock: SharedClock,
    http: H,
    resp: R,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let node = Node::start(config, policies, clock, http, resp).await?;
    shutdown.await;
    node.stop().await
}

async fn evict_periodically(
    service: Service,
    every: std::time::Duration,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut tick = tokio::time::interval(every.max(std::time::Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => return Ok(()),
            _ = tick.tick() => {
                let n = service.evict().await;
                if n > 0 {
                    tracing::debug!(evicted = n, "evicted keys as if never seen");
                }
            }
        }
    }
}

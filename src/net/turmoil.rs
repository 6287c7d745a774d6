//! The simulated implementation of the `net` seam: turmoil's TCP, for `quorate sim cluster`.
//!
//! Inside a turmoil host these sockets go through the simulated network, whose partitions,
//! holds, latencies and losses the simulation's nemesis controls. Outside a simulation they
//! fail (turmoil has no world to route through).

use super::{Connector, Listener};
use std::io;
use std::net::SocketAddr;

/// A listener on the simulated network.
pub struct TurmoilListener(::turmoil::net::TcpListener);

impl TurmoilListener {
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        ::turmoil::net::TcpListener::bind(addr)
            .await
            .map(TurmoilListener)
    }
}

impl Listener for TurmoilListener {
    type Conn = ::turmoil::net::TcpStream;
    async fn accept(&mut self) -> io::Result<(Self::Conn, SocketAddr)> {
        self.0.accept().await
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// Connects over the simulated network.
#[derive(Clone, Copy, Default)]
pub struct TurmoilConnector;

impl Connector for TurmoilConnector {
    type Conn = ::turmoil::net::TcpStream;
    async fn connect(&self, addr: SocketAddr) -> io::Result<Self::Conn> {
        ::turmoil::net::TcpStream::connect(addr).await
    }
}

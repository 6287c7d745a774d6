//! The production implementation of the `net` seam: tokio TCP.

use super::{Connector, Listener};
use std::io;
use std::net::SocketAddr;

/// A TCP listener with Nagle disabled on accepted connections (replies are small and
/// latency-bound).
pub struct TcpListener(tokio::net::TcpListener);

impl TcpListener {
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        tokio::net::TcpListener::bind(addr).await.map(TcpListener)
    }
}

impl Listener for TcpListener {
    type Conn = tokio::net::TcpStream;
    async fn accept(&mut self) -> io::Result<(Self::Conn, SocketAddr)> {
        let (s, a) = self.0.accept().await?;
        s.set_nodelay(true)?;
        Ok((s, a))
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// Connects over TCP.
#[derive(Clone, Copy, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    type Conn = tokio::net::TcpStream;
    async fn connect(&self, addr: SocketAddr) -> io::Result<Self::Conn> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }
}

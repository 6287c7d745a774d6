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

    async fn resolve(&self, host_port: &str) -> io::Result<SocketAddr> {
        resolve(host_port).await
    }
}

/// The first address the system's resolver gives for `host_port` ("quorate-2:7100",
/// "10.0.0.2:7100", "[::1]:7100"). IPv4 is preferred when a name has both, since container
/// networks are IPv4 by default. A name that does not resolve (yet: containers start in any
/// order) is an error the caller retries.
pub async fn resolve(host_port: &str) -> io::Result<SocketAddr> {
    if let Ok(a) = host_port.parse() {
        return Ok(a);
    }
    let found: Vec<SocketAddr> = tokio::net::lookup_host(host_port)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("resolving {host_port}: {e}")))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("resolving {host_port}: no address"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_literal_addresses_and_names() {
        let a = resolve("127.0.0.1:7100").await.unwrap();
        assert_eq!(a, "127.0.0.1:7100".parse::<SocketAddr>().unwrap());
        let b = resolve("localhost:7100").await.unwrap();
        assert!(b.ip().is_loopback() && b.port() == 7100, "{b}");
    }

    #[tokio::test]
    async fn an_unknown_name_is_an_error_naming_it() {
        let e = resolve("no-such-host.invalid:7100").await.unwrap_err();
        assert!(e.to_string().contains("no-such-host.invalid:7100"), "{e}");
    }
}

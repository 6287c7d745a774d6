//! The `net` seam: the only place node code gets sockets.
//!
//! Servers take a [`Listener`] and clients a [`Connector`], so the same code runs over tokio's
//! TCP ([`tcp`]) and, in the simulation, over turmoil's sockets ([`turmoil`]). Nothing outside this module
//! names `tokio::net` or `std::net` sockets.

pub mod tcp;
pub mod turmoil;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncWrite};

/// A byte stream to a peer.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// Accepts connections.
pub trait Listener: Send + 'static {
    type Conn: Stream;
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Conn, SocketAddr)>> + Send;
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// Opens connections.
pub trait Connector: Clone + Send + Sync + 'static {
    type Conn: Stream;
    fn connect(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Conn>> + Send;

    /// The socket address of `host_port` ("10.0.0.2:7100" or "quorate-2:7100"). Callers
    /// resolve again before every dial, so a peer whose name moves to a new address (a
    /// restarted container or pod) is found there. This default reads literal addresses
    /// only; connectors with a name service override it.
    fn resolve(&self, host_port: &str) -> impl Future<Output = io::Result<SocketAddr>> + Send {
        let parsed = host_port.parse::<SocketAddr>().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("\"{host_port}\" is not IP:PORT and this connector resolves no names"),
            )
        });
        std::future::ready(parsed)
    }
}

/// 32 bytes of operating-system entropy, to seed a node's random generators (the peer
/// handshake's nonces). Lives in the seam because it is nondeterministic: the simulation
/// passes seeds derived from its own seed instead of calling this.
pub fn os_seed() -> [u8; 32] {
    use rand::Rng;
    rand::rng().random()
}

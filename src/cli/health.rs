//! `quorate health`: exit 0 when the node answers /readyz with 200, 1 otherwise. Made for
//! container health checks (Docker's HEALTHCHECK, a Kubernetes exec probe), where the image
//! has no curl.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    /// The node's HTTP address. An unspecified address (0.0.0.0:PORT, the listen address a
    /// container is given) is asked on loopback, so the node's own setting can be reused.
    #[arg(long, env = "QUORATE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// Ask /healthz (the process is up) instead of /readyz (every shard has a leader).
    #[arg(long)]
    pub live: bool,
}

/// Where to ask: `addr`, with an unspecified IP replaced by loopback.
pub fn target(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => (Ipv4Addr::LOCALHOST, a.port()).into(),
        SocketAddr::V6(a) if a.ip().is_unspecified() => (Ipv6Addr::LOCALHOST, a.port()).into(),
        other => other,
    }
}

/// `Ok(message)` when healthy, `Err(why)` when not.
pub fn run(args: HealthArgs) -> Result<String, String> {
    let addr = target(args.http_addr);
    let path = if args.live { "/healthz" } else { "/readyz" };
    super::status::get(addr, path).map(|_| format!("{path} at {addr}: ok\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_listen_address_is_asked_on_loopback() {
        let t = |s: &str| target(s.parse().unwrap()).to_string();
        assert_eq!(t("0.0.0.0:8080"), "127.0.0.1:8080");
        assert_eq!(t("[::]:8080"), "[::1]:8080");
        assert_eq!(t("10.1.2.3:8080"), "10.1.2.3:8080");
    }
}

//! The kernel's view of this machine's TCP connections.

/// Established TCP connections (read from `/proc/net/tcp`) whose accepting end listens on
/// one of `ports`: one per connection between nodes listening there.
pub fn established_to(ports: &[u16]) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp (Linux)");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f[1].rsplit(':').next().unwrap_or_default();
            let established = f[3] == "01";
            established && u16::from_str_radix(local_port, 16).is_ok_and(|p| ports.contains(&p))
        })
        .count()
}

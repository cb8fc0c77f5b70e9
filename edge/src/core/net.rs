//! Where a connection comes from, as the bounds on unauthenticated
//! connections count it (the HTTP listeners' per-source cap, the node
//! listener's handshakes): one definition for both.

use std::net::{IpAddr, Ipv6Addr};

/// The source a per-source bound counts by: the IPv4 address (also when
/// it arrives mapped into IPv6), or the /64 of an IPv6 address (one host
/// commonly has a whole /64).
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// The network a per-network bound counts by: the /24 of an IPv4 address,
/// the /48 of an IPv6 one.
pub fn network_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & 0xffff_ff00).into()),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 80) - 1)).into()),
    }
}

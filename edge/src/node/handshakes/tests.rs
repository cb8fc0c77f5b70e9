use std::net::Ipv4Addr;

use super::*;

const LIMITS: HandshakeLimits = HandshakeLimits { max_handshakes: 3, max_per_source: 2, max_per_network: 2 };

fn ip(a: u8, b: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, a, b))
}

fn under_way(id: u64, at: IpAddr, age_ms: u64, known: bool, now: Instant) -> UnderWay {
    let started = now - Duration::from_millis(age_ms);
    UnderWay { id, source: at, network: network_of(at), started, known }
}

fn arrival(at: IpAddr, known: bool) -> Arrival {
    Arrival { source: at, network: network_of(at), known }
}

/// The decision table: free places are taken; a full listener evicts the
/// oldest stranger (never a known address's handshake); a source and a
/// network hold their share only, a known address past its network's.
#[test]
fn a_full_listener_evicts_the_oldest_stranger_and_shares_are_kept() {
    let now = Instant::now();
    assert_eq!(admit(&[], arrival(ip(1, 1), false), LIMITS), Decision::Admit);
    let full = [
        under_way(1, ip(1, 1), 50, true, now),
        under_way(2, ip(2, 1), 40, false, now),
        under_way(3, ip(3, 1), 90, false, now),
    ];
    assert_eq!(admit(&full, arrival(ip(4, 1), false), LIMITS), Decision::Evict(3), "the oldest stranger");
    assert_eq!(admit(&full, arrival(ip(4, 1), true), LIMITS), Decision::Evict(3));
    let all_known = [
        under_way(1, ip(1, 1), 50, true, now),
        under_way(2, ip(2, 1), 40, true, now),
        under_way(3, ip(3, 1), 90, true, now),
    ];
    assert_eq!(admit(&all_known, arrival(ip(4, 1), false), LIMITS), Decision::Busy);
    let one_source = [under_way(1, ip(1, 1), 5, false, now), under_way(2, ip(1, 1), 5, false, now)];
    assert_eq!(admit(&one_source, arrival(ip(1, 1), false), LIMITS), Decision::SourceBusy);
    assert_eq!(admit(&one_source, arrival(ip(1, 1), true), LIMITS), Decision::SourceBusy);
    let one_network = [under_way(1, ip(1, 1), 5, false, now), under_way(2, ip(1, 2), 5, false, now)];
    assert_eq!(admit(&one_network, arrival(ip(1, 3), false), LIMITS), Decision::NetworkBusy);
    assert_eq!(admit(&one_network, arrival(ip(1, 3), true), LIMITS), Decision::Admit, "a node's address");
    assert_eq!(admit(&one_network, arrival(ip(2, 3), false), LIMITS), Decision::Admit);
}

/// Networks are IPv4 /24s and IPv6 /48s.
#[test]
fn networks_are_ipv4_24s_and_ipv6_48s() {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(network_of(ip("10.1.2.3")), ip("10.1.2.0"));
    assert_eq!(network_of(ip("::ffff:10.1.2.3")), ip("10.1.2.0"));
    assert_eq!(network_of(ip("2001:db8:1:2::1")), ip("2001:db8:1::"));
    assert_ne!(network_of(ip("2001:db8:1::1")), network_of(ip("2001:db8:2::1")));
}

/// The table carries it out: the evicted handshake is told, a known
/// node's address is never evicted and passes its network's share.
#[tokio::test(start_paused = true)]
async fn the_table_evicts_strangers_and_keeps_known_nodes() {
    let table = HandshakeTable::new(LIMITS);
    table.known_node(ip(9, 9));
    let node = table.enter(ip(9, 9)).unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    let first = table.enter(ip(1, 1)).unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    let second = table.enter(ip(2, 1)).unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    let third = table.enter(ip(3, 1)).unwrap();
    assert!(first.evicted.is_cancelled(), "the oldest stranger");
    assert!(!node.evicted.is_cancelled() && !second.evicted.is_cancelled() && !third.evicted.is_cancelled());
    drop(first);
    let _fourth = table.enter(ip(4, 1)).unwrap();
    assert!(second.evicted.is_cancelled());
    assert!(!node.evicted.is_cancelled());
    let _node_again = table.enter(ip(9, 9)).expect("a node's address takes a stranger's place");
    assert!(third.evicted.is_cancelled());
    assert_eq!(table.enter(ip(9, 9)).err(), Some(Decision::SourceBusy), "its own source's share");
}

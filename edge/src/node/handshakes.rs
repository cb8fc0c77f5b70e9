//! The node listener's handshakes in progress, bounded so that a flood of
//! unfinished TLS handshakes cannot keep a node out:
//!
//! - the listener always accepts (a full backlog would keep a node from
//!   even completing TCP); when `max_handshakes` are under way, the oldest
//!   unfinished handshake of a *stranger* gives its place to the new one;
//! - an address that presented a valid node certificate recently (a node's
//!   own) is never evicted for a stranger, and its handshake is admitted
//!   ahead of any stranger's;
//! - one source (an IPv4 address, an IPv6 /64) has at most
//!   `max_per_source` handshakes under way, one network (an IPv4 /24, an
//!   IPv6 /48) at most `max_per_network`, a known address aside: many
//!   sources of one network fill no more than their network's share.
//!
//! [`admit`] is the decision, pure; [`HandshakeTable`] carries it out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::net::{network_of, source_of};

/// How long an address that presented a valid node certificate counts as
/// a node's.
const KNOWN_FOR: Duration = Duration::from_secs(3600);
/// The most addresses remembered as nodes' (the oldest is forgotten).
const MAX_KNOWN: usize = 4096;

/// The bounds on handshakes under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    pub max_handshakes: usize,
    pub max_per_source: usize,
    pub max_per_network: usize,
}

/// One handshake under way, as [`admit`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnderWay {
    pub id: u64,
    pub source: IpAddr,
    pub network: IpAddr,
    pub started: Instant,
    /// Its address presented a valid node certificate recently.
    pub known: bool,
}

/// A new connection, as [`admit`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub source: IpAddr,
    pub network: IpAddr,
    pub known: bool,
}

/// What becomes of a new connection's handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admit,
    /// Admitted in the place of handshake `id` (a stranger's, the oldest).
    Evict(u64),
    /// Its source has as many handshakes under way as it may.
    SourceBusy,
    /// Its network has as many handshakes under way as it may.
    NetworkBusy,
    /// Every place is a known address's.
    Busy,
}

/// Whether a new connection's handshake may start (the module's rules). Pure.
pub fn admit(under_way: &[UnderWay], arrival: Arrival, limits: HandshakeLimits) -> Decision {
    if under_way.iter().filter(|h| h.source == arrival.source).count() >= limits.max_per_source {
        return Decision::SourceBusy;
    }
    if !arrival.known && under_way.iter().filter(|h| h.network == arrival.network).count() >= limits.max_per_network {
        return Decision::NetworkBusy;
    }
    if under_way.len() < limits.max_handshakes {
        return Decision::Admit;
    }
    let oldest_stranger = under_way.iter().filter(|h| !h.known).min_by_key(|h| (h.started, h.id));
    oldest_stranger.map_or(Decision::Busy, |h| Decision::Evict(h.id))
}

struct Entry {
    under_way: UnderWay,
    evicted: CancellationToken,
}

/// The handshakes under way on one listener, and the addresses known as
/// nodes'.
pub struct HandshakeTable {
    limits: HandshakeLimits,
    entries: Mutex<HashMap<u64, Entry>>,
    known: Mutex<HashMap<IpAddr, Instant>>,
    next_id: AtomicU64,
}

/// A handshake's place, given back when dropped.
pub struct Place {
    table: Arc<HandshakeTable>,
    id: u64,
    /// Cancelled when a newer handshake took this place.
    pub evicted: CancellationToken,
}

impl HandshakeTable {
    pub fn new(limits: HandshakeLimits) -> Arc<Self> {
        Arc::new(Self { limits, entries: Mutex::default(), known: Mutex::default(), next_id: AtomicU64::new(0) })
    }

    /// A place for the handshake of a connection from `ip`, or why not.
    pub fn enter(self: &Arc<Self>, ip: IpAddr) -> Result<Place, Decision> {
        let now = Instant::now();
        let source = source_of(ip);
        let known = self.known.lock().unwrap().get(&source).is_some_and(|at| now.duration_since(*at) < KNOWN_FOR);
        let arrival = Arrival { source, network: network_of(ip), known };
        let mut entries = self.entries.lock().unwrap();
        let under_way: Vec<UnderWay> = entries.values().map(|e| e.under_way).collect();
        match admit(&under_way, arrival, self.limits) {
            Decision::Admit => {}
            Decision::Evict(id) => {
                if let Some(evicted) = entries.remove(&id) {
                    evicted.evicted.cancel();
                }
            }
            refused => return Err(refused),
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let evicted = CancellationToken::new();
        let under_way = UnderWay { id, source, network: arrival.network, started: now, known };
        entries.insert(id, Entry { under_way, evicted: evicted.clone() });
        Ok(Place { table: self.clone(), id, evicted })
    }

    /// `ip` presented a valid node certificate: its next handshakes are a
    /// node's.
    pub fn known_node(&self, ip: IpAddr) {
        let now = Instant::now();
        let mut known = self.known.lock().unwrap();
        known.retain(|_, at| now.duration_since(*at) < KNOWN_FOR);
        if known.len() >= MAX_KNOWN
            && let Some(oldest) = known.iter().min_by_key(|(_, at)| **at).map(|(ip, _)| *ip)
        {
            known.remove(&oldest);
        }
        known.insert(source_of(ip), now);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.table.entries.lock().unwrap().remove(&self.id);
    }
}

#[cfg(test)]
mod tests;

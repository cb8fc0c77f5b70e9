//! Who holds the listener's connection slots, and whether each connection
//! is doing anything, so that connections that do nothing lose their slot
//! first (nginx's `limit_conn` per source, Envoy's overload manager
//! shedding idle connections):
//!
//! - a connection is *busy* while a request on it is being answered (its
//!   response body included) and *idle* otherwise: before its first
//!   request, between keep-alive requests, or an HTTP/2 connection with no
//!   open stream, whatever PINGs or SETTINGS it sends;
//! - one source (an IPv4 address, an IPv6 /64) holds at most
//!   `limits.max_http_connections_per_source` connections: past it a new
//!   one is closed at once;
//! - when the listener holds `limits.max_http_connections`, a new
//!   connection takes the slot of the connection idle the longest, which is
//!   closed; only when every connection is busy does it wait for one to end;
//! - a connection idle for `limits.http_idle_timeout_ms` is closed.
//!
//! [`admit`] is the decision, pure; [`ConnectionTable`] keeps the
//! connections and carries it out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use crate::core::net::source_of;
use crate::metrics::ReasonLabels;

/// Where a connection comes from, for the per-source cap
/// ([`source_of`]: an IPv4 address, or the /64 of an IPv6 one).
pub type Source = IpAddr;

/// The listener's bounds on connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_per_source: usize,
}

/// One connection holding a slot, as [`admit`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub id: u64,
    pub source: Source,
    /// Since when it has had nothing to answer; `None` while busy.
    pub idle_since: Option<Instant>,
}

/// What becomes of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A slot is free.
    Accept,
    /// The listener is full: connection `id`, idle the longest, gives its
    /// slot up.
    Shed(u64),
    /// Its source holds as many connections as it may.
    SourceFull,
    /// Every slot is held by a busy connection: wait for one to end.
    Full,
}

/// Whether a new connection from `source` gets a slot among `held` (the
/// module's rules). Pure.
pub fn admit(held: &[Held], source: Source, limits: ConnectionLimits) -> Verdict {
    if held.iter().filter(|h| h.source == source).count() >= limits.max_per_source {
        return Verdict::SourceFull;
    }
    if held.len() < limits.max_connections {
        return Verdict::Accept;
    }
    let longest_idle = held.iter().filter_map(|h| Some((h.idle_since?, h.id))).min();
    longest_idle.map_or(Verdict::Full, |(_, id)| Verdict::Shed(id))
}

/// Whether a connection is answering anything, and since when it is not.
#[derive(Debug, Clone, Copy)]
struct Activity {
    in_flight: usize,
    idle_since: Option<Instant>,
}

/// A connection's entry: its source, its activity and how to close it.
struct Entry {
    source: Source,
    activity: watch::Receiver<Activity>,
    shed: CancellationToken,
}

/// The connections of one listener ([`admit`] carried out).
pub struct ConnectionTable {
    limits: ConnectionLimits,
    entries: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
    /// Connections refused (`source_limit`) or shed (`shed_idle`), counted
    /// where it is decided.
    refused: Family<ReasonLabels, Counter>,
    /// A connection ended or became idle: there may be room.
    room: Notify,
}

/// A connection's place in the table, given back when dropped.
pub struct Slot {
    table: Arc<ConnectionTable>,
    id: u64,
    activity: watch::Sender<Activity>,
    /// Cancelled when the connection is shed for a newer one.
    pub shed: CancellationToken,
}

impl ConnectionTable {
    pub fn new(limits: ConnectionLimits, refused: Family<ReasonLabels, Counter>) -> Arc<Self> {
        Arc::new(Self { limits, entries: Mutex::default(), next_id: AtomicU64::new(0), refused, room: Notify::new() })
    }

    /// A slot for a new connection from `source`, once the rules allow one
    /// (waiting while every slot is busy); `None` when its source is full.
    pub async fn enter(self: &Arc<Self>, source: Source) -> Option<Slot> {
        loop {
            let room = self.room.notified();
            match self.try_enter(source) {
                Ok(slot) => return Some(slot),
                Err(Verdict::SourceFull) => return None,
                Err(_) => room.await,
            }
        }
    }

    fn try_enter(self: &Arc<Self>, source: Source) -> Result<Slot, Verdict> {
        let mut entries = self.entries.lock().unwrap();
        // A connection being shed has given its slot up already.
        let held: Vec<Held> = entries
            .iter()
            .filter(|(_, e)| !e.shed.is_cancelled())
            .map(|(id, e)| Held { id: *id, source: e.source, idle_since: e.activity.borrow().idle_since })
            .collect();
        match admit(&held, source, self.limits) {
            Verdict::Accept => {}
            Verdict::Shed(id) => {
                entries[&id].shed.cancel();
                self.refused.get_or_create(&ReasonLabels { reason: "shed_idle" }).inc();
            }
            Verdict::SourceFull => {
                self.refused.get_or_create(&ReasonLabels { reason: "source_limit" }).inc();
                return Err(Verdict::SourceFull);
            }
            Verdict::Full => return Err(Verdict::Full),
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (activity, watching) = watch::channel(Activity { in_flight: 0, idle_since: Some(Instant::now()) });
        let shed = CancellationToken::new();
        entries.insert(id, Entry { source, activity: watching, shed: shed.clone() });
        Ok(Slot { table: self.clone(), id, activity, shed })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.entries.lock().unwrap().remove(&self.id);
        self.table.room.notify_waiters();
    }
}

impl Slot {
    /// Marks one request on the connection as being answered until the
    /// returned guard drops (with its response body).
    pub fn busy(&self) -> Busy {
        self.activity.send_modify(|a| {
            a.in_flight += 1;
            a.idle_since = None;
        });
        Busy { activity: self.activity.clone(), table: self.table.clone() }
    }

    /// Resolves once the connection has been idle for `timeout` (it is
    /// then to be closed).
    pub async fn idle_for(&self, timeout: Duration) {
        let mut watching = self.activity.subscribe();
        loop {
            let since = watching.borrow_and_update().idle_since;
            match since {
                Some(since) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(since + timeout) => return,
                        changed = watching.changed() => if changed.is_err() { return },
                    }
                }
                None => {
                    if watching.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// One request being answered on a connection ([`Slot::busy`]).
pub struct Busy {
    activity: watch::Sender<Activity>,
    table: Arc<ConnectionTable>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut idle = false;
        self.activity.send_modify(|a| {
            a.in_flight -= 1;
            if a.in_flight == 0 {
                a.idle_since = Some(Instant::now());
                idle = true;
            }
        });
        if idle {
            self.table.room.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests;

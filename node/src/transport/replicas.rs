//! One session with every Edge replica. The node dials one URL (a load
//! balancer in front of every replica); each registration tells it which
//! replica answered and which replicas exist. [`ReplicaBook`] is the pure
//! record of that: which replica each live session holds, which of them are
//! draining, and so whether the supervisor (`super::supervise`) must dial
//! again. [`Replicas`] shares it between the sessions and the supervisor.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Which replicas this node holds a session with, and which exist.
#[derive(Debug, Default)]
pub struct ReplicaBook {
    /// Replica id -> the session holding it.
    held: BTreeMap<String, Holding>,
    /// The replica set the Edge last told (empty before any registration).
    replicas: BTreeSet<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holding {
    session: u64,
    /// The replica is shutting down: it serves what it started, nothing new.
    draining: bool,
}

/// What a registration with a replica amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaClaim {
    /// The first session with this replica: it is kept.
    Held,
    /// Another session holds this replica already: this one is closed.
    Duplicate,
}

impl ReplicaBook {
    /// Every replica some session holds, draining ones included (the Edge
    /// answers a new session to any of them as a duplicate).
    pub fn held(&self) -> Vec<String> {
        self.held.keys().cloned().collect()
    }

    /// Session `session` registered with `replica`, which says the replicas
    /// are `replicas` (empty: an Edge of one replica).
    pub fn claim(&mut self, replica: &str, session: u64, replicas: &[String]) -> ReplicaClaim {
        self.set_replicas(replica, replicas);
        if self.held.contains_key(replica) {
            return ReplicaClaim::Duplicate;
        }
        self.held.insert(replica.to_string(), Holding { session, draining: false });
        ReplicaClaim::Held
    }

    /// The replica set changed (`replicas` empty: `replica` alone).
    pub fn set_replicas(&mut self, replica: &str, replicas: &[String]) {
        self.replicas =
            if replicas.is_empty() { [replica.to_string()].into() } else { replicas.iter().cloned().collect() };
    }

    /// `replica` told session `session` it is draining.
    pub fn drain(&mut self, replica: &str, session: u64) {
        if let Some(holding) = self.held.get_mut(replica).filter(|h| h.session == session) {
            holding.draining = true;
        }
    }

    /// Session `session` ended; the replica is free again if it held it.
    pub fn release(&mut self, replica: &str, session: u64) {
        if self.held.get(replica).is_some_and(|h| h.session == session) {
            self.held.remove(replica);
        }
    }

    /// Replicas with a session that takes new work.
    pub fn serving(&self) -> usize {
        self.held.values().filter(|h| !h.draining).count()
    }

    /// Whether to dial again: no session takes new work, or a listed
    /// replica has none that does.
    pub fn wants_dial(&self) -> bool {
        let serves = |r: &String| self.held.get(r).is_some_and(|h| !h.draining);
        self.serving() == 0 || !self.replicas.iter().all(serves)
    }
}

/// The book shared by the sessions and the supervisor, which is woken on
/// every change.
#[derive(Clone, Default)]
pub struct Replicas {
    book: Arc<Mutex<ReplicaBook>>,
    changed: Arc<Notify>,
}

impl Replicas {
    pub fn held(&self) -> Vec<String> {
        self.book.lock().unwrap().held()
    }

    pub fn wants_dial(&self) -> bool {
        self.book.lock().unwrap().wants_dial()
    }

    /// Registers session `session` with `replica`; the returned hold frees
    /// the replica when dropped. `None`: a duplicate.
    pub fn claim(&self, replica: &str, session: u64, replicas: &[String]) -> Option<ReplicaHold> {
        let claim = self.book.lock().unwrap().claim(replica, session, replicas);
        self.changed.notify_one();
        (claim == ReplicaClaim::Held).then(|| ReplicaHold {
            replicas: self.clone(),
            replica: replica.to_string(),
            session,
        })
    }

    /// Resolves after the book changed (a change before the call counts).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// A session's hold on its replica.
pub struct ReplicaHold {
    replicas: Replicas,
    replica: String,
    session: u64,
}

impl ReplicaHold {
    pub fn replica(&self) -> &str {
        &self.replica
    }

    pub fn set_replicas(&self, replicas: &[String]) {
        self.replicas.book.lock().unwrap().set_replicas(&self.replica, replicas);
        self.replicas.changed.notify_one();
    }

    pub fn drain(&self) {
        self.replicas.book.lock().unwrap().drain(&self.replica, self.session);
        self.replicas.changed.notify_one();
    }
}

impl Drop for ReplicaHold {
    fn drop(&mut self) {
        self.replicas.book.lock().unwrap().release(&self.replica, self.session);
        self.replicas.changed.notify_one();
    }
}

#[cfg(test)]
mod tests;

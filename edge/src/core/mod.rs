//! The Edge's pure core: the nouns every layer shares and the decisions
//! made over them, with no tokio, no locks, no metrics and no I/O, so each
//! rule is unit-tested without sockets. The owners of state (`admission`,
//! `overlay`, `residency`, `credentials`, `node::registry`) hold these
//! behind their locks; the request path reads them.

pub mod credential;
pub mod health;
pub mod lease;
pub mod net;
pub mod outlier;
pub mod readiness;
pub mod residency;
pub mod selection;

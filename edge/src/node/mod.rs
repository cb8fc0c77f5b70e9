//! Everything node-facing: the mTLS listener, the session registry, the
//! per-connection control session and the gRPC service that ties them up.

pub mod commands;
pub mod grpc;
pub mod handshakes;
pub mod health;
pub mod limits;
pub mod meter;
pub mod registry;
pub mod session;
pub mod tls;

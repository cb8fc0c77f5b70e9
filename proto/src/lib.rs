//! The contract both sides of the Edge-Node boundary agree on: the gRPC wire
//! (generated from `proto/iop/v1/node_gateway.proto`), closed-enum decoding,
//! node identities, the liveness profile, the Edge config document (which
//! the operator renders and the Edge loads), and the Edge admin API's
//! snapshots (which the Edge writes and the operator reads).

pub mod admin;
pub mod config;
pub mod identity;
pub mod lease;
pub mod liveness;
pub mod provider_error;
pub mod usage;
pub mod wire;

/// Generated protobuf messages and the tonic client/server for `iop.v1.NodeGateway`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("iop.v1");
}

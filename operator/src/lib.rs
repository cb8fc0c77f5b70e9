//! IOP operator: CRD types, the pure reconcile stages (validate, build the
//! Edge config), certificate issuance (the certificates and the node bundle
//! are `iop_pki`'s), status mirroring, the Edge's replicas, and the
//! controller that runs them against the Kubernetes API ([`runtime`]).

pub mod certs;
pub mod crd;
pub mod env;
pub mod mirror;
pub mod reconcile;
pub mod replicas;
pub mod runtime;

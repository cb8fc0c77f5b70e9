//! IOP operator: CRD types, the pure reconcile stages (validate, build the
//! Edge config), certificate issuance and the node bundle.

pub mod bundle;
pub mod certs;
pub mod crd;
pub mod reconcile;

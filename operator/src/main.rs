//! `iop-operator` is built in the Kubernetes issue (CRDs, reconcile, certificates,
//! status mirroring). Until then this binary only says so, so nobody mistakes it for
//! a working controller.

fn main() {
    eprintln!("iop-operator: not implemented yet; see the Kubernetes issue");
    std::process::exit(2);
}

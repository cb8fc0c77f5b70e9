//! Shared pieces of the end-to-end harness: the mock provider, the dev PKI and
//! process helpers used by `iop-dev`, the tests and the benchmark.

pub mod cluster;
pub mod harness;
pub mod mock_provider;
pub mod parts;
pub mod pki;
pub mod schema_example;

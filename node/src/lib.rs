//! IOP Node: the agent on a Mac. It dials the Edge over mTLS gRPC (it sits
//! behind NAT; the Edge never dials it), registers, checks its providers,
//! becomes ready, and runs provider adapters for the runs the Edge assigns.
//!
//! Data flow: `transport` (dial, session, heartbeats) -> `run` (one run's
//! event stream) -> `adapter` (Ollama / OpenAI-compatible HTTP), or
//! `transport` -> `tunnel` (one provider HTTP exchange relayed as-is).
//! `execution` holds what runs and tunnels share; `commands` the node
//! commands that reach a provider.

pub mod adapter;
pub mod capacity;
pub mod commands;
pub mod config;
pub mod doctor;
pub mod execution;
pub mod health;
pub mod keep_warm;
pub mod lease;
pub mod liveness;
pub mod metrics;
pub mod pace;
pub mod residency;
pub mod run;
pub mod scrub;
pub mod service;
pub mod trace;
pub mod transport;
pub mod tunnel;
pub mod usage;
pub mod workspace;

use iop_proto::liveness::HeartbeatProfile;
use tokio_util::sync::CancellationToken;

pub use config::NodeConfig;
pub use transport::TransportError;

/// Runs the node until `shutdown` is cancelled. When `metrics.listen` is
/// configured, `/metrics` is served there and its address printed on stdout
/// as `iop-node metrics on http://ADDR`.
pub async fn run(
    config: NodeConfig,
    heartbeat: HeartbeatProfile,
    shutdown: CancellationToken,
) -> Result<(), TransportError> {
    run_with(config, heartbeat, workspace::sandbox::Detection::Probe, shutdown).await
}

/// [`run`], with how the command sandbox is found (`iop-node
/// --test-no-sandbox` acts as a machine without one, for tests).
pub async fn run_with(
    config: NodeConfig,
    heartbeat: HeartbeatProfile,
    sandbox: workspace::sandbox::Detection,
    shutdown: CancellationToken,
) -> Result<(), TransportError> {
    let metrics = metrics::NodeMetrics::new();
    if let Some(listen) = config.metrics.as_ref().map(|m| m.listen) {
        let addr = metrics::serve(listen, metrics.clone())
            .await
            .map_err(|e| TransportError::Endpoint(format!("metrics.listen {listen}: {e}")))?;
        println!("iop-node metrics on http://{addr}");
    }
    // Every workspace command runs under this executable as its supervisor
    // (`iop_sandbox::main_if_invoked` in `main`).
    let supervisor = std::env::current_exe().map_err(|e| TransportError::Endpoint(format!("own executable: {e}")))?;
    let commands = workspace::sandbox::CommandEnvironment::detect(&config, supervisor, sandbox).await;
    transport::supervise(config, heartbeat, metrics, commands, shutdown).await
}

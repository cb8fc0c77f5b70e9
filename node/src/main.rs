//! `iop-node --config FILE`: keeps a session with the Edge until SIGTERM/Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use iop_proto::liveness::HeartbeatProfile;
use tokio_util::sync::CancellationToken;

/// mimalloc rather than glibc malloc: per-request allocations were about a
/// tenth of the CPU under load (measured with `scripts/bench`, see README
/// "Performance").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "iop-node", version, about = "IOP Node: runs local LLM providers for an IOP Edge")]
struct Args {
    /// Node config file (YAML); see examples/node.yaml.
    #[arg(long)]
    config: PathBuf,
    /// Test-only heartbeat profile override, INTERVAL_MS,WAIT_MS.
    #[arg(long, hide = true, value_parser = HeartbeatProfile::parse_test_override)]
    test_heartbeat_profile: Option<HeartbeatProfile>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match iop_node::NodeConfig::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        trigger.cancel();
    });
    // On a worker thread, not the `block_on` main thread: the control loop
    // wakes for every assignment and spawns the execution, and a worker
    // hands it over without a cross-thread wake-up.
    match tokio::spawn(iop_node::run(config, args.test_heartbeat_profile.unwrap_or_default(), shutdown)).await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            tracing::error!("{e}");
            ExitCode::from(1)
        }
        Err(e) => {
            tracing::error!("node task failed: {e}");
            ExitCode::from(1)
        }
    }
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

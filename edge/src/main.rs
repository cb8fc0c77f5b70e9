//! `iop-edge --config FILE`: runs the Edge until SIGTERM/Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use iop_proto::liveness::HeartbeatProfile;

/// mimalloc rather than glibc malloc: per-request allocations were about a
/// tenth of the CPU under load (measured with `scripts/bench`, see README
/// "Performance").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "iop-edge", version, about = "IOP Edge: LLM gateway that dispatches to nodes over mTLS gRPC")]
struct Args {
    /// Edge config file (YAML); see examples/edge.yaml.
    #[arg(long)]
    config: PathBuf,
    /// How often to check the config file for changes (SIGHUP checks at once).
    #[arg(long, default_value_t = 2000)]
    reload_interval_ms: u64,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
    /// Test-only heartbeat profile override, INTERVAL_MS,WAIT_MS.
    #[arg(long, hide = true, value_parser = HeartbeatProfile::parse_test_override)]
    test_heartbeat_profile: Option<HeartbeatProfile>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    iop_edge::init_logging(args.log_json);
    iop_edge::install_crypto_provider();
    let config = match iop_edge::config::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let edge = match iop_edge::Edge::bind(config, args.test_heartbeat_profile.unwrap_or_default()).await {
        Ok(edge) => edge.watch_config(args.config.clone(), std::time::Duration::from_millis(args.reload_interval_ms)),
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(1);
        }
    };
    // One machine-readable line on stdout (tests and scripts wait for it).
    println!("iop-edge listening http={} grpc={}", edge.http_addr(), edge.grpc_addr());
    match edge.serve(iop_edge::shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(1)
        }
    }
}

//! `iop-node --config FILE`: keeps a session with the Edge until SIGTERM/Ctrl-C.
//! `iop-node service install|uninstall|status`: the node as a per-user service.
//! `iop-node doctor --config FILE`: checks the config, certificates, Edge and providers.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use iop_node::doctor::LocalProvider;
use iop_node::service::{self, Host, Manager, ServiceSpec, SystemRunner};
use iop_proto::liveness::HeartbeatProfile;
use tokio_util::sync::CancellationToken;

/// mimalloc rather than glibc malloc: per-request allocations were about a
/// tenth of the CPU under load (measured with `scripts/bench`, see
/// docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "iop-node",
    version,
    about = "IOP Node: runs local LLM providers for an IOP Edge",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Args {
    /// Node config file (YAML); see examples/node.yaml.
    #[arg(long, required = true)]
    config: Option<PathBuf>,
    /// Test-only heartbeat profile override, INTERVAL_MS,WAIT_MS.
    #[arg(long, hide = true, value_parser = HeartbeatProfile::parse_test_override)]
    test_heartbeat_profile: Option<HeartbeatProfile>,
    /// Test-only: act as a machine without a command sandbox.
    #[arg(long, hide = true)]
    test_no_sandbox: bool,
    /// Test-only: the learned deadlines' floor (and a fallback of four
    /// times it), in milliseconds, instead of 10 s and 120 s.
    #[arg(long, hide = true, value_name = "MS")]
    test_pace_floor_ms: Option<u64>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node as a per-user service: a launchd LaunchAgent on macOS,
    /// a systemd user unit on Linux (docs/node-service.md).
    Service {
        #[command(subcommand)]
        action: ServiceAction,
    },
    /// Check the config, certificate and key, the Edge (TCP and a real TLS
    /// handshake) and local providers; exit code 1 when a check fails.
    Doctor {
        /// Node config file (YAML).
        #[arg(long)]
        config: PathBuf,
        /// A local provider to probe, KIND,BASE_URL,MODEL (KIND ollama or
        /// openai), e.g. ollama,http://127.0.0.1:11434,llama3.2. Repeatable.
        /// The Edge assigns providers at registration; the config lists none.
        #[arg(long = "provider", value_name = "KIND,BASE_URL,MODEL")]
        providers: Vec<LocalProvider>,
    },
}

#[derive(Subcommand)]
enum ServiceAction {
    /// Check that the config loads, write the service file for this
    /// executable and config, and (re)start the service.
    Install {
        /// Node config file (YAML); stored as an absolute path.
        #[arg(long)]
        config: PathBuf,
    },
    /// Stop the service and remove its file (logs are kept).
    Uninstall {
        /// Accepted for symmetry and ignored: there is one node service per user.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Whether the service is installed and running (exit code 0 when it
    /// runs, 3 when it does not). With --config, also whether the installed
    /// file runs this executable with that config.
    Status {
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    // Workspace commands run under this executable as their supervisor
    // (`iop_sandbox::supervisor`), started with a hidden first argument.
    if let Some(code) = iop_node::workspace::sandbox::main_if_invoked() {
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    let args = Args::parse();
    let level = if args.command.is_some() { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    match args.command {
        Some(Command::Service { action }) => service_command(action),
        Some(Command::Doctor { config, providers }) => {
            let options = iop_node::doctor::Options { providers, ..Default::default() };
            let report = runtime().block_on(iop_node::doctor::run(&config, &options));
            println!("{report}");
            ExitCode::from(report.exit_code())
        }
        None => {
            let config = args.config.expect("clap requires --config without a subcommand");
            if let Some(ms) = args.test_pace_floor_ms {
                let profile = iop_node::pace::PaceProfile::with_floor(std::time::Duration::from_millis(ms));
                iop_node::pace::PaceMemory::global().set_profile(profile);
            }
            let sandbox = match args.test_no_sandbox {
                true => iop_node::workspace::sandbox::Detection::AssumeNone,
                false => iop_node::workspace::sandbox::Detection::Probe,
            };
            runtime().block_on(run_node(config, args.test_heartbeat_profile.unwrap_or_default(), sandbox))
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

async fn run_node(
    config: PathBuf,
    heartbeat: HeartbeatProfile,
    sandbox: iop_node::workspace::sandbox::Detection,
) -> ExitCode {
    let config = match iop_node::NodeConfig::load(&config) {
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
    match tokio::spawn(iop_node::run_with(config, heartbeat, sandbox, shutdown)).await {
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

fn service_command(action: ServiceAction) -> ExitCode {
    let is_status = matches!(action, ServiceAction::Status { .. });
    let result = (|| {
        let manager = Manager::for_this_os()?;
        let host = Host::from_env()?;
        let mut runner = SystemRunner;
        match action {
            ServiceAction::Install { config } => {
                let spec = ServiceSpec::prepare(&current_exe()?, &config)?;
                service::install(manager, &host, &spec, &mut runner)
            }
            ServiceAction::Uninstall { config: _ } => service::uninstall(manager, &host, &mut runner),
            ServiceAction::Status { config } => {
                let expected = match config {
                    Some(config) => match ServiceSpec::prepare(&current_exe()?, &config) {
                        Ok(spec) => Some(spec),
                        Err(e) => {
                            println!("cannot compare with --config: {e}");
                            None
                        }
                    },
                    None => None,
                };
                service::status(manager, &host, expected.as_ref(), &mut runner)
            }
        }
    })();
    match result {
        Ok(summary) => {
            print!("{summary}");
            if is_status && !summary.running { ExitCode::from(3) } else { ExitCode::SUCCESS }
        }
        Err(e) => {
            eprintln!("iop-node service: {e}");
            ExitCode::from(1)
        }
    }
}

fn current_exe() -> Result<PathBuf, service::ServiceError> {
    std::env::current_exe()
        .map_err(|e| service::ServiceError::Environment(format!("cannot find this executable's path: {e}")))
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

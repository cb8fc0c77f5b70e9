//! `iop-dev`: the whole system on one machine. Starts the mock provider
//! (behind the node's Ollama adapter, or its OpenAI-compatible one with
//! `--mock-adapter openai`), or points at a real Ollama / OpenAI-compatible
//! server, an Edge and one Node
//! in this process, joined by real mTLS gRPC with a throwaway dev CA, and
//! serves the client API on 127.0.0.1:8080 (admin and metrics on
//! 127.0.0.1:8081) until Ctrl-C / SIGTERM. Without `--keys-file` clients need
//! no API key (logged loudly).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use iop_e2e::harness::{self, DevPki, ProviderSpec};
use iop_e2e::mock_provider::{self, MockConfig};
use iop_e2e::pki::Validity;
use iop_node::config::HealthConfig;
use iop_proto::config::{Adapter, AuthConfig, AuthMode, WorkspaceCommand, WorkspaceEntry};
use iop_proto::liveness::HeartbeatProfile;
use tokio_util::sync::CancellationToken;

const NODE: &str = "dev-node";
/// The one provider's id in the Edge config.
const PROVIDER: &str = "dev-provider";

#[derive(Parser)]
#[command(name = "iop-dev", about = "Run Edge + Node + a provider locally")]
struct Args {
    /// Address of the client-facing HTTP API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Address of the admin API and metrics (keep it on loopback).
    #[arg(long, default_value = "127.0.0.1:8081")]
    admin_addr: SocketAddr,
    /// Require API keys from this keys file (docs/security.md "Keys"); without it
    /// anyone reaching the HTTP address may call.
    #[arg(long)]
    keys_file: Option<std::path::PathBuf>,
    /// Address of the node-facing gRPC listener (0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    grpc_addr: SocketAddr,
    /// Use a real Ollama server at this URL instead of the mock provider.
    #[arg(long, conflicts_with = "openai_base")]
    ollama: Option<String>,
    /// Use a real OpenAI-compatible server at this base URL (without /v1).
    #[arg(long)]
    openai_base: Option<String>,
    /// Model name at the provider, also the public model name clients use.
    /// Defaults to `mock` for the mock provider; required with --openai-base.
    #[arg(long)]
    model: Option<String>,
    /// Expose this directory as workspace `dev` (all five operations): send
    /// `iop-workspace: dev` to run a job in it. Without `--keys-file` it is
    /// open to anyone who reaches the HTTP address (logged loudly); with
    /// it, the keys' `workspaces` decide.
    #[arg(long)]
    workspace: Option<std::path::PathBuf>,
    /// Also serve the admin workspace diagnostic (`POST
    /// /admin/v1/workspaces/{ref}/calls`) on the admin address.
    #[arg(long, requires = "workspace")]
    admin_workspace_calls: bool,
    /// A command jobs may run in the workspace, as `ID=PROGRAM ARG...`
    /// (split at spaces; no shell). Repeatable.
    #[arg(long, requires = "workspace", value_parser = parse_command)]
    workspace_command: Vec<WorkspaceCommand>,
    /// Scripted turns for the mock provider (docs/mock-provider.md "Scripted turns"): a
    /// message containing `iop-mock-script:<name>` gets the script's next turn.
    #[arg(long, conflicts_with_all = ["ollama", "openai_base"])]
    mock_script_file: Option<std::path::PathBuf>,
    /// Which node adapter talks to the mock provider (it speaks both APIs).
    #[arg(long, value_enum, default_value_t = MockAdapter::Ollama, conflicts_with_all = ["ollama", "openai_base"])]
    mock_adapter: MockAdapter,
}

/// The adapter in front of the mock provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MockAdapter {
    Ollama,
    Openai,
}

impl From<MockAdapter> for Adapter {
    fn from(adapter: MockAdapter) -> Self {
        match adapter {
            MockAdapter::Ollama => Adapter::Ollama,
            MockAdapter::Openai => Adapter::Openai,
        }
    }
}

fn adapter_name(adapter: Adapter) -> &'static str {
    match adapter {
        Adapter::Ollama => "Ollama",
        Adapter::Openai => "OpenAI-compatible",
    }
}

/// How the node probes the provider: the documented defaults (docs/failure-handling.md
/// "Provider health": idle probe every 60 s, re-probe from 1 s doubling to
/// 30 s), for a real server and the mock alike. The tests' fast profile
/// (`harness::node_config`) is for tests that restart providers; no test of
/// `iop-dev` needs it, and on a user's server it would probe every second.
fn health_profile() -> HealthConfig {
    HealthConfig::default()
}

/// `ID=PROGRAM ARG...` as a workspace command.
fn parse_command(text: &str) -> Result<WorkspaceCommand, String> {
    let (id, argv) = text.split_once('=').ok_or("expected ID=PROGRAM ARG...")?;
    let argv: Vec<String> = argv.split_whitespace().map(str::to_string).collect();
    if id.is_empty() || argv.is_empty() {
        return Err("expected ID=PROGRAM ARG...".into());
    }
    Ok(WorkspaceCommand::new(id, argv))
}

/// The workspace `dev` at `root`, with every operation and `commands`.
fn dev_workspace(root: &std::path::Path, commands: Vec<WorkspaceCommand>) -> Result<WorkspaceEntry, String> {
    use iop_proto::config::WorkspaceOperation as Op;
    let root = std::fs::canonicalize(root).map_err(|e| format!("--workspace {}: {e}", root.display()))?;
    let root = root.to_str().ok_or("--workspace: the path is not UTF-8")?.to_string();
    Ok(WorkspaceEntry {
        reference: "dev".into(),
        node: NODE.into(),
        root,
        operations: vec![Op::Read, Op::List, Op::Write, Op::Delete, Op::Command],
        commands,
        env_allowlist: ["PATH", "HOME", "LANG"].map(String::from).to_vec(),
        limits: Default::default(),
        network: false,
        stages: Default::default(),
    })
}

fn main() -> ExitCode {
    // This executable is also the node's workspace command supervisor; it
    // must run before any thread exists.
    if let Some(code) = iop_node::workspace::sandbox::main_if_invoked() {
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
    match runtime {
        Ok(runtime) => runtime.block_on(async_main()),
        Err(e) => {
            eprintln!("iop-dev: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn async_main() -> ExitCode {
    let args = Args::parse();
    iop_edge::init_logging(false);
    iop_edge::install_crypto_provider();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iop-dev: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let shutdown = CancellationToken::new();
    let mut mock = None;
    let (adapter, base_url, model) = match (&args.ollama, &args.openai_base) {
        (Some(url), _) => (Adapter::Ollama, url.clone(), args.model.clone().unwrap_or_else(|| "llama3.2".into())),
        (None, Some(url)) => {
            let model = args.model.clone().ok_or("--openai-base needs --model NAME")?;
            (Adapter::Openai, url.clone(), model)
        }
        (None, None) => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let scripts = match &args.mock_script_file {
                Some(path) => Some(mock_provider::Scripts::load(path)?),
                None => None,
            };
            let handle = mock_provider::start(listener, MockConfig { scripts, ..MockConfig::default() }).await;
            let url = handle.base_url();
            mock = Some(handle);
            (args.mock_adapter.into(), url, args.model.clone().unwrap_or_else(|| "mock".into()))
        }
    };

    let dir = tempfile::Builder::new().prefix("iop-dev-").tempdir()?;
    let pki = DevPki::create(dir.path())?;
    let node_pair = pki.node_cert(NODE, Validity::Current)?;
    let provider = ProviderSpec {
        id: PROVIDER.into(),
        node: NODE.into(),
        adapter,
        base_url: base_url.clone(),
        target_model: model.clone(),
        public_model: model.clone(),
        capacity: 4,
        priority: 0,
        mode: Default::default(),
        stall_timeout_ms: 0,
        first_byte_timeout_ms: 0,
        keep_warm: false,
    };
    let mut config = harness::edge_config(&pki, args.http_addr, args.grpc_addr, &[NODE], &[provider]);
    config.listen.admin = args.admin_addr;
    if let Some(keys_file) = &args.keys_file {
        config.auth = AuthConfig {
            mode: AuthMode::Required,
            keys_file: Some(std::path::absolute(keys_file)?),
            ..Default::default()
        };
    }
    let workspace = match &args.workspace {
        Some(dir) => Some(dev_workspace(dir, args.workspace_command.clone())?),
        None => None,
    };
    config.workspaces.extend(workspace.clone());
    if let Some(workspace) = &workspace
        && args.keys_file.is_none()
    {
        // The Edge logs this loudly too; without keys nobody else could use it.
        config.auth.anonymous_workspaces.push(workspace.reference.clone());
    }
    let mut builder = iop_edge::Edge::builder(config);
    if args.admin_workspace_calls {
        builder = builder.admin_workspace_calls();
    }
    let edge = builder.bind().await?;
    let (http_addr, grpc_addr, admin_addr, state) =
        (edge.http_addr(), edge.grpc_addr(), edge.admin_addr(), edge.state());
    let edge_stop = shutdown.clone();
    let edge_task = tokio::spawn(edge.serve(async move { edge_stop.cancelled().await }));

    let mut node_config = harness::node_config(grpc_addr, &pki.ca_file, &node_pair, (200, 5_000));
    node_config.health = health_profile();
    node_config.workspaces.allowed_roots.extend(workspace.iter().map(|w| std::path::PathBuf::from(&w.root)));
    let node_config_health = node_config.health.clone();
    let node_task = tokio::spawn(iop_node::run(node_config, HeartbeatProfile::default(), shutdown.clone()));

    let provider_hint = provider_hint(adapter, &base_url, &model, mock.is_some());
    let up = tokio::select! {
        () = wait_up(&state, &provider_hint) => true,
        () = iop_edge::shutdown_signal() => false,
    };
    // Ctrl-C while waiting stops it as Ctrl-C after does.
    if up {
        println!("IOP dev is up. Base URL: http://{http_addr}/v1   (model: {model})");
        println!("Admin and metrics: http://{admin_addr}/admin/v1/nodes, http://{admin_addr}/metrics");
        let health = &node_config_health;
        println!(
            "Provider: {} adapter -> {base_url} (health probe every {} s; when down, re-probed from {} s up to {} s)",
            adapter_name(adapter),
            health.idle_interval_ms / 1000,
            health.retry_initial_ms / 1000,
            health.retry_max_ms / 1000,
        );
        if mock.is_some() {
            println!(
                "Mock provider: {base_url} (what it received: {base_url}/mock/requests, counters: {base_url}/mock/stats)"
            );
        }
        let key_header = if args.keys_file.is_some() { " -H \"authorization: Bearer $IOP_KEY\"" } else { "" };
        println!("Try:");
        println!(
            "  curl -N http://{http_addr}/v1/chat/completions{key_header} -H 'content-type: application/json' \\\n    -d '{{\"model\":\"{model}\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
        );
        if workspace.is_some() {
            println!("A job in the workspace `dev` (it plans, works with tools, reviews, answers):");
            println!(
                "  curl http://{http_addr}/v1/messages{key_header} -H 'content-type: application/json' -H 'iop-workspace: dev' \\\n    -d '{{\"model\":\"{model}\",\"max_tokens\":1024,\"messages\":[{{\"role\":\"user\",\"content\":\"Summarize README.md\"}}]}}'"
            );
        }
        println!("Press Ctrl-C to stop.");

        iop_edge::shutdown_signal().await;
    }
    println!("iop-dev: stopping");
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(15), node_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(15), edge_task).await;
    if let Some(mock) = mock {
        mock.shutdown().await;
    }
    Ok(())
}

/// What to do when the provider does not answer the node's probe.
fn provider_hint(adapter: Adapter, base_url: &str, model: &str, mock: bool) -> String {
    match (mock, adapter) {
        (true, _) => "the mock provider runs in this process; this is a bug, please report it".into(),
        (false, Adapter::Ollama) => format!(
            "is Ollama running at {base_url}? Start it (`ollama serve`) and fetch the model \
             (`ollama pull {model}`), or pass --ollama URL for another address"
        ),
        (false, Adapter::Openai) => format!(
            "is the OpenAI-compatible server running at {base_url} (it must answer GET {base_url}/v1/models)? \
             Start it, or pass --openai-base URL for another address"
        ),
    }
}

/// What `iop-dev` still waits for before it is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    NodeNotConnected,
    NotProbedYet,
    ProviderDown,
}

/// Waits until the node is ready and its provider answered the node's probe
/// (so the printed curl works at once; before, a request would get 503
/// `no_provider_available`). Meanwhile it says what is missing and how to
/// fix it: at once when the provider did not answer, else after 2 s, and
/// again every 10 s.
async fn wait_up(state: &iop_edge::EdgeState, provider_hint: &str) {
    use iop_edge::core::health::OverlayState;
    let started = tokio::time::Instant::now();
    let mut next_report = started + Duration::from_secs(2);
    let mut last = None;
    loop {
        let waiting = match (state.registry.ready_count() > 0, state.provider_health(PROVIDER)) {
            (true, Some(OverlayState::Available)) => return,
            (false, _) => Waiting::NodeNotConnected,
            (true, Some(OverlayState::Unavailable)) => Waiting::ProviderDown,
            (true, _) => Waiting::NotProbedYet,
        };
        let now = tokio::time::Instant::now();
        if now >= next_report || (waiting == Waiting::ProviderDown && last != Some(waiting)) {
            let what = match waiting {
                Waiting::NodeNotConnected => "the node has not connected to the Edge yet".to_string(),
                Waiting::NotProbedYet => "the node has not probed the provider yet".to_string(),
                Waiting::ProviderDown => {
                    format!("the provider did not answer the node's health probe: {provider_hint}")
                }
            };
            println!(
                "iop-dev: not up yet ({} s): {what}. Still waiting (the node re-probes from 1 s up to every 30 s); Ctrl-C stops.",
                started.elapsed().as_secs()
            );
            last = Some(waiting);
            next_report = now + Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user's server is probed as docs/failure-handling.md "Provider health" documents, not
    /// on the tests' one-second profile.
    #[test]
    fn iop_dev_probes_on_the_documented_intervals() {
        let health = health_profile();
        assert_eq!((health.idle_interval_ms, health.retry_initial_ms, health.retry_max_ms), (60_000, 1_000, 30_000));
    }

    #[test]
    fn the_mock_adapter_is_ollama_by_default_and_only_for_the_mock() {
        let args = Args::try_parse_from(["iop-dev"]).unwrap();
        assert_eq!(args.mock_adapter, MockAdapter::Ollama);
        let args = Args::try_parse_from(["iop-dev", "--mock-adapter", "openai"]).unwrap();
        assert_eq!(Adapter::from(args.mock_adapter), Adapter::Openai);
        assert!(Args::try_parse_from(["iop-dev", "--mock-adapter", "openai", "--ollama", "http://x"]).is_err());
        assert!(Args::try_parse_from(["iop-dev", "--ollama", "http://x"]).is_ok());
    }
}

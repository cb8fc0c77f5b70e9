//! Building blocks for running IOP locally: config documents for a dev
//! layout, and child-process helpers for the end-to-end tests and the
//! benchmark (real binaries, real sockets, real mTLS).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use iop_proto::config::{
    Adapter, AuthConfig, AuthMode, EdgeConfig, EdgeTlsConfig, Limits, ListenConfig, NodeEntry, ProviderEntry,
    PublicModel, Target,
};
use iop_proto::identity::NodeIdentity;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::pki::{DevCa, PairFiles, Validity};

pub const TRUST_DOMAIN: &str = "iop.local";

/// A provider for [`edge_config`]: one provider on `node`, served under `public_model`.
#[derive(Debug, Clone)]
pub struct ProviderSpec {
    pub id: String,
    pub node: String,
    pub adapter: Adapter,
    pub base_url: String,
    pub target_model: String,
    pub public_model: String,
    /// Most concurrent runs (the Edge queues the rest).
    pub capacity: u32,
    /// Priority for the public model (lower is preferred).
    pub priority: u32,
    pub mode: iop_proto::config::ProviderMode,
    /// 0 for the default (300 s).
    pub stall_timeout_ms: u64,
    /// 0 for the default (60 s).
    pub first_byte_timeout_ms: u64,
    /// Ask the node to keep the model resident (Ollama adapter only).
    pub keep_warm: bool,
}

impl ProviderSpec {
    pub fn entry(&self) -> ProviderEntry {
        ProviderEntry {
            id: self.id.clone(),
            node: self.node.clone(),
            adapter: self.adapter,
            target: Target { model: self.target_model.clone(), base_url: self.base_url.clone() },
            models: vec![PublicModel { name: self.public_model.clone(), priority: self.priority }],
            response_stall_timeout_ms: self.stall_timeout_ms,
            first_byte_timeout_ms: self.first_byte_timeout_ms,
            capacity: self.capacity,
            mode: self.mode,
            credential: None,
            continuation: None,
            context_window: None,
            accepts_images: None,
            keep_warm: self.keep_warm,
        }
    }
}

/// A dev PKI written to `dir`: CA and Edge server certificate.
pub struct DevPki {
    pub ca: DevCa,
    pub dir: PathBuf,
    pub ca_file: PathBuf,
    pub edge: PairFiles,
}

impl DevPki {
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        let ca = DevCa::new("IOP dev CA");
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca.cert_pem())?;
        let edge = ca.server_cert(&["localhost"]).write(dir, "edge")?;
        Ok(Self { ca, dir: dir.to_path_buf(), ca_file, edge })
    }

    pub fn node_cert(&self, name: &str, validity: Validity) -> std::io::Result<PairFiles> {
        let identity = NodeIdentity::new(TRUST_DOMAIN, name).expect("valid node name");
        self.ca.node_cert(&identity, validity).write(&self.dir, &format!("node-{name}"))
    }
}

pub fn edge_config(
    pki: &DevPki,
    http: SocketAddr,
    grpc: SocketAddr,
    nodes: &[&str],
    providers: &[ProviderSpec],
) -> EdgeConfig {
    EdgeConfig {
        // Any free port: tests and benches read it from the Edge's first line.
        listen: ListenConfig::new(http, grpc, SocketAddr::from(([127, 0, 0, 1], 0))),
        tls: EdgeTlsConfig {
            ca_file: pki.ca_file.clone(),
            cert_file: pki.edge.cert.clone(),
            key_file: pki.edge.key.clone(),
        },
        trust_domain: TRUST_DOMAIN.to_string(),
        nodes: nodes.iter().map(|n| NodeEntry { name: n.to_string() }).collect(),
        providers: providers.iter().map(ProviderSpec::entry).collect(),
        limits: Limits::default(),
        // Local stacks serve without keys unless a test sets them up.
        auth: AuthConfig { mode: AuthMode::Disabled, ..Default::default() },
        credentials: Vec::new(),
        workspaces: Vec::new(),
        context_fallbacks: Default::default(),
        retry: Default::default(),
        replicas: Vec::new(),
        api: Default::default(),
        outlier: Default::default(),
        scheduling: Default::default(),
        telemetry: Default::default(),
    }
}

/// Node config pointing at `grpc` on loopback, trusting `ca_file`.
pub fn node_config(grpc: SocketAddr, ca_file: &Path, pair: &PairFiles, backoff_ms: (u64, u64)) -> iop_node::NodeConfig {
    iop_node::NodeConfig {
        edge: iop_node::config::EdgeEndpoint {
            url: format!("https://127.0.0.1:{}", grpc.port()),
            server_name: Some("localhost".to_string()),
        },
        tls: iop_node::config::NodeTlsConfig {
            ca_file: ca_file.to_path_buf(),
            cert_file: pair.cert.clone(),
            key_file: pair.key.clone(),
        },
        reconnect: iop_node::config::ReconnectConfig { initial_backoff_ms: backoff_ms.0, max_backoff_ms: backoff_ms.1 },
        metrics: None,
        // Fast re-probing, so a provider's return is seen within a test.
        health: iop_node::config::HealthConfig { idle_interval_ms: 1_000, retry_initial_ms: 50, retry_max_ms: 500 },
        workspaces: Default::default(),
        models: Default::default(),
        images: Default::default(),
        telemetry: Default::default(),
        source: None,
    }
}

/// Path of a workspace binary next to the running test or bench executable
/// (`target/<profile>/`). Cargo builds a package's binaries before its
/// integration tests; `cargo build --workspace --bins` covers the rest.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(path.exists(), "{} not built: run `cargo build --workspace --bins` first", path.display());
    path
}

/// A loopback port that is free and stays this test process's: no other
/// test process picks it while this one runs.
///
/// Chosen up front (not by binding port 0) because an Edge comes back on
/// its ports after a restart, and below the kernel's ephemeral range, which
/// any outgoing connection of a test running alongside may take. Checking
/// that a port binds is not enough: between the check and the binary's own
/// bind another test process could pick the same port (CI saw `Address
/// already in use` with two suites running side by side). So each chosen
/// port is also claimed by an advisory lock on a file named after it, held
/// until this process exits, and a port whose file is locked is passed over.
pub fn free_port() -> SocketAddr {
    static CLAIMED: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let claims = std::env::temp_dir().join("iop-test-ports");
    std::fs::create_dir_all(&claims).unwrap_or_else(|e| panic!("creating {}: {e}", claims.display()));
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let ephemeral_low = range.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(32768u16);
    let low = 10_000.min(ephemeral_low / 2);
    loop {
        let addr = SocketAddr::from(([127, 0, 0, 1], fastrand::u16(low..ephemeral_low)));
        let path = claims.join(addr.port().to_string());
        let Ok(claim) = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path) else {
            continue;
        };
        if claim.try_lock().is_err() || std::net::TcpListener::bind(addr).is_err() {
            continue;
        }
        CLAIMED.lock().unwrap().push(claim);
        return addr;
    }
}

/// A child process that is killed when dropped.
pub struct Proc {
    pub child: Child,
    pub name: &'static str,
    /// The child's `TMPDIR`, removed after it is killed: a process killed
    /// with SIGKILL cannot remove its own temporary files (`iop-dev`'s PKI).
    _tmp: Option<tempfile::TempDir>,
}

impl Proc {
    /// A child that has no temporary directory of its own.
    pub fn new(child: Child, name: &'static str) -> Self {
        Self { child, name, _tmp: None }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("process is running")
    }

    /// The process's resident memory in KiB (Linux `/proc`; 0 elsewhere).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill").arg(signal).arg(self.pid().to_string()).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal} {} failed", self.name);
    }

    /// Freezes the process (SIGSTOP): it stops answering heartbeats.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGTERM, then waits for exit.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        self.signal("-TERM");
        tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("process exits after SIGTERM")
            .expect("wait")
    }
}

/// The resident memory of process `pid` in KiB (Linux `/proc`; 0 elsewhere).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `iop-fast-upstream` on a free loopback port: the process and its base URL.
pub async fn spawn_fast_upstream() -> (Proc, String) {
    let (upstream, line) =
        spawn_until("iop-fast-upstream", &bin("iop-fast-upstream"), &["127.0.0.1:0"], "listening on").await;
    let url = line.rsplit(' ').next().expect("the upstream's address").to_string();
    (upstream, url)
}

/// `iop-edge` with `config`, written to `dir/edge.yaml`: the process and
/// its marker line ([`addr_field`] reads its listeners from it).
pub async fn spawn_edge(dir: &Path, config: &EdgeConfig) -> (Proc, String) {
    let path = dir.join("edge.yaml");
    std::fs::write(&path, config.to_yaml()).expect("writing the edge config");
    let args = ["--config", path.to_str().expect("a UTF-8 temp path")];
    spawn_until("iop-edge", &bin("iop-edge"), &args, "iop-edge listening").await
}

/// Writes `config` to `dir/node.yaml` with its metrics on a free port (the
/// line [`spawn_node`] waits for), and returns the file.
pub fn write_node_config(dir: &Path, mut config: iop_node::config::NodeConfig) -> PathBuf {
    config.metrics = Some(iop_node::config::MetricsConfig { listen: SocketAddr::from(([127, 0, 0, 1], 0)) });
    let path = dir.join("node.yaml");
    std::fs::write(&path, serde_saphyr::to_string(&config).expect("the node config serializes"))
        .expect("writing the node config");
    path
}

/// `iop-node` with the config file `config` ([`write_node_config`]), once
/// its metrics listener is up.
pub async fn spawn_node(config: &Path) -> Proc {
    let args = ["--config", config.to_str().expect("a UTF-8 temp path")];
    spawn_until("iop-node", &bin("iop-node"), &args, "iop-node metrics on").await.0
}

/// Spawns `program` and returns it once a stdout line contains `ready_marker`,
/// together with that line. Stderr is inherited so failures are visible.
pub async fn spawn_until(name: &'static str, program: &Path, args: &[&str], ready_marker: &str) -> (Proc, String) {
    let (proc, mut lines) = spawn_until_lines(name, program, args, ready_marker).await;
    (proc, lines.pop().expect("the marker line"))
}

/// [`spawn_until`], returning every stdout line up to the marker's (last).
pub async fn spawn_until_lines(
    name: &'static str,
    program: &Path,
    args: &[&str],
    ready_marker: &str,
) -> (Proc, Vec<String>) {
    spawn_logged_until_lines(name, program, args, ready_marker, None).await
}

/// [`spawn_until_lines`], with stderr (the process's log, at `RUST_LOG=info`)
/// written to `log` when given, for tests that read what it logged.
pub async fn spawn_logged_until_lines(
    name: &'static str,
    program: &Path,
    args: &[&str],
    ready_marker: &str,
    log: Option<&Path>,
) -> (Proc, Vec<String>) {
    spawn_configured_until_lines(name, program, args, ready_marker, log, |_| {}).await
}

/// [`spawn_logged_until_lines`], with the command set up further by
/// `configure` before it starts (a terminal, an inherited descriptor).
pub async fn spawn_configured_until_lines(
    name: &'static str,
    program: &Path,
    args: &[&str],
    ready_marker: &str,
    log: Option<&Path>,
    configure: impl FnOnce(&mut Command),
) -> (Proc, Vec<String>) {
    let tmp = tempfile::Builder::new().prefix("iop-proc-").tempdir().expect("creating a temporary directory");
    let mut command = Command::new(program);
    command.args(args).stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true).env("TMPDIR", tmp.path());
    if let Some(log) = log {
        let file = std::fs::File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        command.stderr(file).env("RUST_LOG", "info").env_remove("NO_COLOR");
    }
    configure(&mut command);
    let mut child = command.spawn().unwrap_or_else(|e| panic!("spawning {}: {e}", program.display()));
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let printed = tokio::time::timeout(Duration::from_secs(30), async {
        let mut printed = Vec::new();
        while let Some(line) = lines.next_line().await.expect("reading stdout") {
            let done = line.contains(ready_marker);
            printed.push(line);
            if done {
                return printed;
            }
        }
        panic!("{name} exited before printing `{ready_marker}`");
    })
    .await
    .unwrap_or_else(|_| panic!("{name} did not print `{ready_marker}` within 30 s"));
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (Proc { child, name, _tmp: Some(tmp) }, printed)
}

/// Parses `key=ADDR` out of a ready line.
pub fn addr_field(line: &str, key: &str) -> SocketAddr {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= address in `{line}`"))
}

/// Polls `condition` every 20 ms until it holds or `timeout` passes.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

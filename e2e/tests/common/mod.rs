//! A running stack for end-to-end tests: the mock provider, an Edge and
//! Nodes as real child processes talking real mTLS on loopback.
#![allow(dead_code)] // each test binary uses a different subset

pub mod fake_node;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use iop_e2e::harness::{
    self, DevPki, Proc, ProviderSpec, addr_field, bin, spawn_logged_until_lines, spawn_until, wait_until,
};
use iop_e2e::pki::{PairFiles, Validity};
use iop_proto::config::{Adapter, AuthConfig, AuthMode, CredentialProfile, CredentialRef};
use serde_json::Value;

pub const NODE: &str = "mac-1";
/// Short heartbeat profile for liveness tests (interval, wait in ms).
pub const FAST_HEARTBEAT: &str = "100,400";
pub const WAIT: Duration = Duration::from_secs(20);

pub use iop_e2e::harness::free_port;

pub struct StackOptions {
    pub heartbeat: Option<&'static str>,
    pub start_node: bool,
    pub extra_providers: Vec<ProviderSpec>,
    pub limits: Option<iop_proto::config::Limits>,
    /// Nodes besides [`NODE`], configured and (with `start_node`) started.
    pub extra_nodes: Vec<&'static str>,
    /// A keys file: the Edge requires API keys from it (`keys.yaml` in the
    /// stack's directory). `None`: `auth.mode: disabled`.
    pub keys: Option<String>,
    /// Managed credentials: each provider named gets the profile, whose
    /// secret is written to `<profile>.key` in the stack's directory.
    pub credentials: Vec<Managed>,
    /// Extra `iop-edge` arguments (e.g. `--test-lease-fault tamper`).
    pub edge_args: Vec<&'static str>,
    /// The Edge config's `workspaces`.
    pub workspaces: Vec<iop_proto::config::WorkspaceEntry>,
    /// Every node's `workspaces.allowed_roots`.
    pub allowed_roots: Vec<PathBuf>,
    /// `auth.anonymous_workspaces` when no `keys` are set; `None` opens
    /// every workspace of the stack to anonymous callers (what the job tests
    /// run with), `Some(vec![])` closes them all.
    pub anonymous_workspaces: Option<Vec<&'static str>>,
    /// Extra `iop-node` arguments (e.g. `--test-no-sandbox`).
    pub node_args: Vec<&'static str>,
    /// Every node's `workspaces.unsandboxed_commands`.
    pub unsandboxed_commands: bool,
    /// The mock provider's `--script-file` contents (YAML), if any.
    pub mock_script: Option<&'static str>,
    /// More arguments for the stack's mock provider (e.g. `--loaded false`).
    pub mock_args: Vec<&'static str>,
    /// The Edge config's `context_fallbacks` (model -> larger model).
    pub context_fallbacks: Vec<(&'static str, &'static str)>,
    /// The Edge's and nodes' logs go to `edge.log` / `node-<name>.log` in the
    /// stack's directory ([`Stack::log`]) instead of the test's stderr.
    pub capture_logs: bool,
    /// The Edge config's `retry` (default: `RetryConfig::default()`).
    pub retry: iop_proto::config::RetryConfig,
    /// The Edge config's `outlier` (default: the Edge's defaults).
    pub outlier: Option<iop_proto::config::OutlierConfig>,
    /// The Edge config's `scheduling` (default: the Edge's defaults).
    pub scheduling: Option<iop_proto::config::SchedulingConfig>,
    /// `telemetry` of the Edge's and every node's config (default: off).
    pub telemetry: iop_proto::config::TelemetryConfig,
    /// The Edge config's `listen.admin_hosts`.
    pub admin_hosts: Vec<&'static str>,
}

/// A managed credential of [`StackOptions::credentials`].
pub struct Managed {
    pub profile: &'static str,
    pub secret: &'static str,
    pub revision: u64,
    pub providers: Vec<&'static str>,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            heartbeat: None,
            start_node: true,
            extra_providers: Vec::new(),
            limits: None,
            extra_nodes: Vec::new(),
            keys: None,
            credentials: Vec::new(),
            edge_args: Vec::new(),
            workspaces: Vec::new(),
            allowed_roots: Vec::new(),
            anonymous_workspaces: None,
            mock_script: None,
            mock_args: Vec::new(),
            node_args: Vec::new(),
            unsandboxed_commands: false,
            context_fallbacks: Vec::new(),
            capture_logs: false,
            retry: Default::default(),
            outlier: None,
            scheduling: None,
            telemetry: Default::default(),
            admin_hosts: Vec::new(),
        }
    }
}

pub struct Stack {
    pub dir: tempfile::TempDir,
    pub pki: DevPki,
    pub mock: Proc,
    pub mock_url: String,
    pub edge: Option<Proc>,
    pub edge_config: PathBuf,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    pub nodes: Vec<Proc>,
    /// `/metrics` URL of the first node.
    pub node_metrics: Option<String>,
    pub heartbeat: Option<&'static str>,
    pub edge_args: Vec<&'static str>,
    pub allowed_roots: Vec<PathBuf>,
    pub node_args: Vec<&'static str>,
    pub unsandboxed_commands: bool,
    pub client: reqwest::Client,
    pub capture_logs: bool,
    pub telemetry: iop_proto::config::TelemetryConfig,
}

/// A provider on the stack's node; `base_url` is filled in by `Stack::start`.
pub fn provider(id: &str, adapter: Adapter, target_model: &str, public_model: &str, mock_url: &str) -> ProviderSpec {
    ProviderSpec {
        id: id.into(),
        node: NODE.into(),
        adapter,
        base_url: mock_url.into(),
        target_model: target_model.into(),
        public_model: public_model.into(),
        capacity: 4,
        priority: 0,
        mode: Default::default(),
        stall_timeout_ms: 0,
        first_byte_timeout_ms: 0,
        keep_warm: false,
    }
}

/// A mock provider of its own that requires `Authorization: Bearer KEY`.
pub async fn spawn_keyed_mock(key: &str) -> (Proc, String) {
    let args = ["--listen", "127.0.0.1:0", "--api-key", key];
    let (mock, line) = spawn_until("iop-mock-provider", &bin("iop-mock-provider"), &args, "listening on").await;
    (mock, line.split_whitespace().last().unwrap().to_string())
}

/// A mock provider process of its own, so a test can fault one provider's
/// server while its siblings stay healthy, listening on `listen`
/// (`127.0.0.1:0` for any port). Returns the process and its URL.
pub async fn spawn_mock(listen: &str) -> (Proc, String) {
    spawn_mock_with(listen, &[]).await
}

/// [`spawn_mock`] with more `iop-mock-provider` arguments, e.g.
/// `["--loaded", "false", "--load-delay-ms", "2000", "--residency-api", "ollama"]`.
pub async fn spawn_mock_with(listen: &str, args: &[&str]) -> (Proc, String) {
    let args: Vec<&str> = ["--listen", listen].into_iter().chain(args.iter().copied()).collect();
    let (mock, line) = spawn_until("iop-mock-provider", &bin("iop-mock-provider"), &args, "listening on").await;
    (mock, line.split_whitespace().last().unwrap().to_string())
}

/// Makes a workspace root usable by the commands the node runs there, as
/// docs/security.md ("A node run as root") tells an owner who runs the node as root: the root
/// (and what is in it) belongs to `workspaces.command_user`, and every
/// directory above it may be passed through. A node that is not root runs
/// commands as itself: nothing to do.
pub fn let_commands_use(root: &std::path::Path) {
    // SAFETY: geteuid has no preconditions.
    let Some(user) = iop_node::workspace::sandbox::command_user(unsafe { libc::geteuid() }, None).unwrap() else {
        return;
    };
    if !root.exists() {
        return;
    }
    let status = std::process::Command::new("chown")
        .args(["-R", "--no-dereference", &format!("{}:{}", user.uid, user.gid)])
        .arg(root)
        .status()
        .unwrap();
    assert!(status.success(), "chown {}", root.display());
    for dir in root.ancestors().skip(1) {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir).unwrap().permissions().mode();
        if mode & 0o001 == 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o011)).unwrap();
        }
    }
}

/// A plain HTTP client for talking to the Edge and the mock.
pub fn http_client() -> reqwest::Client {
    // reqwest is built without a bundled crypto provider (IOP uses ring).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

impl Stack {
    pub async fn start(options: StackOptions) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::create(dir.path()).unwrap();
        let script = dir.path().join("mock-script.yaml");
        let mut mock_args = vec!["--listen", "127.0.0.1:0"];
        if let Some(text) = options.mock_script {
            std::fs::write(&script, text).unwrap();
            mock_args.extend(["--script-file", script.to_str().unwrap()]);
        }
        mock_args.extend(options.mock_args.iter().copied());
        let (mock, line) =
            spawn_until("iop-mock-provider", &bin("iop-mock-provider"), &mock_args, "listening on").await;
        let mock_url = line.split_whitespace().last().unwrap().to_string();
        let mut providers = vec![
            provider("ollama-mock", Adapter::Ollama, "mock", "mock-ollama", &mock_url),
            provider("openai-mock", Adapter::Openai, "mock", "mock-openai", &mock_url),
        ];
        for mut p in options.extra_providers {
            if p.base_url.is_empty() {
                p.base_url = mock_url.clone();
            }
            providers.push(p);
        }
        let nodes: Vec<&str> = std::iter::once(NODE).chain(options.extra_nodes.iter().copied()).collect();
        // Fixed up front so that a restart comes back on the same ports.
        let mut config = harness::edge_config(&pki, free_port(), free_port(), &nodes, &providers);
        config.listen.admin = free_port();
        if let Some(limits) = options.limits {
            config.limits = limits;
        }
        if let Some(keys) = &options.keys {
            let keys_file = dir.path().join("keys.yaml");
            std::fs::write(&keys_file, keys).unwrap();
            config.auth = AuthConfig { mode: AuthMode::Required, keys_file: Some(keys_file), ..Default::default() };
        }
        config.workspaces = options.workspaces.clone();
        for workspace in &config.workspaces {
            let_commands_use(std::path::Path::new(&workspace.root));
        }
        if config.auth.mode == AuthMode::Disabled {
            config.auth.anonymous_workspaces = match &options.anonymous_workspaces {
                Some(refs) => refs.iter().map(|r| r.to_string()).collect(),
                None => config.workspaces.iter().map(|w| w.reference.clone()).collect(),
            };
        }
        if let Some(scheduling) = options.scheduling.clone() {
            config.scheduling = scheduling;
        }
        if let Some(outlier) = options.outlier.clone() {
            config.outlier = outlier;
        }
        config.context_fallbacks =
            options.context_fallbacks.iter().map(|(from, to)| (from.to_string(), to.to_string())).collect();
        config.retry = options.retry.clone();
        config.telemetry = options.telemetry.clone();
        config.listen.admin_hosts = options.admin_hosts.iter().map(|h| h.to_string()).collect();
        for managed in &options.credentials {
            let file = dir.path().join(format!("{}.key", managed.profile));
            std::fs::write(&file, managed.secret).unwrap();
            config.credentials.push(CredentialProfile {
                profile: managed.profile.into(),
                file,
                revision: managed.revision,
                disabled: false,
            });
            for provider in config.providers.iter_mut().filter(|p| managed.providers.contains(&p.id.as_str())) {
                provider.credential = Some(CredentialRef { profile: managed.profile.into() });
            }
        }
        let edge_config = dir.path().join("edge.yaml");
        std::fs::write(&edge_config, config.to_yaml()).unwrap();
        let listen = &config.listen;
        let mut stack = Stack {
            dir,
            pki,
            mock,
            mock_url,
            edge: None,
            edge_config,
            http: listen.http,
            grpc: listen.grpc,
            admin: listen.admin,
            nodes: Vec::new(),
            node_metrics: None,
            heartbeat: options.heartbeat,
            edge_args: options.edge_args,
            allowed_roots: options.allowed_roots,
            node_args: options.node_args,
            unsandboxed_commands: options.unsandboxed_commands,
            client: http_client(),
            capture_logs: options.capture_logs,
            telemetry: options.telemetry.clone(),
        };
        stack.start_edge().await;
        if options.start_node {
            for name in nodes {
                let pair = stack.pki.node_cert(name, Validity::Current).unwrap();
                let (node, metrics) = stack.spawn_node(&pair, &stack.pki.ca_file.clone()).await;
                stack.nodes.push(node);
                stack.node_metrics.get_or_insert(metrics);
                stack.wait_node_ready(name).await;
            }
        }
        stack
    }

    pub async fn start_edge(&mut self) {
        let config = self.edge_config.to_str().unwrap().to_string();
        let mut args = vec!["--config", config.as_str(), "--reload-interval-ms", "100"];
        if let Some(profile) = self.heartbeat {
            args.extend(["--test-heartbeat-profile", profile]);
        }
        args.extend(self.edge_args.iter().copied());
        let log = self.capture_logs.then(|| self.dir.path().join("edge.log"));
        let (edge, mut lines) =
            spawn_logged_until_lines("iop-edge", &bin("iop-edge"), &args, "iop-edge listening", log.as_deref()).await;
        let line = lines.pop().expect("the marker line");
        self.http = addr_field(&line, "http");
        self.grpc = addr_field(&line, "grpc");
        self.admin = addr_field(&line, "admin");
        self.edge = Some(edge);
    }

    /// Starts an `iop-node` with the given certificate, trusting `ca_file`,
    /// serving its metrics on a free port (returned as a URL).
    pub async fn spawn_node(&self, pair: &PairFiles, ca_file: &std::path::Path) -> (Proc, String) {
        self.spawn_node_with(pair, ca_file, |_| {}).await
    }

    /// [`Stack::spawn_node`], with the process set up further by
    /// `configure` (a controlling terminal, an inherited descriptor).
    pub async fn spawn_node_with(
        &self,
        pair: &PairFiles,
        ca_file: &std::path::Path,
        configure: impl FnOnce(&mut tokio::process::Command),
    ) -> (Proc, String) {
        let mut config = harness::node_config(self.grpc, ca_file, pair, (50, 500));
        config.metrics = Some(iop_node::config::MetricsConfig { listen: "127.0.0.1:0".parse().unwrap() });
        config.workspaces.allowed_roots = self.allowed_roots.clone();
        config.workspaces.unsandboxed_commands = self.unsandboxed_commands;
        config.telemetry = self.telemetry.clone();
        let name = pair.cert.file_stem().unwrap().to_str().unwrap().to_string();
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, serde_saphyr::to_string(&config).unwrap()).unwrap();
        let path = path.to_str().unwrap().to_string();
        let mut args = vec!["--config", path.as_str()];
        if let Some(profile) = self.heartbeat {
            args.extend(["--test-heartbeat-profile", profile]);
        }
        args.extend(self.node_args.iter().copied());
        let log = self.capture_logs.then(|| self.dir.path().join(format!("{name}.log")));
        let (node, mut lines) = harness::spawn_configured_until_lines(
            "iop-node",
            &bin("iop-node"),
            &args,
            "iop-node metrics on",
            log.as_deref(),
            configure,
        )
        .await;
        let line = lines.pop().expect("the marker line");
        let url = line.split_whitespace().last().unwrap().to_string();
        (node, format!("{url}/metrics"))
    }

    /// What `process` (`edge`, or `node-<name>`) logged so far, with
    /// [`StackOptions::capture_logs`].
    pub fn log(&self, process: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{process}.log"))).unwrap_or_default()
    }

    /// A URL on the client listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// A URL on the admin listener (`/admin/*`, `/metrics`).
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// GET as JSON from the listener that serves `path`.
    pub async fn get_json(&self, path: &str) -> Value {
        let url = if path.starts_with("/admin/") { self.admin_url(path) } else { self.url(path) };
        let response = self.client.get(url).send().await.expect("GET");
        serde_json::from_slice(&response.bytes().await.unwrap()).expect("JSON body")
    }

    pub async fn node(&self, name: &str) -> Value {
        let nodes = self.get_json("/admin/v1/nodes").await;
        nodes["nodes"].as_array().unwrap().iter().find(|n| n["name"] == name).cloned().expect("configured node")
    }

    /// Waits until `name` is Ready and returns its generation.
    pub async fn wait_node_ready(&self, name: &str) -> u64 {
        self.wait_node_ready_after(name, 0).await
    }

    /// Waits until `name` is Ready on a generation newer than `previous`.
    pub async fn wait_node_ready_after(&self, name: &str, previous: u64) -> u64 {
        wait_until(&format!("node {name} ready after generation {previous}"), WAIT, || async {
            let node = self.node(name).await;
            node["phase"] == "ready" && node["generation"].as_u64().unwrap_or(0) > previous
        })
        .await;
        self.node(name).await["generation"].as_u64().unwrap()
    }

    /// Value of one sample of the Edge's /metrics, 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        self.metric_at(&self.admin_url("/metrics"), sample).await
    }

    /// Value of one sample of the metrics at `url`, 0 when absent.
    pub async fn metric_at(&self, url: &str, sample: &str) -> f64 {
        let text = self.client.get(url).send().await.unwrap().text().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.trim().parse::<f64>().ok()))
            .unwrap_or(0.0)
    }

    pub async fn wait_metric_at_least(&self, sample: &str, value: f64) {
        wait_until(&format!("{sample} >= {value}"), WAIT, || async { self.metric(sample).await >= value }).await;
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.json_post(path, body).send().await.expect("POST")
    }

    /// `POST path` of `body` with API key `key`.
    pub async fn post_as(&self, key: &str, path: &str, body: &Value) -> reqwest::Response {
        self.json_post(path, body).bearer_auth(key).send().await.expect("POST")
    }

    fn json_post(&self, path: &str, body: &Value) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
    }

    /// Marks providers `ids` `continuation: true` (they continue a
    /// prefilled assistant turn, whatever their nodes detect) and waits for
    /// the Edge to reload.
    pub async fn declare_continuation(&self, ids: &[&str]) {
        self.set_continuation(ids, true).await;
    }

    /// Sets providers `ids`' `continuation` and waits for the Edge to reload.
    pub async fn set_continuation(&self, ids: &[&str], continues: bool) {
        self.edit_providers(ids, |p| p.continuation = Some(continues)).await;
    }

    /// Applies `edit` to providers `ids` in the Edge's config file and waits
    /// for the Edge to reload it.
    pub async fn edit_providers(&self, ids: &[&str], edit: impl Fn(&mut iop_proto::config::ProviderEntry)) {
        let text = std::fs::read_to_string(&self.edge_config).unwrap();
        let mut config = iop_proto::config::EdgeConfig::from_yaml(&text).unwrap();
        let revision = self.get_json("/admin/v1/config").await["config"]["revision"].as_u64().unwrap();
        for p in config.providers.iter_mut().filter(|p| ids.contains(&p.id.as_str())) {
            edit(p);
        }
        std::fs::write(&self.edge_config, config.to_yaml()).unwrap();
        wait_until("the reload is applied", WAIT, || async {
            self.get_json("/admin/v1/config").await["config"]["revision"].as_u64() == Some(revision + 1)
        })
        .await;
    }

    /// Requests the mock at `url` logged on `path` (`GET /mock/requests`),
    /// only those naming `target` as their model when given.
    pub async fn mock_requests(&self, url: &str, path: &str, target: Option<&str>) -> usize {
        let response = self.client.get(format!("{url}/mock/requests")).send().await.unwrap();
        let log: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        let log = log.as_array().unwrap().iter().filter(|r| r["path"] == path);
        log.filter(|r| target.is_none_or(|t| r["body"]["model"] == t)).count()
    }

    /// Replaces the default fault knobs of the mock at `url` (`POST /mock/faults`).
    pub async fn set_mock_faults(&self, url: &str, faults: &str) {
        let response = self.client.post(format!("{url}/mock/faults")).body(faults.to_string()).send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.status());
    }

    /// `/admin/v1/providers` entry of provider `id`.
    pub async fn provider_admin(&self, id: &str) -> Value {
        let all = self.get_json("/admin/v1/providers").await;
        all["providers"].as_array().unwrap().iter().find(|p| p["id"] == id).cloned().expect("configured provider")
    }

    /// Waits until the Edge believes provider `id` reads images or not
    /// (`accepts_images` in `/admin/v1/providers`, as its node reported
    /// what its server says).
    pub async fn wait_accepts_images(&self, id: &str, accepts: bool) {
        wait_until(&format!("{id} accepts_images={accepts}"), WAIT, || async {
            self.provider_admin(id).await["accepts_images"] == accepts
        })
        .await;
    }

    pub async fn mock_stats(&self) -> Value {
        let response = self.client.get(format!("{}/mock/stats", self.mock_url)).send().await.unwrap();
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
    }

    /// The body of the last request the mock provider received at `path`.
    pub async fn last_provider_request(&self, path: &str) -> Value {
        self.last_provider_entry(path).await["body"].clone()
    }

    /// The last request the mock provider received at `path`, as its log
    /// keeps it (`method`, `path`, `body`, `headers`).
    pub async fn last_provider_entry(&self, path: &str) -> Value {
        let response = self.client.get(format!("{}/mock/requests", self.mock_url)).send().await.unwrap();
        let log: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        let entry = log.as_array().unwrap().iter().rev().find(|r| r["path"] == path);
        entry.unwrap_or_else(|| panic!("no request to {path} in {log}")).clone()
    }
}

pub async fn json_body(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&body))))
}

/// Parses an SSE body into its `data:` payloads.
pub async fn sse_events(response: reqwest::Response) -> Vec<String> {
    let text = response.text().await.unwrap();
    text.split("\n\n").filter_map(|event| event.strip_prefix("data: ")).map(str::to_string).collect()
}

/// Concatenated `choices[0].delta.content` of chat completion chunks.
pub fn streamed_text(events: &[String]) -> String {
    events
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

pub fn chat_body(model: &str, content: &str, stream: bool) -> Value {
    serde_json::json!({ "model": model, "stream": stream, "messages": [ { "role": "user", "content": content } ] })
}

/// Runs an SDK script (`e2e/sdk/`) with the tests' Python
/// ([`iop_e2e::parts::python`]) and returns what it printed.
pub async fn run_script(script: &str, args: &[&str]) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk").join(script);
    let python = iop_e2e::parts::python();
    let output = tokio::process::Command::new(&python)
        .arg(script)
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{}: {e} (`scripts/test-deps` makes it)", python.display()));
    assert!(
        output.status.success(),
        "sdk script failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Names under `<root>/.iop/job` (workspace request state still on disk).
pub fn job_dirs(root: &std::path::Path) -> Vec<String> {
    match std::fs::read_dir(root.join(".iop/job")) {
        Ok(entries) => entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Whether process `pid` exists and is not a zombie (nothing may reap an
/// orphan promptly in a container). Linux reads `/proc`; macOS has none,
/// so POSIX `ps` answers there (empty when the process is gone).
pub fn alive(pid: i32) -> bool {
    if cfg!(target_os = "linux") {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
    } else {
        let ps = std::process::Command::new("ps").args(["-o", "stat=", "-p", &pid.to_string()]).output();
        ps.is_ok_and(|out| {
            let state = String::from_utf8_lossy(&out.stdout);
            !state.trim().is_empty() && !state.trim_start().starts_with('Z')
        })
    }
}

/// `setsid PROGRAM ARGS...` for workspace command scripts on every
/// platform: macOS has no `setsid(1)`; both have perl (as the node's own
/// tests do it).
pub const SETSID: &str = "perl -MPOSIX -e 'POSIX::setsid() or die qq(setsid: $!); exec @ARGV or die qq(exec: $!)'";

/// The pid a workspace command wrote to `<root>/grandchild.pid` (the
/// commands of the workspace tests start a grandchild and record it).
pub async fn grandchild(root: &std::path::Path) -> i32 {
    let file = root.join("grandchild.pid");
    wait_until("the command's grandchild started", WAIT, || async {
        std::fs::read_to_string(&file).is_ok_and(|s| s.ends_with('\n') && s.trim().parse::<i32>().is_ok())
    })
    .await;
    std::fs::read_to_string(&file).unwrap().trim().parse().unwrap()
}

/// `iop-edge new-key --name NAME` with more `args` (e.g. `--expires-in
/// 30d`): the key it printed once and its entry line for a new principal.
pub fn new_key(name: &str, args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(iop_e2e::harness::bin("iop-edge"))
        .args(["new-key", "--name", name])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let key = text.lines().find_map(|l| l.trim().strip_prefix("iop-").map(|k| format!("iop-{k}"))).expect("a key");
    let entry = text.lines().find(|l| l.trim_start().starts_with("- { name:")).expect("an entry").to_string();
    (key, entry)
}

/// A one-page PDF whose text layer is `text` (Helvetica, so plain WinAnsi
/// text; `text` holds no parentheses or backslashes), written by hand with
/// a correct cross-reference table: what a client's file reader sends, not
/// what the Edge's PDF crate writes.
pub fn one_page_pdf(text: &str) -> Vec<u8> {
    let content = format!("BT /F1 12 Tf 72 720 Td ({text}) Tj ET");
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_string(),
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>"
            .to_string(),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_string(),
        format!("<< /Length {} >>\nstream\n{content}\nendstream", content.len()),
    ];
    let mut pdf = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (number, body) in (1..).zip(&objects) {
        offsets.push(pdf.len());
        pdf.extend_from_slice(format!("{number} 0 obj\n{body}\nendobj\n").as_bytes());
    }
    let xref = pdf.len();
    // Each entry is exactly 20 bytes, its line ending ` \n`.
    pdf.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes());
    for offset in offsets {
        pdf.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    let trailer = format!("trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1);
    pdf.extend_from_slice(trailer.as_bytes());
    pdf
}

//! The Edge config document (`iop-edge --config FILE`). The operator renders
//! it into a ConfigMap; the Edge loads and validates it. Relative file paths
//! are resolved by the loader against the config file's directory.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::identity;
use crate::pb::AdapterKind;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeConfig {
    pub listen: ListenConfig,
    pub tls: EdgeTlsConfig,
    /// SPIFFE trust domain of node identities (`spiffe://<trust_domain>/node/<name>`).
    pub trust_domain: String,
    /// Nodes allowed to connect. A certificate whose identity is not listed is refused.
    #[serde(default)]
    pub nodes: Vec<NodeEntry>,
    #[serde(default)]
    pub providers: Vec<ProviderEntry>,
    #[serde(default)]
    pub limits: Limits,
    /// Client authentication (API keys). Absent means `mode: required`,
    /// which then needs a `keys_file`: an Edge is never open by accident.
    #[serde(default)]
    pub auth: AuthConfig,
    /// Managed provider credentials (see `ProviderEntry::credential`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialProfile>,
    /// Directories on nodes where jobs may work, and what they may do there
    /// (the cluster admin's half of the consent; the Mac owner's is the
    /// node's `workspaces.allowed_roots`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<WorkspaceEntry>,
    /// Public model -> a larger-context public model: a request the first
    /// one's provider refuses as too long for its context window moves to
    /// the second before anything reached the client (one hop).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub context_fallbacks: BTreeMap<String, String>,
    /// How a failed attempt is retried before the commit point (see
    /// [`RetryConfig`]).
    #[serde(default, skip_serializing_if = "RetryConfig::is_default")]
    pub retry: RetryConfig,
    /// Every replica of this Edge by id (`iop-edge --replica-id`; in
    /// Kubernetes the pod names, rendered by the operator). Each node keeps
    /// one session with each. Empty: one replica, whatever its id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<String>,
    /// How the client APIs treat what no local provider can do.
    #[serde(default, skip_serializing_if = "ApiConfig::is_default")]
    pub api: ApiConfig,
    /// Passive outlier ejection of providers whose generations keep failing
    /// (the Edge's `outlier` module).
    #[serde(default, skip_serializing_if = "OutlierConfig::is_default")]
    pub outlier: OutlierConfig,
    /// How selection weighs model residency (the Edge's `admission::choose`).
    #[serde(default, skip_serializing_if = "SchedulingConfig::is_default")]
    pub scheduling: SchedulingConfig,
    /// OpenTelemetry traces (off unless `telemetry.otlp_endpoint` is set).
    #[serde(default, skip_serializing_if = "TelemetryConfig::is_default")]
    pub telemetry: TelemetryConfig,
}

/// `telemetry` (the Edge's and the node's config alike): where spans go.
/// Off by default; with `otlp_endpoint` set, spans are exported over
/// OTLP/HTTP (protobuf) to `<otlp_endpoint>/v1/traces` in batches. Spans
/// carry ids, model and provider names, token counts and timings (the
/// GenAI semantic conventions' attributes), never prompts, answers or keys.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's base URL, e.g. `http://otel-collector:4318`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
}

impl TelemetryConfig {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
            if !scheme_ok || endpoint.len() > 2048 || endpoint.chars().any(char::is_whitespace) {
                return Err(invalid("telemetry.otlp_endpoint", "must be an http:// or https:// URL"));
            }
        }
        Ok(())
    }
}

/// `scheduling`: within a priority group, a provider whose model its node
/// reports `not_loaded` is charged `load_penalty` extra requests, so a
/// provider with the model in memory wins unless it has more than
/// `load_penalty` more runs in flight than the cold one. `0` ignores
/// residency (fewest in flight only).
///
/// The default, 4: a cold load of a 30-70 GB model on an Apple SSD
/// (2-3 GB/s, plus start-up) takes 15-35 s, about as long as four typical
/// answers of a few hundred tokens take on the warm Mac, so a request queued
/// behind up to four others there still answers no later than the cold load
/// would; past that, spreading the load is worth the load. A load also evicts
/// whatever else that Mac had in memory, which this default avoids paying
/// for single requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulingConfig {
    #[serde(default = "SchedulingConfig::default_load_penalty")]
    pub load_penalty: u32,
}

impl SchedulingConfig {
    fn default_load_penalty() -> u32 {
        4
    }
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.load_penalty > 10_000 {
            return Err(invalid("scheduling.load_penalty", "must be between 0 (ignore residency) and 10000"));
        }
        Ok(())
    }
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        Self { load_penalty: Self::default_load_penalty() }
    }
}

/// `outlier`: a provider whose generations fail `consecutive_failures` times
/// in a row (its 5xx, unreachable, reset or cut, stall, protocol error; not
/// 429s, client errors or refused credentials) is left out of selection for
/// `base_ejection_ms`, doubled on each ejection in a row up to
/// `max_ejection_ms`, unless no other provider of the route is eligible.
///
/// The defaults are Envoy's (`consecutive_5xx: 5`, `base_ejection_time: 30s`,
/// `max_ejection_time: 300s`): five failures in a row are seconds of an
/// outage on a provider with traffic, yet one or two unlucky requests do not
/// take a provider (and so its share of the load) out of a small pool; 30 s
/// is a short outage's worth, and a provider that stays broken is asked
/// again at most every 5 minutes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierConfig {
    /// `false` turns ejection off (as does `consecutive_failures: 0`).
    #[serde(default = "OutlierConfig::yes")]
    pub enabled: bool,
    #[serde(default = "OutlierConfig::default_consecutive_failures")]
    pub consecutive_failures: u32,
    #[serde(default = "OutlierConfig::default_base_ejection_ms")]
    pub base_ejection_ms: u64,
    #[serde(default = "OutlierConfig::default_max_ejection_ms")]
    pub max_ejection_ms: u64,
}

impl OutlierConfig {
    fn yes() -> bool {
        true
    }
    fn default_consecutive_failures() -> u32 {
        5
    }
    /// With half-open trials (the Edge's `core::outlier`), 10, 20 and then
    /// 30 s between trials: a provider that recovered is back within 30 s.
    fn default_base_ejection_ms() -> u64 {
        10_000
    }
    fn default_max_ejection_ms() -> u64 {
        30_000
    }
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.consecutive_failures > 1_000 {
            return Err(invalid("outlier.consecutive_failures", "must be between 0 (off) and 1000"));
        }
        if !(100..=3_600_000).contains(&self.base_ejection_ms) {
            return Err(invalid("outlier.base_ejection_ms", "must be between 100 and 3600000"));
        }
        if !(self.base_ejection_ms..=86_400_000).contains(&self.max_ejection_ms) {
            return Err(invalid("outlier.max_ejection_ms", "must be between base_ejection_ms and 86400000"));
        }
        Ok(())
    }
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            enabled: Self::yes(),
            consecutive_failures: Self::default_consecutive_failures(),
            base_ejection_ms: Self::default_base_ejection_ms(),
            max_ejection_ms: Self::default_max_ejection_ms(),
        }
    }
}

/// How the client APIs treat requests that name things no local provider has.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    #[serde(default)]
    pub hosted_tools: HostedTools,
}

impl ApiConfig {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Tools that run on an API vendor's platform (`web_search`, `file_search`,
/// Anthropic's `web_search_20250305`, ...), which coding agents send by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostedTools {
    /// Served without them; the response's `iop-dropped-tools` header names them.
    #[default]
    Drop,
    /// Answered `400 invalid_request` naming the tool.
    Refuse,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceEntry {
    /// Opaque name clients use; never a path. Unique in the config.
    #[serde(rename = "ref")]
    pub reference: String,
    /// The node (by name) whose directory it is.
    pub node: String,
    /// Absolute directory on the node.
    pub root: String,
    pub operations: Vec<WorkspaceOperation>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<WorkspaceCommand>,
    /// Environment variable names a command keeps; every other is cleared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_allowlist: Vec<String>,
    #[serde(default)]
    pub limits: WorkspaceLimits,
    /// Commands may use the network (default off; enforced by the node's
    /// sandbox).
    #[serde(default, skip_serializing_if = "is_false")]
    pub network: bool,
    /// How a job on this workspace runs.
    #[serde(default, skip_serializing_if = "WorkspaceStages::is_default")]
    pub stages: WorkspaceStages,
}

/// A job's stages on one workspace (the `WorkspaceTemplate`'s `stages`):
/// whether it plans first and has its work reviewed, how many repairs a
/// review may ask for, each stage's deadline, and prompts that replace the
/// built-in ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceStages {
    #[serde(default = "WorkspaceStages::yes")]
    pub plan: bool,
    #[serde(default = "WorkspaceStages::yes")]
    pub review: bool,
    #[serde(default = "WorkspaceStages::default_max_repairs")]
    pub max_repairs: u32,
    #[serde(default = "WorkspaceStages::default_stage_timeout_ms")]
    pub stage_timeout_ms: u64,
    #[serde(default, skip_serializing_if = "StagePrompts::is_empty")]
    pub prompts: StagePrompts,
}

fn is_false(value: &bool) -> bool {
    !value
}

/// The one definition of the stage defaults (the CRD's call these).
impl WorkspaceStages {
    fn yes() -> bool {
        true
    }
    pub fn default_max_repairs() -> u32 {
        1
    }
    pub fn default_stage_timeout_ms() -> u64 {
        300_000
    }
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for WorkspaceStages {
    fn default() -> Self {
        Self {
            plan: true,
            review: true,
            max_repairs: Self::default_max_repairs(),
            stage_timeout_ms: Self::default_stage_timeout_ms(),
            prompts: StagePrompts::default(),
        }
    }
}

/// Instructions that replace a stage's built-in prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagePrompts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize: Option<String>,
}

impl StagePrompts {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn all(&self) -> [(&'static str, &Option<String>); 5] {
        [
            ("plan", &self.plan),
            ("work", &self.work),
            ("review", &self.review),
            ("repair", &self.repair),
            ("finalize", &self.finalize),
        ]
    }
}

/// Longest stage prompt accepted.
pub const MAX_STAGE_PROMPT_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceOperation {
    Read,
    List,
    Write,
    Delete,
    Command,
}

/// A command a job may run by id: this exact argv, no arguments added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceCommand {
    pub id: String,
    pub argv: Vec<String>,
    #[serde(default = "WorkspaceCommand::default_timeout_ms")]
    pub timeout_ms: u64,
    /// What one run may use (docs/security.md "Command limits").
    #[serde(default, skip_serializing_if = "CommandLimits::is_default")]
    pub limits: CommandLimits,
}

impl WorkspaceCommand {
    fn default_timeout_ms() -> u64 {
        600_000
    }

    /// A command with the default timeout and limits.
    pub fn new(id: impl Into<String>, argv: Vec<String>) -> Self {
        Self { id: id.into(), argv, timeout_ms: Self::default_timeout_ms(), limits: CommandLimits::default() }
    }
}

/// The bounds of one run of a command template: its whole process tree
/// together. Hitting one ends the command with `limit_exceeded` naming it
/// (docs/security.md "Command limits" says how each is enforced on Linux and macOS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandLimits {
    /// Processes at once (a fork bomb stops here).
    #[serde(default = "CommandLimits::default_max_processes")]
    pub max_processes: u32,
    /// Resident memory of the tree.
    #[serde(default = "CommandLimits::default_max_memory_bytes")]
    pub max_memory_bytes: u64,
    /// CPU time of the tree, finished children included.
    #[serde(default = "CommandLimits::default_max_cpu_seconds")]
    pub max_cpu_seconds: u64,
    /// The largest file a process may write (RLIMIT_FSIZE).
    #[serde(default = "CommandLimits::default_max_file_size_bytes")]
    pub max_file_size_bytes: u64,
    /// How much the workspace root may grow during the run.
    #[serde(default = "CommandLimits::default_max_disk_bytes")]
    pub max_disk_bytes: u64,
}

/// The one definition of the defaults: generous for a build or a test run
/// on a laptop, far below what takes the machine down.
impl CommandLimits {
    pub fn default_max_processes() -> u32 {
        256
    }
    pub fn default_max_memory_bytes() -> u64 {
        4 << 30
    }
    pub fn default_max_cpu_seconds() -> u64 {
        1_800
    }
    pub fn default_max_file_size_bytes() -> u64 {
        1 << 30
    }
    pub fn default_max_disk_bytes() -> u64 {
        4 << 30
    }

    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Each field with its allowed range (the CRD's schema says the same).
    pub fn ranges(&self) -> [(&'static str, u64, u64, u64); 5] {
        [
            ("max_processes", u64::from(self.max_processes), 1, 65_536),
            ("max_memory_bytes", self.max_memory_bytes, 16 << 20, 1 << 40),
            ("max_cpu_seconds", self.max_cpu_seconds, 1, 86_400),
            ("max_file_size_bytes", self.max_file_size_bytes, 1 << 10, 1 << 40),
            ("max_disk_bytes", self.max_disk_bytes, 1 << 10, 1 << 40),
        ]
    }

    /// The wire form's values, a zero (or absent) field taking its default.
    pub fn from_wire(wire: Option<&crate::pb::CommandLimits>) -> Self {
        let d = Self::default();
        let Some(w) = wire else { return d };
        let or = |v: u64, default: u64| if v == 0 { default } else { v };
        Self {
            max_processes: if w.max_processes == 0 { d.max_processes } else { w.max_processes },
            max_memory_bytes: or(w.max_memory_bytes, d.max_memory_bytes),
            max_cpu_seconds: or(w.max_cpu_seconds, d.max_cpu_seconds),
            max_file_size_bytes: or(w.max_file_size_bytes, d.max_file_size_bytes),
            max_disk_bytes: or(w.max_disk_bytes, d.max_disk_bytes),
        }
    }
}

impl Default for CommandLimits {
    fn default() -> Self {
        Self {
            max_processes: Self::default_max_processes(),
            max_memory_bytes: Self::default_max_memory_bytes(),
            max_cpu_seconds: Self::default_max_cpu_seconds(),
            max_file_size_bytes: Self::default_max_file_size_bytes(),
            max_disk_bytes: Self::default_max_disk_bytes(),
        }
    }
}

impl From<CommandLimits> for crate::pb::CommandLimits {
    fn from(l: CommandLimits) -> Self {
        Self {
            max_processes: l.max_processes,
            max_memory_bytes: l.max_memory_bytes,
            max_cpu_seconds: l.max_cpu_seconds,
            max_file_size_bytes: l.max_file_size_bytes,
            max_disk_bytes: l.max_disk_bytes,
        }
    }
}

/// Bounds of one job in a workspace (the same ranges as the
/// `WorkspaceTemplate` CRD's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceLimits {
    #[serde(default = "WorkspaceLimits::default_max_file_bytes")]
    pub max_file_bytes: u64,
    #[serde(default = "WorkspaceLimits::default_max_list_entries")]
    pub max_list_entries: u32,
    #[serde(default = "WorkspaceLimits::default_max_output_bytes")]
    pub max_output_bytes: u64,
    #[serde(default = "WorkspaceLimits::default_max_iterations")]
    pub max_iterations: u32,
    #[serde(default = "WorkspaceLimits::default_wall_clock_ms")]
    pub wall_clock_ms: u64,
    /// Jobs that may run in the workspace at once, on each Edge replica
    /// (two jobs writing one tree race); the Edge's own, never sent to
    /// the node.
    #[serde(default = "WorkspaceLimits::default_max_concurrent_jobs")]
    pub max_concurrent_jobs: u32,
}

/// The one definition of the defaults (the `WorkspaceTemplate` CRD's call
/// these).
impl WorkspaceLimits {
    pub fn default_max_file_bytes() -> u64 {
        16 * 1024 * 1024
    }
    pub fn default_max_list_entries() -> u32 {
        1_000
    }
    pub fn default_max_output_bytes() -> u64 {
        1024 * 1024
    }
    pub fn default_max_iterations() -> u32 {
        32
    }
    pub fn default_wall_clock_ms() -> u64 {
        600_000
    }
    pub fn default_max_concurrent_jobs() -> u32 {
        1
    }
}

impl Default for WorkspaceLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: Self::default_max_file_bytes(),
            max_list_entries: Self::default_max_list_entries(),
            max_output_bytes: Self::default_max_output_bytes(),
            max_iterations: Self::default_max_iterations(),
            wall_clock_ms: Self::default_wall_clock_ms(),
            max_concurrent_jobs: Self::default_max_concurrent_jobs(),
        }
    }
}

/// The rule for a workspace root: absolute, at most 1024 bytes, no NUL, no
/// empty, `.` or `..` component. (Whether it exists, is a directory and lies
/// in an allowed root is the node's to check.)
pub fn check_workspace_root(root: &str) -> Result<(), &'static str> {
    if !root.starts_with('/') || root.len() < 2 || root.len() > 1024 {
        return Err("must be an absolute path of 2-1024 bytes");
    }
    if root.contains('\0') {
        return Err("must not contain NUL");
    }
    let trimmed = root.strip_suffix('/').unwrap_or(root);
    if trimmed[1..].split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err("must not contain empty, `.` or `..` components");
    }
    Ok(())
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 128
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// The principals and their key hashes (see the Edge's `auth` module).
    /// Relative to the config file's directory; reloaded with the config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_file: Option<PathBuf>,
    /// Workspace refs (exact) that callers may run jobs in when `mode` is
    /// `disabled`: anyone who reaches the listener may then write files and
    /// run the workspace's commands there. Only with `mode: disabled`; every
    /// other ref refuses anonymous jobs (`404 workspace_not_found`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anonymous_workspaces: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// Every client request needs a key of an enabled principal.
    #[default]
    Required,
    /// Anyone who reaches the listener may use every model (local development).
    Disabled,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// Client-facing HTTP API (OpenAI/Anthropic), `/healthz`, `/readyz`.
    pub http: SocketAddr,
    /// Node-facing gRPC over mTLS.
    pub grpc: SocketAddr,
    /// `/admin/*` and `/metrics`: for the operator and Prometheus only, never
    /// exposed to clients. Loopback unless set.
    #[serde(default = "ListenConfig::default_admin")]
    pub admin: SocketAddr,
    /// Names the admin listener answers to besides this machine's own
    /// (`localhost`, `127.0.0.1`, `[::1]` and the address a connection
    /// reached): its Service names in a cluster. `*.name` allows every name
    /// below `name` (a headless Service's per-replica names). A request
    /// addressed to any other name is refused (`403`) whatever the auth
    /// mode: a web page of a name that rebinds to the admin address sends
    /// its own name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin_hosts: Vec<String>,
}

impl ListenConfig {
    pub fn new(http: SocketAddr, grpc: SocketAddr, admin: SocketAddr) -> Self {
        Self { http, grpc, admin, admin_hosts: Vec::new() }
    }

    pub fn default_admin() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 8081))
    }

    /// Whether `name` (a `Host` without its port, lowercase) is one of
    /// [`Self::admin_hosts`].
    pub fn is_admin_host(&self, name: &str) -> bool {
        self.admin_hosts.iter().any(|pattern| match pattern.strip_prefix("*.") {
            Some(parent) => name.strip_suffix(parent).is_some_and(|below| below.len() > 1 && below.ends_with('.')),
            None => pattern == name,
        })
    }
}

/// A lowercase DNS name: labels of `[a-z0-9-]`, neither starting nor
/// ending with `-`, at most 253 characters.
pub fn is_lowercase_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            (1..=63).contains(&label.len())
                && edge(label.bytes().next())
                && edge(label.bytes().last())
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeTlsConfig {
    /// CA bundle that node client certificates must chain to.
    pub ca_file: PathBuf,
    /// The Edge's server certificate chain (PEM).
    pub cert_file: PathBuf,
    /// The Edge's private key (PEM).
    pub key_file: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderEntry {
    /// Unique provider id; appears in admin output and metrics.
    pub id: String,
    /// The node (by name) that runs this provider.
    pub node: String,
    pub adapter: Adapter,
    pub target: Target,
    /// Public model names clients use to reach this provider.
    pub models: Vec<PublicModel>,
    /// No progress from the provider for this long ends the run as stalled.
    /// 0 means learned per provider by its node (`iop-node`'s pace: 10000 to
    /// 300000 ms, 300000 until learned).
    #[serde(default)]
    pub response_stall_timeout_ms: u64,
    /// Nothing at all from the provider (headers included) for this long
    /// after the request was sent ends the attempt like a stall (replayed
    /// before the first byte). 0 means the default (60000 ms).
    #[serde(default)]
    pub first_byte_timeout_ms: u64,
    /// Most runs this provider executes at once; more wait in the route queue.
    #[serde(default = "ProviderEntry::default_capacity")]
    pub capacity: u32,
    /// `normalized` (default): the Edge translates every API into a run and
    /// the node's adapter speaks the provider's API. `tunnel`: requests whose
    /// API the provider serves itself (OpenAI Chat Completions and Responses
    /// against an OpenAI-compatible endpoint) are relayed byte-for-byte;
    /// other APIs are still normalized.
    #[serde(default)]
    pub mode: ProviderMode,
    /// The provider's credential (an API key for a keyed server), managed by
    /// the Edge under a profile of `credentials` and sealed per execution for
    /// the node; absent for a server that needs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialRef>,
    /// Whether a committed stream broken on any provider of the same public
    /// model may be continued here (`limits.max_continuations`): the
    /// provider continues a prefilled final assistant turn (the answer goes
    /// on from the assistant message's text instead of starting a new turn).
    /// Unset (the default): as its node detects the server (Ollama and
    /// llama.cpp's server continue; LM Studio, vLLM and unknown servers are
    /// never asked, since a server that starts a new turn would repeat the
    /// answer). `false` turns it off, `true` declares a server the node
    /// cannot detect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<bool>,
    /// The model's context window in tokens, where its node cannot read it
    /// from the server (it reads Ollama's, llama.cpp's and LM Studio's).
    /// Within a public model, a prompt longer than a provider's window (by
    /// the Edge's estimate) goes to a provider whose window fits instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// Whether the model reads images, where its node cannot read it from
    /// the server (it reads llama.cpp's `/props`, Ollama's `/api/show` and
    /// LM Studio's model type). A request with an image goes only to
    /// providers of its public model not known to refuse images, and is the
    /// client's 400 `unsupported_content` when every one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepts_images: Option<bool>,
    /// Ask the provider to keep its model resident (Ollama only: `keep_alive`
    /// on runs and a periodic zero-token touch). The node honours it only
    /// where its owner opted in (the node's config); it pins memory on
    /// someone's Mac, so the cluster alone cannot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_warm: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialRef {
    pub profile: String,
}

/// A managed provider credential: the secret lives in `file` (a mounted
/// Secret in Kubernetes), only on the Edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialProfile {
    pub profile: String,
    /// Holds the secret (surrounding whitespace ignored). Relative to the
    /// config file's directory; reloaded with the config.
    pub file: PathBuf,
    /// Raise it with every new secret: a node refuses a lease older than the
    /// newest revision it has seen for the profile.
    pub revision: u64,
    /// Refuse every execution on providers using this profile (fail closed).
    #[serde(default)]
    pub disabled: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderMode {
    #[default]
    Normalized,
    Tunnel,
}

impl ProviderEntry {
    fn default_capacity() -> u32 {
        4
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Adapter {
    Ollama,
    Openai,
}

impl From<WorkspaceOperation> for crate::pb::WorkspaceOperation {
    fn from(op: WorkspaceOperation) -> Self {
        match op {
            WorkspaceOperation::Read => Self::Read,
            WorkspaceOperation::List => Self::List,
            WorkspaceOperation::Write => Self::Write,
            WorkspaceOperation::Delete => Self::Delete,
            WorkspaceOperation::Command => Self::Command,
        }
    }
}

impl From<WorkspaceLimits> for crate::pb::WorkspaceLimits {
    fn from(l: WorkspaceLimits) -> Self {
        Self {
            max_file_bytes: l.max_file_bytes,
            max_list_entries: l.max_list_entries,
            max_output_bytes: l.max_output_bytes,
            max_iterations: l.max_iterations,
            wall_clock_ms: l.wall_clock_ms,
        }
    }
}

impl WorkspaceEntry {
    fn wire_operations(&self) -> Vec<i32> {
        self.operations.iter().map(|op| crate::pb::WorkspaceOperation::from(*op).into()).collect()
    }

    /// The catalog entry its node receives at registration (root and the
    /// whole template, command argv included).
    pub fn assignment(&self) -> crate::pb::WorkspaceAssignment {
        crate::pb::WorkspaceAssignment {
            r#ref: self.reference.clone(),
            root: self.root.clone(),
            operations: self.wire_operations(),
            commands: self
                .commands
                .iter()
                .map(|c| crate::pb::WorkspaceCommandTemplate {
                    id: c.id.clone(),
                    argv: c.argv.clone(),
                    timeout_ms: c.timeout_ms,
                    limits: Some(c.limits.into()),
                })
                .collect(),
            env_allowlist: self.env_allowlist.clone(),
            limits: Some(self.limits.into()),
            network: self.network,
        }
    }

    /// The whole template as a request's authority: names and limits only.
    pub fn authority(&self) -> crate::pb::WorkspaceAuthority {
        crate::pb::WorkspaceAuthority {
            operations: self.wire_operations(),
            command_ids: self.commands.iter().map(|c| c.id.clone()).collect(),
            env_names: self.env_allowlist.clone(),
            limits: Some(self.limits.into()),
        }
    }
}

impl From<Adapter> for AdapterKind {
    fn from(a: Adapter) -> Self {
        match a {
            Adapter::Ollama => AdapterKind::Ollama,
            Adapter::Openai => AdapterKind::Openai,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Model name as the provider knows it.
    pub model: String,
    /// Provider base URL as seen from the node.
    pub base_url: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicModel {
    pub name: String,
    /// Lower is preferred. Providers sharing the lowest priority form the first group.
    #[serde(default)]
    pub priority: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted request body.
    #[serde(default = "Limits::default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Requests that may wait per route (public model) when every provider is
    /// at capacity; beyond it clients get 429.
    #[serde(default = "Limits::default_queue_depth")]
    pub queue_depth: usize,
    /// How long a request may wait in its route queue before a 503.
    #[serde(default = "Limits::default_queue_timeout_ms")]
    pub queue_timeout_ms: u64,
    /// Attempts per request, counting the first (retries happen only before
    /// the first byte reached the client).
    #[serde(default = "Limits::default_max_attempts")]
    pub max_attempts: u32,
    /// Budget of one request from arrival to its last byte, across attempts.
    #[serde(default = "Limits::default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Largest answer the Edge holds in memory for one request: a
    /// non-streaming answer, or what a Responses stream repeats in its final
    /// event. Past it the client gets `response_too_large`.
    #[serde(default = "Limits::default_max_response_bytes")]
    pub max_response_bytes: usize,
    /// Client HTTP connections open at once. Past it a new connection takes
    /// the slot of the connection idle the longest (closed), or waits while
    /// every connection is answering a request.
    #[serde(default = "Limits::default_max_http_connections")]
    pub max_http_connections: usize,
    /// Connections one source (an IPv4 address, an IPv6 /64) may hold at
    /// once; past it a new one is closed. Behind a load balancer or Ingress
    /// every connection comes from its few addresses: raise it there.
    #[serde(default = "Limits::default_max_http_connections_per_source")]
    pub max_http_connections_per_source: usize,
    /// A connection must send its first bytes, and each request's headers,
    /// within this long.
    #[serde(default = "Limits::default_http_header_timeout_ms")]
    pub http_header_timeout_ms: u64,
    /// A connection answering nothing (between keep-alive requests, or
    /// HTTP/2 without an open stream, PINGs or not) is closed after this
    /// long; each chunk of a request body must arrive within it too.
    #[serde(default = "Limits::default_http_idle_timeout_ms")]
    pub http_idle_timeout_ms: u64,
    /// A request body must arrive at this many bytes per second on average
    /// once `http_idle_timeout_ms` has passed (a body trickled a byte at a
    /// time is cut with `408`); 0: no minimum.
    #[serde(default = "Limits::default_min_body_bytes_per_s")]
    pub min_body_bytes_per_s: u64,
    /// Request body bytes the Edge holds at once, across requests being
    /// read or answered; a body that does not fit is refused with `503`.
    #[serde(default = "Limits::default_max_body_bytes_in_flight")]
    pub max_body_bytes_in_flight: usize,
    /// A streaming request that has not committed (no content yet) after
    /// this long gets its response head and then keepalives in its API's
    /// form at this interval; 0 disables.
    #[serde(default = "Limits::default_stream_keepalive_ms")]
    pub stream_keepalive_ms: u64,
    /// Jobs one principal may run at once on this replica, unless its keys
    /// file entry sets `max_concurrent_jobs` (anonymous callers count as
    /// one principal).
    #[serde(default = "Limits::default_max_jobs_per_principal")]
    pub max_jobs_per_principal: u32,
    /// Continuations per streaming request: how often a committed stream
    /// that broke after text is continued on a provider with
    /// continuation (0: never).
    #[serde(default = "Limits::default_max_continuations")]
    pub max_continuations: u32,
}

impl Limits {
    fn default_max_body_bytes() -> usize {
        4 * 1024 * 1024
    }
    fn default_queue_depth() -> usize {
        64
    }
    fn default_queue_timeout_ms() -> u64 {
        30_000
    }
    fn default_max_attempts() -> u32 {
        3
    }
    fn default_request_timeout_ms() -> u64 {
        600_000
    }
    fn default_max_response_bytes() -> usize {
        16 * 1024 * 1024
    }
    fn default_max_http_connections() -> usize {
        4096
    }
    fn default_max_http_connections_per_source() -> usize {
        1024
    }
    fn default_http_header_timeout_ms() -> u64 {
        10_000
    }
    fn default_http_idle_timeout_ms() -> u64 {
        30_000
    }
    fn default_min_body_bytes_per_s() -> u64 {
        1024
    }
    fn default_max_body_bytes_in_flight() -> usize {
        256 * 1024 * 1024
    }
    fn default_stream_keepalive_ms() -> u64 {
        10_000
    }
    fn default_max_jobs_per_principal() -> u32 {
        4
    }
    /// One continuation covers the provider that broke; a second covers
    /// the continuing provider breaking too (the same outage often reaches
    /// both). Each one sends the whole prompt plus the answer so far again,
    /// so a stream that broke three times is told so rather than retried
    /// on.
    fn default_max_continuations() -> u32 {
        2
    }
}

impl Limits {
    /// Checks every bound; the error names the offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
        if !(1024..=crate::wire::MAX_REQUEST_BODY_BYTES).contains(&l.max_body_bytes) {
            return Err(invalid("limits.max_body_bytes", "must be between 1024 and 67108864 (64 MiB)"));
        }
        if l.queue_depth > 100_000 {
            return Err(invalid("limits.queue_depth", "must be at most 100000"));
        }
        if !(1..=10).contains(&l.max_attempts) {
            return Err(invalid("limits.max_attempts", "must be between 1 and 10"));
        }
        if l.queue_timeout_ms == 0 || l.request_timeout_ms < 1_000 {
            return Err(invalid("limits", "queue_timeout_ms must be > 0 and request_timeout_ms at least 1000"));
        }
        if !(1024..=1024 * 1024 * 1024).contains(&l.max_response_bytes) {
            return Err(invalid("limits.max_response_bytes", "must be between 1024 and 1073741824"));
        }
        if !(1..=1_000_000).contains(&l.max_http_connections) {
            return Err(invalid("limits.max_http_connections", "must be between 1 and 1000000"));
        }
        if !(100..=3_600_000).contains(&l.http_idle_timeout_ms) {
            return Err(invalid("limits.http_idle_timeout_ms", "must be between 100 and 3600000"));
        }
        if !(1..=1_000_000).contains(&l.max_http_connections_per_source) {
            return Err(invalid("limits.max_http_connections_per_source", "must be between 1 and 1000000"));
        }
        if !(100..=3_600_000).contains(&l.http_header_timeout_ms) {
            return Err(invalid("limits.http_header_timeout_ms", "must be between 100 and 3600000"));
        }
        if l.min_body_bytes_per_s > 1_000_000_000 {
            return Err(invalid("limits.min_body_bytes_per_s", "must be between 0 and 1000000000"));
        }
        if l.max_body_bytes_in_flight < l.max_body_bytes || l.max_body_bytes_in_flight > 64 << 30 {
            return Err(invalid(
                "limits.max_body_bytes_in_flight",
                "must be at least limits.max_body_bytes and at most 64 GiB",
            ));
        }
        if l.stream_keepalive_ms != 0 && !(100..=3_600_000).contains(&l.stream_keepalive_ms) {
            return Err(invalid("limits.stream_keepalive_ms", "must be 0 (off) or between 100 and 3600000"));
        }
        if !(1..=1_000).contains(&l.max_jobs_per_principal) {
            return Err(invalid("limits.max_jobs_per_principal", "must be between 1 and 1000"));
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: Self::default_max_body_bytes(),
            queue_depth: Self::default_queue_depth(),
            queue_timeout_ms: Self::default_queue_timeout_ms(),
            max_attempts: Self::default_max_attempts(),
            request_timeout_ms: Self::default_request_timeout_ms(),
            max_response_bytes: Self::default_max_response_bytes(),
            max_http_connections: Self::default_max_http_connections(),
            max_http_connections_per_source: Self::default_max_http_connections_per_source(),
            http_header_timeout_ms: Self::default_http_header_timeout_ms(),
            http_idle_timeout_ms: Self::default_http_idle_timeout_ms(),
            min_body_bytes_per_s: Self::default_min_body_bytes_per_s(),
            max_body_bytes_in_flight: Self::default_max_body_bytes_in_flight(),
            stream_keepalive_ms: Self::default_stream_keepalive_ms(),
            max_jobs_per_principal: Self::default_max_jobs_per_principal(),
            max_continuations: Self::default_max_continuations(),
        }
    }
}

/// The retry discipline before the commit point. Before a request drops
/// from the failed provider's priority group to a lower one, the failed
/// provider is retried once when its `Retry-After` (429/503) or, for a 5xx
/// or an unreachable provider, a short backoff fits
/// `same_provider_max_wait_ms` and the request's deadline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Longest wait for the same-provider retry; 0 turns it off (the request
    /// drops to the lower group at once, as before).
    #[serde(default = "RetryConfig::default_same_provider_max_wait_ms")]
    pub same_provider_max_wait_ms: u64,
    /// Per public model (route) overrides, keyed like `context_fallbacks`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub routes: BTreeMap<String, RouteRetry>,
}

/// A route's override of [`RetryConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRetry {
    pub same_provider_max_wait_ms: u64,
}

impl RetryConfig {
    /// Longest `same_provider_max_wait_ms` (one minute): a longer wait is a
    /// queue, not a retry.
    pub const MAX_SAME_PROVIDER_WAIT_MS: u64 = 60_000;

    fn default_same_provider_max_wait_ms() -> u64 {
        3_000
    }

    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The same-provider wait bound for `route` (its override, else the global one).
    pub fn same_provider_max_wait(&self, route: &str) -> std::time::Duration {
        let ms = self.routes.get(route).map_or(self.same_provider_max_wait_ms, |r| r.same_provider_max_wait_ms);
        std::time::Duration::from_millis(ms)
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self { same_provider_max_wait_ms: Self::default_same_provider_max_wait_ms(), routes: BTreeMap::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("config is not valid YAML for this schema: {0}")]
    Parse(String),
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

/// The rule for a name the config gives something: a provider id, a
/// credential profile, a workspace ref or command id, and (in the Edge's
/// keys file) a principal: 1-63 of `[A-Za-z0-9-_.]`, so it is also safe as
/// a file name and a metric label value.
/// A replica id: a host or pod name, 1-253 of `[A-Za-z0-9-_.]`.
pub fn is_replica_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 253 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

pub fn is_config_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 63 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), reason: reason.into() }
}

/// Longest accepted provider base URL and target model name.
pub const MAX_BASE_URL_LEN: usize = 2048;
pub const MAX_TARGET_MODEL_LEN: usize = 256;

fn is_control(c: char) -> bool {
    c.is_control()
}

/// The rule for a provider base URL, shared by the Edge config, the
/// operator's validation and (as a pattern) the `Provider` CRD schema:
/// `http(s)://host[:port][/path]`, where `host` is a DNS name (labels of
/// letters, digits, `-` and `_`, starting and ending with a letter or digit,
/// joined by `.`, the last one not all digits), an IPv4 address (four
/// decimal numbers 0-255 without leading zeros: a host whose last label is
/// all digits is read as one, so `999.999.999.999` or `2130706433` is
/// refused, never resolved) or a bracketed IPv6 address, `port` is
/// 1-65535 without leading zeros, and the path has no whitespace or control
/// characters. No credentials, query or fragment; at most
/// [`MAX_BASE_URL_LEN`] characters. The base URL is the server's root (or
/// the prefix it serves its API under): the node appends `/api/...` or
/// `/v1/...` itself.
///
/// The error is the reason, for a message that names the field.
pub fn check_base_url(url: &str) -> Result<(), &'static str> {
    if url.chars().count() > MAX_BASE_URL_LEN {
        return Err("must be at most 2048 characters");
    }
    if url.chars().any(|c| c.is_whitespace() || is_control(c)) {
        return Err("must not contain whitespace or control characters");
    }
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return Err("must be an http:// or https:// URL");
    };
    if rest.contains(['?', '#']) {
        return Err("must not have a query or fragment");
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err("must not carry credentials");
    }
    let port = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (ip, after) = bracketed.split_once(']').ok_or("has an unclosed IPv6 address")?;
            if ip.parse::<std::net::Ipv6Addr>().is_err() {
                return Err("has an invalid IPv6 address");
            }
            match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or("has characters after the IPv6 address")?),
            }
        }
        None => {
            let (host, port) = match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            if host.is_empty() {
                return Err("must name a host");
            }
            let label_ok = |l: &str| {
                let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
                edge(l.bytes().next())
                    && edge(l.bytes().last())
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            };
            if !host.split('.').all(label_ok) {
                return Err("has an invalid host name");
            }
            // A last label of digits only makes it an IPv4 literal (URL
            // parsers read it as one), which must then be a valid one.
            let last = host.rsplit('.').next().unwrap_or_default();
            if last.bytes().all(|b| b.is_ascii_digit()) && host.parse::<std::net::Ipv4Addr>().is_err() {
                return Err("has an invalid IPv4 address");
            }
            port
        }
    };
    if let Some(port) = port {
        let digits = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
        if !digits || port.starts_with('0') || !port.parse::<u32>().is_ok_and(|p| p <= 65_535) {
            return Err("port must be between 1 and 65535");
        }
    }
    Ok(())
}

/// The rule for a target model name (Edge config, operator, CRD schema):
/// 1-[`MAX_TARGET_MODEL_LEN`] characters, no control characters, not
/// starting or ending with whitespace. The error is the reason.
pub fn check_target_model(model: &str) -> Result<(), &'static str> {
    if model.is_empty() || model.chars().count() > MAX_TARGET_MODEL_LEN {
        return Err("must be 1-256 characters");
    }
    if model.chars().any(is_control) {
        return Err("must not contain control characters");
    }
    if model.starts_with(char::is_whitespace) || model.ends_with(char::is_whitespace) {
        return Err("must not start or end with whitespace");
    }
    Ok(())
}

impl EdgeConfig {
    /// Parses and validates a YAML document.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let config: EdgeConfig = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).expect("the edge config always serializes")
    }

    /// Checks every cross-field rule; the error names the offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (i, host) in self.listen.admin_hosts.iter().enumerate() {
            if !is_lowercase_dns_name(host.strip_prefix("*.").unwrap_or(host)) {
                return Err(invalid(
                    format!("listen.admin_hosts[{i}]"),
                    "must be a lowercase DNS name, or `*.` and one (no port)",
                ));
            }
        }
        if identity::validate_trust_domain(&self.trust_domain).is_err() {
            return Err(invalid("trust_domain", "must be a non-empty lowercase DNS-like name"));
        }
        let mut nodes = BTreeSet::new();
        for (i, node) in self.nodes.iter().enumerate() {
            identity::validate_name(&node.name).map_err(|e| invalid(format!("nodes[{i}].name"), e.to_string()))?;
            if !nodes.insert(node.name.as_str()) {
                return Err(invalid(format!("nodes[{i}].name"), format!("duplicate node `{}`", node.name)));
            }
        }
        let mut profiles = BTreeSet::new();
        for (i, c) in self.credentials.iter().enumerate() {
            let at = |f: &str| format!("credentials[{i}].{f}");
            if !is_config_name(&c.profile) {
                return Err(invalid(at("profile"), "must be 1-63 of [A-Za-z0-9-_.]"));
            }
            if !profiles.insert(c.profile.as_str()) {
                return Err(invalid(at("profile"), format!("duplicate profile `{}`", c.profile)));
            }
            if c.revision == 0 {
                return Err(invalid(at("revision"), "must be at least 1"));
            }
        }
        let mut ids = BTreeSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            let at = |f: &str| format!("providers[{i}].{f}");
            if !is_config_name(&p.id) {
                return Err(invalid(at("id"), "must be 1-63 of [A-Za-z0-9-_.]"));
            }
            if !ids.insert(p.id.as_str()) {
                return Err(invalid(at("id"), format!("duplicate provider id `{}`", p.id)));
            }
            if !nodes.contains(p.node.as_str()) {
                return Err(invalid(at("node"), format!("node `{}` is not listed under nodes", p.node)));
            }
            check_target_model(&p.target.model).map_err(|reason| invalid(at("target.model"), reason))?;
            check_base_url(&p.target.base_url).map_err(|reason| invalid(at("target.base_url"), reason))?;
            if p.models.is_empty() {
                return Err(invalid(at("models"), "must name at least one public model"));
            }
            for (j, m) in p.models.iter().enumerate() {
                if m.name.is_empty() || m.name.len() > 256 || m.name.chars().any(char::is_whitespace) {
                    return Err(invalid(
                        format!("providers[{i}].models[{j}].name"),
                        "must be 1-256 non-whitespace characters",
                    ));
                }
            }
            if crate::liveness::response_stall_timeout(p.response_stall_timeout_ms).is_err() {
                return Err(invalid(
                    at("response_stall_timeout_ms"),
                    "must be 0 (default) or between 1000 and 3600000",
                ));
            }
            if crate::liveness::first_byte_timeout(p.first_byte_timeout_ms).is_err() {
                return Err(invalid(at("first_byte_timeout_ms"), "must be 0 (default) or between 1000 and 3600000"));
            }
            if let Some(credential) = &p.credential
                && !profiles.contains(credential.profile.as_str())
            {
                return Err(invalid(
                    at("credential.profile"),
                    format!("profile `{}` is not listed under credentials", credential.profile),
                ));
            }
            if !(1..=1024).contains(&p.capacity) {
                return Err(invalid(at("capacity"), "must be between 1 and 1024"));
            }
            if p.keep_warm && p.adapter != Adapter::Ollama {
                return Err(invalid(at("keep_warm"), "is only for the ollama adapter (Ollama's keep_alive)"));
            }
        }
        if self.auth.mode == AuthMode::Required && self.auth.keys_file.is_none() {
            return Err(invalid(
                "auth.keys_file",
                "required when auth.mode is `required` (the default); set `auth: { mode: disabled }` to serve without keys",
            ));
        }
        self.validate_workspaces(&nodes)?;
        self.validate_anonymous_workspaces()?;
        let models = self.model_index();
        for (from, to) in &self.context_fallbacks {
            let at = format!("context_fallbacks.{from}");
            if !models.contains_key(from.as_str()) {
                return Err(invalid(at, "is not a public model of any provider"));
            }
            if !models.contains_key(to.as_str()) {
                return Err(invalid(at, format!("falls back to `{to}`, which is not a public model of any provider")));
            }
            if from == to {
                return Err(invalid(at, "cannot fall back to itself"));
            }
        }
        let too_long =
            format!("must be at most {} (0 turns the same-provider retry off)", RetryConfig::MAX_SAME_PROVIDER_WAIT_MS);
        if self.retry.same_provider_max_wait_ms > RetryConfig::MAX_SAME_PROVIDER_WAIT_MS {
            return Err(invalid("retry.same_provider_max_wait_ms", too_long));
        }
        for (route, r) in &self.retry.routes {
            let at = format!("retry.routes.{route}");
            if !models.contains_key(route.as_str()) {
                return Err(invalid(at, "is not a public model of any provider"));
            }
            if r.same_provider_max_wait_ms > RetryConfig::MAX_SAME_PROVIDER_WAIT_MS {
                return Err(invalid(format!("{at}.same_provider_max_wait_ms"), too_long));
            }
        }
        let mut replicas = BTreeSet::new();
        for (i, id) in self.replicas.iter().enumerate() {
            if !is_replica_id(id) {
                return Err(invalid(format!("replicas[{i}]"), "must be 1-253 of [A-Za-z0-9-_.]"));
            }
            if !replicas.insert(id.as_str()) {
                return Err(invalid(format!("replicas[{i}]"), format!("duplicate replica `{id}`")));
            }
        }
        self.limits.validate()?;
        self.outlier.validate()?;
        self.scheduling.validate()?;
        self.telemetry.validate()?;
        Ok(())
    }

    fn validate_workspaces(&self, nodes: &BTreeSet<&str>) -> Result<(), ConfigError> {
        let mut refs = BTreeSet::new();
        for (i, w) in self.workspaces.iter().enumerate() {
            let at = |f: &str| format!("workspaces[{i}].{f}");
            if !is_config_name(&w.reference) {
                return Err(invalid(at("ref"), "must be 1-63 of [A-Za-z0-9-_.]"));
            }
            if !refs.insert(w.reference.as_str()) {
                return Err(invalid(at("ref"), format!("duplicate workspace `{}`", w.reference)));
            }
            if !nodes.contains(w.node.as_str()) {
                return Err(invalid(at("node"), format!("node `{}` is not listed under nodes", w.node)));
            }
            check_workspace_root(&w.root).map_err(|reason| invalid(at("root"), reason))?;
            let operations: BTreeSet<_> = w.operations.iter().collect();
            if operations.is_empty() || operations.len() != w.operations.len() {
                return Err(invalid(at("operations"), "must list at least one operation, each once"));
            }
            let mut ids = BTreeSet::new();
            for (j, c) in w.commands.iter().enumerate() {
                let at = |f: &str| format!("workspaces[{i}].commands[{j}].{f}");
                if !is_config_name(&c.id) {
                    return Err(invalid(at("id"), "must be 1-63 of [A-Za-z0-9-_.]"));
                }
                if !ids.insert(c.id.as_str()) {
                    return Err(invalid(at("id"), format!("duplicate command `{}`", c.id)));
                }
                if c.argv.is_empty() || c.argv.len() > 64 || c.argv.iter().any(|a| a.is_empty() || a.contains('\0')) {
                    return Err(invalid(at("argv"), "must have 1-64 non-empty arguments without NUL"));
                }
                if !(1_000..=3_600_000).contains(&c.timeout_ms) {
                    return Err(invalid(at("timeout_ms"), "must be between 1000 and 3600000"));
                }
                for (field, value, min, max) in c.limits.ranges() {
                    if !(min..=max).contains(&value) {
                        return Err(invalid(
                            at(&format!("limits.{field}")),
                            format!("must be between {min} and {max}"),
                        ));
                    }
                }
            }
            if !w.commands.is_empty() && !operations.contains(&WorkspaceOperation::Command) {
                return Err(invalid(at("commands"), "commands need the `command` operation"));
            }
            if let Some(j) = w.env_allowlist.iter().position(|n| !is_env_name(n)) {
                return Err(invalid(
                    format!("workspaces[{i}].env_allowlist[{j}]"),
                    "must be an environment variable name",
                ));
            }
            let l = &w.limits;
            let ranges = [
                ("max_file_bytes", l.max_file_bytes, 1, 1 << 30),
                ("max_list_entries", u64::from(l.max_list_entries), 1, 100_000),
                ("max_output_bytes", l.max_output_bytes, 1, 64 << 20),
                ("max_iterations", u64::from(l.max_iterations), 1, 1_000),
                ("wall_clock_ms", l.wall_clock_ms, 1_000, 86_400_000),
                ("max_concurrent_jobs", u64::from(l.max_concurrent_jobs), 1, 1_000),
            ];
            for (field, value, min, max) in ranges {
                if !(min..=max).contains(&value) {
                    return Err(invalid(at(&format!("limits.{field}")), format!("must be between {min} and {max}")));
                }
            }
            let stages = &w.stages;
            if stages.max_repairs > 10 {
                return Err(invalid(at("stages.max_repairs"), "must be between 0 and 10"));
            }
            if !(1_000..=86_400_000).contains(&stages.stage_timeout_ms) {
                return Err(invalid(at("stages.stage_timeout_ms"), "must be between 1000 and 86400000"));
            }
            for (name, prompt) in stages.prompts.all() {
                if prompt.as_ref().is_some_and(|p| p.trim().is_empty() || p.len() > MAX_STAGE_PROMPT_BYTES) {
                    let message = format!("must be non-empty and at most {MAX_STAGE_PROMPT_BYTES} bytes");
                    return Err(invalid(at(&format!("stages.prompts.{name}")), message));
                }
            }
        }
        Ok(())
    }

    /// `auth.anonymous_workspaces`: only with auth disabled, each a
    /// configured workspace ref, each once.
    fn validate_anonymous_workspaces(&self) -> Result<(), ConfigError> {
        let open = &self.auth.anonymous_workspaces;
        if !open.is_empty() && self.auth.mode != AuthMode::Disabled {
            return Err(invalid(
                "auth.anonymous_workspaces",
                "only with auth.mode `disabled` (with keys, the principals' `workspaces` decide)",
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, reference) in open.iter().enumerate() {
            let at = format!("auth.anonymous_workspaces[{i}]");
            if !self.workspaces.iter().any(|w| &w.reference == reference) {
                return Err(invalid(at, format!("`{reference}` is not a configured workspace ref")));
            }
            if !seen.insert(reference.as_str()) {
                return Err(invalid(at, format!("duplicate workspace `{reference}`")));
            }
        }
        Ok(())
    }

    /// Public model name -> providers serving it, each with its priority.
    pub fn model_index(&self) -> BTreeMap<&str, Vec<(u32, &ProviderEntry)>> {
        let mut index: BTreeMap<&str, Vec<(u32, &ProviderEntry)>> = BTreeMap::new();
        for p in &self.providers {
            for m in &p.models {
                index.entry(m.name.as_str()).or_default().push((m.priority, p));
            }
        }
        index
    }
}

#[cfg(test)]
mod tests;

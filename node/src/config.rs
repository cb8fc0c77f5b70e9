//! The node config file (`iop-node --config FILE`): where the Edge is and
//! which certificate proves who this node is. Which providers to run comes
//! from the Edge at registration, not from here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub edge: EdgeEndpoint,
    pub tls: NodeTlsConfig,
    #[serde(default)]
    pub reconnect: ReconnectConfig,
    /// Serve Prometheus metrics; off when absent.
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
    /// How often providers are probed again (see `crate::health`).
    #[serde(default)]
    pub health: HealthConfig,
    /// The Mac owner's consent for workspaces (see `crate::workspace`).
    #[serde(default)]
    pub workspaces: WorkspacesConfig,
    /// Images a client gives by URL (see `crate::adapter::images`).
    #[serde(default)]
    pub images: ImagesConfig,
    /// What the node may ask of its model servers (see `crate::keep_warm`).
    #[serde(default)]
    pub models: ModelsConfig,
    /// OpenTelemetry traces (off unless `telemetry.otlp_endpoint` is set).
    #[serde(default)]
    pub telemetry: iop_proto::config::TelemetryConfig,
    /// The file this config was loaded from (no sandboxed command reads it).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// Whether this node may fetch an image a client gave by URL for a
/// provider that takes only image data (Ollama). Off by default: the node
/// would make requests from the owner's network on a client's behalf.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesConfig {
    #[serde(default)]
    pub fetch_urls: bool,
}

/// Whether this node honours a provider's `keep_warm` (Ollama only): its
/// runs then ask Ollama to keep the model loaded for a while and the node
/// touches the model periodically, so it holds the Mac's memory while the
/// node runs. Off by default: the memory is the owner's to give.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    #[serde(default)]
    pub allow_keep_warm: bool,
}

/// The owner's consent for workspaces (docs/workspaces.md, docs/security.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspacesConfig {
    /// Directories under which the Edge may declare workspaces on this
    /// node. Empty (the default): no workspace is accepted.
    #[serde(default)]
    pub allowed_roots: Vec<std::path::PathBuf>,
    /// Run workspace commands even where this machine has no OS sandbox
    /// (Landlock, Seatbelt). Off by default: such commands are refused.
    #[serde(default)]
    pub unsandboxed_commands: bool,
    /// Paths a sandboxed command may read (and execute) besides the
    /// workspace and the system directories, e.g. `~/.cargo`, `~/.rustup`.
    #[serde(default)]
    pub command_read_paths: Vec<std::path::PathBuf>,
    /// The user commands run as when the node runs as root (default
    /// `nobody`); never root. Ignored when the node is not root: commands
    /// then run as the node's own user. The workspace roots must be
    /// writable by this user (docs/security.md "A node run as root").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_user: Option<String>,
}

/// The provider health monitor's timing (see `crate::health`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// Probe interval of a provider that is available (default 60 s).
    #[serde(default = "HealthConfig::default_idle")]
    pub idle_interval_ms: u64,
    /// First re-probe of a provider that is not available (default 1 s) ...
    #[serde(default = "HealthConfig::default_retry_initial")]
    pub retry_initial_ms: u64,
    /// ... doubling up to this (default 30 s).
    #[serde(default = "HealthConfig::default_retry_max")]
    pub retry_max_ms: u64,
}

impl HealthConfig {
    fn default_idle() -> u64 {
        60_000
    }
    fn default_retry_initial() -> u64 {
        1_000
    }
    fn default_retry_max() -> u64 {
        30_000
    }
    pub fn idle_interval(&self) -> Duration {
        Duration::from_millis(self.idle_interval_ms)
    }
    pub fn retry_initial(&self) -> Duration {
        Duration::from_millis(self.retry_initial_ms)
    }
    pub fn retry_max(&self) -> Duration {
        Duration::from_millis(self.retry_max_ms)
    }
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            idle_interval_ms: Self::default_idle(),
            retry_initial_ms: Self::default_retry_initial(),
            retry_max_ms: Self::default_retry_max(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of `GET /metrics`, e.g. `127.0.0.1:9464`.
    pub listen: std::net::SocketAddr,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeEndpoint {
    /// The Edge's node-facing gRPC endpoint, e.g. `https://iop.example.com:7443`.
    pub url: String,
    /// Name the Edge's server certificate must carry; defaults to the URL's host.
    #[serde(default)]
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeTlsConfig {
    /// CA that signed the Edge's server certificate.
    pub ca_file: PathBuf,
    /// This node's client certificate (URI SAN spiffe://<trust-domain>/node/<name>).
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconnectConfig {
    /// First retry delay after a lost or refused connection; also the
    /// pause after a dial that reached a replica held already
    /// (`crate::transport::backoff::Redial`).
    #[serde(default = "ReconnectConfig::default_initial")]
    pub initial_backoff_ms: u64,
    /// Cap of the exponential backoff (and of the pause after duplicates).
    #[serde(default = "ReconnectConfig::default_max")]
    pub max_backoff_ms: u64,
}

impl ReconnectConfig {
    fn default_initial() -> u64 {
        500
    }
    fn default_max() -> u64 {
        30_000
    }
    pub fn initial(&self) -> Duration {
        Duration::from_millis(self.initial_backoff_ms)
    }
    pub fn max(&self) -> Duration {
        Duration::from_millis(self.max_backoff_ms)
    }
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        Self { initial_backoff_ms: Self::default_initial(), max_backoff_ms: Self::default_max() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path}: {reason}")]
    Parse { path: String, reason: String },
    #[error("config file {path}: {field}: {reason}")]
    Invalid { path: String, field: &'static str, reason: String },
}

impl NodeConfig {
    /// Reads, parses and validates `path`; relative TLS paths are resolved
    /// against the file's directory.
    pub fn load(path: &Path) -> Result<Self, NodeConfigError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| NodeConfigError::Read { path: shown.clone(), source })?;
        let mut config = Self::from_yaml(&text).map_err(|e| match e {
            NodeConfigError::Parse { reason, .. } => NodeConfigError::Parse { path: shown.clone(), reason },
            NodeConfigError::Invalid { field, reason, .. } => {
                NodeConfigError::Invalid { path: shown.clone(), field, reason }
            }
            other => other,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let files = [&mut config.tls.ca_file, &mut config.tls.cert_file, &mut config.tls.key_file];
        for file in files.into_iter().chain(config.workspaces.command_read_paths.iter_mut()) {
            if file.is_relative() {
                *file = base.join(&*file);
            }
        }
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    pub fn from_yaml(text: &str) -> Result<Self, NodeConfigError> {
        let config: NodeConfig = serde_saphyr::from_str(text)
            .map_err(|e| NodeConfigError::Parse { path: String::new(), reason: e.to_string() })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), NodeConfigError> {
        let invalid =
            |field, reason: &str| NodeConfigError::Invalid { path: String::new(), field, reason: reason.into() };
        if self.server_name().is_none() {
            return Err(invalid("edge.url", "must be https://HOST[:PORT]"));
        }
        if let Err(iop_proto::config::ConfigError::Invalid { reason, .. }) = self.telemetry.validate() {
            return Err(invalid("telemetry.otlp_endpoint", &reason));
        }
        if self.reconnect.initial_backoff_ms == 0 {
            return Err(invalid("reconnect.initial_backoff_ms", "must be greater than 0"));
        }
        if self.reconnect.max_backoff_ms < self.reconnect.initial_backoff_ms {
            return Err(invalid("reconnect.max_backoff_ms", "must be at least initial_backoff_ms"));
        }
        // Probes are metadata calls; faster than 10 ms would only load the provider.
        let health = &self.health;
        if !(10..=3_600_000).contains(&health.idle_interval_ms) {
            return Err(invalid("health.idle_interval_ms", "must be between 10 and 3600000"));
        }
        if !(10..=3_600_000).contains(&health.retry_initial_ms) {
            return Err(invalid("health.retry_initial_ms", "must be between 10 and 3600000"));
        }
        if !(health.retry_initial_ms..=3_600_000).contains(&health.retry_max_ms) {
            return Err(invalid("health.retry_max_ms", "must be between retry_initial_ms and 3600000"));
        }
        Ok(())
    }

    /// The host and port the node dials: the URL's, 443 when it names no
    /// port, read with the URI parser the dialer's `Endpoint` uses.
    pub fn edge_host_port(&self) -> Option<(String, u16)> {
        let uri: tonic::transport::Uri = self.edge.url.parse().ok()?;
        let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
        (!host.is_empty()).then(|| (host.to_string(), uri.port_u16().unwrap_or(443)))
    }

    /// The TLS server name to verify: explicit, or the URL's host.
    pub fn server_name(&self) -> Option<String> {
        if let Some(name) = &self.edge.server_name {
            return Some(name.clone());
        }
        let rest = self.edge.url.strip_prefix("https://")?;
        let authority = rest.split('/').next()?;
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next()?,
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        (!host.is_empty()).then(|| host.to_string())
    }
}

#[cfg(test)]
mod tests;

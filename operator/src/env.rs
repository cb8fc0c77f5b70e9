//! `iop-operator run` takes its settings from the environment the chart sets
//! (`charts/iop/templates/operator-deployment.yaml`). Parsing is pure: the
//! variables come from a lookup function, so tests need no process
//! environment. Every error names its variable.

use std::net::SocketAddr;

use iop_proto::config::{
    AuthConfig, AuthMode, HostedTools, Limits, ListenConfig, OutlierConfig, SchedulingConfig, TelemetryConfig,
};

use crate::reconcile::Settings;

pub const NAMESPACE: &str = "IOP_NAMESPACE";
pub const POD_NAME: &str = "IOP_POD_NAME";
/// Label selector of the Edge pods (`KEY=VALUE[,KEY=VALUE...]`): the
/// replicas rendered into the Edge config and polled for status.
pub const EDGE_POD_SELECTOR: &str = "IOP_EDGE_POD_SELECTOR";
pub const EDGE_SERVER_NAMES: &str = "IOP_EDGE_SERVER_NAMES";
pub const TRUST_DOMAIN: &str = "IOP_TRUST_DOMAIN";
/// Optional: the name of the operator's ClusterRole and ClusterRoleBinding
/// (the chart gives both the same name). Set, the operator makes its
/// namespace their owner, so deleting the namespace removes them too.
pub const CLUSTER_RBAC_NAME: &str = "IOP_CLUSTER_RBAC_NAME";
/// Optional: where `/metrics`, `/healthz` and `/readyz` are served.
pub const METRICS_ADDR: &str = "IOP_METRICS_ADDR";
pub const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9464";

/// The Edge's listen addresses inside its pod: fixed by the chart
/// (`edge-deployment.yaml` container ports `http` and `grpc`).
pub const EDGE_HTTP_LISTEN: &str = "0.0.0.0:8080";
pub const EDGE_GRPC_LISTEN: &str = "0.0.0.0:7443";
/// The admin listener: reachable in the cluster, limited by the chart's
/// NetworkPolicy to the operator (and the metrics scraper). The operator
/// reads each replica's admin API at `<pod IP>:<this port>`.
pub const EDGE_ADMIN_LISTEN: &str = "0.0.0.0:8081";
/// Optional: the names the Edge's admin listener answers to besides its
/// own address (`listen.admin_hosts`), comma-separated: the chart's admin
/// Services. A lowercase DNS name each, or `*.` and one.
pub const EDGE_ADMIN_HOSTS: &str = "IOP_EDGE_ADMIN_HOSTS";
/// Sets one field of the Edge's `limits`.
pub type SetLimit = fn(&mut Limits, u64);

/// Optional: the Edge's bounds on client connections and request bodies
/// (`limits.*`), each unset one the Edge's default: the chart's
/// `edge.limits`.
pub const EDGE_HTTP_LIMITS: [(&str, SetLimit); 6] = [
    ("IOP_EDGE_MAX_HTTP_CONNECTIONS", |l, n| l.max_http_connections = n as usize),
    ("IOP_EDGE_MAX_HTTP_CONNECTIONS_PER_SOURCE", |l, n| l.max_http_connections_per_source = n as usize),
    ("IOP_EDGE_HTTP_HEADER_TIMEOUT_MS", |l, n| l.http_header_timeout_ms = n),
    ("IOP_EDGE_HTTP_IDLE_TIMEOUT_MS", |l, n| l.http_idle_timeout_ms = n),
    ("IOP_EDGE_MIN_BODY_BYTES_PER_S", |l, n| l.min_body_bytes_per_s = n),
    ("IOP_EDGE_MAX_BODY_BYTES_IN_FLIGHT", |l, n| l.max_body_bytes_in_flight = n as usize),
];
/// Optional: `required` (default) or `disabled` (no client API keys).
pub const EDGE_AUTH_MODE: &str = "IOP_EDGE_AUTH_MODE";
/// Optional: `drop` (default) or `refuse`, the Edge's `api.hosted_tools`.
pub const EDGE_HOSTED_TOOLS: &str = "IOP_EDGE_HOSTED_TOOLS";
/// Optional: the Edge's `outlier` (passive outlier ejection), each unset
/// one the Edge's default: generation failures in a row (0 turns ejection
/// off), the first ejection's length and the longest one.
pub const EDGE_OUTLIER_CONSECUTIVE_FAILURES: &str = "IOP_EDGE_OUTLIER_CONSECUTIVE_FAILURES";
pub const EDGE_OUTLIER_BASE_EJECTION_MS: &str = "IOP_EDGE_OUTLIER_BASE_EJECTION_MS";
pub const EDGE_OUTLIER_MAX_EJECTION_MS: &str = "IOP_EDGE_OUTLIER_MAX_EJECTION_MS";
/// Optional: the Edge's `scheduling.load_penalty` (0-10000; unset: the
/// Edge's default, 4): the extra requests in flight a provider whose model
/// is not loaded is charged in selection; 0 ignores residency.
pub const EDGE_SCHEDULING_LOAD_PENALTY: &str = "IOP_EDGE_SCHEDULING_LOAD_PENALTY";
/// Optional: the Edge's `telemetry.otlp_endpoint`, the OTLP/HTTP collector
/// its spans go to (unset or empty: traces off).
pub const EDGE_OTLP_ENDPOINT: &str = "IOP_EDGE_OTLP_ENDPOINT";
/// Tests only (the chart never sets it): the operator's clock runs this many
/// seconds ahead of the system clock (negative: behind). Certificate
/// issuance and renewal, condition timestamps and the leader Lease all read
/// that clock, so a test sees a certificate enter its renewal window
/// without waiting (`e2e/tests/cluster.rs`).
pub const TEST_CLOCK_OFFSET: &str = "IOP_TEST_CLOCK_OFFSET_S";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// The namespace whose IOP objects are reconciled (the operator's own).
    pub namespace: String,
    /// Holder identity in the leader-election Lease.
    pub pod_name: String,
    /// Label selector of the Edge pods, `KEY=VALUE[,KEY=VALUE...]`
    /// (equality terms only, as the chart writes it).
    pub edge_pod_selector: String,
    /// DNS names (or IP addresses) on the Edge server certificate.
    pub edge_server_names: Vec<String>,
    /// The Edge's `listen.admin_hosts` ([`EDGE_ADMIN_HOSTS`]).
    pub edge_admin_hosts: Vec<String>,
    /// The Edge's `limits` ([`EDGE_HTTP_LIMITS`]; the others default).
    pub edge_limits: Limits,
    /// SPIFFE trust domain of node identities.
    pub trust_domain: String,
    /// The operator's ClusterRole and ClusterRoleBinding ([`CLUSTER_RBAC_NAME`]).
    pub cluster_rbac_name: Option<String>,
    /// The metrics and probe listener ([`DEFAULT_METRICS_ADDR`] when unset).
    pub metrics_addr: SocketAddr,
    /// Whether the Edge requires client API keys ([`EDGE_AUTH_MODE`]).
    pub edge_auth: AuthMode,
    /// What the Edge does with hosted tools ([`EDGE_HOSTED_TOOLS`]).
    pub hosted_tools: HostedTools,
    /// The Edge's `outlier` ([`EDGE_OUTLIER_CONSECUTIVE_FAILURES`] and the
    /// two after it).
    pub outlier: OutlierConfig,
    /// The Edge's `scheduling` ([`EDGE_SCHEDULING_LOAD_PENALTY`]).
    pub scheduling: SchedulingConfig,
    /// The Edge's `telemetry` ([`EDGE_OTLP_ENDPOINT`]).
    pub telemetry: TelemetryConfig,
    /// [`TEST_CLOCK_OFFSET`] in seconds (0 when unset).
    pub clock_offset_s: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("{var} is not set (the Helm chart sets it; see charts/iop/templates/operator-deployment.yaml)")]
    Missing { var: &'static str },
    #[error("{var}=`{value}`: {reason}")]
    Invalid { var: &'static str, value: String, reason: &'static str },
}

impl RunConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, EnvError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Parses the settings from `lookup` (variable name -> value).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let get = |var: &'static str| {
            lookup(var).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).ok_or(EnvError::Missing { var })
        };
        let invalid = |var: &'static str, value: &str, reason: &'static str| EnvError::Invalid {
            var,
            value: value.to_string(),
            reason,
        };

        let namespace = get(NAMESPACE)?;
        if !is_dns_label(&namespace) {
            return Err(invalid(NAMESPACE, &namespace, "not a namespace name (a DNS label)"));
        }
        let pod_name = get(POD_NAME)?;
        if pod_name.len() > 253 || pod_name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(POD_NAME, &pod_name, "not a pod name"));
        }

        let edge_pod_selector = get(EDGE_POD_SELECTOR)?;
        if !is_equality_selector(&edge_pod_selector) {
            return Err(invalid(
                EDGE_POD_SELECTOR,
                &edge_pod_selector,
                "must be KEY=VALUE[,KEY=VALUE...] (the Edge pods' labels)",
            ));
        }

        let names_raw = get(EDGE_SERVER_NAMES)?;
        let edge_server_names: Vec<String> =
            names_raw.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_string).collect();
        if edge_server_names.is_empty() {
            return Err(invalid(EDGE_SERVER_NAMES, &names_raw, "must list at least one DNS name"));
        }
        if edge_server_names.iter().any(|n| n.parse::<std::net::IpAddr>().is_err() && !is_dns_name(n)) {
            return Err(invalid(EDGE_SERVER_NAMES, &names_raw, "every entry must be a DNS name or an IP address"));
        }

        let hosts_raw = lookup(EDGE_ADMIN_HOSTS).unwrap_or_default();
        let edge_admin_hosts: Vec<String> =
            hosts_raw.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_string).collect();
        // The rule the Edge config applies to `listen.admin_hosts`.
        if edge_admin_hosts.iter().any(|n| !iop_proto::config::is_lowercase_dns_name(n.strip_prefix("*.").unwrap_or(n)))
        {
            return Err(invalid(
                EDGE_ADMIN_HOSTS,
                &hosts_raw,
                "every entry must be a lowercase DNS name, or `*.` and one",
            ));
        }

        let mut edge_limits = Limits::default();
        for (var, set) in EDGE_HTTP_LIMITS {
            let Some(value) = lookup(var).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()) else { continue };
            let n = value.parse::<u64>().map_err(|_| invalid(var, &value, "must be a whole number"))?;
            set(&mut edge_limits, n);
            // The Edge config's own rule for the field.
            edge_limits.validate().map_err(|_| invalid(var, &value, "out of range (see docs/configuration.md)"))?;
        }

        let trust_domain = get(TRUST_DOMAIN)?;
        // The same rule the Edge config applies to `trust_domain`.
        if iop_proto::identity::validate_trust_domain(&trust_domain).is_err() {
            return Err(invalid(TRUST_DOMAIN, &trust_domain, "must be a lowercase DNS-like name (a-z, 0-9, '.', '-')"));
        }

        let cluster_rbac_name = lookup(CLUSTER_RBAC_NAME).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        if let Some(name) = &cluster_rbac_name
            && !is_dns_name(name)
        {
            return Err(invalid(CLUSTER_RBAC_NAME, name, "not a ClusterRole name (a DNS subdomain)"));
        }

        let metrics_addr = match lookup(METRICS_ADDR).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()) {
            None => DEFAULT_METRICS_ADDR.parse().expect("the default metrics address parses"),
            Some(value) => value
                .parse::<SocketAddr>()
                .map_err(|_| invalid(METRICS_ADDR, &value, "must be IP:PORT, e.g. 0.0.0.0:9464 or [::]:9464"))?,
        };

        let edge_auth = match lookup(EDGE_AUTH_MODE).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).as_deref()
        {
            None | Some("required") => AuthMode::Required,
            Some("disabled") => AuthMode::Disabled,
            Some(other) => return Err(invalid(EDGE_AUTH_MODE, other, "must be `required` or `disabled`")),
        };

        let hosted_tools =
            match lookup(EDGE_HOSTED_TOOLS).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).as_deref() {
                None | Some("drop") => HostedTools::Drop,
                Some("refuse") => HostedTools::Refuse,
                Some(other) => return Err(invalid(EDGE_HOSTED_TOOLS, other, "must be `drop` or `refuse`")),
            };

        let mut outlier = OutlierConfig::default();
        for (var, field) in [
            (EDGE_OUTLIER_CONSECUTIVE_FAILURES, 0),
            (EDGE_OUTLIER_BASE_EJECTION_MS, 1),
            (EDGE_OUTLIER_MAX_EJECTION_MS, 2),
        ] {
            let Some(value) = lookup(var).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()) else { continue };
            let number = value.parse::<u64>().map_err(|_| invalid(var, &value, "must be a whole number"))?;
            match field {
                0 => {
                    outlier.consecutive_failures =
                        u32::try_from(number).map_err(|_| invalid(var, &value, "must be between 0 (off) and 1000"))?
                }
                1 => outlier.base_ejection_ms = number,
                _ => outlier.max_ejection_ms = number,
            }
        }
        if let Err(iop_proto::config::ConfigError::Invalid { field, .. }) = outlier.validate() {
            let var = match field.as_str() {
                "outlier.consecutive_failures" => EDGE_OUTLIER_CONSECUTIVE_FAILURES,
                "outlier.base_ejection_ms" => EDGE_OUTLIER_BASE_EJECTION_MS,
                _ => EDGE_OUTLIER_MAX_EJECTION_MS,
            };
            let value = lookup(var).unwrap_or_default();
            return Err(invalid(
                var,
                &value,
                "out of range: failures 0 (off) to 1000; base ejection 100 to 3600000 ms; max ejection from the \
                 base to 86400000 ms",
            ));
        }

        let mut scheduling = SchedulingConfig::default();
        if let Some(value) =
            lookup(EDGE_SCHEDULING_LOAD_PENALTY).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
        {
            let out_of_range =
                || invalid(EDGE_SCHEDULING_LOAD_PENALTY, &value, "must be between 0 (ignore residency) and 10000");
            scheduling.load_penalty = value.parse::<u32>().map_err(|_| out_of_range())?;
            scheduling.validate().map_err(|_| out_of_range())?;
        }

        let telemetry = TelemetryConfig {
            otlp_endpoint: lookup(EDGE_OTLP_ENDPOINT).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()),
        };
        if telemetry.validate().is_err() {
            let value = telemetry.otlp_endpoint.clone().unwrap_or_default();
            return Err(invalid(EDGE_OTLP_ENDPOINT, &value, "must be an http:// or https:// URL"));
        }

        // Within a century either way: far past what any test needs, and the
        // clock stays within the range `time` and Kubernetes timestamps take.
        let clock_offset_s = match lookup(TEST_CLOCK_OFFSET).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()) {
            None => 0,
            Some(value) => {
                value.parse::<i64>().ok().filter(|s| s.unsigned_abs() <= 100 * 365 * 86_400).ok_or_else(|| {
                    invalid(TEST_CLOCK_OFFSET, &value, "must be a whole number of seconds (tests only)")
                })?
            }
        };

        Ok(Self {
            namespace,
            pod_name,
            edge_pod_selector,
            edge_server_names,
            edge_admin_hosts,
            edge_limits,
            trust_domain,
            cluster_rbac_name,
            metrics_addr,
            edge_auth,
            hosted_tools,
            outlier,
            scheduling,
            telemetry,
            clock_offset_s,
        })
    }

    /// The reconcile settings: trust domain, the chart's fixed Edge listen
    /// addresses, TLS and keys paths, and the auth mode.
    pub fn settings(&self) -> Settings {
        let addr = |s: &str| s.parse::<SocketAddr>().expect("constant listen addresses parse");
        let mut listen = ListenConfig::new(addr(EDGE_HTTP_LISTEN), addr(EDGE_GRPC_LISTEN), addr(EDGE_ADMIN_LISTEN));
        listen.admin_hosts = self.edge_admin_hosts.clone();
        let mut settings = Settings::new(self.trust_domain.clone(), listen);
        settings.limits = self.edge_limits.clone();
        if self.edge_auth == AuthMode::Disabled {
            settings.auth = AuthConfig { mode: AuthMode::Disabled, ..Default::default() };
        }
        settings.api.hosted_tools = self.hosted_tools;
        settings.outlier = self.outlier.clone();
        settings.scheduling = self.scheduling.clone();
        settings.telemetry = self.telemetry.clone();
        settings
    }
}

/// `KEY=VALUE[,KEY=VALUE...]`: label keys (an optional DNS prefix and `/`,
/// then a name) and values of letters, digits, `-`, `_`, `.` (values may be
/// empty), as `kubectl get pods -l` takes them.
fn is_equality_selector(s: &str) -> bool {
    let label =
        |v: &str, max: usize| v.len() <= max && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    s.split(',').all(|term| {
        let Some((key, value)) = term.split_once('=') else { return false };
        let (prefix, name) = key.rsplit_once('/').map_or((None, key), |(p, n)| (Some(p), n));
        !name.is_empty()
            && label(name, 63)
            && prefix.is_none_or(|p| !p.is_empty() && is_dns_name(p))
            && label(value, 63)
    })
}

fn is_dns_label(s: &str) -> bool {
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    s.len() <= 63
        && edge(s.bytes().next())
        && edge(s.bytes().last())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_dns_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    s.len() <= 253
        && s.split('.').all(|label| {
            let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
            label.len() <= 63
                && edge(label.bytes().next())
                && edge(label.bytes().last())
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests;

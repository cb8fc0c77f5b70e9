//! Reconcile of one namespace, in stages: read (client) -> [`validate`]
//! (pure) -> [`desired::build`] (pure) -> apply (client) -> status (client).
//! The pure stages take every input as a value, the clock included, so they
//! are tested without an API server.

pub mod conditions;
pub mod credentials;
pub mod desired;
pub mod unchanged;
pub mod validate;

use std::path::PathBuf;

use iop_proto::config::{
    ApiConfig, AuthConfig, AuthMode, EdgeConfig, EdgeTlsConfig, Limits, ListenConfig, OutlierConfig, SchedulingConfig,
    TelemetryConfig,
};

use crate::crd::{NodeCatalog, Provider, WorkspaceTemplate};

pub use desired::{BuildError, Excluded, Prepared, StatusUpdate, build};
pub use validate::{Invalid, Reason};

/// The ConfigMap the Edge mounts, and the key holding its config file.
pub const CONFIG_MAP_NAME: &str = "iop-edge-config";
pub const CONFIG_KEY: &str = "edge.yaml";

/// Where the Edge pod mounts the `iop-edge-tls` Secret.
pub const EDGE_TLS_DIR: &str = "/etc/iop/tls";

/// Where the Edge pod mounts the API keys Secret (`edge.auth.keysSecret` in
/// the chart; created by the administrator, never by the operator).
pub const EDGE_KEYS_FILE: &str = "/etc/iop/keys/keys.yaml";

/// Field managers, one per write site (server-side apply).
pub const FIELD_MANAGER_CONFIG: &str = "iop-operator/config";
pub const FIELD_MANAGER_CERTS: &str = "iop-operator/certs";
pub const FIELD_MANAGER_STATUS: &str = "iop-operator/status";

/// Operator-wide settings that are not part of any custom resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// SPIFFE trust domain of node identities.
    pub trust_domain: String,
    /// The Edge's listen addresses (inside its pod).
    pub listen: ListenConfig,
    /// TLS files inside the Edge pod.
    pub tls: EdgeTlsConfig,
    /// Edge-wide limits. `queue_depth` and `queue_timeout_ms` are raised to
    /// the largest value any valid `Provider` asks for.
    pub limits: Limits,
    /// Client authentication (the keys file is a Secret mounted into the Edge).
    pub auth: AuthConfig,
    /// The client APIs' treatment of hosted tools.
    pub api: ApiConfig,
    /// The Edge's passive outlier ejection.
    pub outlier: OutlierConfig,
    /// How the Edge's selection weighs model residency.
    pub scheduling: SchedulingConfig,
    /// Where the Edge's spans go (off by default).
    pub telemetry: TelemetryConfig,
}

impl Settings {
    /// Settings with the Edge's TLS files at [`EDGE_TLS_DIR`], default
    /// limits, and API keys required from [`EDGE_KEYS_FILE`].
    pub fn new(trust_domain: impl Into<String>, listen: ListenConfig) -> Self {
        let tls_file = |name: &str| PathBuf::from(EDGE_TLS_DIR).join(name);
        Self {
            trust_domain: trust_domain.into(),
            listen,
            tls: EdgeTlsConfig {
                ca_file: tls_file("ca.pem"),
                cert_file: tls_file("edge.pem"),
                key_file: tls_file("edge-key.pem"),
            },
            limits: Limits::default(),
            auth: AuthConfig {
                mode: AuthMode::Required,
                keys_file: Some(PathBuf::from(EDGE_KEYS_FILE)),
                ..Default::default()
            },
            api: ApiConfig::default(),
            outlier: OutlierConfig::default(),
            scheduling: SchedulingConfig::default(),
            telemetry: TelemetryConfig::default(),
        }
    }
}

impl Settings {
    /// An Edge config of these settings with no node, provider, credential
    /// or workspace: what the build stage fills, and what one object is
    /// checked in alone (by the Edge's own rules).
    pub fn empty_config(&self) -> EdgeConfig {
        EdgeConfig {
            listen: self.listen.clone(),
            tls: self.tls.clone(),
            trust_domain: self.trust_domain.clone(),
            nodes: Vec::new(),
            providers: Vec::new(),
            limits: self.limits.clone(),
            auth: self.auth.clone(),
            credentials: Vec::new(),
            workspaces: Vec::new(),
            context_fallbacks: Default::default(),
            retry: Default::default(),
            replicas: Vec::new(),
            api: self.api.clone(),
            outlier: self.outlier.clone(),
            scheduling: self.scheduling.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

/// Every IOP object of one namespace, as read.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub namespace: String,
    pub providers: Vec<Provider>,
    pub nodes: Vec<NodeCatalog>,
    pub templates: Vec<WorkspaceTemplate>,
    /// The Secrets Providers' `credentialSecretRef`s name, by name (those
    /// that exist).
    pub secrets: std::collections::BTreeMap<String, k8s_openapi::api::core::v1::Secret>,
    /// The operator's own `iop-edge-credentials` as last written (for the
    /// revisions it carries).
    pub edge_credentials: Option<k8s_openapi::api::core::v1::Secret>,
    /// `iop-edge-config` as last seen by its watch (compared with the
    /// desired one before applying: [`unchanged`]).
    pub edge_config_map: Option<k8s_openapi::api::core::v1::ConfigMap>,
    /// The Edge's replica ids: its pods' names, sorted
    /// ([`crate::replicas::replica_ids`]); the config's `replicas`.
    pub replicas: Vec<String>,
    /// The namespace is being deleted: everything in it goes, the Edge
    /// included, so nothing is rendered and every finalizer is released.
    pub namespace_terminating: bool,
}

#[cfg(test)]
pub(crate) mod fixtures;

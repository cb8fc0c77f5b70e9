//! `NodeCatalog`: one node (a Mac running `iop-node`). Its name is the node's
//! name, so its identity is `spiffe://<trust-domain>/node/<metadata.name>`;
//! the operator issues its client certificate and lists it in the Edge
//! config. Deleting it removes the identity, and the Edge closes the node's
//! connection on reload.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One IOP node and the workspaces it offers.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "iop.dev",
    version = "v1alpha1",
    kind = "NodeCatalog",
    namespaced,
    status = "NodeCatalogStatus",
    category = "iop",
    validation = Rule::new(
        "size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')"
    )
    .message("the name is the node identity: 1-63 of a-z, 0-9 and '-', starting and ending with a letter or digit"),
    doc = "One IOP node (its name is the node identity) and the workspaces it offers.",
    printcolumn(
        name = "Connected",
        type_ = "boolean",
        json_path = ".status.connected",
        description = "A session to at least one Edge replica is open",
    ),
    printcolumn(
        name = "Replicas",
        type_ = "string",
        json_path = ".status.replicasSummary",
        description = "Edge replicas the node holds a session with, of all replicas",
    ),
    printcolumn(
        name = "Node-Version",
        type_ = "string",
        json_path = ".status.version",
        description = "The iop-node version the node reported at registration (kept while it is away)",
    ),
    printcolumn(
        name = "Generation",
        type_ = "integer",
        json_path = ".status.generation",
        description = "Generation of the newest Edge connection",
    ),
    printcolumn(
        name = "Cert-Expiry",
        type_ = "string",
        json_path = ".status.certificate.notAfter",
        description = "Client certificate expiry",
    ),
    printcolumn(
        name = "Bundle-Current",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="BundleCurrent")].status"#,
        description = "Every session of the node presents the certificate issued last (condition BundleCurrent)",
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
)]
#[serde(rename_all = "camelCase")]
pub struct NodeCatalogSpec {
    #[serde(default)]
    pub certificate: CertificateSettings,
    /// Workspaces the node offers, by opaque reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["ref"]))]
    pub workspaces: Vec<Workspace>,
}

/// The node's client certificate (an X509-SVID issued by the operator's CA).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.renewBeforeHours < self.validityHours",
    "message": "renewBeforeHours must be less than validityHours",
    "fieldPath": ".renewBeforeHours",
}]))]
pub struct CertificateSettings {
    /// Lifetime of each issued certificate.
    #[serde(default = "CertificateSettings::default_validity_hours")]
    #[schemars(range(min = 1, max = 8760))]
    pub validity_hours: u32,
    /// A new certificate is issued this long before the current one expires.
    /// At least 1 hour: the operator checks certificates at every reconcile,
    /// at the latest every 5 minutes, and a smaller window could let the
    /// Secret hold an expired certificate until the next check.
    #[serde(default = "CertificateSettings::default_renew_before_hours")]
    #[schemars(range(min = 1, max = 8759))]
    pub renew_before_hours: u32,
}

impl CertificateSettings {
    /// These settings as the certificates' [`Renewal`].
    pub fn renewal(&self) -> crate::certs::Renewal {
        let hours = |h: u32| std::time::Duration::from_secs(u64::from(h) * 3600);
        crate::certs::Renewal { validity: hours(self.validity_hours), renew_before: hours(self.renew_before_hours) }
    }

    fn default_validity_hours() -> u32 {
        (iop_pki::NODE_VALIDITY.as_secs() / 3600) as u32
    }
    fn default_renew_before_hours() -> u32 {
        (iop_pki::NODE_RENEW_BEFORE.as_secs() / 3600) as u32
    }
}

impl Default for CertificateSettings {
    fn default() -> Self {
        Self { validity_hours: Self::default_validity_hours(), renew_before_hours: Self::default_renew_before_hours() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Workspace {
    /// Opaque reference clients use; never a path.
    #[serde(rename = "ref")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"))]
    pub reference: String,
    /// Absolute root directory on the node.
    #[schemars(length(min = 2, max = 1024), regex(pattern = r"^/[^\x00]*$"))]
    pub root_path: String,
    /// Name of the `WorkspaceTemplate` (same namespace) that says what may be done in it.
    #[schemars(length(min = 1, max = 253))]
    pub template: String,
}

/// Written by the operator only: connection state and the conditions
/// `WorkspacesReady` and `BundleCurrent` mirror the Edge's sessions
/// (`iop-operator/status`); certificate fields and the conditions
/// `CAExpiring` and `CertificateIssued` come from issuance
/// (`iop-operator/certs`); `Ready` and `observedGeneration` from reconcile
/// (`iop-operator/config`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCatalogStatus {
    /// A session to at least one Edge replica is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected: Option<bool>,
    /// Edge replicas the node holds a session with (that answered the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected_replicas: Option<u32>,
    /// Edge replicas (the Edge pods listed in the Edge config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// `connectedReplicas/replicas`, e.g. `2/2` (the REPLICAS column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas_summary: Option<String>,
    /// Generation of the newest (or last) Edge connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// When `connected` last changed, or the newest connection began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// The `iop-node` version the node reported at registration (the
    /// NODE-VERSION column); kept from the last session while it is away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CertificateStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    /// Serial number, lowercase hex.
    pub serial: String,
    /// RFC 3339 expiry of the current client certificate.
    pub not_after: Time,
}

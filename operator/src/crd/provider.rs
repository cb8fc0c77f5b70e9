//! `Provider`: one model served by one node, and how the Edge routes to it.
//! Each valid `Provider` becomes one `providers[]` entry of the Edge config
//! (its id is the object's name).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A model on a node (`NodeCatalog`), published to clients under one or more
/// public model names.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "iop.dev",
    version = "v1alpha1",
    kind = "Provider",
    namespaced,
    status = "ProviderStatus",
    category = "iop",
    validation = Rule::new("size(self.metadata.name) <= 63")
        .message("the name is the provider id in the Edge config: at most 63 characters"),
    doc = "A model served by one IOP node, published to clients under public model names.",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node", description = "NodeCatalog that runs it"),
    printcolumn(
        name = "Model",
        type_ = "string",
        json_path = ".spec.target.model",
        description = "Model name at the provider",
    ),
    printcolumn(
        name = "Health",
        type_ = "string",
        json_path = ".status.health",
        description = "Live health reported by the Edge",
    ),
    printcolumn(
        name = "Classification",
        type_ = "string",
        json_path = ".status.classification",
        description = "Liveness classification of the last health evidence",
    ),
    printcolumn(
        name = "Ejected",
        type_ = "string",
        json_path = ".status.ejectedUntil",
        description = "Left out of selection until then after generation failures in a row (outlier ejection)",
    ),
    printcolumn(
        name = "Loaded",
        type_ = "string",
        json_path = ".status.residency",
        description = "Whether the model is in the server's memory now (loaded, not_loaded, unknown)",
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Public",
        type_ = "string",
        json_path = ".status.publicModels",
        description = "Public model names",
        priority = 1,
    ),
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.credentialSecretRef) || self.adapter == 'openai'",
    "message": "credentialSecretRef applies only to the openai adapter (ollama takes no API key)",
    "fieldPath": ".credentialSecretRef",
}, {
    "rule": "!has(self.keepWarm) || !self.keepWarm || self.adapter == 'ollama'",
    "message": KEEP_WARM_MESSAGE,
    "fieldPath": ".keepWarm",
}]))]
pub struct ProviderSpec {
    /// Name of the `NodeCatalog` (same namespace) whose node runs this provider.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub node: String,
    /// How the node talks to the provider: `ollama`, or `openai` for any
    /// OpenAI-compatible server.
    pub adapter: Adapter,
    /// The model the node runs and the server it runs on.
    pub target: ProviderTarget,
    /// Public model names clients send as `model`. Lower priority is
    /// preferred; providers sharing a name and the lowest priority share load.
    #[schemars(
        length(min = 1, max = 32),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub models: Vec<PublicModel>,
    /// Most runs this provider executes at once; more wait in the route queue.
    #[serde(default = "default_capacity")]
    #[schemars(range(min = 1, max = 1024))]
    pub capacity: u32,
    /// Queue limits. The Edge queues per public model, not per provider, so
    /// the operator takes the Edge-wide limit from the largest value any valid
    /// provider asks for; omitted values use the operator's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueLimits>,
    /// No progress from the provider for this long ends a run as stalled.
    /// 0 means learned per provider by its node (10000 to 300000 ms; 300000
    /// until learned); otherwise 1000 to 3600000.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == 0 || (self >= 1000 && self <= 3600000)",
        "message": "must be 0 (default) or between 1000 and 3600000",
    }]))]
    pub response_stall_timeout_ms: u64,
    /// Nothing at all from the provider (headers included) for this long
    /// after the request was sent ends the attempt like a stall (replayed
    /// before the first byte). 0 means the default (60000 ms); otherwise
    /// 1000 to 3600000.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == 0 || (self >= 1000 && self <= 3600000)",
        "message": "must be 0 (default) or between 1000 and 3600000",
    }]))]
    pub first_byte_timeout_ms: u64,
    /// `normalized` (default): the Edge translates every API into a run.
    /// `tunnel`: requests in an API the provider serves itself are relayed
    /// byte-for-byte; other APIs are still normalized.
    #[serde(default)]
    pub mode: ProviderMode,
    /// Whether the Edge may continue a stream of the same public model that
    /// broke after text here (`limits.max_continuations`): the server
    /// continues a prefilled final assistant turn. Unset (the default): as
    /// the node detects the server (Ollama and llama.cpp's server do; LM
    /// Studio, vLLM and unknown servers are never asked). `false` turns it
    /// off; `true` declares a server the node cannot detect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<bool>,
    /// The model's context window in tokens, where the node cannot read it
    /// from the server (it reads Ollama's, llama.cpp's and LM Studio's).
    /// Within a public model, a prompt longer than a provider's window goes
    /// to a provider whose window fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub context_window: Option<u32>,
    /// Whether the model reads images, where the node cannot read it from
    /// the server (it reads llama.cpp's, Ollama's and LM Studio's). A
    /// request with an image goes only to providers of its model not known
    /// to refuse images; when every one refuses, it is a 400
    /// `unsupported_content` before any is called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepts_images: Option<bool>,
    /// Ask the node to keep the model resident in the server's memory
    /// (Ollama `keep_alive` on runs and a periodic zero-token touch), so it
    /// never goes cold between requests. Ollama adapter only. The node
    /// honours it only where the Mac's owner opted in (the node's config):
    /// it pins memory on someone's Mac. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_warm: bool,
    /// Secret key holding the provider API key (openai adapter only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_secret_ref: Option<SecretKeyRef>,
}

/// What the API server says of `keepWarm` on a Provider whose adapter is not `ollama`.
pub const KEEP_WARM_MESSAGE: &str = "keepWarm applies only to the ollama adapter (Ollama's keep_alive)";

fn default_capacity() -> u32 {
    4
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Adapter {
    Ollama,
    Openai,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderMode {
    #[default]
    Normalized,
    Tunnel,
}

/// The schema's restatement of `iop_proto::config::check_target_model`: no
/// control characters (C0, DEL, C1), no whitespace at either end.
pub const TARGET_MODEL_PATTERN: &str = r"^[^\s\x00-\x1F\x7F-\x9F]([^\x00-\x1F\x7F-\x9F]*[^\s\x00-\x1F\x7F-\x9F])?$";

/// The schema's restatement of `iop_proto::config::check_base_url`: a DNS
/// host name whose last label is not all digits, an IPv4 address (four
/// numbers 0-255 without leading zeros) or a bracketed IPv6 address, a port
/// of 1-65535 without leading zeros, a path without whitespace or control
/// characters; no credentials, query or fragment. (The operator also parses
/// the IPv6 address itself.) In the schema it is a CEL rule with a message
/// ([`BASE_URL_MESSAGE`]), not a `pattern`, whose error would print it.
pub const BASE_URL_PATTERN: &str = concat!(
    r"^https?://(",
    // IPv4
    r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
    // DNS name: labels, the last one not all digits
    r"|([A-Za-z0-9]([-A-Za-z0-9_]*[A-Za-z0-9])?\.)*",
    r"([A-Za-z]([-A-Za-z0-9_]*[A-Za-z0-9])?|[0-9]+([A-Za-z]([-A-Za-z0-9_]*[A-Za-z0-9])?|[-_][-A-Za-z0-9_]*[A-Za-z0-9]))",
    // [IPv6]
    r"|\[[0-9A-Fa-f:.]+\])",
    r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?",
    r"(/[^?#\s\x00-\x1F\x7F-\x9F]*)?$",
);

/// What the API server says of a `target.baseUrl` that breaks [`BASE_URL_PATTERN`].
pub const BASE_URL_MESSAGE: &str = "must be http(s)://host[:port][/path]: a DNS name, an IPv4 address or a \
     [bracketed] IPv6 address, a port of 1-65535, no user:password@, query (?) or fragment (#), no spaces or \
     control characters";

/// A `target.baseUrl` whose path ends in `/v1`: the node adds `/v1/...`
/// itself, so such a provider would be asked for `/v1/v1/models` and be
/// unavailable with only the node's log to say why.
pub const API_SUFFIX_PATTERN: &str = r"/v1/?$";

/// What the API server says of a `target.baseUrl` ending in `/v1`.
pub const API_SUFFIX_MESSAGE: &str =
    "must not end in /v1: give the server's root (e.g. http://127.0.0.1:1234); the node adds the API path itself";

/// What the API server says of a `target.model` that breaks [`TARGET_MODEL_PATTERN`].
pub const TARGET_MODEL_MESSAGE: &str =
    "must be 1-256 characters without control characters, not starting or ending with whitespace";

/// The CEL rule that `self` matches `pattern` (a raw string: the pattern's
/// backslashes reach RE2 as they are).
pub fn matches_rule(pattern: &str) -> String {
    debug_assert!(!pattern.contains('\''), "a raw CEL string cannot hold a quote");
    format!("self.matches(r'{pattern}')")
}

/// What the node runs: which model, on which server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderTarget {
    /// Model name as the provider knows it (Ollama tag, or the `id` an
    /// OpenAI-compatible server lists), e.g. `llama3.2:3b`. 1-256
    /// characters, no control characters.
    #[schemars(
        length(min = 1, max = 256),
        extend("x-kubernetes-validations" = [{"rule": matches_rule(TARGET_MODEL_PATTERN), "message": TARGET_MODEL_MESSAGE}])
    )]
    pub model: String,
    /// The model server's root URL as seen from the node (the Mac), e.g.
    /// `http://127.0.0.1:11434` for Ollama or `http://127.0.0.1:1234` for LM
    /// Studio: `http(s)://host[:port][/prefix]` with a port of 1-65535 and
    /// no credentials, query or fragment. Without `/v1`: the node adds the
    /// API path (`/api/...`, `/v1/...`) itself.
    #[schemars(
        length(max = 2048),
        extend("x-kubernetes-validations" = [
            {"rule": matches_rule(BASE_URL_PATTERN), "message": BASE_URL_MESSAGE},
            {"rule": format!("!{}", matches_rule(API_SUFFIX_PATTERN)), "message": API_SUFFIX_MESSAGE},
        ])
    )]
    pub base_url: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.contextFallback) || self.contextFallback != self.name",
    "message": "a model cannot fall back to itself",
    "fieldPath": ".contextFallback",
}]))]
pub struct PublicModel {
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^\S+$"))]
    pub name: String,
    /// Lower is preferred.
    #[serde(default)]
    #[schemars(range(max = 1000))]
    pub priority: u32,
    /// A request for this model that the provider refuses as too long for
    /// its context window moves, before anything reached the client, to this
    /// larger-context model (one hop). A public model name of a Provider in
    /// the namespace, not this one; it applies to this public model on every
    /// Provider that serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^\S+$"))]
    pub context_fallback: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueLimits {
    /// Requests that may wait per public model when every provider is busy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub depth: Option<u32>,
    /// How long a request may wait in the queue before it fails with 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600000))]
    pub timeout_ms: Option<u64>,
}

/// A key of a Secret in the same namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Written by the operator only. The health fields mirror the Edge's overlay
/// (field manager `iop-operator/status`); `publicModels`, `conditions` and
/// `observedGeneration` come from reconcile (`iop-operator/config`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// Liveness classification of the node's last health evidence (paired
    /// with `health`: available/request_stalled, unavailable/provider_unhealthy,
    /// unknown/health_unknown; degraded takes the worse of its replicas'
    /// views: provider_unhealthy, else health_unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classification: Option<Classification>,
    /// The node session's health observation sequence of the last update
    /// (of the newest session's evidence, with several Edge replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_observation_sequence: Option<u64>,
    /// The node connection generation the health belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// When `health` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Set while an Edge replica has the provider ejected from selection
    /// after generation failures in a row (outlier ejection, separate from
    /// `health`): until when (the latest of the replicas').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ejected_until: Option<Time>,
    /// Whether the provider's model is in its server's memory now, as the
    /// node reports it: `loaded`, `not_loaded` (the next request waits for
    /// a load) or `unknown` (no report, node not ready, or the server cannot
    /// tell). A replica that knows beats one that does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residency: Option<Residency>,
    /// How long the node's last measured load of the model took (the run
    /// that found it not loaded waited this long for its first byte), in
    /// seconds (millisecond precision); absent before any load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_load_seconds: Option<f64>,
    /// When that load ended (the latest of the replicas', whole seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_load_time: Option<Time>,
    /// The public model names of `spec.models`, comma-separated, in spec
    /// order (the `PUBLIC` column of `kubectl get providers -o wide`; a
    /// printer column shows only the first item of a list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_models: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl ProviderSpec {
    /// `status.publicModels`: the public model names, comma-separated, in spec order.
    pub fn public_models(&self) -> String {
        self.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The name of the Secret `credentialSecretRef` names, if any: the
    /// Secrets the reconcile reads and the watch reacts to.
    pub fn credential_secret(&self) -> Option<&str> {
        self.credential_secret_ref.as_ref().map(|r| r.name.as_str())
    }
}

/// A provider's health as the Edge replicas with a ready session with its
/// node see it:
/// `available` (every one of them), `degraded` (some, not all),
/// `unavailable` (none sees it available, at least one sees it down),
/// `unknown` (no replica is connected to its node or answers, or none can
/// tell). The whole rule is in docs/crds.md (Provider status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Available,
    Degraded,
    Unavailable,
    Unknown,
}

/// Model residency as the Edge's `/admin/v1/providers` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Residency {
    Loaded,
    NotLoaded,
    Unknown,
}

/// The node's liveness classification pairs: `available`/`request_stalled`,
/// `unavailable`/`provider_unhealthy`, `unknown`/`health_unknown`; and
/// `credential_refused_by_node` for a provider not available because its
/// node refuses its managed credential's leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Classification {
    RequestStalled,
    ProviderUnhealthy,
    HealthUnknown,
    CredentialRefusedByNode,
}

impl From<Adapter> for iop_proto::config::Adapter {
    fn from(a: Adapter) -> Self {
        match a {
            Adapter::Ollama => Self::Ollama,
            Adapter::Openai => Self::Openai,
        }
    }
}

impl From<ProviderMode> for iop_proto::config::ProviderMode {
    fn from(m: ProviderMode) -> Self {
        match m {
            ProviderMode::Normalized => Self::Normalized,
            ProviderMode::Tunnel => Self::Tunnel,
        }
    }
}

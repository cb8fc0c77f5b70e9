//! `WorkspaceTemplate`: what may be done inside a workspace that refers to it
//! (operations, fixed command templates, environment names, limits) and how
//! a job there runs (its stages).

use iop_proto::config::MAX_STAGE_PROMPT_BYTES;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Operations, commands, environment names, limits and job stages of a workspace.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "iop.dev",
    version = "v1alpha1",
    kind = "WorkspaceTemplate",
    namespaced,
    status = "WorkspaceTemplateStatus",
    category = "iop",
    doc = "What may be done inside a workspace: operations, command templates, environment names, limits, and how a job there runs (its stages).",
    printcolumn(
        name = "Operations",
        type_ = "string",
        json_path = ".spec.operations",
        description = "Allowed operations"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.commands) && size(self.commands) > 0) == ('command' in self.operations)",
    "message": "commands are required with the command operation and allowed only with it",
    "fieldPath": ".commands",
}]))]
pub struct WorkspaceTemplateSpec {
    /// Allowed operations.
    #[schemars(length(min = 1, max = 5), extend("x-kubernetes-list-type" = "set"))]
    pub operations: Vec<Operation>,
    /// Fixed command templates, run without a shell; clients name them by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["id"]))]
    pub commands: Vec<CommandTemplate>,
    /// Names of environment variables a command may inherit from the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 128),
        extend("x-kubernetes-list-type" = "set"),
        inner(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$"), length(max = 128))
    )]
    pub env_allowlist: Vec<String>,
    #[serde(default)]
    pub limits: WorkspaceLimits,
    /// Commands may use the network (default off; enforced by the node's
    /// sandbox).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub network: bool,
    /// How a job on a workspace of this template runs: planning (read and
    /// list only), then working (every granted operation), then reviewing
    /// (read and list; answers a JSON verdict, approve or repair) and, while
    /// a review asks for it, repairing (read and list; plans the fix) and
    /// working again; finally finalizing (no tools).
    #[serde(default)]
    pub stages: WorkspaceStages,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Read,
    List,
    Write,
    Delete,
    Command,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandTemplate {
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"))]
    pub id: String,
    /// Program and arguments, passed verbatim; the program is resolved on the node.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 4096)))]
    pub argv: Vec<String>,
    /// Every process the command started is killed after this long.
    #[serde(default = "CommandTemplate::default_timeout_ms")]
    #[schemars(range(min = 1000, max = 3600000))]
    pub timeout_ms: u64,
    /// What one run may use, its whole process tree together; hitting one
    /// ends the command with `limit_exceeded` naming it.
    #[serde(default)]
    pub limits: CommandLimits,
}

impl CommandTemplate {
    fn default_timeout_ms() -> u64 {
        60_000
    }
}

/// The bounds of one run of a command (`iop_proto::config::CommandLimits`:
/// the same defaults and ranges).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandLimits {
    /// Processes at once.
    #[serde(default = "iop_proto::config::CommandLimits::default_max_processes")]
    #[schemars(range(min = 1, max = 65536))]
    pub max_processes: u32,
    /// Resident memory of the process tree.
    #[serde(default = "iop_proto::config::CommandLimits::default_max_memory_bytes")]
    #[schemars(range(min = 16777216, max = 1099511627776u64))]
    pub max_memory_bytes: u64,
    /// CPU time of the process tree, finished children included.
    #[serde(default = "iop_proto::config::CommandLimits::default_max_cpu_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub max_cpu_seconds: u64,
    /// Largest file one process may write.
    #[serde(default = "iop_proto::config::CommandLimits::default_max_file_size_bytes")]
    #[schemars(range(min = 1024, max = 1099511627776u64))]
    pub max_file_size_bytes: u64,
    /// How much the workspace root may grow during the run.
    #[serde(default = "iop_proto::config::CommandLimits::default_max_disk_bytes")]
    #[schemars(range(min = 1024, max = 1099511627776u64))]
    pub max_disk_bytes: u64,
}

impl Default for CommandLimits {
    fn default() -> Self {
        iop_proto::config::CommandLimits::default().into()
    }
}

impl From<iop_proto::config::CommandLimits> for CommandLimits {
    fn from(l: iop_proto::config::CommandLimits) -> Self {
        Self {
            max_processes: l.max_processes,
            max_memory_bytes: l.max_memory_bytes,
            max_cpu_seconds: l.max_cpu_seconds,
            max_file_size_bytes: l.max_file_size_bytes,
            max_disk_bytes: l.max_disk_bytes,
        }
    }
}

impl From<CommandLimits> for iop_proto::config::CommandLimits {
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceLimits {
    /// Largest file a read or write may move.
    #[serde(default = "WorkspaceLimits::default_max_file_bytes")]
    #[schemars(range(min = 1, max = 1073741824))]
    pub max_file_bytes: u64,
    /// Most entries one list returns (the rest is truncated).
    #[serde(default = "WorkspaceLimits::default_max_list_entries")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_list_entries: u32,
    /// Shared stdout+stderr cap of one command.
    #[serde(default = "WorkspaceLimits::default_max_output_bytes")]
    #[schemars(range(min = 1, max = 67108864))]
    pub max_output_bytes: u64,
    /// Tool calls per stage of one request.
    #[serde(default = "WorkspaceLimits::default_max_iterations")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_iterations: u32,
    /// Wall-clock budget of one request's workspace use.
    #[serde(default = "WorkspaceLimits::default_wall_clock_ms")]
    #[schemars(range(min = 1000, max = 86400000))]
    pub wall_clock_ms: u64,
    /// Jobs that may run in one workspace of this template at once, on each
    /// Edge replica; more are refused with 429 and Retry-After.
    #[serde(default = "WorkspaceLimits::default_max_concurrent_jobs")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_concurrent_jobs: u32,
}

/// The Edge config's defaults (`iop_proto::config::WorkspaceLimits`).
impl WorkspaceLimits {
    fn default_max_file_bytes() -> u64 {
        iop_proto::config::WorkspaceLimits::default_max_file_bytes()
    }
    fn default_max_list_entries() -> u32 {
        iop_proto::config::WorkspaceLimits::default_max_list_entries()
    }
    fn default_max_output_bytes() -> u64 {
        iop_proto::config::WorkspaceLimits::default_max_output_bytes()
    }
    fn default_max_iterations() -> u32 {
        iop_proto::config::WorkspaceLimits::default_max_iterations()
    }
    fn default_wall_clock_ms() -> u64 {
        iop_proto::config::WorkspaceLimits::default_wall_clock_ms()
    }
    fn default_max_concurrent_jobs() -> u32 {
        iop_proto::config::WorkspaceLimits::default_max_concurrent_jobs()
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStages {
    /// Whether a job plans (read and list only) before it works.
    #[serde(default = "WorkspaceStages::default_plan")]
    pub plan: bool,
    /// Whether a job's work is reviewed (read and list only; the review
    /// answers a JSON verdict, approve or repair) before it finalizes.
    #[serde(default = "WorkspaceStages::default_review")]
    pub review: bool,
    /// Most review/repair rounds: after this many repairs the job finalizes
    /// whatever the review says (0: it finalizes after the first review).
    #[serde(default = "WorkspaceStages::default_max_repairs")]
    #[schemars(range(max = 10))]
    pub max_repairs: u32,
    /// Deadline of each visit of a stage; a stage still running then fails
    /// the job (`limits.wallClockMs` bounds the whole job).
    #[serde(default = "WorkspaceStages::default_stage_timeout_ms")]
    #[schemars(range(min = 1000, max = 86400000))]
    pub stage_timeout_ms: u64,
    #[serde(default)]
    pub prompts: StagePrompts,
}

/// The Edge config's defaults (`iop_proto::config::WorkspaceStages`).
impl WorkspaceStages {
    fn default_plan() -> bool {
        iop_proto::config::WorkspaceStages::default().plan
    }
    fn default_review() -> bool {
        iop_proto::config::WorkspaceStages::default().review
    }
    fn default_max_repairs() -> u32 {
        iop_proto::config::WorkspaceStages::default_max_repairs()
    }
    fn default_stage_timeout_ms() -> u64 {
        iop_proto::config::WorkspaceStages::default_stage_timeout_ms()
    }
}

impl Default for WorkspaceStages {
    fn default() -> Self {
        Self {
            plan: Self::default_plan(),
            review: Self::default_review(),
            max_repairs: Self::default_max_repairs(),
            stage_timeout_ms: Self::default_stage_timeout_ms(),
            prompts: StagePrompts::default(),
        }
    }
}

/// Instructions that replace a stage's built-in one; each must hold a
/// non-blank character and at most 16384 bytes (16 KiB).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StagePrompts {
    /// Replaces the instruction of planning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_STAGE_PROMPT_BYTES), regex(pattern = r"\S"))]
    pub plan: Option<String>,
    /// Replaces the instruction of working.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_STAGE_PROMPT_BYTES), regex(pattern = r"\S"))]
    pub work: Option<String>,
    /// Replaces the instruction of reviewing, format included: it must ask
    /// for exactly `{"verdict":"approve"|"repair","notes":"..."}` (any other
    /// answer counts as a repair without notes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_STAGE_PROMPT_BYTES), regex(pattern = r"\S"))]
    pub review: Option<String>,
    /// Replaces the instruction of repairing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_STAGE_PROMPT_BYTES), regex(pattern = r"\S"))]
    pub repair: Option<String>,
    /// Replaces the instruction of finalizing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_STAGE_PROMPT_BYTES), regex(pattern = r"\S"))]
    pub finalize: Option<String>,
}

/// Written by reconcile (`iop-operator/config`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplateStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

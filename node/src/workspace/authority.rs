//! What a request may do in a workspace. The catalog entry the Edge assigned
//! at registration is the most ([`Template`], command argv included); the
//! Edge's frozen authority in `WorkspaceOpen` only narrows it: the node keeps
//! the operations, command ids and environment names both name, and the
//! lower of each limit ([`effective`]). Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use iop_proto::pb::{self, WorkspaceOperation as Op};

/// A command a request may run by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandTemplate {
    pub argv: Vec<String>,
    pub timeout: Duration,
    /// The catalog's alone to set (a request's authority names commands,
    /// never their bounds).
    pub limits: iop_proto::config::CommandLimits,
}

/// A workspace's template, or a request's share of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub operations: BTreeSet<Op>,
    pub commands: BTreeMap<String, CommandTemplate>,
    pub env_allowlist: Vec<String>,
    pub limits: pb::WorkspaceLimits,
    /// Commands may use the network (the catalog's alone to grant).
    pub network: bool,
}

/// An operation value the node does not know grants nothing.
fn operations(values: &[i32]) -> BTreeSet<Op> {
    values.iter().filter_map(|v| iop_proto::wire::closed_enum::<Op>("workspace.operation", *v).ok()).collect()
}

impl Template {
    /// The catalog entry as assigned; absent limits are the documented
    /// defaults (one definition, in `iop_proto::config`).
    pub fn from_assignment(a: &pb::WorkspaceAssignment) -> Self {
        Self {
            operations: operations(&a.operations),
            commands: a
                .commands
                .iter()
                .map(|c| {
                    let timeout = Duration::from_millis(c.timeout_ms);
                    let limits = iop_proto::config::CommandLimits::from_wire(c.limits.as_ref());
                    (c.id.clone(), CommandTemplate { argv: c.argv.clone(), timeout, limits })
                })
                .collect(),
            env_allowlist: a.env_allowlist.clone(),
            limits: a.limits.unwrap_or_else(|| iop_proto::config::WorkspaceLimits::default().into()),
            network: a.network,
        }
    }

    pub fn allows(&self, op: Op) -> bool {
        self.operations.contains(&op)
    }

    /// As `WorkspaceOpenResponse.effective` reports it: names, never argv.
    pub fn to_wire(&self) -> pb::WorkspaceAuthority {
        pb::WorkspaceAuthority {
            operations: self.operations.iter().map(|op| (*op).into()).collect(),
            command_ids: self.commands.keys().cloned().collect(),
            env_names: self.env_allowlist.clone(),
            limits: Some(self.limits),
        }
    }
}

/// The template narrowed to `requested`. An absent requested limit set
/// keeps the template's limits; a requested limit never raises one.
pub fn effective(template: &Template, requested: &pb::WorkspaceAuthority) -> Template {
    let asked = operations(&requested.operations);
    let limits = match requested.limits {
        None => template.limits,
        Some(r) => {
            let t = template.limits;
            pb::WorkspaceLimits {
                max_file_bytes: t.max_file_bytes.min(r.max_file_bytes),
                max_list_entries: t.max_list_entries.min(r.max_list_entries),
                max_output_bytes: t.max_output_bytes.min(r.max_output_bytes),
                max_iterations: t.max_iterations.min(r.max_iterations),
                wall_clock_ms: t.wall_clock_ms.min(r.wall_clock_ms),
            }
        }
    };
    Template {
        operations: template.operations.intersection(&asked).copied().collect(),
        commands: template
            .commands
            .iter()
            .filter(|(id, _)| requested.command_ids.contains(id))
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect(),
        env_allowlist: template.env_allowlist.iter().filter(|n| requested.env_names.contains(n)).cloned().collect(),
        limits,
        network: template.network,
    }
}

#[cfg(test)]
mod tests;

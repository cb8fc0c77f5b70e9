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
mod tests {
    use super::*;

    fn template() -> Template {
        Template::from_assignment(&pb::WorkspaceAssignment {
            r#ref: "site".into(),
            root: "/w/site".into(),
            operations: vec![Op::Read.into(), Op::List.into(), Op::Command.into()],
            commands: vec![
                pb::WorkspaceCommandTemplate {
                    id: "test".into(),
                    argv: vec!["make".into(), "test".into()],
                    timeout_ms: 9,
                    limits: Some(pb::CommandLimits { max_processes: 7, ..Default::default() }),
                },
                pb::WorkspaceCommandTemplate {
                    id: "lint".into(),
                    argv: vec!["make".into()],
                    timeout_ms: 9,
                    limits: None,
                },
            ],
            env_allowlist: vec!["PATH".into(), "HOME".into()],
            limits: Some(pb::WorkspaceLimits {
                max_file_bytes: 100,
                max_list_entries: 10,
                max_output_bytes: 50,
                max_iterations: 4,
                wall_clock_ms: 1000,
            }),
            network: true,
        })
    }

    #[test]
    fn the_edge_can_only_narrow_the_catalog() {
        let requested = pb::WorkspaceAuthority {
            // write is not in the catalog; 99 is no operation at all.
            operations: vec![Op::Read.into(), Op::Write.into(), Op::Command.into(), 99],
            command_ids: vec!["test".into(), "rm-rf".into()],
            env_names: vec!["PATH".into(), "AWS_SECRET_ACCESS_KEY".into()],
            limits: Some(pb::WorkspaceLimits {
                max_file_bytes: 1 << 40,
                max_list_entries: 5,
                max_output_bytes: 50,
                max_iterations: 100,
                wall_clock_ms: 10,
            }),
        };
        let granted = effective(&template(), &requested);
        assert_eq!(granted.operations, BTreeSet::from([Op::Read, Op::Command]));
        assert_eq!(granted.commands.keys().collect::<Vec<_>>(), ["test"]);
        assert_eq!(granted.commands["test"].argv, ["make", "test"], "argv comes from the catalog");
        let limits = granted.commands["test"].limits;
        assert_eq!(limits.max_processes, 7, "bounds come from the catalog");
        assert_eq!(
            limits.max_memory_bytes,
            iop_proto::config::CommandLimits::default_max_memory_bytes(),
            "0 is the default"
        );
        assert_eq!(template().commands["lint"].limits, iop_proto::config::CommandLimits::default());
        assert_eq!(granted.env_allowlist, ["PATH"]);
        assert_eq!(
            granted.limits,
            pb::WorkspaceLimits {
                max_file_bytes: 100,
                max_list_entries: 5,
                max_output_bytes: 50,
                max_iterations: 4,
                wall_clock_ms: 10
            }
        );
        assert_eq!(granted.to_wire().command_ids, ["test"]);
        assert!(granted.network, "the network grant is the catalog's, not the request's");
    }

    #[test]
    fn an_empty_authority_grants_nothing_and_absent_limits_keep_the_catalogs() {
        let granted = effective(&template(), &pb::WorkspaceAuthority::default());
        assert!(granted.operations.is_empty() && granted.commands.is_empty() && granted.env_allowlist.is_empty());
        assert_eq!(granted.limits, template().limits);
        let bare = Template::from_assignment(&pb::WorkspaceAssignment::default());
        assert_eq!(bare.limits, iop_proto::config::WorkspaceLimits::default().into());
    }
}

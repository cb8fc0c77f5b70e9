//! Workspaces, the Mac owner's half of the consent: a directory the cluster
//! admin declared for this node (`NodeConfigPayload.workspaces`) is
//! accepted only if it lies inside one of the owner's
//! `workspaces.allowed_roots`, exists, is a directory, and neither it nor any
//! directory on its path is a symbolic link. Each accepted root is opened
//! (`O_DIRECTORY | O_NOFOLLOW`) and the handle held for the connection; the
//! file and command executors work beneath these handles. Every entry gets a
//! closed status for `NodeReady`; a bad entry never stops the node from
//! serving its providers.
//!
//! The allowed-roots check is lexical and comes first, so the Edge cannot
//! learn anything about paths outside them (not even whether they exist).

pub mod authority;
pub mod cleanup;
pub mod command;
pub mod disk;
pub mod files;
pub mod runtime;
pub mod sandbox;

use std::collections::HashMap;
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iop_proto::config::check_workspace_root;
use iop_proto::pb::{self, WorkspaceState};

/// An accepted workspace: its root, the directory handle held for it, and
/// the most any request on it may be granted.
#[derive(Debug)]
pub struct Workspace {
    pub root: PathBuf,
    pub dir: File,
    pub template: authority::Template,
}

/// The workspaces of one connection, by ref.
#[derive(Debug, Default)]
pub struct WorkspaceCatalog {
    accepted: HashMap<String, Arc<Workspace>>,
}

impl WorkspaceCatalog {
    pub fn get(&self, reference: &str) -> Option<&Arc<Workspace>> {
        self.accepted.get(reference)
    }

    pub fn len(&self) -> usize {
        self.accepted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.accepted.is_empty()
    }
}

/// The owner's allowed roots as the checks compare them: each resolved once
/// (following links there is the owner's choice, e.g. macOS `/tmp`); one
/// that does not resolve allows nothing (logged).
pub fn resolve_allowed_roots(configured: &[PathBuf]) -> Vec<PathBuf> {
    configured
        .iter()
        .filter_map(|root| match std::fs::canonicalize(root) {
            Ok(resolved) => Some(resolved),
            Err(e) => {
                tracing::warn!(error = %e, "an allowed workspace root does not resolve; it allows nothing");
                None
            }
        })
        .collect()
}

/// Checks every assigned workspace against `allowed` (resolved roots) and
/// the node's own files (`node_files` says whether a root overlaps them).
pub fn admit(
    allowed: &[PathBuf],
    node_files: &dyn Fn(&Path) -> bool,
    assignments: &[pb::WorkspaceAssignment],
) -> (WorkspaceCatalog, Vec<pb::WorkspaceStatus>) {
    let mut catalog = WorkspaceCatalog::default();
    let mut statuses = Vec::with_capacity(assignments.len());
    for a in assignments {
        let opened = open_root(allowed, &a.root).and_then(|dir| match node_files(Path::new(&a.root)) {
            true => Err(WorkspaceState::NodeFiles),
            false => Ok(dir),
        });
        let state = match opened {
            Ok(dir) => {
                let template = authority::Template::from_assignment(a);
                let workspace = Workspace { root: PathBuf::from(&a.root), dir, template };
                catalog.accepted.insert(a.r#ref.clone(), Arc::new(workspace));
                WorkspaceState::Accepted
            }
            Err(state) => {
                // The reason only: paths stay out of logs.
                tracing::warn!(workspace = %a.r#ref, reason = state.as_str_name(), "workspace not accepted");
                state
            }
        };
        statuses.push(pb::WorkspaceStatus { r#ref: a.r#ref.clone(), state: state.into() });
    }
    (catalog, statuses)
}

fn open_root(allowed: &[PathBuf], root: &str) -> Result<File, WorkspaceState> {
    check_workspace_root(root).map_err(|_| WorkspaceState::InvalidPath)?;
    let path = Path::new(root);
    if !allowed.iter().any(|a| path.starts_with(a)) {
        return Err(WorkspaceState::OutsideAllowedRoots);
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => WorkspaceState::NotFound,
        // A file where a directory of the path should be.
        ErrorKind::NotADirectory => WorkspaceState::NotADirectory,
        _ => WorkspaceState::Unreadable,
    })?;
    if meta.file_type().is_symlink() {
        return Err(WorkspaceState::Symlink);
    }
    if !meta.is_dir() {
        return Err(WorkspaceState::NotADirectory);
    }
    // A link on the way there makes the resolved path differ.
    let resolved = std::fs::canonicalize(path).map_err(|_| WorkspaceState::Unreadable)?;
    if resolved != path.components().collect::<PathBuf>() {
        return Err(WorkspaceState::Symlink);
    }
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|_| WorkspaceState::Unreadable)?;
    // What was opened is what was checked (not swapped in between).
    let opened = dir.metadata().map_err(|_| WorkspaceState::Unreadable)?;
    if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
        return Err(WorkspaceState::Symlink);
    }
    Ok(dir)
}

#[cfg(test)]
mod tests;

//! The workspace command sandbox (docs/security.md): what a command a
//! model may run on the owner's machine can reach, and the guarantee that
//! nothing it started outlives it.
//!
//! - [`policy`]: one pure function from the workspace's authority to a
//!   [`Policy`] value (paths readable, writable, denied; network).
//! - [`seatbelt`]: the macOS renderer (an SBPL profile for `sandbox-exec`).
//! - `linux`: the Linux applier (Landlock, seccomp, a read-only `.iop`).
//! - [`supervisor`]: the process each command runs under; it applies the
//!   sandbox between `fork` and `exec` and ends every process the command
//!   started.
//!
//! The node runs the supervisor as its own executable with a hidden first
//! argument; every binary that runs the node (`iop-node`, `iop-dev`) calls
//! [`main_if_invoked`] first thing in `main`.

pub mod policy;
pub mod seatbelt;
pub mod supervisor;

#[cfg(target_os = "linux")]
mod linux;

pub use policy::{Authority, Policy};
use serde::{Deserialize, Serialize};

/// First argument that makes a binary the command supervisor.
pub const EXEC_ARG: &str = "__iop-sandbox-exec";
/// First argument that makes a binary report what sandbox this machine has.
pub const PROBE_ARG: &str = "__iop-sandbox-probe";

/// What the node asks the supervisor to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invocation {
    /// `None`: no sandbox (the owner's `workspaces.unsandboxed_commands`).
    pub policy: Option<Policy>,
    /// Time between `SIGTERM` and `SIGKILL` when the node ends the command.
    pub grace_ms: u64,
    pub argv: Vec<String>,
    /// The user the command runs as, when the node runs as root
    /// (`workspaces.command_user`); `None`: the node's own.
    pub user: Option<CommandUser>,
    pub limits: Limits,
}

/// An unprivileged user and group a command runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandUser {
    pub uid: u32,
    pub gid: u32,
}

/// What the supervisor bounds (the workspace's disk budget is the node's:
/// it watches the root, not the processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Processes of the command's tree at once.
    pub processes: u32,
    /// Resident memory of the tree.
    pub memory_bytes: u64,
    /// CPU time of the tree, finished processes included.
    pub cpu_seconds: u64,
    /// The largest file one process may write (`RLIMIT_FSIZE`).
    pub file_size_bytes: u64,
}

/// Which bound ended a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Processes,
    Memory,
    Cpu,
    FileSize,
}

/// How a supervised command ended (one JSON line on the status descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Report {
    Exited {
        code: i32,
    },
    Signaled {
        signal: i32,
    },
    /// A bound of [`Limits`] was hit: the whole tree was killed.
    LimitExceeded {
        limit: Limit,
    },
    /// The program could not be started (nothing ran).
    SpawnFailed,
    /// The sandbox could not be applied (nothing ran).
    SandboxFailed,
}

/// A denial of docs/security.md's threat model this machine cannot make (the
/// node logs each at start and reports them to the Edge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gap {
    /// Landlock before ABI 6: a command may signal its user's processes.
    SignalScope,
    /// Landlock before ABI 4: TCP is not restricted.
    Tcp,
    /// No mount namespace: `.iop` stays writable.
    ReservedWritable,
    /// The capability bounding set cannot be cleared (not root, no user
    /// namespace); `no_new_privs` still keeps every capability out of reach.
    BoundingSet,
    /// macOS: no seccomp, so `setpriority` on the user's other processes
    /// is not refused.
    Priority,
}

/// The sandbox mechanism a machine has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxKind {
    Landlock,
    Seatbelt,
}

/// What [`PROBE_ARG`] finds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    pub kind: SandboxKind,
    /// E.g. the Landlock ABI, for the node's log.
    pub detail: String,
    /// What this machine's sandbox cannot refuse (sorted).
    pub gaps: Vec<Gap>,
}

/// Runs the supervisor or the probe when this process was started as one
/// (its exit code), else `None`.
pub fn main_if_invoked() -> Option<i32> {
    // `args_os`: the binary's own arguments (a config path, say) need not
    // be UTF-8, and this runs before it parses them.
    let mut args = std::env::args_os();
    let first = args.nth(1)?;
    match first.to_str() {
        Some(EXEC_ARG) => Some(match args.next().and_then(|a| a.into_string().ok()) {
            Some(invocation) => supervisor::exec_main(&invocation),
            None => 2,
        }),
        Some(PROBE_ARG) => Some(match probe() {
            Ok(found) => {
                println!("{}", serde_json::to_string(&found).unwrap_or_default());
                0
            }
            Err(why) => {
                println!("{why}");
                1
            }
        }),
        _ => None,
    }
}

#[cfg(target_os = "linux")]
fn probe() -> Result<Probe, String> {
    linux::probe().map_err(|e| e.to_string())
}

#[cfg(target_os = "macos")]
fn probe() -> Result<Probe, String> {
    // The profile commands get (for an empty directory of its own), run for
    // real on `true`: if this works, so does a command's start.
    let dir = std::env::temp_dir().join(format!("iop-sandbox-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("probe directory: {e}"))?;
    let root = std::fs::canonicalize(&dir).map_err(|e| format!("probe directory: {e}"))?;
    let authority = Authority { root: &root, network: false, owner_read: &[], node_files: &[], home: None };
    let profile = seatbelt::profile(&policy::policy(&authority, &policy::system_read_paths()));
    let line = profile.command_line(&["/usr/bin/true".to_string()]);
    let status = std::process::Command::new(&line[0]).args(&line[1..]).current_dir(&root).status();
    let _ = std::fs::remove_dir(&root);
    let status = status.map_err(|e| format!("{}: {e}", seatbelt::SANDBOX_EXEC))?;
    if !status.success() {
        return Err(format!("{} failed: {status}", seatbelt::SANDBOX_EXEC));
    }
    Ok(Probe { kind: SandboxKind::Seatbelt, detail: "sandbox-exec".into(), gaps: vec![Gap::Priority] })
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn probe() -> Result<Probe, String> {
    Err("no sandbox on this platform".into())
}

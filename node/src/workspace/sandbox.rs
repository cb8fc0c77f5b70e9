//! How this node runs workspace commands, decided once at start
//! (docs/security.md): in the OS sandbox this machine has (Landlock on
//! Linux, Seatbelt on macOS, found by running the supervisor's probe for
//! real), without one only when the owner set
//! `workspaces.unsandboxed_commands: true`, or not at all. The decision is
//! logged, sent with every `Register` and shown in the Edge's
//! `/admin/v1/nodes`.
//!
//! The policy itself is [`iop_sandbox::policy`]: this module only supplies
//! what the node knows (its own files, the owner's read paths, the home
//! directory whose secrets stay denied), the supervisor's path, and the
//! user commands run as: the node's own, or, when the node runs as root,
//! `workspaces.command_user` (default `nobody`; never root: a node as root
//! that has no such user refuses every command).

use std::path::{Path, PathBuf};

use iop_proto::pb;
pub use iop_sandbox::main_if_invoked;
use iop_sandbox::{Authority, CommandUser, Policy, Probe};

use crate::config::NodeConfig;

/// How the node finds its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detection {
    /// Run the supervisor's probe (always, outside tests).
    Probe,
    /// Act as a machine without a sandbox (`iop-node --test-no-sandbox`).
    AssumeNone,
}

/// What commands run under here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxMode {
    Sandboxed(Probe),
    /// No sandbox, allowed by the owner.
    Unsandboxed,
    /// No sandbox, not allowed: commands are refused.
    Refused,
}

/// Everything a command needs from the node process.
#[derive(Debug, Clone)]
pub struct CommandEnvironment {
    /// The executable that runs as each command's supervisor (this one).
    pub supervisor: PathBuf,
    pub mode: SandboxMode,
    /// Who commands run as: `None`, the node's own user (it is not root).
    pub user: Option<CommandUser>,
    owner_read: Vec<PathBuf>,
    node_files: Vec<PathBuf>,
    home: Option<PathBuf>,
}

/// The default of `workspaces.command_user`.
pub const DEFAULT_COMMAND_USER: &str = "nobody";

/// Why a command cannot run here at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxUnavailable;

impl CommandEnvironment {
    /// Probes the machine with `supervisor` and applies the owner's choice.
    pub async fn detect(config: &NodeConfig, supervisor: PathBuf, detection: Detection) -> Self {
        // SAFETY: geteuid has no preconditions.
        let user = match command_user(unsafe { libc::geteuid() }, config.workspaces.command_user.as_deref()) {
            Ok(user) => user,
            Err(why) => {
                tracing::warn!(reason = %why, "workspace commands are refused: the node runs as root and has no user to run them as");
                return Self::new(config, supervisor, SandboxMode::Refused);
            }
        };
        if let Some(user) = user {
            tracing::info!(
                uid = user.uid,
                gid = user.gid,
                "the node runs as root: workspace commands run as workspaces.command_user"
            );
        }
        let found = match detection {
            Detection::Probe => probe(&supervisor).await,
            Detection::AssumeNone => Err("--test-no-sandbox".to_string()),
        };
        let mode = match (found, config.workspaces.unsandboxed_commands) {
            (Ok(probe), _) => {
                tracing::info!(sandbox = ?probe.kind, detail = %probe.detail, "workspace commands run in the OS sandbox");
                for gap in &probe.gaps {
                    tracing::warn!(
                        gap = wire_gap(*gap).label(),
                        "the command sandbox cannot refuse this here (docs/security.md)"
                    );
                }
                SandboxMode::Sandboxed(probe)
            }
            (Err(why), true) => {
                tracing::warn!(
                    reason = %why,
                    "NO COMMAND SANDBOX on this machine; workspace commands run WITHOUT one because the node config sets workspaces.unsandboxed_commands: true"
                );
                SandboxMode::Unsandboxed
            }
            (Err(why), false) => {
                tracing::warn!(
                    reason = %why,
                    "no command sandbox on this machine: workspace commands are refused (workspaces.unsandboxed_commands: true runs them without one)"
                );
                SandboxMode::Refused
            }
        };
        Self { user, ..Self::new(config, supervisor, mode) }
    }

    /// Runs commands as the node's own user (`detect` sets the command
    /// user of a node run as root).
    pub fn new(config: &NodeConfig, supervisor: PathBuf, mode: SandboxMode) -> Self {
        let tls = &config.tls;
        let files = [Some(&tls.ca_file), Some(&tls.cert_file), Some(&tls.key_file), config.source.as_ref()];
        let home = std::env::var_os("HOME").map(|h| absolute(Path::new(&h)));
        Self {
            supervisor,
            mode,
            user: None,
            owner_read: config.workspaces.command_read_paths.iter().map(|p| absolute(p)).collect(),
            node_files: protected(files.into_iter().flatten().map(|p| absolute(p)), home.as_deref()),
            home,
        }
    }

    /// What the sandbox cannot refuse here, as `Register` reports it.
    pub fn wire_gaps(&self) -> Vec<i32> {
        match &self.mode {
            SandboxMode::Sandboxed(probe) => probe.gaps.iter().map(|g| wire_gap(*g).into()).collect(),
            SandboxMode::Unsandboxed | SandboxMode::Refused => Vec::new(),
        }
    }

    /// As `Register` reports it.
    pub fn wire(&self) -> pb::CommandSandbox {
        match &self.mode {
            SandboxMode::Sandboxed(probe) => match probe.kind {
                iop_sandbox::SandboxKind::Landlock => pb::CommandSandbox::Landlock,
                iop_sandbox::SandboxKind::Seatbelt => pb::CommandSandbox::Seatbelt,
            },
            SandboxMode::Unsandboxed => pb::CommandSandbox::Unsandboxed,
            SandboxMode::Refused => pb::CommandSandbox::Unavailable,
        }
    }

    /// The policy of a command in `root` (`None`: run unsandboxed, as the
    /// owner allowed).
    pub fn policy(&self, root: &Path, network: bool) -> Result<Option<Policy>, SandboxUnavailable> {
        match self.mode {
            SandboxMode::Refused => Err(SandboxUnavailable),
            SandboxMode::Unsandboxed => Ok(None),
            SandboxMode::Sandboxed(_) => {
                let authority = Authority {
                    root,
                    network,
                    owner_read: &self.owner_read,
                    node_files: &self.node_files,
                    home: self.home.as_deref(),
                };
                Ok(Some(iop_sandbox::policy::policy(&authority, &iop_sandbox::policy::system_read_paths())))
            }
        }
    }

    /// Whether `root` holds or lies in the node's own files
    /// ([`iop_sandbox::policy::overlaps`]).
    pub fn overlaps_node_files(&self, root: &Path) -> bool {
        iop_sandbox::policy::overlaps(root, &self.node_files)
    }
}

fn wire_gap(gap: iop_sandbox::Gap) -> pb::SandboxGap {
    match gap {
        iop_sandbox::Gap::SignalScope => pb::SandboxGap::SignalScope,
        iop_sandbox::Gap::Tcp => pb::SandboxGap::Tcp,
        iop_sandbox::Gap::ReservedWritable => pb::SandboxGap::ReservedWritable,
        iop_sandbox::Gap::BoundingSet => pb::SandboxGap::BoundingSet,
        iop_sandbox::Gap::Priority => pb::SandboxGap::Priority,
    }
}

/// The user a node with effective uid `euid` runs commands as: its own
/// (`None`) unless it is root; then `name` (the config's
/// `workspaces.command_user`, default [`DEFAULT_COMMAND_USER`]), which must
/// exist and must not be root.
pub fn command_user(euid: u32, name: Option<&str>) -> Result<Option<CommandUser>, String> {
    if euid != 0 {
        return Ok(None);
    }
    let name = name.unwrap_or(DEFAULT_COMMAND_USER);
    let Some(user) = lookup_user(name) else {
        return Err(format!("workspaces.command_user `{name}` is no user on this machine"));
    };
    if user.uid == 0 || user.gid == 0 {
        return Err(format!("workspaces.command_user `{name}` is root (uid or gid 0)"));
    }
    Ok(Some(user))
}

/// The uid and primary gid of user `name` (`getpwnam_r`).
fn lookup_user(name: &str) -> Option<CommandUser> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain data filled by getpwnam_r, which writes its
    // strings into `buf` (of the length given) and sets `found`.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(name.as_ptr(), &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found);
        if rc != 0 || found.is_null() {
            return None;
        }
        Some(CommandUser { uid: pwd.pw_uid, gid: pwd.pw_gid })
    }
}

/// Runs the supervisor's probe: what sandbox this machine has, tried for
/// real in a throwaway process.
async fn probe(supervisor: &Path) -> Result<Probe, String> {
    let probe = tokio::process::Command::new(supervisor)
        .arg(iop_sandbox::PROBE_ARG)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .await;
    match probe {
        Ok(out) if out.status.success() => serde_json::from_slice::<Probe>(&out.stdout).map_err(|e| e.to_string()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stdout).trim().chars().take(200).collect()),
        Err(e) => Err(e.to_string()),
    }
}

/// The node's own files and the directories that hold them, except `/` and
/// the home directory (a key kept in `~` protects the key, not all of `~`).
/// Keep the node's files in a directory of their own, as `iop-operator
/// node-bundle` and `iop-edge pki node` write them.
fn protected(files: impl Iterator<Item = PathBuf>, home: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for file in files {
        if let Some(dir) = file.parent().filter(|d| d.parent().is_some() && Some(*d) != home) {
            out.push(dir.to_path_buf());
        }
        out.push(file);
    }
    out.sort();
    out.dedup();
    out
}

/// `path` made absolute and free of links where it exists.
fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()))
}

#[cfg(test)]
impl CommandEnvironment {
    /// `mode` with the test supervisor, no owner read paths, and
    /// `node_files` as the node's own.
    pub fn for_tests(mode: SandboxMode, node_files: Vec<PathBuf>) -> Self {
        Self { supervisor: test_supervisor(), mode, user: None, owner_read: Vec::new(), node_files, home: None }
    }
}

/// The supervisor binary for tests in this crate: `iop-node`, built next
/// to the test executable (Cargo builds it for the crate's integration
/// tests).
#[cfg(test)]
pub fn test_supervisor() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join("iop-node");
    assert!(path.exists(), "{} not built: run `cargo build -p iop-node --bins` first", path.display());
    path
}

/// Whether process `pid` still runs: it exists and is not a zombie (an
/// orphan may wait a moment for its new parent to reap it). Linux reads
/// `/proc`; macOS has none, so POSIX `ps` answers there (empty when the
/// process is gone).
#[cfg(test)]
pub fn running(pid: i32) -> bool {
    if cfg!(target_os = "linux") {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])))
    } else {
        let ps = std::process::Command::new("ps").args(["-o", "stat=", "-p", &pid.to_string()]).output();
        ps.is_ok_and(|out| {
            let state = String::from_utf8_lossy(&out.stdout);
            !state.trim().is_empty() && !state.trim_start().starts_with('Z')
        })
    }
}

/// `setsid PROGRAM ARGS...` for test scripts on every platform: macOS has
/// no `setsid(1)`; both have perl. Dies loudly if `setsid(2)` fails.
#[cfg(test)]
pub const SETSID: &str = "perl -MPOSIX -e 'POSIX::setsid() or die qq(setsid: $!); exec @ARGV or die qq(exec: $!)'";

#[cfg(test)]
mod tests;

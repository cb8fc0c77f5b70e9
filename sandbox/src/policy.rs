//! What a workspace command may touch: one pure function from the
//! workspace's authority to a [`Policy`] value. The platform renderers
//! ([`crate::seatbelt`] for macOS, `crate::linux` for Landlock and seccomp)
//! only translate it; neither adds or drops a path of its own.
//!
//! The rules, in order of precedence:
//! 1. The node's own files (its config, certificate, key and CA, and the
//!    directories holding them) are never readable or writable, whatever
//!    else allows them.
//! 2. Writes: beneath the workspace root only, never beneath its reserved
//!    `.iop` (the node's per-request state).
//! 3. Reads (and execution): the root, the platform's system directories
//!    ([`system_read_paths`]), and what the Mac's owner added in the node
//!    config (`workspaces.command_read_paths`). The home directory is not
//!    among them, and the owner's secrets in it ([`OWNER_SECRETS`]: `~/.ssh`,
//!    keychains, cloud credentials) stay denied even where the owner made a
//!    directory holding them readable. Neither is the machine's private
//!    material ([`SYSTEM_DENIED`]: `/etc/shadow`, `/etc/ssl/private`, ...).
//! 4. A few device files ([`DEVICES`]) are readable and writable; no
//!    terminal among them (`/dev/tty` would reach the node's terminal).
//! 5. Network: none unless the workspace grants it (`network: true`).
//! 6. Other processes: none (signals and ptrace only within the sandbox),
//!    whatever the paths say.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The node's reserved directory beneath a workspace root.
pub const RESERVED: &str = ".iop";

/// Device files every command may read and write (nothing else in `/dev`).
pub const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// The owner's secrets beneath the home directory: never readable, even
/// when the owner lists `~` (or a directory holding one) in
/// `workspaces.command_read_paths`.
pub const OWNER_SECRETS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials.toml",
    ".password-store",
    "Library/Keychains",
    "Library/Cookies",
    ".local/share/keyrings",
];

/// What the workspace and the node's owner grant a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority<'a> {
    /// The accepted workspace root (absolute, without links).
    pub root: &'a Path,
    /// The workspace's `network` grant.
    pub network: bool,
    /// The owner's extra readable paths (node config `workspaces.command_read_paths`).
    pub owner_read: &'a [PathBuf],
    /// The node's own config, key, certificate and CA files, and the
    /// directories that hold them (the node decides which; see its
    /// `workspace::sandbox`).
    pub node_files: &'a [PathBuf],
    /// The owner's home directory, whose [`OWNER_SECRETS`] are denied.
    pub home: Option<&'a Path>,
}

/// A command's sandbox, as every renderer reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Read, write, execute (but see `reserved` and `denied`).
    pub root: PathBuf,
    /// `<root>/.iop`: never written.
    pub reserved: PathBuf,
    /// Read and execute only; sorted, none inside a denied path.
    pub read: Vec<PathBuf>,
    /// Read and write device files.
    pub devices: Vec<PathBuf>,
    /// Never read or written; sorted.
    pub denied: Vec<PathBuf>,
    pub network: bool,
}

/// The system directories a command reads on this platform (the linker,
/// libraries, interpreters, `/etc` for users, time zones and certificates).
pub fn system_read_paths() -> Vec<PathBuf> {
    let paths: &[&str] = if cfg!(target_os = "macos") {
        &[
            "/bin",
            "/sbin",
            "/usr",
            "/System",
            "/Library",
            "/Applications",
            "/opt",
            "/private/etc",
            "/private/var/db/timezone",
            "/etc",
        ]
    } else {
        // Not all of `/proc`: a Landlock domain may still read another
        // process's `/proc/<pid>/environ` (seen on Linux 6.18, where ptrace
        // and `mem` are refused), so the command's first process reads its
        // own `/proc/self` (bound when the sandbox is applied, in that
        // process; its children do not have theirs) and a few machine-wide
        // files, never another process's directory.
        &[
            "/bin",
            "/sbin",
            "/usr",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            "/etc",
            "/opt",
            // Of `/sys`, what runtimes read to size themselves: online CPUs
            // (glibc's sysconf, Python, Node) and cgroup limits (Rust, Go,
            // the JVM). Not the rest: devices, firmware, kernel tunables.
            "/sys/devices/system/cpu",
            "/sys/fs/cgroup",
            "/proc/self",
            "/proc/cpuinfo",
            "/proc/meminfo",
            "/proc/stat",
            "/proc/version",
            "/proc/loadavg",
            "/proc/uptime",
            "/proc/filesystems",
        ]
    };
    paths.iter().map(PathBuf::from).collect()
}

/// Files of the system read paths no command reads even so (root-only on
/// a normal system, but a node may run as root). `/proc/self/net` is the
/// machine's socket tables (the network namespace is the node's).
pub const SYSTEM_DENIED: &[&str] = &[
    // Terminals (should the owner make `/dev` readable): the node's own
    // may be one of them.
    "/dev/tty",
    "/dev/console",
    "/dev/ptmx",
    "/dev/pts",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
    "/etc/security/opasswd",
    "/proc/self/net",
    "/private/etc/sudoers",
    "/private/etc/sudoers.d",
    "/private/etc/ssh",
    "/private/etc/master.passwd",
];

/// The policy of a command in `authority`'s workspace. `system` is
/// [`system_read_paths`] outside tests.
pub fn policy(authority: &Authority<'_>, system: &[PathBuf]) -> Policy {
    let mut denied: Vec<PathBuf> = authority
        .node_files
        .iter()
        .filter(|p| p.is_absolute() && p.parent().is_some())
        .cloned()
        .chain(SYSTEM_DENIED.iter().map(PathBuf::from))
        .chain(
            authority
                .home
                .filter(|h| h.is_absolute())
                .into_iter()
                .flat_map(|home| OWNER_SECRETS.iter().map(|s| home.join(s))),
        )
        .collect();
    denied.sort();
    denied.dedup();
    let mut read: Vec<PathBuf> = system
        .iter()
        .chain(authority.owner_read)
        .filter(|p| p.is_absolute() && !denied.iter().any(|d| p.starts_with(d)))
        .cloned()
        .collect();
    read.sort();
    read.dedup();
    Policy {
        root: authority.root.to_path_buf(),
        reserved: authority.root.join(RESERVED),
        read,
        devices: DEVICES.iter().map(PathBuf::from).collect(),
        denied,
        network: authority.network,
    }
}

/// Whether a workspace root holds, or lies in, one of the node's own files
/// and directories (`Authority::node_files`): such a root is refused, since
/// its files would be the tools' to read and the commands' to write.
pub fn overlaps(root: &Path, node_files: &[PathBuf]) -> bool {
    node_files.iter().any(|p| p.starts_with(root) || root.starts_with(p))
}

/// The read paths as rules that cannot express "except": a path that
/// contains a denied path is replaced by its children (`list`), recursively
/// along the way to the denied path, so the denied path and nothing else
/// is left out. (Landlock only adds access; it has no deny rule.)
pub fn carve(read: &[PathBuf], denied: &[PathBuf], list: &dyn Fn(&Path) -> Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for path in read {
        carve_one(path, denied, list, &mut out);
    }
    out
}

fn carve_one(path: &Path, denied: &[PathBuf], list: &dyn Fn(&Path) -> Vec<PathBuf>, out: &mut Vec<PathBuf>) {
    if denied.iter().any(|d| path.starts_with(d)) {
        return;
    }
    if !denied.iter().any(|d| d.starts_with(path)) {
        out.push(path.to_path_buf());
        return;
    }
    for child in list(path) {
        carve_one(&child, denied, list, out);
    }
}

#[cfg(test)]
mod tests;

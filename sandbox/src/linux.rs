//! The Linux renderer and applier: Landlock for the file system, TCP and
//! scoping (signals and abstract UNIX sockets stay inside the sandbox; a
//! Landlock domain never ptraces, and so never reads `/proc/<pid>/environ`
//! or `mem` of, a process outside it), a seccomp filter for the sockets
//! Landlock does not cover (UDP, UNIX, raw: `socket(2)` fails with `EACCES`
//! when the workspace has no network), and, where the node may create a
//! mount namespace (as root, or with unprivileged user namespaces), a
//! read-only bind of the reserved `.iop` (Landlock only adds access, so it
//! cannot take writes away beneath the writable root).
//!
//! [`apply`] runs in the supervisor's child between `fork` and `exec`; the
//! supervisor is single-threaded, so allocating there is safe.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope,
};

use crate::policy::{Policy, RESERVED, carve};

/// The newest Landlock ABI whose rights this code was written and tested
/// against (newer kernels are used at this level; older ones best-effort).
const ABI_VETTED: ABI = ABI::V6;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("Landlock is not enforced by this kernel")]
    NotEnforced,
    #[error("Landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("seccomp: {0}")]
    Seccomp(String),
}

/// Restricts the calling (single-threaded) process to `policy`; `root` is
/// the workspace root's held handle. Whether `.iop` could be made
/// read-only is the probe's to report (`Probe::reserved_read_only`): this
/// runs between `fork` and `exec`, where nothing can be logged.
pub fn apply(policy: &Policy, root: BorrowedFd<'_>) -> Result<(), ApplyError> {
    reserved_read_only(root);
    restrict(policy, root)?;
    if !policy.network {
        deny_sockets()?;
    }
    Ok(())
}

fn restrict(policy: &Policy, root: BorrowedFd<'_>) -> Result<(), ApplyError> {
    let abi = ABI_VETTED;
    let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi))?.scope(Scope::from_all(abi))?;
    if !policy.network {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
    }
    let mut created = ruleset.create()?;
    let root = root.try_clone_to_owned().map_err(|_| ApplyError::NotEnforced)?;
    created = created.add_rule(PathBeneath::new(root, AccessFs::from_all(abi)))?;
    let list = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir).map(|entries| entries.flatten().map(|e| e.path()).collect()).unwrap_or_default()
    };
    for path in carve(&policy.read, &policy.denied, &list) {
        // A system path this machine does not have (`/lib32`) is no rule.
        let Ok(fd) = PathFd::new(&path) else { continue };
        let is_dir = std::fs::metadata(&path).is_ok_and(|m| m.is_dir());
        let access =
            if is_dir { AccessFs::from_read(abi) } else { AccessFs::from_read(abi) & AccessFs::from_file(abi) };
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    let device: BitFlags<AccessFs> = AccessFs::from_file(abi) & !AccessFs::Execute;
    for path in &policy.devices {
        let Ok(fd) = PathFd::new(path) else { continue };
        created = created.add_rule(PathBeneath::new(fd, device))?;
    }
    let status = created.restrict_self()?;
    match status.ruleset {
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        _ => Err(ApplyError::NotEnforced),
    }
}

/// `socket(2)` and `io_uring_setup(2)` (which can open sockets without
/// `socket(2)`) fail with `EACCES`. `socketpair(2)` stays: it reaches no one.
fn deny_sockets() -> Result<(), ApplyError> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
    let arch: TargetArch = std::env::consts::ARCH.try_into().map_err(|e| ApplyError::Seccomp(format!("{e:?}")))?;
    let rules = [(libc::SYS_socket, vec![]), (libc::SYS_io_uring_setup, vec![])].into_iter().collect();
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32), arch)
        .map_err(|e| ApplyError::Seccomp(e.to_string()))?;
    let program: BpfProgram =
        filter.try_into().map_err(|e: seccompiler::BackendError| ApplyError::Seccomp(e.to_string()))?;
    seccompiler::apply_filter(&program).map_err(|e| ApplyError::Seccomp(e.to_string()))
}

/// Makes `<root>/.iop` read-only in a mount namespace of the process's own,
/// if it may create one; `false` otherwise (the command then runs without
/// it; see the module doc). The working directory is the root.
fn reserved_read_only(root: BorrowedFd<'_>) -> bool {
    let name = CString::new(RESERVED).expect("no NUL");
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: plain syscalls on valid descriptors and C strings.
    unsafe {
        // Only a real directory (never a link) is covered.
        let fd = libc::openat(root.as_raw_fd(), name.as_ptr(), flags);
        if fd < 0 {
            return false;
        }
        drop(OwnedFd::from_raw_fd(fd));
        if !new_mount_namespace() {
            return false;
        }
        // Opened again inside the new namespace (a descriptor from the old
        // one cannot be bound here); the working directory moved with it.
        let fd = libc::openat(libc::AT_FDCWD, name.as_ptr(), flags);
        if fd < 0 {
            return false;
        }
        let reserved = OwnedFd::from_raw_fd(fd);
        let target = CString::new(format!("/proc/self/fd/{}", reserved.as_raw_fd())).expect("no NUL");
        let slash = CString::new("/").expect("no NUL");
        let private = libc::MS_REC | libc::MS_PRIVATE;
        if libc::mount(std::ptr::null(), slash.as_ptr(), std::ptr::null(), private, std::ptr::null()) != 0
            || libc::mount(target.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0
        {
            return false;
        }
        // The bind now covers `.iop`; remount that (the new) mount, keeping
        // the flags a user namespace may not drop.
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(name.as_ptr(), &mut stat) != 0 {
            return false;
        }
        let mut remount = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        for (st, ms) in [
            (libc::ST_NOSUID, libc::MS_NOSUID),
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ] {
            if stat.f_flag & st != 0 {
                remount |= ms;
            }
        }
        libc::mount(std::ptr::null(), name.as_ptr(), std::ptr::null(), remount, std::ptr::null()) == 0
    }
}

/// Enters a new mount namespace: directly as root, else inside a new user
/// namespace that maps only the caller's own ids (so after `exec` the
/// command holds no capability in it).
fn new_mount_namespace() -> bool {
    // SAFETY: plain syscalls.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        return unsafe { libc::unshare(libc::CLONE_NEWNS) } == 0;
    }
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        return false;
    }
    std::fs::write("/proc/self/setgroups", "deny").is_ok()
        && std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")).is_ok()
        && std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")).is_ok()
}

/// What this machine offers (run in a throwaway process: it restricts
/// itself): the Landlock ABI in force, and whether `.iop` can be made
/// read-only.
pub fn probe() -> Result<crate::Probe, ApplyError> {
    let reserved_read_only = new_mount_namespace();
    let abi = ABI_VETTED;
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .create()?
        .restrict_self()?;
    if !matches!(status.ruleset, RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced) {
        return Err(ApplyError::NotEnforced);
    }
    deny_sockets()?;
    let abi = match status.landlock {
        landlock::LandlockStatus::Available { effective_abi, .. } => effective_abi as i32,
        _ => 0,
    };
    Ok(crate::Probe { kind: crate::SandboxKind::Landlock, detail: format!("abi {abi}"), reserved_read_only })
}

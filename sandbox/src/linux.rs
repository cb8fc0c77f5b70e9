//! The Linux renderer and applier, in the order [`apply`] takes them:
//! 1. Where the node may create a mount namespace (as root, or with
//!    unprivileged user namespaces), a read-only bind of the reserved `.iop`
//!    (Landlock only adds access, so it cannot take writes away beneath the
//!    writable root).
//! 2. Landlock for the file system, TCP and scoping (signals and abstract
//!    UNIX sockets stay inside the sandbox; a Landlock domain never ptraces,
//!    and so never reads `/proc/<pid>/environ` or `mem` of, a process
//!    outside it). No right to make device nodes or sockets anywhere.
//! 3. [`drop_privileges`]: the capability bounding and ambient sets
//!    cleared, the command user taken (a node run as root), every remaining
//!    capability set emptied, `no_new_privs`.
//! 4. seccomp ([`deny_rules`]): what a command never needs and root's
//!    powers are made of (`reboot`, modules, `bpf`, `perf_event_open`, the
//!    kernel keyring, namespaces, mounts, device nodes, real-time
//!    scheduling), the terminal injections (`TIOCSTI`, `TIOCLINUX`), and
//!    every resource call aimed at another process (`prlimit`,
//!    `setpriority`, `sched_setaffinity`, ... on any pid but its own), so a
//!    command can neither starve nor kill the node or its supervisor
//!    through their limits. Sockets Landlock does not cover (UDP, UNIX,
//!    raw) when the workspace has no network.
//!
//! Why no PID namespace for "the node out of reach": the command would be
//! the namespace's init, which ignores the node's `SIGTERM` unless it set a
//! handler and takes every process with it when it exits, so the supervisor
//! would need an init of its own inside the sandbox to forward signals and
//! report the command's exit. The seccomp rules above refuse the same
//! calls on every kernel that has seccomp, and Landlock's signal scope
//! keeps signals inside the tree (a kernel without it reports the gap
//! `signal_scope`).
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
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::CommandUser;
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
    #[error("dropping privileges: {0}")]
    Privileges(&'static str),
}

/// Restricts the calling (single-threaded) process to `policy` and runs it
/// as `user`; `root` is the workspace root's held handle. Whether `.iop`
/// could be made read-only is the probe's to report (`Probe::gaps`): this
/// runs between `fork` and `exec`, where nothing can be logged.
pub fn apply(policy: &Policy, user: Option<CommandUser>, root: BorrowedFd<'_>) -> Result<(), ApplyError> {
    reserved_read_only(root);
    restrict(policy, root)?;
    drop_privileges(user)?;
    filter(policy.network)
}

/// Every seccomp filter of a command (the probe installs the same, so what
/// it finds is what a command gets): the refusals of [`deny_rules`],
/// `clone3`, the x32 convention, and sockets without `network`.
fn filter(network: bool) -> Result<(), ApplyError> {
    install(&deny_rules()?, SeccompAction::Errno(libc::EPERM as u32))?;
    // `clone3` passes its flags in memory, where seccomp cannot look:
    // refused as absent, so libc falls back to `clone`, whose flags it can.
    install(&[(libc::SYS_clone3, vec![])], SeccompAction::Errno(libc::ENOSYS as u32))?;
    deny_x32()?;
    if !network {
        deny_sockets()?;
    }
    Ok(())
}

/// The capability sets `capset(2)` writes (version 3: two 32-bit words).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Leaves the process with no capability it could use or regain, as
/// `user` when given (the node runs as root), else as the node's own user:
/// - the bounding set cleared (where the process may: root, or inside the
///   user namespace of `reserved_read_only`), so not even root's `exec`
///   regains a capability; the ambient set cleared;
/// - `user`'s ids taken, with no supplementary groups;
/// - effective, permitted and inheritable emptied;
/// - `no_new_privs`: no set-id or file-capability program raises them.
///
/// Also used without a sandbox (the owner's `unsandboxed_commands`): never
/// root's powers, sandbox or not.
pub fn drop_privileges(user: Option<CommandUser>) -> Result<(), ApplyError> {
    // SAFETY: prctl, setgroups, setres[ug]id and capset with valid
    // arguments; nothing here touches memory the process does not own.
    unsafe {
        for cap in 0..64 {
            // EINVAL past the kernel's last capability; EPERM without
            // CAP_SETPCAP (a plain user without a namespace: the probe
            // reports it as a gap, and no_new_privs holds).
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                break;
            }
        }
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        if let Some(user) = user {
            if libc::setgroups(0, std::ptr::null()) != 0 {
                return Err(ApplyError::Privileges("setgroups"));
            }
            if libc::setresgid(user.gid, user.gid, user.gid) != 0 {
                return Err(ApplyError::Privileges("setresgid"));
            }
            if libc::setresuid(user.uid, user.uid, user.uid) != 0 {
                return Err(ApplyError::Privileges("setresuid"));
            }
            if libc::geteuid() != user.uid || libc::getegid() != user.gid {
                return Err(ApplyError::Privileges("ids"));
            }
        }
        let header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
        let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        if libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) != 0 {
            return Err(ApplyError::Privileges("capset"));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(ApplyError::Privileges("no_new_privs"));
        }
    }
    Ok(())
}

type Rules = Vec<(i64, Vec<SeccompRule>)>;

/// The calls refused with `EPERM` (an empty rule list: always).
fn deny_rules() -> Result<Rules, ApplyError> {
    let seccomp = |e: seccompiler::BackendError| ApplyError::Seccomp(e.to_string());
    let cond = |arg: u8, len: Len, op: Op, value: u64| Cond::new(arg, len, op, value).map_err(seccomp);
    let rule = |conditions: Vec<Cond>| SeccompRule::new(conditions).map_err(seccomp);
    // "Any pid but the caller's own" (0 names the caller).
    let other_pid =
        |arg: u8| -> Result<Vec<SeccompRule>, ApplyError> { Ok(vec![rule(vec![cond(arg, Len::Dword, Op::Ne, 0)?])?]) };
    let mut rules: Rules = [
        libc::SYS_reboot,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_fsconfig,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_open_by_handle_at,
        // Its attributes are in memory (where seccomp cannot look), and it
        // is how SCHED_DEADLINE is set.
        libc::SYS_sched_setattr,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_ioperm,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_iopl,
    ]
    .into_iter()
    .map(|call| (call, Vec::new()))
    .collect();
    // The terminal: typing into it (`TIOCSTI`) or its console tricks. The
    // request is an `int`: only its low 32 bits are compared, so high bits
    // set by the caller do not slip past.
    // (The requests' type differs between libc targets: cast, not From.)
    #[allow(clippy::unnecessary_cast)]
    let (tiocsti, tioclinux) = (libc::TIOCSTI as u64, libc::TIOCLINUX as u64);
    rules.push((
        libc::SYS_ioctl,
        vec![rule(vec![cond(1, Len::Dword, Op::Eq, tiocsti)?])?, rule(vec![cond(1, Len::Dword, Op::Eq, tioclinux)?])?],
    ));
    // Device nodes (a FIFO or a plain file is fine).
    let device = |arg: u8| -> Result<Vec<SeccompRule>, ApplyError> {
        Ok(vec![
            rule(vec![cond(arg, Len::Dword, Op::MaskedEq(libc::S_IFMT as u64), libc::S_IFCHR as u64)?])?,
            rule(vec![cond(arg, Len::Dword, Op::MaskedEq(libc::S_IFMT as u64), libc::S_IFBLK as u64)?])?,
        ])
    };
    #[cfg(target_arch = "x86_64")]
    rules.push((libc::SYS_mknod, device(1)?));
    rules.push((libc::SYS_mknodat, device(2)?));
    // Another process's limits, priority, CPUs or I/O class.
    rules.push((libc::SYS_prlimit64, other_pid(0)?));
    rules.push((libc::SYS_sched_setaffinity, other_pid(0)?));
    rules.push((libc::SYS_sched_setparam, other_pid(0)?));
    // setpriority(which, who): PRIO_USER reaches every process of the
    // user; any other `who` but 0 another process or group.
    rules.push((
        libc::SYS_setpriority,
        vec![
            rule(vec![cond(0, Len::Dword, Op::Eq, libc::PRIO_USER as u64)?])?,
            rule(vec![cond(1, Len::Dword, Op::Ne, 0)?])?,
        ],
    ));
    // ioprio_set(which, who): IOPRIO_WHO_USER (3), or another who.
    rules.push((
        libc::SYS_ioprio_set,
        vec![rule(vec![cond(0, Len::Dword, Op::Eq, 3)?])?, rule(vec![cond(1, Len::Dword, Op::Ne, 0)?])?],
    ));
    // sched_setscheduler(pid, policy): another pid, or a real-time policy
    // (SCHED_RESET_ON_FORK may be or-ed in).
    let policy = |value: libc::c_int| {
        cond(1, Len::Dword, Op::MaskedEq(!(libc::SCHED_RESET_ON_FORK as u32) as u64), value as u64)
    };
    rules.push((
        libc::SYS_sched_setscheduler,
        vec![
            rule(vec![cond(0, Len::Dword, Op::Ne, 0)?])?,
            rule(vec![policy(libc::SCHED_FIFO)?])?,
            rule(vec![policy(libc::SCHED_RR)?])?,
            rule(vec![policy(6)?])?, // SCHED_DEADLINE
        ],
    ));
    // New namespaces through `clone` (`unshare` and `setns` are refused).
    let namespaces = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ];
    let clone: Result<Vec<SeccompRule>, ApplyError> = namespaces
        .iter()
        .map(|flag| rule(vec![cond(0, Len::Qword, Op::MaskedEq(*flag as u64), *flag as u64)?]))
        .collect();
    rules.push((libc::SYS_clone, clone?));
    Ok(rules)
}

/// On x86-64, the x32 calling convention: the same calls under numbers with
/// bit 30 set, which a filter keyed on the 64-bit numbers would let
/// through on a kernel built with x32. (The i386 convention has an
/// architecture of its own, and every filter above kills a process that
/// uses it.) Written by hand: `seccompiler` matches numbers, not a range.
#[cfg(target_arch = "x86_64")]
fn deny_x32() -> Result<(), ApplyError> {
    use seccompiler::sock_filter;
    const X32_BIT: u32 = 0x4000_0000;
    let program: BpfProgram = vec![
        // A = seccomp_data.nr
        sock_filter { code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, jt: 0, jf: 0, k: 0 },
        // if A >= X32_BIT: next, else skip it
        sock_filter { code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16, jt: 0, jf: 1, k: X32_BIT },
        sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW },
    ];
    seccompiler::apply_filter(&program).map_err(|e| ApplyError::Seccomp(e.to_string()))
}

#[cfg(not(target_arch = "x86_64"))]
fn deny_x32() -> Result<(), ApplyError> {
    Ok(())
}

/// Installs one filter: `rules` answer `action`, everything else passes.
fn install(rules: &[(i64, Vec<SeccompRule>)], action: SeccompAction) -> Result<(), ApplyError> {
    let arch: TargetArch = std::env::consts::ARCH.try_into().map_err(|e| ApplyError::Seccomp(format!("{e:?}")))?;
    let filter = SeccompFilter::new(rules.iter().cloned().collect(), SeccompAction::Allow, action, arch)
        .map_err(|e| ApplyError::Seccomp(e.to_string()))?;
    let program: BpfProgram =
        filter.try_into().map_err(|e: seccompiler::BackendError| ApplyError::Seccomp(e.to_string()))?;
    seccompiler::apply_filter(&program).map_err(|e| ApplyError::Seccomp(e.to_string()))
}

fn restrict(policy: &Policy, root: BorrowedFd<'_>) -> Result<(), ApplyError> {
    let abi = ABI_VETTED;
    let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi))?.scope(Scope::from_all(abi))?;
    if !policy.network {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
    }
    let mut created = ruleset.create()?;
    let root = root.try_clone_to_owned().map_err(|_| ApplyError::NotEnforced)?;
    // Everything beneath the root but device nodes and sockets (a socket
    // file would be a door other processes of the machine could use).
    let beneath_root = AccessFs::from_all(abi) & !(AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::MakeSock);
    created = created.add_rule(PathBeneath::new(root, beneath_root))?;
    // A link among the children is left out, never followed: a rule on
    // `/proc/self/root` (carving `/proc/self` around `/proc/self/net`) would
    // be a rule on `/`.
    let list = |dir: &Path| -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        entries.flatten().filter(|e| e.file_type().is_ok_and(|t| !t.is_symlink())).map(|e| e.path()).collect()
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
    install(
        &[(libc::SYS_socket, vec![]), (libc::SYS_io_uring_setup, vec![])],
        SeccompAction::Errno(libc::EACCES as u32),
    )
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
/// itself the way a command is): the Landlock ABI in force, and what it
/// cannot refuse.
pub fn probe() -> Result<crate::Probe, ApplyError> {
    let namespace = new_mount_namespace();
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
    // The bounding set can be cleared where the namespace could be made
    // (root, or a user namespace of its own): checked, not assumed.
    drop_privileges(None)?;
    // SAFETY: prctl with integer arguments.
    let bounding_cleared = unsafe { libc::prctl(libc::PR_CAPBSET_READ, 0, 0, 0, 0) } == 0;
    filter(false)?;
    let abi = match status.landlock {
        landlock::LandlockStatus::Available { effective_abi, .. } => effective_abi as i32,
        _ => 0,
    };
    Ok(crate::Probe {
        kind: crate::SandboxKind::Landlock,
        detail: format!("abi {abi}"),
        gaps: gaps(abi, namespace, bounding_cleared),
    })
}

/// What a machine with Landlock `abi` cannot refuse.
fn gaps(abi: i32, namespace: bool, bounding_cleared: bool) -> Vec<crate::Gap> {
    let mut gaps = Vec::new();
    if abi < 6 {
        gaps.push(crate::Gap::SignalScope);
    }
    if abi < 4 {
        gaps.push(crate::Gap::Tcp);
    }
    if !namespace {
        gaps.push(crate::Gap::ReservedWritable);
    }
    if !bounding_cleared {
        gaps.push(crate::Gap::BoundingSet);
    }
    gaps.sort();
    gaps
}

#[cfg(test)]
mod tests;

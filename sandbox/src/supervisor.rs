//! The supervisor: the process a workspace command runs under, so that
//! when the command ends (by itself, or when the node asks on a timeout,
//! cancel, cleanup or session end) every process it started ends too,
//! including ones that called `setsid`, double-forked or ignore `SIGTERM`,
//! and so that the command stays within its [`Limits`].
//!
//! The node starts its own executable with [`EXEC_ARG`] (see
//! [`crate::main_if_invoked`]): a fresh single-threaded process that
//! - marks every descriptor it inherited above 2 close-on-exec, so the
//!   command gets none of what the node's launcher left open;
//! - on Linux becomes a child subreaper, so every orphan of the command's
//!   tree is re-parented to it rather than to init, and stays findable as
//!   its descendant; asks for `SIGTERM` if the node dies;
//! - on macOS (no subreaper) remembers every descendant it has seen, by pid
//!   and start time, so one that was orphaned since is still found. A
//!   double fork faster than the poll escapes this walk; the Seatbelt
//!   profile still holds it;
//! - starts the command in the workspace root (the node hands the root's
//!   held handle as fd [`ROOT_FD`]) in a session of its own, with no
//!   controlling terminal (so nothing it does reaches the terminal the
//!   node was started from), its resource limits set, and the sandbox and
//!   the command user applied between `fork` and `exec`;
//! - every [`POLL`] looks at the command's tree: more processes, resident
//!   memory or CPU time than [`Limits`] allow kills it all at once and
//!   reports [`Report::LimitExceeded`];
//! - when the command's own process exits: kills whatever it left running
//!   (`SIGKILL`) and reaps it;
//! - on `SIGTERM` from the node: `SIGTERM` to every descendant, then after
//!   the grace `SIGKILL` to all of them, again until none is left;
//! - writes one [`Report`] line to fd [`STATUS_FD`] and exits.
//!
//! Because the supervisor exits only once every descendant is gone, the
//! node's pipes close when it exits: no leftover holds the tool call open.
//! The supervisor is outside the command's sandbox, and the command can
//! neither signal it (Landlock's signal scope on Linux, `(target
//! same-sandbox)` on macOS) nor lower its limits (seccomp refuses
//! `prlimit` on any process but the caller).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use crate::{CommandUser, Invocation, Limit, Limits, Report};

/// The node passes the workspace root's handle as this descriptor ...
pub const ROOT_FD: i32 = 3;
/// ... and reads the supervisor's [`Report`] from this one.
pub const STATUS_FD: i32 = 4;

/// How often the supervisor looks at its descendants while the command
/// runs (macOS) and between kill rounds.
pub const POLL: Duration = Duration::from_millis(50);
/// Most time spent killing leftovers (a process in uninterruptible sleep
/// dies when its I/O ends); then the supervisor reports and exits anyway.
/// The node waits longer than this before it kills a supervisor.
pub const KILL_CAP: Duration = Duration::from_secs(10);

/// The supervisor's entry: reads the invocation, supervises, reports.
pub fn exec_main(invocation: &str) -> i32 {
    let Ok(invocation) = serde_json::from_str::<Invocation>(invocation) else { return 2 };
    // SAFETY: fcntl on any number is safe; a closed one answers EBADF.
    if [ROOT_FD, STATUS_FD].iter().any(|fd| unsafe { libc::fcntl(*fd, libc::F_GETFD) } < 0) {
        return 2;
    }
    // SAFETY: the node opened both descriptors for this process (see the
    // constants; checked open above); nothing else in it owns them.
    let (root, mut status) = unsafe { (OwnedFd::from_raw_fd(ROOT_FD), File::from_raw_fd(STATUS_FD)) };
    close_on_exec_from(ROOT_FD);
    let report = supervise(&invocation, &root);
    let line = serde_json::to_string(&report).unwrap_or_default();
    let _ = writeln!(status, "{line}");
    0
}

fn supervise(invocation: &Invocation, root: &OwnedFd) -> Report {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0);
    }
    let Some(signals) = SignalPipe::install() else { return Report::SpawnFailed };
    // SAFETY: getppid and fchdir have no preconditions.
    let node = unsafe { libc::getppid() };
    if node == 1 || unsafe { libc::fchdir(root.as_raw_fd()) } != 0 {
        return Report::SpawnFailed;
    }
    let argv = command_line(invocation);
    let Some((program, args)) = argv.split_first() else { return Report::SpawnFailed };
    let mut command = std::process::Command::new(program);
    command.args(args);
    let (policy, user, limits) = (invocation.policy.clone(), invocation.user, invocation.limits);
    // RLIMIT_NPROC counts every process of the user, not of the command:
    // the command's share is on top of what the user already runs.
    // SAFETY: getuid has no preconditions.
    let uid = user.map_or(unsafe { libc::getuid() }, |u| u.uid);
    let nproc = u64::from(limits.processes) + processes().values().filter(|p| p.uid == uid).count() as u64;
    let root_fd = root.as_raw_fd();
    // SAFETY: the closure runs in the child of this single-threaded
    // process, so allocating there is safe; it restores the default signal
    // state, leaves the terminal's session, sets the limits and applies
    // the sandbox and the user.
    unsafe {
        command.pre_exec(move || {
            SignalPipe::reset_in_child();
            if libc::setsid() < 0 {
                return Err(std::io::Error::from_raw_os_error(SANDBOX_ERRNO));
            }
            set_limits(&limits, nproc)?;
            let root = BorrowedFd::borrow_raw(root_fd);
            apply_sandbox(policy.as_ref(), user, root)
        });
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) if e.raw_os_error() == Some(SANDBOX_ERRNO) => return Report::SandboxFailed,
        Err(_) => return Report::SpawnFailed,
    };
    let pid = child.id() as libc::pid_t;
    // Reaped below with waitpid(-1), like every orphan that comes here.
    drop(child);
    let mut tree = Tree::new();
    let mut exit = None;
    let mut deadline = None;
    let mut exceeded = None;
    loop {
        let signal = signals.wait(POLL);
        // The node went away (macOS has no parent-death signal): as if it
        // had asked the command to end.
        // SAFETY: getppid has no preconditions.
        let orphaned = unsafe { libc::getppid() } != node;
        if (orphaned || signal.is_some_and(|s| s != libc::SIGCHLD)) && deadline.is_none() {
            tree.refresh();
            tree.signal_all(libc::SIGTERM);
            deadline = Some(Instant::now() + Duration::from_millis(invocation.grace_ms));
        }
        reap(pid, &mut exit);
        if exit.is_some() || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        tree.refresh();
        exceeded = tree.usage().exceeds(&limits);
        if exceeded.is_some() {
            break;
        }
    }
    // Whatever is left: killed and reaped, round after round, until this
    // process has no child (new orphans of the killed ones come here).
    let cap = Instant::now() + KILL_CAP;
    loop {
        tree.refresh();
        tree.signal_all(libc::SIGKILL);
        if !reap(pid, &mut exit) || Instant::now() >= cap {
            break;
        }
        let _ = signals.wait(Duration::from_millis(5));
    }
    if let Some(limit) = exceeded.or_else(|| exit.and_then(limit_signal)) {
        return Report::LimitExceeded { limit };
    }
    exit.unwrap_or(Report::Signaled { signal: libc::SIGKILL })
}

/// The limit a command's own death by signal names: the kernel's answers
/// to `RLIMIT_CPU` and `RLIMIT_FSIZE`.
fn limit_signal(exit: Report) -> Option<Limit> {
    match exit {
        Report::Signaled { signal } if signal == libc::SIGXCPU => Some(Limit::Cpu),
        Report::Signaled { signal } if signal == libc::SIGXFSZ => Some(Limit::FileSize),
        _ => None,
    }
}

/// The command's resource limits, set in the child before `exec` (they
/// are inherited by everything it starts): CPU seconds of each process
/// (`SIGXCPU` at the limit, `SIGKILL` a second later), the largest file it
/// may write (`SIGXFSZ`), `nproc` processes of its user, no core files
/// (a core dump would be written into the root, past the disk budget).
/// Resident memory has no rlimit that means it (`RLIMIT_AS` counts address
/// space that runtimes such as V8, Go and the JVM reserve and never use):
/// the supervisor's poll bounds it. A lower hard limit the node already
/// runs under wins (only root may raise one).
fn set_limits(limits: &Limits, nproc: u64) -> std::io::Result<()> {
    let set = |resource, soft: u64, hard: u64| {
        // SAFETY: getrlimit and setrlimit with valid structs.
        let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        let ceiling = if unsafe { libc::getrlimit(resource, &mut current) } == 0 { current.rlim_max } else { u64::MAX };
        let (soft, hard) = (soft.min(ceiling), hard.min(ceiling));
        let limit = libc::rlimit { rlim_cur: soft as libc::rlim_t, rlim_max: hard as libc::rlim_t };
        if unsafe { libc::setrlimit(resource, &limit) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(SANDBOX_ERRNO))
        }
    };
    set(libc::RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds.saturating_add(1))?;
    set(libc::RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes)?;
    set(libc::RLIMIT_NPROC, nproc, nproc)?;
    set(libc::RLIMIT_CORE, 0, 0)
}

/// Marks every descriptor from `first` up close-on-exec: nothing the
/// process inherited (from the node, or the node's launcher) reaches the
/// command.
fn close_on_exec_from(first: i32) {
    #[cfg(target_os = "linux")]
    {
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        // SAFETY: close_range only changes descriptor flags.
        if unsafe {
            libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC)
        } == 0
        {
            return;
        }
    }
    // Older kernels and macOS: one by one, up to the descriptor limit.
    // SAFETY: getdtablesize and fcntl on any number are safe.
    let top = unsafe { libc::getdtablesize() }.clamp(first, 1 << 16);
    for fd in first..top {
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// The errno a failed sandbox is reported with from the child (one `exec`
/// itself never returns).
const SANDBOX_ERRNO: i32 = libc::ENOTRECOVERABLE;

/// The sandbox and the user; without a sandbox (the owner's choice) the
/// privileges are dropped all the same.
#[cfg(target_os = "linux")]
fn apply_sandbox(
    policy: Option<&crate::Policy>,
    user: Option<CommandUser>,
    root: BorrowedFd<'_>,
) -> std::io::Result<()> {
    let applied = match policy {
        None => crate::linux::drop_privileges(user),
        Some(policy) => crate::linux::apply(policy, user, root),
    };
    applied.map_err(|_| std::io::Error::from_raw_os_error(SANDBOX_ERRNO))
}

/// On macOS the sandbox is `sandbox-exec` itself ([`command_line`]); the
/// user is taken here.
#[cfg(not(target_os = "linux"))]
fn apply_sandbox(_: Option<&crate::Policy>, user: Option<CommandUser>, _: BorrowedFd<'_>) -> std::io::Result<()> {
    let Some(user) = user else { return Ok(()) };
    // SAFETY: plain id calls; the result is checked below.
    let switched = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(user.gid) == 0
            && libc::setuid(user.uid) == 0
            && libc::geteuid() == user.uid
            && libc::getegid() == user.gid
    };
    if switched { Ok(()) } else { Err(std::io::Error::from_raw_os_error(SANDBOX_ERRNO)) }
}

fn command_line(invocation: &Invocation) -> Vec<String> {
    match &invocation.policy {
        Some(policy) if cfg!(target_os = "macos") => crate::seatbelt::profile(policy).command_line(&invocation.argv),
        _ => invocation.argv.clone(),
    }
}

/// Reaps every child that has ended (recording the command's own status);
/// whether any child is left.
fn reap(command: libc::pid_t, exit: &mut Option<Report>) -> bool {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid < 0 {
            return false;
        }
        if pid == 0 {
            return true;
        }
        if pid == command {
            *exit = Some(if libc::WIFSIGNALED(status) {
                Report::Signaled { signal: libc::WTERMSIG(status) }
            } else {
                Report::Exited { code: libc::WEXITSTATUS(status) }
            });
        }
    }
}

/// The supervisor's descendants: on Linux, whatever `/proc` says is below
/// it (orphans come to it); on macOS also every process ever seen below it
/// that still runs (same pid and start time).
struct Tree {
    me: libc::pid_t,
    /// pid -> start time, of descendants seen so far (macOS).
    seen: BTreeMap<libc::pid_t, u64>,
    /// The process table of the last refresh.
    table: BTreeMap<libc::pid_t, Proc>,
}

/// What the tree uses now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Usage {
    processes: usize,
    resident_bytes: u64,
    /// Of the live processes and every finished one (Linux; macOS leaves
    /// CPU time to `RLIMIT_CPU`).
    cpu_seconds: f64,
}

impl Usage {
    /// The first limit this usage is past (a process count at the limit
    /// is past it: `RLIMIT_NPROC` stops the tree there).
    fn exceeds(&self, limits: &Limits) -> Option<Limit> {
        if self.processes >= limits.processes as usize {
            Some(Limit::Processes)
        } else if self.resident_bytes > limits.memory_bytes {
            Some(Limit::Memory)
        } else if self.cpu_seconds > limits.cpu_seconds as f64 {
            Some(Limit::Cpu)
        } else {
            None
        }
    }
}

impl Tree {
    fn new() -> Self {
        // SAFETY: getpid has no preconditions.
        Self { me: unsafe { libc::getpid() }, seen: BTreeMap::new(), table: BTreeMap::new() }
    }

    /// Records the current descendants.
    fn refresh(&mut self) {
        let table = candidates(self.me);
        let mut below: BTreeSet<libc::pid_t> = BTreeSet::from([self.me]);
        // Roots: this process, and what was seen before and still runs as
        // the same process (it may have been re-parented away).
        self.seen.retain(|pid, start| table.get(pid).is_some_and(|p| p.start == *start));
        below.extend(self.seen.keys());
        let mut grew = true;
        while grew {
            grew = false;
            for (pid, p) in &table {
                if below.contains(&p.ppid) && below.insert(*pid) {
                    grew = true;
                }
            }
        }
        below.remove(&self.me);
        for pid in below {
            if let Some(p) = table.get(&pid) {
                self.seen.insert(pid, p.start);
            }
        }
        self.table = table;
    }

    /// What the descendants of the last refresh use, with what this
    /// process reaped (the command and the orphans that came to it).
    fn usage(&self) -> Usage {
        let mut usage = Usage { cpu_seconds: reaped_cpu_seconds(), ..Usage::default() };
        for pid in self.seen.keys() {
            let Some(p) = self.table.get(pid) else { continue };
            let (resident, cpu) = member_usage(*pid, p);
            usage.processes += 1;
            usage.resident_bytes += resident;
            usage.cpu_seconds += cpu;
        }
        usage
    }

    fn signal_all(&self, signal: i32) {
        for pid in self.seen.keys() {
            // SAFETY: kill has no memory-safety preconditions; a process
            // already gone answers ESRCH.
            unsafe { libc::kill(*pid, signal) };
        }
    }
}

/// A process as the table lists it.
#[derive(Debug, Clone, Copy)]
struct Proc {
    ppid: libc::pid_t,
    start: u64,
    uid: libc::uid_t,
    /// Resident bytes and CPU seconds (its own and its reaped children's),
    /// read with the rest of its `stat`; macOS asks per descendant.
    #[cfg(target_os = "linux")]
    resident_bytes: u64,
    #[cfg(target_os = "linux")]
    cpu_seconds: f64,
}

/// CPU seconds of this process's reaped children (and theirs).
fn reaped_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a struct of its own type.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    if cfg!(target_os = "linux") { seconds(usage.ru_utime) + seconds(usage.ru_stime) } else { 0.0 }
}

/// Resident bytes and CPU seconds of one descendant.
#[cfg(target_os = "linux")]
fn member_usage(_: libc::pid_t, p: &Proc) -> (u64, f64) {
    (p.resident_bytes, p.cpu_seconds)
}

/// Resident bytes of one descendant (CPU time: `RLIMIT_CPU` only).
#[cfg(target_os = "macos")]
fn member_usage(pid: libc::pid_t, _: &Proc) -> (u64, f64) {
    // SAFETY: proc_taskinfo is plain data; the size passed is its size.
    let mut info: libc::proc_taskinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_taskinfo>() as libc::c_int;
    let got = unsafe {
        libc::proc_pidinfo(pid, libc::PROC_PIDTASKINFO, 0, (&mut info as *mut libc::proc_taskinfo).cast(), size)
    };
    if got == size { (info.pti_resident_size, 0.0) } else { (0, 0.0) }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn member_usage(_: libc::pid_t, _: &Proc) -> (u64, f64) {
    (0, 0.0)
}

/// The processes that may be below `me`: on Linux its descendants, read
/// from the kernel's `children` lists (every orphan of the tree is a child
/// of this subreaper), so a look costs the tree's size, not the machine's;
/// the whole table where the kernel has no such list, and on macOS.
fn candidates(me: libc::pid_t) -> BTreeMap<libc::pid_t, Proc> {
    #[cfg(target_os = "linux")]
    if let Some(below) = descendants(me) {
        return below;
    }
    let _ = me;
    processes()
}

/// `me`'s descendants, or `None` without `/proc/<pid>/task/<tid>/children`
/// (a kernel built without `CONFIG_PROC_CHILDREN`).
#[cfg(target_os = "linux")]
fn descendants(me: libc::pid_t) -> Option<BTreeMap<libc::pid_t, Proc>> {
    let children = |pid: libc::pid_t| -> Option<Vec<libc::pid_t>> {
        let mut found = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
            let list = std::fs::read_to_string(task.path().join("children")).ok()?;
            found.extend(list.split_whitespace().filter_map(|p| p.parse::<libc::pid_t>().ok()));
        }
        Some(found)
    };
    let (ticks, page) = clock();
    let mut table = BTreeMap::new();
    let mut queue = children(me)?;
    while let Some(pid) = queue.pop() {
        if table.contains_key(&pid) {
            continue;
        }
        let Some(proc) = read_proc(pid, ticks, page) else { continue };
        table.insert(pid, proc);
        // A process that went away between the two reads has no list.
        queue.extend(children(pid).unwrap_or_default());
    }
    Some(table)
}

/// Clock ticks per second and the page size, for `stat`'s fields.
#[cfg(target_os = "linux")]
fn clock() -> (f64, u64) {
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    (ticks.max(1) as f64, page.max(1) as u64)
}

/// One process from `/proc/<pid>/stat` (and its owner).
#[cfg(target_os = "linux")]
fn read_proc(pid: libc::pid_t, ticks: f64, page: u64) -> Option<Proc> {
    use std::os::unix::fs::MetadataExt;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let uid = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    // After the command name (which may hold spaces and parentheses) come
    // the fields from the 3rd (state) on: field N is at N - 3.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    // utime, stime, cutime, cstime (14-17), in clock ticks; rss (24), in pages.
    let cpu: u64 = (14..=17).filter_map(field).sum();
    Some(Proc {
        ppid: field(4)? as libc::pid_t,
        start: field(22)?,
        uid,
        resident_bytes: field(24).unwrap_or(0).saturating_mul(page),
        cpu_seconds: cpu as f64 / ticks,
    })
}

/// Every process this user can see.
#[cfg(target_os = "linux")]
fn processes() -> BTreeMap<libc::pid_t, Proc> {
    let (ticks, page) = clock();
    let Ok(entries) = std::fs::read_dir("/proc") else { return BTreeMap::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().and_then(|n| n.parse::<libc::pid_t>().ok()))
        .filter_map(|pid| read_proc(pid, ticks, page).map(|proc| (pid, proc)))
        .collect()
}

/// Every process this user can see.
#[cfg(target_os = "macos")]
fn processes() -> BTreeMap<libc::pid_t, Proc> {
    let mut table = BTreeMap::new();
    let mut pids = vec![0 as libc::pid_t; 8192];
    let size = (pids.len() * std::mem::size_of::<libc::pid_t>()) as libc::c_int;
    // SAFETY: the buffer holds `size` bytes.
    let count = unsafe { libc::proc_listallpids(pids.as_mut_ptr().cast(), size) };
    if count <= 0 {
        return table;
    }
    for &pid in pids.iter().take(count as usize) {
        // SAFETY: proc_bsdinfo is plain data; the size passed is its size.
        let mut info: libc::proc_bsdinfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::proc_bsdinfo>() as libc::c_int;
        let got = unsafe {
            libc::proc_pidinfo(pid, libc::PROC_PIDTBSDINFO, 0, (&mut info as *mut libc::proc_bsdinfo).cast(), size)
        };
        if got == size {
            let start = info.pbi_start_tvsec.wrapping_mul(1_000_000).wrapping_add(info.pbi_start_tvusec);
            table.insert(pid, Proc { ppid: info.pbi_ppid as libc::pid_t, start, uid: info.pbi_ruid });
        }
    }
    table
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn processes() -> BTreeMap<libc::pid_t, Proc> {
    BTreeMap::new()
}

/// Signals as bytes on a pipe (the classic self-pipe: portable, unlike
/// `sigtimedwait`, which macOS lacks), so the loop can wait for a signal or
/// a timeout with `poll`.
struct SignalPipe {
    read: OwnedFd,
}

static SIGNAL_WRITE_FD: AtomicI32 = AtomicI32::new(-1);
const WATCHED: [i32; 4] = [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

extern "C" fn on_signal(signal: libc::c_int) {
    let byte = signal as u8;
    // SAFETY: write is async-signal-safe; a full pipe just drops the byte
    // (the loop polls anyway).
    unsafe { libc::write(SIGNAL_WRITE_FD.load(Ordering::Relaxed), (&byte as *const u8).cast(), 1) };
}

impl SignalPipe {
    fn install() -> Option<Self> {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the array.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return None;
        }
        for fd in fds {
            // SAFETY: fcntl on descriptors just created.
            unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK);
            }
        }
        SIGNAL_WRITE_FD.store(fds[1], Ordering::Relaxed);
        for signal in WATCHED {
            // SAFETY: a zeroed sigaction with a plain handler is valid.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
        // SAFETY: fds[0] was just created and is owned here.
        Some(Self { read: unsafe { OwnedFd::from_raw_fd(fds[0]) } })
    }

    /// In the child before `exec`: default dispositions (handlers would be
    /// reset by `exec` anyway; this keeps the window before it clean).
    fn reset_in_child() {
        for signal in WATCHED {
            // SAFETY: signal(2) is async-signal-safe.
            unsafe { libc::signal(signal, libc::SIG_DFL) };
        }
    }

    /// The first signal that arrives within `timeout` (the rest are
    /// drained: the loop looks at everything after each wake-up).
    fn wait(&self, timeout: Duration) -> Option<i32> {
        let mut poll = libc::pollfd { fd: self.read.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, timeout.as_millis() as libc::c_int) };
        if ready <= 0 {
            return None;
        }
        let mut buf = [0u8; 64];
        // SAFETY: reads into a buffer of that size.
        let n = unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let got = &buf[..n.max(0) as usize];
        // A termination request wins over SIGCHLD in the same batch.
        got.iter().map(|b| *b as i32).find(|s| *s != libc::SIGCHLD).or(got.first().map(|b| *b as i32))
    }
}

//! The command executor: a template's fixed argv, run in an accepted
//! workspace under the command supervisor (`iop_sandbox::supervisor`). No
//! shell, no PTY, no argument from the model.
//!
//! - The node starts its own executable as the supervisor and hands it the
//!   workspace root's held handle (fd 3; the command starts there, so a
//!   root renamed or swapped since acceptance is not followed by path) and
//!   a status pipe (fd 4) for the command's exit.
//! - The supervisor applies the OS sandbox (`policy`; `None` only where the
//!   owner allowed unsandboxed commands) between `fork` and `exec`.
//! - The environment is cleared down to the allowlisted names (their
//!   values taken from the node's own environment).
//! - A timeout or a cancel sends the supervisor `SIGTERM`: it ends every
//!   process the command started (`SIGTERM`, the grace, then `SIGKILL`),
//!   `setsid` and double-fork escapes included, and so it does when the
//!   command exits by itself with leftovers running. The call returns when
//!   the supervisor exits; the pipes then get a short bounded drain
//!   ([`DRAIN_AFTER_EXIT`]), never a wait on a leftover's descriptor.
//! - stdout and stderr are drained together into one output buffer with one
//!   cap; past it the rest is read and dropped (so the child never blocks on
//!   a full pipe) and the result says `truncated`.
//! - The template's limits bound it: processes, memory, CPU time and file
//!   size by the supervisor, the root's growth by the node ([`super::disk`]).
//!   Hitting one ends the whole tree at once and the result names it
//!   (`limit_exceeded`).

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iop_proto::config::CommandLimits;
use iop_proto::pb::CommandLimit;
use iop_sandbox::{CommandUser, Invocation, Limit, Limits, Policy, Report};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

/// Time between `SIGTERM` and `SIGKILL` of a command being ended.
pub const TERM_GRACE: Duration = Duration::from_secs(2);
/// How long the pipes may still deliver output once the supervisor exited
/// (everything the command started is gone by then; this only bounds it).
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);
/// How long past the grace a supervisor asked to stop may take before the
/// node kills it outright: longer than its own cap on killing leftovers,
/// so it is never cut off while it still has some to end.
const SUPERVISOR_SLACK: Duration = iop_sandbox::supervisor::KILL_CAP.saturating_add(Duration::from_secs(5));

/// What to run and with what bounds.
#[derive(Debug, Clone)]
pub struct CommandSpec<'a> {
    pub argv: &'a [String],
    pub env_allowlist: &'a [String],
    pub timeout: Duration,
    pub max_output_bytes: usize,
    pub grace: Duration,
    /// The supervisor executable (the node's own).
    pub supervisor: &'a Path,
    /// The sandbox; `None` runs the command without one.
    pub policy: Option<&'a Policy>,
    /// Who it runs as (`None`: the node's own user, which is not root).
    pub user: Option<CommandUser>,
    pub limits: CommandLimits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandResult {
    pub exit: Exit,
    pub timed_out: bool,
    pub cancelled: bool,
    /// stdout and stderr interleaved as they arrived, at most the cap.
    pub output: Vec<u8>,
    pub truncated: bool,
    pub duration: Duration,
    /// The limit that ended it, if one did.
    pub limit_exceeded: Option<CommandLimit>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("the command has no program")]
    EmptyArgv,
    /// The program does not exist or cannot be executed (the reason only:
    /// argv stays out of errors and logs).
    #[error("the command could not be started")]
    SpawnFailed,
    /// The sandbox could not be applied; nothing ran.
    #[error("the command sandbox could not be applied")]
    SandboxFailed,
}

/// The bytes kept of a command's output, shared by its two pipes.
#[derive(Default)]
struct Output {
    kept: Vec<u8>,
    truncated: bool,
}

/// Runs `spec` in the directory `root` until it exits, times out or
/// `cancel` fires.
pub async fn run(
    root: &File,
    spec: &CommandSpec<'_>,
    cancel: &CancellationToken,
) -> Result<CommandResult, CommandError> {
    if spec.argv.is_empty() {
        return Err(CommandError::EmptyArgv);
    }
    let limits = spec.limits;
    let invocation = Invocation {
        policy: spec.policy.cloned(),
        grace_ms: spec.grace.as_millis() as u64,
        argv: spec.argv.to_vec(),
        user: spec.user,
        limits: Limits {
            processes: limits.max_processes,
            memory_bytes: limits.max_memory_bytes,
            cpu_seconds: limits.max_cpu_seconds,
            file_size_bytes: limits.max_file_size_bytes,
        },
    };
    let invocation = serde_json::to_string(&invocation).map_err(|_| CommandError::SpawnFailed)?;
    let disk = super::disk::Watch::start(root, limits.max_disk_bytes).await.map_err(|_| CommandError::SpawnFailed)?;
    let (mut status_read, status_write) = std::io::pipe().map_err(|_| CommandError::SpawnFailed)?;
    let mut command = tokio::process::Command::new(spec.supervisor);
    command.arg(iop_sandbox::EXEC_ARG).arg(invocation);
    command.env_clear().stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for name in spec.env_allowlist {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.kill_on_drop(true);
    let (dir, status_fd) = (root.as_raw_fd(), status_write.as_raw_fd());
    // SAFETY: only fcntl and dup2, both async-signal-safe, run between fork
    // and exec; both descriptors stay open in the parent until the spawn
    // returns. Each is first copied above the target numbers, so placing
    // one cannot close the other.
    unsafe {
        command.pre_exec(move || {
            let root = libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 10);
            let status = libc::fcntl(status_fd, libc::F_DUPFD_CLOEXEC, 10);
            if root < 0
                || status < 0
                || libc::dup2(root, iop_sandbox::supervisor::ROOT_FD) < 0
                || libc::dup2(status, iop_sandbox::supervisor::STATUS_FD) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let mut child = command.spawn().map_err(|_| CommandError::SpawnFailed)?;
    // The supervisor holds the only write end now: EOF once it exits.
    drop(status_write);
    let supervisor = child.id().map(|pid| pid as i32);
    let output = Arc::new(Mutex::new(Output::default()));
    let drain = |pipe: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>| {
        let (output, cap) = (output.clone(), spec.max_output_bytes);
        async move {
            let Some(mut pipe) = pipe else { return };
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut out = output.lock().unwrap();
                let room = cap.saturating_sub(out.kept.len());
                out.kept.extend_from_slice(&buf[..n.min(room)]);
                out.truncated |= n > room;
            }
        }
    };
    let stdout = child.stdout.take().map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    let stderr = child.stderr.take().map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    let mut drained = Box::pin(futures_util::future::join(drain(stdout), drain(stderr)));
    // (status, timed out, cancelled, disk budget exceeded)
    let waited = async {
        tokio::select! {
            status = child.wait() => (status, false, false, false),
            _ = tokio::time::sleep(spec.timeout) => (stop(supervisor, &mut child, spec.grace).await, true, false, false),
            _ = cancel.cancelled() => (stop(supervisor, &mut child, spec.grace).await, false, true, false),
            _ = disk.exceeded() => (stop(supervisor, &mut child, spec.grace).await, false, false, true),
        }
    };
    // The pipes are drained while the command runs, or it blocks on them;
    // once the supervisor is gone, only briefly.
    tokio::pin!(waited);
    let mut pipes_closed = false;
    let (status, timed_out, cancelled, over_disk) = tokio::select! {
        status = &mut waited => status,
        _ = &mut drained => {
            pipes_closed = true;
            waited.await
        }
    };
    if !pipes_closed {
        let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut drained).await;
    }
    let status = status.map_err(|_| CommandError::SpawnFailed)?;
    let mut line = String::new();
    // The write end closed with the supervisor: this read does not block.
    let _ = status_read.read_to_string(&mut line);
    let mut limit_exceeded = None;
    let exit = match serde_json::from_str::<Report>(line.trim()) {
        Ok(Report::Exited { code }) => Exit::Code(code),
        Ok(Report::Signaled { signal }) => Exit::Signal(signal),
        Ok(Report::LimitExceeded { limit }) => {
            limit_exceeded = Some(wire_limit(limit));
            Exit::Signal(libc::SIGKILL)
        }
        Ok(Report::SpawnFailed) => return Err(CommandError::SpawnFailed),
        Ok(Report::SandboxFailed) => return Err(CommandError::SandboxFailed),
        // The supervisor itself was killed (it did not stop in time).
        Err(_) if timed_out || cancelled || over_disk => {
            Exit::Signal(std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(libc::SIGKILL))
        }
        Err(_) => return Err(CommandError::SpawnFailed),
    };
    // The last writes may have come after the last walk.
    if over_disk || (limit_exceeded.is_none() && !timed_out && !cancelled && disk.finally_exceeded().await) {
        limit_exceeded = Some(CommandLimit::Disk);
    }
    let Output { kept, truncated } = std::mem::take(&mut *output.lock().unwrap());
    Ok(CommandResult {
        exit,
        timed_out,
        cancelled,
        output: kept,
        truncated,
        duration: started.elapsed(),
        limit_exceeded,
    })
}

fn wire_limit(limit: Limit) -> CommandLimit {
    match limit {
        Limit::Processes => CommandLimit::Processes,
        Limit::Memory => CommandLimit::Memory,
        Limit::Cpu => CommandLimit::Cpu,
        Limit::FileSize => CommandLimit::FileSize,
    }
}

/// Asks the supervisor to end the command (`SIGTERM`: it ends the whole
/// tree, `SIGKILL` after `grace`); kills the supervisor itself only if it
/// does not finish in time.
async fn stop(
    supervisor: Option<i32>,
    child: &mut tokio::process::Child,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    if let Some(pid) = supervisor {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    match tokio::time::timeout(grace + SUPERVISOR_SLACK, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::warn!("a command supervisor did not stop in time; killed");
            let _ = child.start_kill();
            child.wait().await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::sandbox::SETSID;
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    /// A sandboxed command of the tests below: a minute, 64 KiB of output.
    fn sandboxed<'a>(
        argv: &'a [String],
        env_allowlist: &'a [String],
        supervisor: &'a Path,
        policy: &'a Policy,
        user: Option<CommandUser>,
        limits: CommandLimits,
    ) -> CommandSpec<'a> {
        CommandSpec {
            argv,
            env_allowlist,
            timeout: Duration::from_secs(60),
            max_output_bytes: 65_536,
            grace: Duration::from_millis(200),
            supervisor,
            policy: Some(policy),
            user,
            limits,
        }
    }

    async fn run_in(dir: &std::path::Path, args: &[&str], env: &[&str], timeout_ms: u64, cap: usize) -> CommandResult {
        let root = File::open(dir).unwrap();
        let (argv, env) = (argv(args), argv(env));
        let spec = CommandSpec {
            argv: &argv,
            env_allowlist: &env,
            timeout: Duration::from_millis(timeout_ms),
            max_output_bytes: cap,
            grace: Duration::from_millis(200),
            supervisor: &super::super::sandbox::test_supervisor(),
            policy: None,
            user: None,
            limits: CommandLimits::default(),
        };
        run(&root, &spec, &CancellationToken::new()).await.unwrap()
    }

    #[tokio::test]
    async fn exit_codes_signals_and_the_working_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        let done = run_in(&dir, &["sh", "-c", "exit 3"], &["PATH"], 10_000, 1024).await;
        assert_eq!((done.exit, done.timed_out, done.cancelled), (Exit::Code(3), false, false));
        let killed = run_in(&dir, &["sh", "-c", "kill -9 $$"], &["PATH"], 10_000, 1024).await;
        assert_eq!(killed.exit, Exit::Signal(9));
        let pwd = run_in(&dir, &["pwd", "-P"], &["PATH"], 10_000, 1024).await;
        assert_eq!(String::from_utf8(pwd.output).unwrap().trim(), dir.to_str().unwrap());
        let root = File::open(&dir).unwrap();
        let missing = argv(&["/nonexistent/program"]);
        let spec = CommandSpec {
            argv: &missing,
            env_allowlist: &[],
            timeout: Duration::from_secs(1),
            max_output_bytes: 10,
            grace: Duration::ZERO,
            supervisor: &super::super::sandbox::test_supervisor(),
            policy: None,
            user: None,
            limits: CommandLimits::default(),
        };
        assert_eq!(run(&root, &spec, &CancellationToken::new()).await, Err(CommandError::SpawnFailed));
        let empty = CommandSpec { argv: &[], ..spec };
        assert_eq!(run(&root, &empty, &CancellationToken::new()).await, Err(CommandError::EmptyArgv));
    }

    #[tokio::test]
    async fn the_environment_is_only_the_allowlist() {
        let tmp = tempfile::tempdir().unwrap();
        let env = run_in(tmp.path(), &["/usr/bin/env"], &["PATH", "IOP_SURELY_UNSET_VARIABLE"], 10_000, 65_536).await;
        let text = String::from_utf8(env.output).unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.split_once('=').map(|(n, _)| n)).collect();
        assert_eq!(names, ["PATH"], "{text}");
        let none = run_in(tmp.path(), &["/usr/bin/env"], &[], 10_000, 65_536).await;
        assert!(none.output.is_empty(), "{}", String::from_utf8_lossy(&none.output));
    }

    #[tokio::test]
    async fn stdout_and_stderr_share_one_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let script = "printf 1234; printf 5678 >&2; printf 9999; exit 0";
        let capped = run_in(tmp.path(), &["sh", "-c", script], &["PATH"], 10_000, 6).await;
        assert_eq!((capped.output.len(), capped.truncated), (6, true));
        let whole = run_in(tmp.path(), &["sh", "-c", script], &["PATH"], 10_000, 64).await;
        // Interleaved as they arrived: compare the bytes, not their order.
        let (mut got, mut want) = (whole.output.clone(), b"123456789999".to_vec());
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!((got, whole.truncated), (want, false));
        // A child that writes far more than the cap still finishes.
        let flood = run_in(tmp.path(), &["sh", "-c", "yes | head -c 2000000"], &["PATH"], 10_000, 100).await;
        assert_eq!((flood.exit, flood.output.len(), flood.truncated), (Exit::Code(0), 100, true));
    }

    /// Whether a process the group left behind has ended (gone, or a
    /// zombie awaiting its new parent). `SIGKILL` was sent before `run`
    /// returned; its pipe closes a moment before it is a zombie, so this
    /// waits for that (bounded) instead of reading one snapshot.
    fn ended(pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while super::super::sandbox::running(pid) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    #[tokio::test]
    async fn a_timeout_ends_the_whole_group_grandchildren_included() {
        let tmp = tempfile::tempdir().unwrap();
        let script = "sleep 60 & echo $!; wait";
        let result = run_in(tmp.path(), &["sh", "-c", script], &["PATH"], 300, 1024).await;
        assert!(result.timed_out);
        assert_eq!(result.exit, Exit::Signal(libc::SIGTERM));
        let grandchild: i32 = String::from_utf8(result.output).unwrap().trim().parse().unwrap();
        assert!(ended(grandchild), "the backgrounded sleep {grandchild} outlived its group");
    }

    #[tokio::test]
    async fn a_child_that_ignores_term_is_killed_after_the_grace() {
        let tmp = tempfile::tempdir().unwrap();
        let result = run_in(tmp.path(), &["sh", "-c", "trap '' TERM; sleep 60"], &["PATH"], 200, 1024).await;
        assert!(result.timed_out);
        assert_eq!(result.exit, Exit::Signal(libc::SIGKILL));
    }

    #[tokio::test]
    async fn cancel_ends_the_group_and_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let root = File::open(tmp.path()).unwrap();
        let args = argv(&["sh", "-c", "sleep 60 & wait"]);
        let spec = CommandSpec {
            argv: &args,
            env_allowlist: &[],
            timeout: Duration::from_secs(60),
            max_output_bytes: 10,
            grace: Duration::from_millis(200),
            supervisor: &super::super::sandbox::test_supervisor(),
            policy: None,
            user: None,
            limits: CommandLimits::default(),
        };
        let cancel = CancellationToken::new();
        let (result, ()) = tokio::join!(run(&root, &spec, &cancel), async { cancel.cancel() });
        let result = result.unwrap();
        assert!(result.cancelled && !result.timed_out);
    }

    #[tokio::test]
    async fn leftovers_of_a_child_that_exited_are_killed() {
        let tmp = tempfile::tempdir().unwrap();
        // The shell exits at once; its background sleep would hold the pipe
        // for ten minutes.
        let result = run_in(tmp.path(), &["sh", "-c", "sleep 600 & echo $!"], &["PATH"], 10_000, 1024).await;
        assert_eq!(result.exit, Exit::Code(0));
        let grandchild: i32 = String::from_utf8(result.output).unwrap().trim().parse().unwrap();
        assert!(ended(grandchild));
        assert!(result.duration < Duration::from_secs(300), "run waited for the leftover sleep");
    }

    /// `setsid` leaves the process group, a double fork leaves the parent:
    /// neither outlives the command (issue: `setsid sleep 3000 &` survived
    /// a completed job).
    #[tokio::test]
    async fn setsid_and_double_fork_escapes_end_with_the_command() {
        let tmp = tempfile::tempdir().unwrap();
        let script = format!(
            "{SETSID} sleep 3000 </dev/null >/dev/null 2>&1 & echo $!; \
             (sleep 3000 </dev/null >/dev/null 2>&1 & echo $!) ; exit 0"
        );
        let result = run_in(tmp.path(), &["sh", "-c", &script], &["PATH"], 10_000, 1024).await;
        assert_eq!(result.exit, Exit::Code(0));
        let pids: Vec<i32> =
            String::from_utf8(result.output).unwrap().split_whitespace().map(|p| p.parse().unwrap()).collect();
        assert_eq!(pids.len(), 2);
        for pid in pids {
            assert!(ended(pid), "{pid} outlived its command");
        }
    }

    /// A leftover that left the group and keeps stdout open does not hold
    /// the call until the timeout (it used to wait the whole wall clock).
    #[tokio::test]
    async fn a_leftover_holding_the_pipe_does_not_hold_the_call() {
        let tmp = tempfile::tempdir().unwrap();
        let script = format!("{SETSID} sh -c 'trap \"\" TERM; echo $$; sleep 3000' & sleep 0.2; exit 7");
        let result = run_in(tmp.path(), &["sh", "-c", &script], &["PATH"], 120_000, 1024).await;
        assert_eq!((result.exit, result.timed_out), (Exit::Code(7), false));
        assert!(result.duration < Duration::from_secs(60), "the call waited on the leftover: {:?}", result.duration);
        let leftover: i32 = String::from_utf8(result.output).unwrap().trim().parse().unwrap();
        assert!(ended(leftover), "the leftover {leftover} outlived its command");
    }

    /// A timeout ends an escaped process that ignores `SIGTERM` too.
    #[tokio::test]
    async fn a_timeout_ends_escapes_that_ignore_term() {
        let tmp = tempfile::tempdir().unwrap();
        let script = format!("{SETSID} sh -c 'trap \"\" TERM; sleep 3000' & echo $!; trap '' TERM; sleep 3000");
        let result = run_in(tmp.path(), &["sh", "-c", &script], &["PATH"], 300, 1024).await;
        assert!(result.timed_out);
        assert_eq!(result.exit, Exit::Signal(libc::SIGKILL));
        let escaped: i32 = String::from_utf8(result.output).unwrap().trim().parse().unwrap();
        assert!(ended(escaped), "{escaped} outlived the timeout");
    }

    /// Each denial of the sandbox (Landlock on Linux, Seatbelt on macOS,
    /// where `.github/workflows/macos.yml` runs it), tried by a real
    /// command: no write outside the root or into `.iop`, no read of the
    /// node's files, its environment or the home directory, no signal to
    /// the node, no socket; the root itself stays usable.
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    #[tokio::test]
    async fn the_sandbox_holds_a_hostile_command_in_its_workspace() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let (root, outside, node_dir) = (base.join("site"), base.join("outside"), base.join("node"));
        for dir in [&root, &root.join(".iop/job"), &outside, &node_dir] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(node_dir.join("node-key.pem"), "PRIVATE KEY").unwrap();
        std::fs::write(outside.join("readme"), "owner's").unwrap();
        let owner_read = [base.clone()];
        let node_files = [node_dir.clone(), node_dir.join("node-key.pem")];
        let authority = iop_sandbox::Authority {
            root: &root,
            network: false,
            owner_read: &owner_read,
            node_files: &node_files,
            home: None,
        };
        let policy = iop_sandbox::policy::policy(&authority, &iop_sandbox::policy::system_read_paths());
        let node_pid = std::process::id();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (base, outside_dir, node) = (base.display(), outside.display(), node_dir.display());
        let macos = cfg!(target_os = "macos");
        // (name, command, verdict): each probe prints `<name>=ok` or
        // `<name>=denied`. No command holds a single quote.
        let mut probes: Vec<(&str, String, &str)> = vec![
            ("write_root", "echo x > mine.txt".into(), "ok"),
            ("read_root", "cat mine.txt".into(), "ok"),
            ("read_system", "cat /etc/hostname || cat /etc/passwd".into(), "ok"),
            ("read_owner_path", format!("cat {outside_dir}/readme"), "ok"),
            // Landlock cannot except a path from a rule: the owner's path is
            // carved into its children and is no longer listable itself.
            // Seatbelt excepts the node's directory (`require-not`) and
            // leaves the owner's path readable.
            ("list_owner_path", format!("ls {base}"), if macos { "ok" } else { "denied" }),
            ("write_outside", format!("echo x > {outside_dir}/x"), "denied"),
            ("write_reserved", "echo x > .iop/job/planted".into(), "denied"),
            ("read_node_key", format!("cat {node}/node-key.pem"), "denied"),
            ("list_node_dir", format!("ls {node}"), "denied"),
        ];
        if macos {
            // No `/proc`: `ps -E` shows a same-user process's environment.
            let home = std::env::var("HOME").unwrap();
            probes.push((
                "read_node_environ",
                format!("ps -E -ww -o command= -p {node_pid} | grep -q PATH="),
                "denied",
            ));
            probes.push(("read_home", format!("ls {home}"), "denied"));
        } else {
            probes.push(("read_node_environ", format!("cat /proc/{node_pid}/environ"), "denied"));
            probes.push(("read_own_proc", "read -r line < /proc/self/status".into(), "ok"));
        }
        probes.push(("signal_node", format!("kill -0 {node_pid}"), "denied"));
        probes.push(("tcp_socket", format!("exec 3<>/dev/tcp/127.0.0.1/{port}"), "denied"));
        probes.push(if macos {
            ("unix_socket", "perl -MSocket -e \"socket(my \\$s, PF_UNIX, SOCK_STREAM, 0) or exit 1\"".into(), "denied")
        } else {
            // The system's python: a PATH entry under the home directory
            // (pyenv) is not readable in the sandbox, so a denial there
            // would prove nothing. `python_runs` shows it starts.
            ("python_socket", "/usr/bin/python3 -c \"import socket; socket.socket(socket.AF_UNIX)\"".into(), "denied")
        });
        if !macos {
            probes.push(("python_runs", "/usr/bin/python3 -c pass".into(), "ok"));
            probes.push(("read_net_table", "cat /proc/self/net/tcp".into(), "denied"));
            // `/proc/self/root` is a link to `/`: carving `/proc/self`
            // around `/proc/self/net` must not make it a rule on `/`.
            probes.push(("read_via_proc_root", format!("cat /proc/self/root{node}/node-key.pem"), "denied"));
            probes.push(("read_sys", "ls /sys/kernel".into(), "denied"));
            probes.push(("read_cpus", "cat /sys/devices/system/cpu/online".into(), "ok"));
            probes.push(("open_tty", "exec 3<>/dev/tty".into(), "denied"));
            // The machine's private keys (a node run as root could read
            // them before): only where this machine has the directory, so
            // the denial means something.
            if Path::new("/etc/ssl/private").is_dir() {
                probes.push(("list_ssl_private", "ls /etc/ssl/private".into(), "denied"));
            }
        }
        let mut script = String::from(
            "try() { if eval \"$2\" >/dev/null 2>&1; then echo \"$1=ok\"; else echo \"$1=denied\"; fi; }\n",
        );
        for (name, command, _) in &probes {
            assert!(!command.contains('\''), "{command}");
            script.push_str(&format!("try {name} '{command}'\n"));
        }
        let (argv, env) = (argv(&["bash", "-c", &script]), argv(&["PATH"]));
        let supervisor = super::super::sandbox::test_supervisor();
        let spec = sandboxed(&argv, &env, &supervisor, &policy, None, CommandLimits::default());
        let dir = File::open(&root).unwrap();
        let result = run(&dir, &spec, &CancellationToken::new()).await.unwrap();
        let text = String::from_utf8(result.output).unwrap();
        let verdicts: Vec<&str> = text.lines().collect();
        let want: Vec<String> = probes.iter().map(|(name, _, verdict)| format!("{name}={verdict}")).collect();
        assert_eq!(verdicts, want, "{text}");
        assert!(!outside.join("x").exists() && !root.join(".iop/job/planted").exists());
        assert_eq!(std::fs::read_to_string(root.join("mine.txt")).unwrap(), "x\n");
        drop(listener);
    }
    /// Root's powers, the terminal and the node's process, tried by
    /// `sandbox/testdata/hostile.py` from inside a sandboxed command: each
    /// attack must be refused (exit 1; 0 is an attack that got through,
    /// anything else a probe that did not run, and fails the test too).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_sandbox_refuses_roots_powers_the_terminal_and_the_nodes_process() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::write(root.join("hostile.py"), include_str!("../../../sandbox/testdata/hostile.py")).unwrap();
        let authority =
            iop_sandbox::Authority { root: &root, network: false, owner_read: &[], node_files: &[], home: None };
        let policy = iop_sandbox::policy::policy(&authority, &iop_sandbox::policy::system_read_paths());
        // A descriptor the node inherited from its launcher (not
        // close-on-exec), on a file the command could not open itself.
        let secret = tempfile::NamedTempFile::new().unwrap();
        // SAFETY: dup of an open descriptor; closed at the end.
        let inherited = unsafe { libc::dup(std::os::fd::AsRawFd::as_raw_fd(secret.as_file())) };
        assert!(inherited > 2);
        let node = std::process::id();
        // SAFETY: geteuid has no preconditions.
        let bounding = if unsafe { libc::geteuid() } == 0 { "bounding" } else { "" };
        let supervisor = super::super::sandbox::test_supervisor();
        let dir = File::open(&root).unwrap();
        async fn attempt(dir: &File, line: &[String], supervisor: &Path, policy: &Policy) -> CommandResult {
            let spec = sandboxed(line, &[], supervisor, policy, None, CommandLimits::default());
            run(dir, &spec, &CancellationToken::new()).await.unwrap()
        }
        // Run as the command's first process: only it reads its own
        // `/proc/self` (see `iop_sandbox::policy::system_read_paths`).
        for first in [vec!["capabilities", bounding], vec!["descriptors"]] {
            let mut line = argv(&["/usr/bin/python3", "hostile.py"]);
            line.extend(first.iter().filter(|a| !a.is_empty()).map(|a| a.to_string()));
            let result = attempt(&dir, &line, &supervisor, &policy).await;
            let output = String::from_utf8_lossy(&result.output);
            assert_eq!(result.exit, Exit::Code(1), "{first:?} was not refused: {output}");
        }
        let attacks = [
            "reboot".to_string(),
            "sethostname".into(),
            "bpf".into(),
            "perf_event_open".into(),
            "finit_module".into(),
            "keyring".into(),
            "mknod".into(),
            "unshare".into(),
            "realtime".into(),
            "tiocsti".into(),
            "tiocsti_high_bits".into(),
            "tty".into(),
            format!("prlimit {node}"),
            format!("prlimit_cpu {node}"),
            format!("setpriority {node}"),
            format!("affinity {node}"),
            "net_table".into(),
        ];
        let script: String =
            attacks.iter().map(|a| format!("/usr/bin/python3 hostile.py {a}; echo \"{a}=$?\"\n")).collect();
        let result = attempt(&dir, &argv(&["bash", "-c", &script]), &supervisor, &policy).await;
        // SAFETY: closes the descriptor dup'ed above.
        unsafe { libc::close(inherited) };
        let text = String::from_utf8(result.output).unwrap();
        let verdicts: Vec<&str> = text.lines().filter(|l| l.contains('=')).collect();
        let want: Vec<String> = attacks.iter().map(|a| format!("{a}=1")).collect();
        assert_eq!(verdicts, want, "{text}");
        assert!(!root.join("kmsg").exists(), "a device node was made");
    }

    /// Each limit of a template ends a command that runs past it, and the
    /// result names which; the command runs as the command user when the
    /// test runs as root (as a node run as root would run it), so the
    /// process limit is the kernel's too and a fork bomb stays small.
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    #[tokio::test]
    async fn each_limit_ends_the_command_and_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        // SAFETY: geteuid has no preconditions.
        let user = super::super::sandbox::command_user(unsafe { libc::geteuid() }, None).unwrap();
        if let Some(user) = user {
            std::os::unix::fs::chown(&root, Some(user.uid), Some(user.gid)).unwrap();
        }
        let authority =
            iop_sandbox::Authority { root: &root, network: false, owner_read: &[], node_files: &[], home: None };
        let policy = iop_sandbox::policy::policy(&authority, &iop_sandbox::policy::system_read_paths());
        let supervisor = super::super::sandbox::test_supervisor();
        let small = CommandLimits {
            max_processes: 16,
            max_memory_bytes: 64 << 20,
            max_cpu_seconds: 1,
            max_file_size_bytes: 1 << 20,
            max_disk_bytes: 4 << 20,
        };
        let cases: [(&str, &str, CommandLimit); 5] = [
            // A fork bomb whose processes wait for their children: held at
            // the limit by RLIMIT_NPROC, ended at the supervisor's next look.
            // Finite (255 processes; the filler 50 MB), so a broken limit
            // fails the test instead of taking the machine down.
            (
                "processes",
                "bomb() { if [ $1 -lt 7 ]; then bomb $(($1 + 1)) & bomb $(($1 + 1)) & fi; wait; }; bomb 0",
                CommandLimit::Processes,
            ),
            (
                "memory",
                "exec /usr/bin/python3 -c 'import time; b = b\"x\" * (1 << 30); time.sleep(60)'",
                CommandLimit::Memory,
            ),
            ("cpu", "while :; do :; done", CommandLimit::Cpu),
            ("file_size", "exec head -c 100000000 /dev/zero > big", CommandLimit::FileSize),
            ("disk", "for i in $(seq 200); do head -c 262144 /dev/zero > f$i; done; sleep 60", CommandLimit::Disk),
        ];
        let env = argv(&["PATH"]);
        for (name, script, limit) in cases {
            let line = argv(&["bash", "-c", script]);
            let spec = sandboxed(&line, &env, &supervisor, &policy, user, small);
            let result = run(&File::open(&root).unwrap(), &spec, &CancellationToken::new()).await.unwrap();
            let output = String::from_utf8_lossy(&result.output);
            assert_eq!(result.limit_exceeded, Some(limit), "{name}: {:?} {output}", result.exit);
            assert!(!result.timed_out, "{name}");
        }
        // Within every limit: no limit named, and the command ran as the
        // command user.
        let line = argv(&["bash", "-c", "id -u; echo ok > ok.txt"]);
        let spec = sandboxed(&line, &env, &supervisor, &policy, user, small);
        let result = run(&File::open(&root).unwrap(), &spec, &CancellationToken::new()).await.unwrap();
        assert_eq!((result.exit, result.limit_exceeded), (Exit::Code(0), None));
        // SAFETY: getuid has no preconditions.
        let want = user.map_or(unsafe { libc::getuid() }, |u| u.uid);
        assert_eq!(String::from_utf8_lossy(&result.output).trim(), want.to_string());
    }
}

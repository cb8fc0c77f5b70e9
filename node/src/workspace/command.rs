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
mod tests;

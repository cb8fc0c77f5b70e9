//! The command executor: a template's fixed argv, run in an accepted
//! workspace. No shell, no PTY, no argument from the model.
//!
//! - The child starts in the workspace root: `fchdir` on the held handle in
//!   `pre_exec`, so a root renamed or swapped since acceptance is not
//!   followed by path.
//! - Its environment is cleared down to the allowlisted names (their values
//!   taken from the node's own environment).
//! - It leads a process group of its own. A timeout or a cancel ends the
//!   whole group: `SIGTERM`, a grace period, then `SIGKILL`. When the child
//!   exits by itself, whatever it left running in its group is killed too
//!   (the request owns everything it started).
//! - stdout and stderr are drained together into one output buffer with one
//!   cap; past it the rest is read and dropped (so the child never blocks on
//!   a full pipe) and the result says `truncated`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

/// Time between `SIGTERM` and `SIGKILL` of a group being ended.
pub const TERM_GRACE: Duration = Duration::from_secs(2);

/// What to run and with what bounds.
#[derive(Debug, Clone)]
pub struct CommandSpec<'a> {
    pub argv: &'a [String],
    pub env_allowlist: &'a [String],
    pub timeout: Duration,
    pub max_output_bytes: usize,
    pub grace: Duration,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("the command has no program")]
    EmptyArgv,
    /// The program does not exist or cannot be executed (the reason only:
    /// argv stays out of errors and logs).
    #[error("the command could not be started")]
    SpawnFailed,
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
    let (program, args) = spec.argv.split_first().ok_or(CommandError::EmptyArgv)?;
    let mut command = tokio::process::Command::new(program);
    command.args(args).env_clear().stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for name in spec.env_allowlist {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.process_group(0).kill_on_drop(true);
    let dir = root.as_raw_fd();
    // SAFETY: only fchdir, which is async-signal-safe, runs between fork
    // and exec; `dir` stays open in the parent until the spawn returns.
    unsafe {
        command.pre_exec(move || if libc::fchdir(dir) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
    }
    let started = Instant::now();
    let mut child = command.spawn().map_err(|_| CommandError::SpawnFailed)?;
    let group = child.id().map(|pid| pid as i32);
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
    let drained = futures_util::future::join(drain(stdout), drain(stderr));
    let (mut timed_out, mut cancelled) = (false, false);
    let waited = async {
        let status = tokio::select! {
            status = child.wait() => status,
            _ = tokio::time::sleep(spec.timeout) => {
                timed_out = true;
                end_group(group, &mut child, spec.grace).await
            }
            _ = cancel.cancelled() => {
                cancelled = true;
                end_group(group, &mut child, spec.grace).await
            }
        };
        // Whatever the child left running in its group goes with it; then
        // the pipes close and the drain ends.
        kill_group(group, libc::SIGKILL);
        status
    };
    // The pipes are drained while the child runs, or it blocks on them.
    let (status, _) = tokio::join!(waited, drained);
    let status = status.map_err(|_| CommandError::SpawnFailed)?;
    let exit = match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(signal)) => Exit::Signal(signal),
        (None, None) => Exit::Code(-1),
    };
    let Output { kept, truncated } = std::mem::take(&mut *output.lock().unwrap());
    Ok(CommandResult { exit, timed_out, cancelled, output: kept, truncated, duration: started.elapsed() })
}

/// `SIGTERM` to the group, `SIGKILL` after `grace` if the child is still
/// there; the child's status.
async fn end_group(
    group: Option<i32>,
    child: &mut tokio::process::Child,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    kill_group(group, libc::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            kill_group(group, libc::SIGKILL);
            child.wait().await
        }
    }
}

fn kill_group(group: Option<i32>, signal: i32) {
    if let Some(pgid) = group {
        // SAFETY: killpg has no memory-safety preconditions; a group that is
        // already gone answers ESRCH, which is fine.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
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
        let dead = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dead() {
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
}

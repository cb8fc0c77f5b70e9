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
        probes.push(("read_node_environ", format!("ps -E -ww -o command= -p {node_pid} | grep -q PATH="), "denied"));
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
    let mut script =
        String::from("try() { if eval \"$2\" >/dev/null 2>&1; then echo \"$1=ok\"; else echo \"$1=denied\"; fi; }\n");
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
    std::fs::write(root.join("hostile.py"), include_str!("../../../../sandbox/testdata/hostile.py")).unwrap();
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

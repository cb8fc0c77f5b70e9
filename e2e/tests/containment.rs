//! What a workspace command can reach on the node's machine, tried by real
//! hostile commands through real `iop-edge` and `iop-node` processes (the
//! admin workspace diagnostic runs them): the sandbox (Landlock on Linux,
//! Seatbelt on macOS: `.github/workflows/macos.yml`) denies each escape the
//! threat model of docs/security.md names, and a command's processes never outlive
//! it. Where this machine has no sandbox the node refuses every command,
//! and the test checks that instead, unless `IOP_REQUIRE_SANDBOX` or
//! `IOP_REQUIRE_ALL` is set.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::{CommandLimits, WorkspaceCommand, WorkspaceEntry, WorkspaceOperation as Op};
use serde_json::{Value, json};

fn command(id: &str, script: &str) -> WorkspaceCommand {
    WorkspaceCommand::new(id, vec!["bash".into(), "-c".into(), script.into()])
}

/// The attacks of `sandbox/testdata/hostile.py` (written into the root),
/// each a command `attack-<name>`: root's powers, the terminal, the node's
/// and the supervisor's process, what the command inherited. Each exits 1
/// when refused (0: it got through; anything else: the probe failed).
const HOSTILE: &str = include_str!("../../sandbox/testdata/hostile.py");
const ATTACKS: &[(&str, &str)] = &[
    // Run as the command's first process (`exec`): only it reads its own
    // `/proc/self`.
    ("capabilities", "exec /usr/bin/python3 hostile.py capabilities $(cat bounding)"),
    ("descriptors", "exec /usr/bin/python3 hostile.py descriptors"),
    ("reboot", "/usr/bin/python3 hostile.py reboot"),
    ("sethostname", "/usr/bin/python3 hostile.py sethostname"),
    ("bpf", "/usr/bin/python3 hostile.py bpf"),
    ("perf_event_open", "/usr/bin/python3 hostile.py perf_event_open"),
    ("finit_module", "/usr/bin/python3 hostile.py finit_module"),
    ("keyring", "/usr/bin/python3 hostile.py keyring"),
    ("mknod", "/usr/bin/python3 hostile.py mknod"),
    ("unshare", "/usr/bin/python3 hostile.py unshare"),
    ("realtime", "/usr/bin/python3 hostile.py realtime"),
    ("tiocsti", "/usr/bin/python3 hostile.py tiocsti"),
    ("tiocsti_high_bits", "/usr/bin/python3 hostile.py tiocsti_high_bits"),
    ("tty", "/usr/bin/python3 hostile.py tty"),
    ("node_prlimit", "/usr/bin/python3 hostile.py prlimit $(cat node.pid)"),
    // The attacker: the node's RLIMIT_CPU to 1 s, then output the
    // node must read.
    ("node_cpu_limit", "/usr/bin/python3 hostile.py prlimit_cpu $(cat node.pid) && yes | head -c 50000000"),
    ("node_priority", "/usr/bin/python3 hostile.py setpriority $(cat node.pid)"),
    ("node_affinity", "/usr/bin/python3 hostile.py affinity $(cat node.pid)"),
    // The supervisor is the command's parent: its descriptor limit lowered
    // would stop it reading the command's status.
    ("supervisor_prlimit", "exec /usr/bin/python3 hostile.py prlimit $PPID"),
    ("net_table", "/usr/bin/python3 hostile.py net_table"),
];

/// A command that runs past a small limit of its template.
fn bounded(id: &str, script: &str, limits: CommandLimits) -> WorkspaceCommand {
    WorkspaceCommand { limits, ..command(id, script) }
}

fn small_limits() -> CommandLimits {
    CommandLimits {
        max_processes: 16,
        max_memory_bytes: 64 << 20,
        max_cpu_seconds: 2,
        max_file_size_bytes: 1 << 20,
        max_disk_bytes: 4 << 20,
    }
}

/// Reads the node's environment: on Linux its `/proc/<pid>/environ`; on
/// macOS (no `/proc`) what `ps -E` shows of a process of the same user
/// (`KERN_PROCARGS2`). Exits 0 only when the environment was read (and
/// prints none of it).
const NODE_ENVIRON: &str = if cfg!(target_os = "macos") {
    "ps -E -ww -o command= -p $(cat node.pid) | grep -q PATH= || exit 42"
} else {
    "cat /proc/$(cat node.pid)/environ || exit 42"
};

/// A machine without a command sandbox passes these tests by showing that
/// every command is refused; CI on a machine that has one (the macOS
/// workflow) sets `IOP_REQUIRE_SANDBOX` (and Linux CI `IOP_REQUIRE_ALL`),
/// so that a node that found none fails them instead.
fn no_sandbox_here() {
    assert!(
        std::env::var_os("IOP_REQUIRE_SANDBOX").is_none() && !iop_e2e::parts::require_all(),
        "IOP_REQUIRE_SANDBOX or IOP_REQUIRE_ALL is set but the node found no command sandbox"
    );
    eprintln!("no command sandbox on this machine: checking that every command is refused instead");
}

/// The commands an attacker would write. `node.pid` and `edge.port` are
/// put in the root once the stack runs (the scripts read them there).
fn site(root: &Path, outside: &Path, node_key: &Path) -> WorkspaceEntry {
    let (outside, key) = (outside.display(), node_key.display());
    WorkspaceEntry {
        reference: "site".into(),
        node: NODE.into(),
        root: root.to_str().unwrap().into(),
        operations: vec![Op::Read, Op::List, Op::Write, Op::Command],
        commands: [
            command("inside", "echo made > made.txt && cat made.txt"),
            // Each exits 42 when its own operation is refused (not 126/127
            // for a shell or program that could not start).
            command("outside", &format!("echo x > {outside}/planted || exit 42")),
            command("reserved", "mkdir -p .iop/planted || exit 42"),
            command("node_key", &format!("cat {key} || exit 42")),
            command("node_environ", NODE_ENVIRON),
            command("signal_node", "kill -STOP $(cat node.pid) || exit 42"),
            command("tcp", "exec 3<>/dev/tcp/127.0.0.1/$(cat edge.port) || exit 42"),
            command("unix", "perl -MSocket -e 'socket(my $s, PF_UNIX, SOCK_STREAM, 0) or exit 42'"),
            command("escape", &format!("{SETSID} sleep 3000 </dev/null >/dev/null 2>&1 & echo $! > escaped.pid")),
            command(
                "linger",
                &format!("{SETSID} sleep 3000 </dev/null >/dev/null 2>&1 & echo $! > lingering.pid; wait"),
            ),
            // A fork bomb whose processes wait for their children, a memory
            // hog, a disk filler of many small files. Each is finite (255
            // processes, 50 MB), so a broken limit fails the test instead
            // of taking the machine down.
            bounded(
                "bomb",
                "bomb() { if [ $1 -lt 7 ]; then bomb $(($1 + 1)) & bomb $(($1 + 1)) & fi; wait; }; bomb 0",
                small_limits(),
            ),
            bounded(
                "hog",
                "exec /usr/bin/python3 -c 'import time; b = b\"x\" * (1 << 30); time.sleep(60)'",
                small_limits(),
            ),
            bounded(
                "filler",
                "for i in $(seq 200); do head -c 262144 /dev/zero > fill$i; done; sleep 60",
                small_limits(),
            ),
        ]
        .into_iter()
        .chain(ATTACKS.iter().map(|(name, script)| command(&format!("attack-{name}"), script)))
        .collect(),
        env_allowlist: vec!["PATH".into()],
        limits: Default::default(),
        network: false,
        stages: Default::default(),
    }
}

/// The same directory and commands, with the network granted.
fn networked(site: &WorkspaceEntry) -> WorkspaceEntry {
    WorkspaceEntry { reference: "net".into(), network: true, ..site.clone() }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    stack: Stack,
}

async fn start() -> Fixture {
    start_with(Vec::new(), false).await
}

async fn start_with(node_args: Vec<&'static str>, unsandboxed_commands: bool) -> Fixture {
    start_on(node_args, unsandboxed_commands, None).await
}

/// The fixture's node started with `node_args`, the owner's
/// `unsandboxed_commands`, and `terminal` (a pseudo-terminal's side) as
/// its controlling terminal and stdin, and inherited again as fd 9, as a
/// node run in the foreground of a shell has it.
async fn start_on(
    node_args: Vec<&'static str>,
    unsandboxed_commands: bool,
    terminal: Option<std::os::fd::RawFd>,
) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let (allowed, outside) = (base.join("allowed"), base.join("outside"));
    let root = allowed.join("site");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(root.join("hostile.py"), HOSTILE).unwrap();
    // The stack writes the node's key into its own directory; its path is
    // only known once it runs, so the command reads a link to it.
    let key_link = base.join("node-key-link");
    let site = site(&root, &outside, &key_link);
    let mut stack = Stack::start(StackOptions {
        workspaces: vec![networked(&site), site],
        allowed_roots: vec![allowed, std::fs::canonicalize(std::env::temp_dir()).unwrap()],
        edge_args: vec!["--admin-workspace-calls"],
        start_node: false,
        node_args,
        unsandboxed_commands,
        ..Default::default()
    })
    .await;
    std::os::unix::fs::symlink(stack.pki.dir.join(format!("node-{NODE}-key.pem")), &key_link).unwrap();
    let pair = stack.pki.node_cert(NODE, iop_e2e::pki::Validity::Current).unwrap();
    let ca = stack.pki.ca_file.clone();
    let (node, metrics) = match terminal {
        None => stack.spawn_node(&pair, &ca).await,
        Some(tty) => {
            stack
                .spawn_node_with(&pair, &ca, move |command| {
                    // SAFETY: only async-signal-safe calls between fork and
                    // exec, on a descriptor the test keeps open.
                    unsafe {
                        command.pre_exec(move || {
                            if libc::setsid() < 0
                                || libc::dup2(tty, 0) < 0
                                || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0
                                || libc::dup2(tty, 9) < 0
                            {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                })
                .await
        }
    };
    std::fs::write(root.join("node.pid"), node.pid().to_string()).unwrap();
    std::fs::write(root.join("edge.port"), stack.http.port().to_string()).unwrap();
    stack.nodes.push(node);
    stack.node_metrics = Some(metrics);
    stack.wait_node_ready(NODE).await;
    Fixture { _tmp: tmp, root, outside, stack }
}

/// Runs each command id in workspace `site` through the admin diagnostic;
/// their results.
async fn run(stack: &Stack, ids: &[&str]) -> Vec<Value> {
    run_in(stack, "site", ids).await
}

async fn run_in(stack: &Stack, workspace: &str, ids: &[&str]) -> Vec<Value> {
    let calls: Vec<Value> = ids.iter().map(|id| json!({"op": "command", "command": id})).collect();
    let body = serde_json::to_vec(&json!({ "calls": calls })).unwrap();
    let response = stack
        .client
        .post(stack.admin_url(&format!("/admin/v1/workspaces/{workspace}/calls")))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let (status, answer) = json_body(response).await;
    assert_eq!(status, 200, "{answer}");
    answer["results"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_hostile_command_stays_inside_what_the_owner_consented_to() {
    let f = start().await;
    let stack = &f.stack;
    let sandbox = stack.node(NODE).await["command_sandbox"].as_str().unwrap().to_string();
    let ids = ["inside", "outside", "reserved", "node_key", "node_environ", "signal_node", "tcp", "unix"];
    let results = run(stack, &ids).await;
    if sandbox == "unavailable" {
        // No sandbox here: every command is refused, nothing ran.
        no_sandbox_here();
        assert!(results.iter().all(|r| r["result"] == "sandbox_unavailable"), "{results:?}");
        assert!(!f.root.join("made.txt").exists());
        return;
    }
    assert_eq!(sandbox, if cfg!(target_os = "macos") { "seatbelt" } else { "landlock" });
    let exit = |i: usize| results[i]["exit_code"].as_i64();
    let output = |i: usize| results[i]["output"].as_str().unwrap_or_default().to_string();
    assert_eq!((exit(0), output(0).trim()), (Some(0), "made"), "a command works in its root: {results:?}");
    for (i, id) in ids.iter().enumerate().skip(1) {
        assert_eq!(exit(i), Some(42), "`{id}` was not denied: {}", results[i]);
    }
    assert!(!f.outside.join("planted").exists(), "wrote outside the root");
    assert!(!f.root.join(".iop/planted").exists(), "wrote into .iop");
    assert!(!output(3).contains("PRIVATE KEY"), "read the node's key");
    assert!(!output(4).contains("PATH="), "read the node's environment");
    // The node was not stopped: it still answers.
    let response = stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(stack.node(NODE).await["command_sandbox"], json!(sandbox));
    // The workspace that grants the network reaches the same port.
    let granted = run_in(stack, "net", &["tcp", "outside"]).await;
    assert_eq!(granted[0]["exit_code"], 0, "network: true lets a command connect: {granted:?}");
    assert_eq!(granted[1]["exit_code"], 42, "and nothing else: {granted:?}");
}

/// A process a command hid with `setsid` is gone when the call answers.
#[tokio::test]
async fn nothing_a_command_started_outlives_it() {
    let f = start().await;
    let results = run(&f.stack, &["escape"]).await;
    if results[0]["result"] == "sandbox_unavailable" {
        no_sandbox_here();
        return;
    }
    assert_eq!(results[0]["exit_code"], 0, "{results:?}");
    let pid: i32 = std::fs::read_to_string(f.root.join("escaped.pid")).unwrap().trim().parse().unwrap();
    wait_until("the escaped process is gone", WAIT, || async { !alive(pid) }).await;
}

/// A workspace whose root holds the node's own key and certificates is
/// refused (its files would be the tools' to read), whatever the owner's
/// allowed roots say.
#[tokio::test]
async fn a_root_holding_the_nodes_files_is_refused() {
    let f = start().await;
    let stack = &f.stack;
    let generation = stack.node(NODE).await["generation"].as_u64().unwrap();
    let text = std::fs::read_to_string(&stack.edge_config).unwrap();
    let mut config = iop_proto::config::EdgeConfig::from_yaml(&text).unwrap();
    let mut keys = config.workspaces[0].clone();
    keys.reference = "keys".into();
    keys.root = stack.pki.dir.to_str().unwrap().into();
    config.workspaces.push(keys);
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    stack.wait_node_ready_after(NODE, generation).await;
    wait_until("the keys workspace is refused", WAIT, || async {
        stack.node(NODE).await["workspaces"]["keys"] == "node_files"
    })
    .await;
    assert_eq!(stack.node(NODE).await["workspaces"]["site"], "accepted");
}

/// A machine without a sandbox (`--test-no-sandbox` acts as one): the node
/// refuses every command unless its owner allowed unsandboxed commands, and
/// says which in `/admin/v1/nodes`; the process cleanup holds either way.
#[tokio::test]
async fn without_a_sandbox_commands_run_only_where_the_owner_allows_it() {
    let refused = start_with(vec!["--test-no-sandbox"], false).await;
    assert_eq!(refused.stack.node(NODE).await["command_sandbox"], "unavailable");
    let results = run(&refused.stack, &["inside", "escape"]).await;
    let labels: Vec<&str> = results.iter().map(|r| r["result"].as_str().unwrap()).collect();
    assert_eq!(labels, ["sandbox_unavailable", "sandbox_unavailable"]);
    assert!(!refused.root.join("made.txt").exists() && !refused.root.join("escaped.pid").exists());

    let allowed = start_with(vec!["--test-no-sandbox"], true).await;
    assert_eq!(allowed.stack.node(NODE).await["command_sandbox"], "unsandboxed");
    let results = run(&allowed.stack, &["inside", "escape"]).await;
    assert_eq!((results[0]["exit_code"].as_i64(), results[1]["exit_code"].as_i64()), (Some(0), Some(0)), "{results:?}");
    let pid: i32 = std::fs::read_to_string(allowed.root.join("escaped.pid")).unwrap().trim().parse().unwrap();
    wait_until("the escaped process is gone", WAIT, || async { !alive(pid) }).await;
}

/// The node process dies (SIGKILL: no cleanup of its own runs) while a
/// command runs: the supervisor notices and ends everything the command
/// started.
#[tokio::test]
async fn a_command_does_not_outlive_a_killed_node() {
    let mut f = start().await;
    let (client, url) = (f.stack.client.clone(), f.stack.admin_url("/admin/v1/workspaces/site/calls"));
    let body = serde_json::to_vec(&json!({"calls": [{"op": "command", "command": "linger"}]})).unwrap();
    let pending =
        tokio::spawn(
            async move { client.post(url).header("content-type", "application/json").body(body).send().await },
        );
    let pid_file = f.root.join("lingering.pid");
    wait_until("the command started", WAIT, || async {
        std::fs::read_to_string(&pid_file).is_ok_and(|t| t.ends_with('\n'))
    })
    .await;
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let mut node = f.stack.nodes.remove(0);
    node.child.kill().await.unwrap();
    wait_until("the lingering process is gone", WAIT, || async { !alive(pid) }).await;
    pending.abort();
}

/// The command's stand-in for "the node's owner would let this through":
/// every attack of `hostile.py` is refused, the node keeps serving, and
/// `/admin/v1/nodes` says what this machine's sandbox cannot refuse.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_command_has_no_privilege_and_cannot_touch_the_node_or_its_supervisor() {
    let f = start().await;
    let stack = &f.stack;
    let node = stack.node(NODE).await;
    if node["command_sandbox"] == "unavailable" {
        no_sandbox_here();
        return;
    }
    let gaps: Vec<&str> = node["sandbox_gaps"].as_array().unwrap().iter().map(|g| g.as_str().unwrap()).collect();
    let known = ["signal_scope", "tcp", "reserved_writable", "bounding_set", "priority"];
    assert!(gaps.iter().all(|g| known.contains(g)), "{gaps:?}");
    // The bounding set is cleared wherever the node could (the gap says
    // where it could not).
    let bounding = if gaps.contains(&"bounding_set") { "" } else { "bounding" };
    std::fs::write(f.root.join("bounding"), bounding).unwrap();
    let ids: Vec<String> = ATTACKS.iter().map(|(name, _)| format!("attack-{name}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let results = run(stack, &ids).await;
    for (result, id) in results.iter().zip(&ids) {
        assert_eq!(result["exit_code"], 1, "`{id}` was not refused: {result}");
    }
    assert!(!f.root.join("kmsg").exists(), "a device node was made");
    // The node's limits are its own: it still answers, after more than a
    // second of CPU since the RLIMIT_CPU attempt.
    assert!(alive(stack.nodes[0].pid() as i32));
    let response = stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await;
    assert_eq!(response.status(), 200);
}

/// The node runs in the foreground of a terminal (its controlling
/// terminal and stdin, and a descriptor on it the node inherited): the
/// command has no terminal, types nothing into the owner's, and gets none
/// of the node's descriptors.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_command_cannot_type_into_the_terminal_the_node_runs_in() {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors; no name, settings or size.
    let opened =
        unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(opened, 0, "openpty");
    let f = start_on(Vec::new(), false, Some(slave)).await;
    if f.stack.node(NODE).await["command_sandbox"] == "unavailable" {
        no_sandbox_here();
        return;
    }
    let results =
        run(&f.stack, &["attack-tty", "attack-tiocsti", "attack-tiocsti_high_bits", "attack-descriptors"]).await;
    for result in &results {
        assert_eq!(result["exit_code"], 1, "not refused: {results:?}");
    }
    // Nothing was typed into the terminal: its input queue is empty.
    // SAFETY: fcntl and read on the descriptor opened above.
    unsafe {
        let flags = libc::fcntl(slave, libc::F_GETFL);
        libc::fcntl(slave, libc::F_SETFL, flags | libc::O_NONBLOCK);
        let mut buf = [0u8; 64];
        let n = libc::read(slave, buf.as_mut_ptr().cast(), buf.len());
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert!(n < 0 && errno == Some(libc::EAGAIN), "the terminal has input: {:?}", &buf[..n.max(0) as usize]);
        libc::close(slave);
        libc::close(master);
    }
    assert_eq!(f.stack.node(NODE).await["phase"], "ready");
}

/// A fork bomb, a memory hog and a disk filler each end at their
/// template's limit with a typed result naming it, counted by the node.
#[tokio::test]
async fn each_limit_ends_its_command_with_a_typed_result() {
    let f = start().await;
    let stack = &f.stack;
    let results = run(stack, &["bomb", "hog", "filler"]).await;
    if results[0]["result"] == "sandbox_unavailable" {
        no_sandbox_here();
        return;
    }
    let named: Vec<(&str, &str)> =
        results.iter().map(|r| (r["result"].as_str().unwrap(), r["limit"].as_str().unwrap_or("-"))).collect();
    assert_eq!(
        named,
        [("limit_exceeded", "processes"), ("limit_exceeded", "memory"), ("limit_exceeded", "disk")],
        "{results:?}"
    );
    for limit in ["processes", "memory", "disk"] {
        let metric = format!("iop_node_workspace_command_limit_exceeded_total{{limit=\"{limit}\"}}");
        assert_eq!(stack.metric_at(stack.node_metrics.as_ref().unwrap(), &metric).await, 1.0, "{metric}");
    }
    let response = stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await;
    assert_eq!(response.status(), 200);
}

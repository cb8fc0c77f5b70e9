//! Install, uninstall and status against a temporary HOME with a fake
//! command runner (no launchctl or systemctl runs); the rendered files are
//! read back by their own tools where those exist (python3's plistlib,
//! `systemd-analyze verify`).

use std::os::unix::fs::PermissionsExt;

use super::*;

/// The config's directory: spaces, `&`, quotes, `<`, `%` and `$`,
/// everything either file format must escape.
const AWKWARD: &str = "my \"nodes\" & <co>'s 100% $HOME";
/// The executable's directory: as awkward as systemd takes an executable
/// path (no quotes or backslashes there).
const EXE_DIR: &str = "bin & 100% $HOME";

const UID: u32 = 501;

/// An executable that exists here: `/usr/bin/true` (macOS has no
/// `/bin/true`), or `/bin/true` on a Linux without merged `/usr`.
fn true_exe() -> &'static Path {
    ["/usr/bin/true", "/bin/true"].into_iter().map(Path::new).find(|p| p.exists()).expect("no true(1)")
}

struct Fixture {
    dir: tempfile::TempDir,
    host: Host,
    spec: ServiceSpec,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let awkward = dir.path().join(AWKWARD);
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&awkward).unwrap();
        let config = awkward.join("node.yaml");
        std::fs::write(
            &config,
            "edge: { url: \"https://edge.example:7443\" }\ntls: { ca_file: ca.pem, cert_file: n.pem, key_file: k.pem }\n",
        )
        .unwrap();
        let exe = dir.path().join(EXE_DIR).join("iop-node");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        std::fs::copy(true_exe(), &exe).unwrap();
        let spec = ServiceSpec::prepare(&exe, &config).unwrap();
        Self { host: Host { home, xdg_config_home: None, uid: UID }, spec, dir }
    }

    fn home(&self) -> &Path {
        &self.host.home
    }
}

/// Records every command; answers with `reply(command line)`.
struct FakeRunner<F: FnMut(&str) -> Output> {
    calls: Vec<String>,
    pauses: usize,
    reply: F,
}

fn runner<F: FnMut(&str) -> Output>(reply: F) -> FakeRunner<F> {
    FakeRunner { calls: Vec::new(), pauses: 0, reply }
}

impl<F: FnMut(&str) -> Output> Runner for FakeRunner<F> {
    fn run(&mut self, program: &str, args: &[&str]) -> Result<Output, ServiceError> {
        let line = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
        self.calls.push(line.clone());
        Ok((self.reply)(&line))
    }

    fn pause(&mut self, _: Duration) {
        self.pauses += 1;
    }
}

fn ok(stdout: &str) -> Output {
    Output { success: true, code: Some(0), stdout: stdout.into(), stderr: String::new() }
}

fn failed(code: i32, stderr: &str) -> Output {
    Output { success: false, code: Some(code), stdout: String::new(), stderr: stderr.into() }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The plist as python3's plistlib reads it, as JSON (python3 is a test
/// prerequisite: scripts/test-deps installs it where it is missing).
fn plistlib(path: &Path) -> serde_json::Value {
    let script = "import json, plistlib, sys; print(json.dumps(plistlib.load(open(sys.argv[1], 'rb'))))";
    let output = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("python3: {e} (scripts/test-deps installs it)"));
    assert!(output.status.success(), "plistlib refused the plist: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn launchd_install_writes_a_plist_plistlib_reads_and_bootstraps_it() {
    let f = Fixture::new();
    let mut r =
        runner(|line| if line.starts_with("launchctl print") { failed(113, "Could not find service") } else { ok("") });
    let summary = install(Manager::Launchd, &f.host, &f.spec, &mut r).unwrap();

    let plist = f.home().join("Library/LaunchAgents/dev.iop.node.plist");
    assert_eq!(
        r.calls,
        [
            "launchctl print gui/501/dev.iop.node".to_string(),
            "launchctl enable gui/501/dev.iop.node".into(),
            format!("launchctl bootstrap gui/501 {}", plist.display()),
        ]
    );
    assert_eq!(mode(&plist), 0o644);
    let logs = f.home().join("Library/Logs/iop-node");
    assert!(logs.is_dir(), "the log directory is created");
    assert!(summary.to_string().contains(&format!("log: {}/iop-node.log", logs.display())), "{summary}");
    let leftovers: Vec<_> = std::fs::read_dir(plist.parent().unwrap()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary file is left behind");

    let text = std::fs::read_to_string(&plist).unwrap();
    assert!(text.contains("&amp; &lt;co&gt;&apos;s"), "{text}");
    let parsed = plistlib(&plist);
    let expected = serde_json::json!({
        "Label": "dev.iop.node",
        "ProgramArguments": [f.spec.exe(), "--config", f.spec.config()],
        "RunAtLoad": true,
        "KeepAlive": { "SuccessfulExit": false },
        "ThrottleInterval": 10,
        "ProcessType": "Interactive",
        "StandardErrorPath": format!("{}/iop-node.log", logs.display()),
        "StandardOutPath": format!("{}/iop-node.out.log", logs.display()),
    });
    assert_eq!(parsed, expected);
    assert!(f.spec.config().contains(AWKWARD) && f.spec.config().starts_with('/'));
}

#[test]
fn launchd_reinstall_boots_out_the_loaded_job_first_and_waits_for_it() {
    let f = Fixture::new();
    let mut prints = 0;
    let mut r = runner(|line| {
        if line.starts_with("launchctl print") {
            prints += 1;
            // Loaded, still loaded just after bootout, then gone.
            return if prints <= 2 { ok("") } else { failed(113, "") };
        }
        ok("")
    });
    let summary = install(Manager::Launchd, &f.host, &f.spec, &mut r).unwrap();
    let commands: Vec<&str> = r.calls.iter().map(|c| c.split(' ').nth(1).unwrap()).collect();
    assert_eq!(commands, ["print", "bootout", "print", "print", "enable", "bootstrap"]);
    assert_eq!(r.pauses, 1);
    assert!(summary.to_string().contains("stopped the running dev.iop.node"));
}

#[test]
fn a_failed_bootstrap_reports_launchctl_and_a_hint() {
    let f = Fixture::new();
    let mut r = runner(|line| match line.split(' ').nth(1) {
        Some("print") => failed(113, ""),
        Some("bootstrap") => failed(5, "Bootstrap failed: 5: Input/output error\n"),
        _ => ok(""),
    });
    let err = install(Manager::Launchd, &f.host, &f.spec, &mut r).unwrap_err().to_string();
    assert!(err.contains("failed (exit code 5): Bootstrap failed: 5: Input/output error."), "{err}");
    assert!(err.contains("logged-in desktop session"), "{err}");
}

#[test]
fn launchd_uninstall_boots_out_and_removes_the_plist() {
    let f = Fixture::new();
    let mut r = runner(|line| if line.starts_with("launchctl print") { failed(113, "") } else { ok("") });
    install(Manager::Launchd, &f.host, &f.spec, &mut r).unwrap();
    let plist = f.host.service_file(Manager::Launchd);

    let mut r = runner(|_| ok(""));
    let summary = uninstall(Manager::Launchd, &f.host, &mut r).unwrap();
    assert_eq!(r.calls, ["launchctl print gui/501/dev.iop.node", "launchctl bootout gui/501/dev.iop.node"]);
    assert!(!plist.exists());
    assert!(summary.to_string().contains("removed"), "{summary}");

    let mut r = runner(|_| failed(113, ""));
    let summary = uninstall(Manager::Launchd, &f.host, &mut r).unwrap();
    assert_eq!(r.calls, ["launchctl print gui/501/dev.iop.node"], "nothing to boot out");
    assert!(summary.to_string().contains("was not loaded"), "{summary}");
}

const LAUNCHCTL_PRINT: &str = "gui/501/dev.iop.node = {
\tactive count = 1
\tpath = /Users/me/Library/LaunchAgents/dev.iop.node.plist
\ttype = LaunchAgent
\tstate = running

\tprogram = /usr/local/bin/iop-node
\targuments = {
\t\t/usr/local/bin/iop-node
\t\t--config
\t\t/Users/me/node.yaml
\t}

\tevent triggers = {
\t\tstate = active
\t}
\truns = 2
\tpid = 4242
\tlast exit code = 1
}
";

#[test]
fn launchd_status_summarizes_launchctl_print() {
    let state = LaunchdState::parse(LAUNCHCTL_PRINT);
    assert_eq!(
        state,
        LaunchdState { state: Some("running".into()), pid: Some(4242), runs: Some(2), last_exit: Some("1".into()) }
    );
    let never = LaunchdState::parse("x = {\n\tstate = not running\n\tlast exit code = (never exited)\n}\n");
    assert_eq!(never.to_string(), "is loaded, not running, last exit code (never exited)");

    let f = Fixture::new();
    let mut r = runner(|line| if line.starts_with("launchctl print") { failed(113, "") } else { ok("") });
    let summary = status(Manager::Launchd, &f.host, Some(&f.spec), &mut r).unwrap();
    assert!(!summary.running);
    assert!(summary.to_string().contains("not installed") && summary.to_string().contains("is not loaded"));

    install(Manager::Launchd, &f.host, &f.spec, &mut r).unwrap();
    let mut r = runner(|_| ok(LAUNCHCTL_PRINT));
    let summary = status(Manager::Launchd, &f.host, Some(&f.spec), &mut r).unwrap();
    assert!(summary.running, "{summary}");
    let text = summary.to_string();
    assert!(text.contains("runs this executable with this config"), "{text}");
    assert!(text.contains("is loaded, running, pid 4242, started 2 time(s), last exit code 1"), "{text}");

    let other_config = f.dir.path().join("other.yaml");
    std::fs::copy(f.spec.config(), &other_config).unwrap();
    let other = ServiceSpec::prepare(Path::new(f.spec.exe()), &other_config).unwrap();
    let summary = status(Manager::Launchd, &f.host, Some(&other), &mut r).unwrap();
    assert!(summary.to_string().contains("differs from what install would write now"), "{summary}");
}

#[test]
fn systemd_install_writes_the_unit_and_enables_it() {
    let f = Fixture::new();
    let mut r = runner(|line| if line.contains("is-active") { failed(3, "") } else { ok("no\n") });
    let summary = install(Manager::Systemd, &f.host, &f.spec, &mut r).unwrap();
    assert_eq!(
        r.calls,
        [
            "systemctl --user is-active --quiet iop-node.service",
            "systemctl --user daemon-reload",
            "systemctl --user enable --now iop-node.service",
            "loginctl show-user 501 --property=Linger --value",
        ]
    );
    let unit_file = f.home().join(".config/systemd/user/iop-node.service");
    assert_eq!(mode(&unit_file), 0o644);
    let text = summary.to_string();
    assert!(text.contains("loginctl enable-linger"), "{text}");
    assert!(text.contains("journalctl --user -u iop-node"), "{text}");

    let unit = std::fs::read_to_string(&unit_file).unwrap();
    let lines: Vec<&str> = unit.lines().collect();
    let exec =
        format!("ExecStart=\"{}\" \"--config\" {}", f.spec.exe().replace('%', "%%"), systemd_quote(f.spec.config()));
    for line in [
        "[Unit]",
        "StartLimitIntervalSec=0",
        "[Service]",
        "Type=exec",
        exec.as_str(),
        "Restart=on-failure",
        "RestartSec=5s",
        "RestartSteps=5",
        "RestartMaxDelaySec=60s",
        "[Install]",
        "WantedBy=default.target",
    ] {
        assert!(lines.contains(&line), "missing `{line}` in\n{unit}");
    }
    assert!(exec.contains(r#"my \"nodes\" & <co>'s 100%% $$HOME"#), "{exec}");
    assert!(exec.contains("bin & 100%% $HOME/iop-node"), "{exec}");
}

#[test]
fn systemd_refuses_an_executable_path_it_cannot_run() {
    let f = Fixture::new();
    let exe = Path::new(f.spec.config()).with_file_name("iop-node");
    let spec = ServiceSpec::prepare(&exe, Path::new(f.spec.config())).unwrap();
    let mut r = runner(|_| ok(""));
    let err = install(Manager::Systemd, &f.host, &spec, &mut r).unwrap_err().to_string();
    assert!(err.contains("systemd refuses an executable path containing a quote"), "{err}");
    assert!(r.calls.is_empty());
    assert!(!f.host.service_file(Manager::Systemd).exists());
    // launchd takes any path.
    let mut r = runner(|line| if line.starts_with("launchctl print") { failed(113, "") } else { ok("") });
    install(Manager::Launchd, &f.host, &spec, &mut r).unwrap();
}

#[test]
fn systemd_reinstall_restarts_a_running_unit_and_honours_xdg_config_home() {
    let mut f = Fixture::new();
    let xdg = f.dir.path().join("xdg");
    f.host.xdg_config_home = Some(xdg.clone());
    let mut r = runner(|line| if line.starts_with("loginctl") { ok("yes\n") } else { ok("") });
    let summary = install(Manager::Systemd, &f.host, &f.spec, &mut r).unwrap();
    assert!(xdg.join("systemd/user/iop-node.service").is_file());
    assert!(r.calls.contains(&"systemctl --user restart iop-node.service".to_string()), "{:?}", r.calls);
    let text = summary.to_string();
    assert!(text.contains("restarted") && text.contains("linger is on"), "{text}");
}

#[test]
fn systemd_uninstall_disables_removes_and_reloads() {
    let f = Fixture::new();
    let mut r = runner(|_| ok(""));
    install(Manager::Systemd, &f.host, &f.spec, &mut r).unwrap();

    let mut r = runner(|_| ok(""));
    uninstall(Manager::Systemd, &f.host, &mut r).unwrap();
    assert_eq!(r.calls, ["systemctl --user disable --now iop-node.service", "systemctl --user daemon-reload"]);
    assert!(!f.host.service_file(Manager::Systemd).exists());

    let mut r = runner(|_| ok(""));
    let summary = uninstall(Manager::Systemd, &f.host, &mut r).unwrap();
    assert!(r.calls.is_empty());
    assert!(summary.to_string().contains("nothing to uninstall"));
}

#[test]
fn systemd_status_summarizes_systemctl_show() {
    let f = Fixture::new();
    let mut r = runner(|_| ok(""));
    install(Manager::Systemd, &f.host, &f.spec, &mut r).unwrap();
    let show = "LoadState=loaded\nUnitFileState=enabled\nActiveState=active\nSubState=running\nMainPID=77\n\
                ExecMainStatus=0\nNRestarts=3\n";
    let mut r = runner(|line| if line.contains(" show ") { ok(show) } else { ok("no\n") });
    let summary = status(Manager::Systemd, &f.host, Some(&f.spec), &mut r).unwrap();
    assert!(summary.running);
    let text = summary.to_string();
    assert!(text.contains("iop-node.service is enabled, active (running), pid 77, restarted 3 time(s)"), "{text}");
    assert!(text.contains("loginctl enable-linger"), "{text}");

    let failed_unit = "LoadState=loaded\nUnitFileState=enabled\nActiveState=failed\nSubState=failed\nMainPID=0\n\
                       ExecMainStatus=2\nNRestarts=0\n";
    assert_eq!(
        SystemdState::parse(failed_unit).to_string(),
        "is enabled, failed (failed), restarted 0 time(s), last exit status 2"
    );
    assert_eq!(SystemdState::parse("LoadState=not-found\nActiveState=inactive\n").to_string(), "is not loaded");
}

/// systemd reads the unit back: the quoting must yield the executable's
/// real path (verify fails on a path that does not exist) whatever it holds.
/// `systemd-analyze` is a Linux test prerequisite (scripts/test-deps).
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "systemd-analyze is Linux's")]
fn systemd_analyze_accepts_the_unit() {
    let f = Fixture::new();
    let path = f.dir.path().join(UNIT);
    std::fs::write(&path, unit(&f.spec)).unwrap();
    // System mode: `--user` needs a user manager, which CI containers lack;
    // nothing in the unit depends on the mode.
    let output = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("systemd-analyze: {e} (scripts/test-deps installs it)"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "systemd-analyze verify: {stderr}");
    // Before systemd 254 the backoff keys are unknown (and ignored): nothing else may be reported.
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.contains("Unknown key 'RestartSteps'") || line.contains("Unknown key 'RestartMaxDelaySec'"),
            "systemd-analyze verify: {stderr}"
        );
    }
}

#[test]
fn prepare_refuses_a_config_the_node_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let exe = true_exe();
    let missing = ServiceSpec::prepare(exe, &dir.path().join("nope.yaml")).unwrap_err().to_string();
    assert!(missing.starts_with("refusing to install: cannot read config file"), "{missing}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "edge: { url: \"http://plain\" }\ntls: { ca_file: a, cert_file: b, key_file: c }\n").unwrap();
    let invalid = ServiceSpec::prepare(exe, &bad).unwrap_err().to_string();
    assert!(invalid.contains("edge.url: must be https://HOST[:PORT]"), "{invalid}");
    let newline = dir.path().join("a\nb.yaml");
    std::fs::copy(Fixture::new().spec.config(), &newline).unwrap();
    let control = ServiceSpec::prepare(exe, &newline).unwrap_err().to_string();
    assert!(control.contains("contains a control character"), "{control}");
}

#[test]
fn prepare_makes_a_relative_config_absolute() {
    let f = Fixture::new();
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff(Path::new(f.spec.config()), &cwd);
    let spec = ServiceSpec::prepare(true_exe(), &relative).unwrap();
    assert!(Path::new(spec.config()).is_absolute(), "{}", spec.config());
    assert!(Path::new(spec.config()).exists());
}

/// `target` relative to `base` (both absolute), with `..` steps.
fn pathdiff(target: &Path, base: &Path) -> PathBuf {
    let common = target.components().zip(base.components()).take_while(|(a, b)| a == b).count();
    let ups = base.components().count() - common;
    let mut out: PathBuf = std::iter::repeat_n("..", ups).collect();
    out.extend(target.components().skip(common));
    out
}

#[test]
fn atomic_writes_replace_the_file_with_mode_0644() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.plist");
    std::fs::write(&path, "old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    write_atomic(&path, "new").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
    assert_eq!(mode(&path), 0o644);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    let err = write_atomic(&dir.path().join("missing-dir/f"), "x").unwrap_err().to_string();
    assert!(err.starts_with("cannot write"), "{err}");
}

//! `iop-node service install|uninstall|status`: the node as a per-user
//! service, a launchd LaunchAgent on macOS and a systemd user unit on Linux.
//!
//! Staged like a reconcile: [`ServiceSpec::prepare`] validates (the config
//! must load with the node's own loader; paths become absolute), `render`
//! builds the file from values, and [`install`] / [`uninstall`] /
//! [`status`] apply it: write the file atomically and drive
//! `launchctl` / `systemctl` through a [`Runner`], which tests replace to
//! see which commands would run.

mod error;
mod render;
mod spec;
#[cfg(test)]
mod tests;

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use error::ServiceError;
pub use render::{log_files, plist, systemd_exe_problem, systemd_quote, unit, xml_escape};
use spec::check_path;
pub use spec::{LABEL, ServiceSpec};

/// The systemd user unit's name.
pub const UNIT: &str = "iop-node.service";

/// How long `install` waits for launchd to let go of a booted-out service.
const BOOTOUT_WAIT: Duration = Duration::from_secs(5);
const BOOTOUT_POLL: Duration = Duration::from_millis(250);

/// The service manager this runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    Launchd,
    Systemd,
}

impl Manager {
    pub fn for_this_os() -> Result<Self, ServiceError> {
        if cfg!(target_os = "macos") {
            Ok(Self::Launchd)
        } else if cfg!(target_os = "linux") {
            Ok(Self::Systemd)
        } else {
            Err(ServiceError::Unsupported)
        }
    }
}

/// The current user, as far as the service files go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub home: PathBuf,
    /// `$XDG_CONFIG_HOME` when set to an absolute path.
    pub xdg_config_home: Option<PathBuf>,
    pub uid: u32,
}

impl Host {
    pub fn from_env() -> Result<Self, ServiceError> {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .ok_or_else(|| ServiceError::Environment("HOME is not set to an absolute path".into()))?;
        check_path("HOME", &home)?;
        let xdg_config_home = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
        if let Some(xdg) = &xdg_config_home {
            check_path("XDG_CONFIG_HOME", xdg)?;
        }
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        Ok(Self { home, xdg_config_home, uid })
    }

    /// The plist or unit file.
    pub fn service_file(&self, manager: Manager) -> PathBuf {
        match manager {
            Manager::Launchd => self.home.join("Library/LaunchAgents").join(format!("{LABEL}.plist")),
            Manager::Systemd => {
                let config = self.xdg_config_home.clone().unwrap_or_else(|| self.home.join(".config"));
                config.join("systemd/user").join(UNIT)
            }
        }
    }

    /// launchd's log directory (systemd logs to the journal).
    pub fn log_dir(&self) -> PathBuf {
        self.home.join("Library/Logs/iop-node")
    }

    fn launchd_domain(&self) -> String {
        format!("gui/{}", self.uid)
    }

    fn launchd_target(&self) -> String {
        format!("gui/{}/{LABEL}", self.uid)
    }
}

/// What a command printed and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    pub success: bool,
    /// `None` when it was ended by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `launchctl`, `systemctl` and `loginctl`.
pub trait Runner {
    fn run(&mut self, program: &str, args: &[&str]) -> Result<Output, ServiceError>;

    /// Waits between polls.
    fn pause(&mut self, duration: Duration) {
        std::thread::sleep(duration);
    }
}

/// The real commands.
pub struct SystemRunner;

impl Runner for SystemRunner {
    fn run(&mut self, program: &str, args: &[&str]) -> Result<Output, ServiceError> {
        let output = std::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|source| ServiceError::Spawn { program: program.into(), source })?;
        Ok(Output {
            success: output.status.success(),
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// Runs a command that must succeed.
fn run_ok(runner: &mut dyn Runner, program: &str, args: &[&str], hint: &str) -> Result<Output, ServiceError> {
    let output = runner.run(program, args)?;
    if output.success {
        return Ok(output);
    }
    Err(ServiceError::Command {
        command: std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" "),
        status: output.code.map_or_else(|| "killed by a signal".into(), |c| format!("exit code {c}")),
        stderr: output.stderr.trim().to_string(),
        hint: if hint.is_empty() { String::new() } else { format!(". {hint}") },
    })
}

const LAUNCHCTL_HINT: &str = "launchctl manages gui/<uid> only within a logged-in desktop session: run this in \
                              Terminal on the Mac, not over plain SSH";
const SYSTEMCTL_HINT: &str = "systemctl --user needs this user's session bus: run it as the user logged in \
                              (`sudo -u` or `su` are not enough; `machinectl shell USER@` is)";

/// What install, uninstall or status did and found, for the user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub lines: Vec<String>,
    /// Status: the service runs.
    pub running: bool,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// Writes the service file and (re)starts the service.
pub fn install(
    manager: Manager,
    host: &Host,
    spec: &ServiceSpec,
    runner: &mut dyn Runner,
) -> Result<Summary, ServiceError> {
    let file = host.service_file(manager);
    let mut lines = Vec::new();
    match manager {
        Manager::Launchd => {
            let log_dir = host.log_dir();
            check_path("log directory", &log_dir)?;
            create_dir(&log_dir)?;
            create_dir(parent(&file))?;
            write_atomic(&file, &plist(spec, &log_dir))?;
            lines.push(format!("wrote {}", file.display()));
            let (domain, target) = (host.launchd_domain(), host.launchd_target());
            if launchd_loaded(runner, &target)? {
                run_ok(runner, "launchctl", &["bootout", &target], LAUNCHCTL_HINT)?;
                wait_unloaded(runner, &target)?;
                lines.push(format!("stopped the running {LABEL}"));
            }
            // A `launchctl disable` from earlier would make bootstrap fail.
            run_ok(runner, "launchctl", &["enable", &target], LAUNCHCTL_HINT)?;
            run_ok(runner, "launchctl", &["bootstrap", &domain, path_str(&file)], LAUNCHCTL_HINT)?;
            let (log, _) = log_files(&log_dir);
            lines.push(format!("started {target}: it runs now and at every login, and restarts if it fails"));
            lines.push(format!("log: {log} (tail -f it; stdout goes to iop-node.out.log next to it)"));
            lines.push("check: iop-node service status; iop-node doctor --config FILE".into());
        }
        Manager::Systemd => {
            if let Some(reason) = systemd_exe_problem(spec.exe()) {
                return Err(ServiceError::Path { what: "executable", path: spec.exe().into(), reason: reason.into() });
            }
            create_dir(parent(&file))?;
            write_atomic(&file, &unit(spec))?;
            lines.push(format!("wrote {}", file.display()));
            let was_active = runner.run("systemctl", &["--user", "is-active", "--quiet", UNIT])?.success;
            run_ok(runner, "systemctl", &["--user", "daemon-reload"], SYSTEMCTL_HINT)?;
            run_ok(runner, "systemctl", &["--user", "enable", "--now", UNIT], SYSTEMCTL_HINT)?;
            if was_active {
                // `enable --now` leaves a running unit as it is; the new file
                // takes effect on restart.
                run_ok(runner, "systemctl", &["--user", "restart", UNIT], SYSTEMCTL_HINT)?;
                lines.push(format!("restarted {UNIT} with the new unit"));
            } else {
                lines.push(format!("enabled and started {UNIT}; it restarts if it fails"));
            }
            lines.push(linger_line(runner, host.uid));
            lines.push("log: journalctl --user -u iop-node -f".into());
            lines.push("check: iop-node service status; iop-node doctor --config FILE".into());
        }
    }
    Ok(Summary { lines, running: true })
}

/// Stops the service and removes its file. Logs are kept.
pub fn uninstall(manager: Manager, host: &Host, runner: &mut dyn Runner) -> Result<Summary, ServiceError> {
    let file = host.service_file(manager);
    let mut lines = Vec::new();
    match manager {
        Manager::Launchd => {
            let target = host.launchd_target();
            if launchd_loaded(runner, &target)? {
                run_ok(runner, "launchctl", &["bootout", &target], LAUNCHCTL_HINT)?;
                lines.push(format!("stopped and unloaded {target}"));
            } else {
                lines.push(format!("{target} was not loaded"));
            }
            lines.push(remove(&file)?);
            lines.push(format!("logs are kept in {}", host.log_dir().display()));
        }
        Manager::Systemd => {
            if file.exists() {
                run_ok(runner, "systemctl", &["--user", "disable", "--now", UNIT], SYSTEMCTL_HINT)?;
                lines.push(format!("stopped and disabled {UNIT}"));
                lines.push(remove(&file)?);
                run_ok(runner, "systemctl", &["--user", "daemon-reload"], SYSTEMCTL_HINT)?;
            } else {
                lines.push(format!("{} does not exist: nothing to uninstall", file.display()));
            }
        }
    }
    Ok(Summary { lines, running: false })
}

/// Whether the service file is there (and, given `expected`, whether it is
/// what `install` would write now) and what the service manager reports.
pub fn status(
    manager: Manager,
    host: &Host,
    expected: Option<&ServiceSpec>,
    runner: &mut dyn Runner,
) -> Result<Summary, ServiceError> {
    let file = host.service_file(manager);
    let mut lines = Vec::new();
    let installed = match std::fs::read_to_string(&file) {
        Ok(text) => {
            let rendered = expected.map(|spec| match manager {
                Manager::Launchd => plist(spec, &host.log_dir()),
                Manager::Systemd => unit(spec),
            });
            lines.push(match rendered {
                None => format!("file: {}", file.display()),
                Some(r) if r == text => format!("file: {} (runs this executable with this config)", file.display()),
                Some(_) => format!(
                    "file: {} differs from what install would write now (another executable or config): run \
                     `iop-node service install --config FILE` again",
                    file.display()
                ),
            });
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            lines.push(format!("file: {} does not exist: not installed", file.display()));
            false
        }
        Err(source) => return Err(ServiceError::Io { action: "read", path: file.display().to_string(), source }),
    };
    let running = match manager {
        Manager::Launchd => {
            let target = host.launchd_target();
            let print = runner.run("launchctl", &["print", &target])?;
            let running = if print.success {
                let state = LaunchdState::parse(&print.stdout);
                lines.push(format!("launchd: {target} {state}"));
                state.state.as_deref() == Some("running")
            } else {
                lines.push(format!("launchd: {target} is not loaded"));
                false
            };
            if installed {
                lines.push(format!("log: {}", log_files(&host.log_dir()).0));
            }
            running
        }
        Manager::Systemd => {
            let show = run_ok(
                runner,
                "systemctl",
                &[
                    "--user",
                    "show",
                    UNIT,
                    "--property=LoadState,UnitFileState,ActiveState,SubState,MainPID,ExecMainStatus,NRestarts",
                ],
                SYSTEMCTL_HINT,
            )?;
            let state = SystemdState::parse(&show.stdout);
            lines.push(format!("systemd: {UNIT} {state}"));
            if installed {
                lines.push(linger_line(runner, host.uid));
                lines.push("log: journalctl --user -u iop-node".into());
            }
            state.active == "active"
        }
    };
    Ok(Summary { lines, running })
}

/// The top-level fields of `launchctl print gui/<uid>/<label>` that say
/// whether the job runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchdState {
    pub state: Option<String>,
    pub pid: Option<u32>,
    pub runs: Option<u32>,
    pub last_exit: Option<String>,
}

impl LaunchdState {
    /// Reads `key = value` lines one tab deep (nested blocks, which have
    /// `state` keys of their own, are deeper).
    pub fn parse(text: &str) -> Self {
        let mut state = Self::default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix('\t') else { continue };
            if rest.starts_with(char::is_whitespace) {
                continue;
            }
            let Some((key, value)) = rest.split_once(" = ") else { continue };
            let value = value.trim();
            match key.trim() {
                "state" => state.state = Some(value.to_string()),
                "pid" => state.pid = value.parse().ok(),
                "runs" => state.runs = value.parse().ok(),
                "last exit code" => state.last_exit = Some(value.to_string()),
                _ => {}
            }
        }
        state
    }
}

impl fmt::Display for LaunchdState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "is loaded, {}", self.state.as_deref().unwrap_or("state unknown"))?;
        if let Some(pid) = self.pid {
            write!(f, ", pid {pid}")?;
        }
        if let Some(runs) = self.runs {
            write!(f, ", started {runs} time(s)")?;
        }
        if let Some(exit) = &self.last_exit {
            write!(f, ", last exit code {exit}")?;
        }
        Ok(())
    }
}

/// The properties `systemctl --user show` printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemdState {
    pub load: String,
    pub unit_file: String,
    pub active: String,
    pub sub: String,
    pub pid: Option<u32>,
    pub last_exit: Option<i32>,
    pub restarts: Option<u32>,
}

impl SystemdState {
    pub fn parse(text: &str) -> Self {
        let mut state = Self::default();
        for (key, value) in text.lines().filter_map(|l| l.split_once('=')) {
            match key {
                "LoadState" => state.load = value.into(),
                "UnitFileState" => state.unit_file = value.into(),
                "ActiveState" => state.active = value.into(),
                "SubState" => state.sub = value.into(),
                "MainPID" => state.pid = value.parse().ok().filter(|p| *p != 0),
                "ExecMainStatus" => state.last_exit = value.parse().ok(),
                "NRestarts" => state.restarts = value.parse().ok(),
                _ => {}
            }
        }
        state
    }
}

impl fmt::Display for SystemdState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.load == "not-found" {
            return f.write_str("is not loaded");
        }
        let enabled = if self.unit_file.is_empty() { "unit file state unknown" } else { &self.unit_file };
        write!(f, "is {enabled}, {} ({})", self.active, self.sub)?;
        if let Some(pid) = self.pid {
            write!(f, ", pid {pid}")?;
        }
        if let Some(restarts) = self.restarts {
            write!(f, ", restarted {restarts} time(s)")?;
        }
        if let Some(code) = self.last_exit.filter(|_| self.pid.is_none()) {
            write!(f, ", last exit status {code}")?;
        }
        Ok(())
    }
}

fn launchd_loaded(runner: &mut dyn Runner, target: &str) -> Result<bool, ServiceError> {
    Ok(runner.run("launchctl", &["print", target])?.success)
}

/// `bootout` returns before launchd has let go of the job, and a
/// `bootstrap` meanwhile fails ("Input/output error").
fn wait_unloaded(runner: &mut dyn Runner, target: &str) -> Result<(), ServiceError> {
    let mut waited = Duration::ZERO;
    while launchd_loaded(runner, target)? {
        if waited >= BOOTOUT_WAIT {
            return Err(ServiceError::Environment(format!(
                "launchd still has {target} loaded {} s after bootout; try again",
                BOOTOUT_WAIT.as_secs()
            )));
        }
        runner.pause(BOOTOUT_POLL);
        waited += BOOTOUT_POLL;
    }
    Ok(())
}

fn linger_line(runner: &mut dyn Runner, uid: u32) -> String {
    let uid = uid.to_string();
    let linger = runner
        .run("loginctl", &["show-user", &uid, "--property=Linger", "--value"])
        .ok()
        .filter(|o| o.success)
        .map(|o| o.stdout.trim() == "yes");
    match linger {
        Some(true) => "linger is on: the node starts at boot, without a login".into(),
        _ => "the node runs while you are logged in; to start it at boot without a login: \
              loginctl enable-linger"
            .into(),
    }
}

fn parent(file: &Path) -> &Path {
    file.parent().unwrap_or(Path::new("/"))
}

fn path_str(path: &Path) -> &str {
    // Every path here is built from checked (UTF-8) parts.
    path.to_str().unwrap_or_default()
}

fn create_dir(dir: &Path) -> Result<(), ServiceError> {
    std::fs::create_dir_all(dir).map_err(|source| ServiceError::Io {
        action: "create directory",
        path: dir.display().to_string(),
        source,
    })
}

fn remove(file: &Path) -> Result<String, ServiceError> {
    match std::fs::remove_file(file) {
        Ok(()) => Ok(format!("removed {}", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(format!("{} did not exist", file.display())),
        Err(source) => Err(ServiceError::Io { action: "remove", path: file.display().to_string(), source }),
    }
}

/// Writes `contents` to a temporary file next to `path` (mode 0644 whatever
/// the umask), syncs it and renames it over `path`: a reader sees the old
/// file or the new one, never half of one.
pub fn write_atomic(path: &Path, contents: &str) -> Result<(), ServiceError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = parent(path).join(format!(".{name}.{}.tmp", std::process::id()));
    let io = |action, source| ServiceError::Io { action, path: path.display().to_string(), source };
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("write", e));
    }
    Ok(())
}

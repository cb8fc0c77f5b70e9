//! A real Kubernetes control plane for `e2e/tests/cluster.rs`: etcd,
//! kube-apiserver and kube-controller-manager started by the `control-plane`
//! script of `../shared/k8s/` (its README), driven with the real `kubectl`
//! and `helm`.
//!
//! - [`crate::parts::kubernetes`] finds the script and the tools (where the
//!   control plane is absent, the suite is reported as skipped).
//! - [`ControlPlane::start`] starts one in a temporary directory; dropping
//!   it stops exactly what was started (the script's `stop`), on a panic too.
//!   A watchdog process stops it as well if the test process dies without
//!   unwinding (SIGKILL from a test runner's timeout).
//! - [`ControlPlane::namespace`] makes a namespace with the chart's operator
//!   RBAC (rendered by `helm template` from `charts/iop`) and a kubeconfig
//!   for the operator's ServiceAccount with a token from `kubectl create
//!   token`: the operator never runs as admin.
//! - [`ControlPlane::audit`] reads the audit log (every request of a
//!   service account), to compare the rights used with the Role's.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use crate::parts::repo_root;

/// What the cluster suite needs ([`crate::parts::kubernetes`] finds it).
pub use crate::parts::KubeTools as Tools;

/// A running control plane in its own temporary directory.
pub struct ControlPlane {
    pub tools: Tools,
    pub dir: tempfile::TempDir,
    /// The admin (`system:masters`) kubeconfig.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub api: String,
    pub ca: PathBuf,
    watchdog: Option<Child>,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager (about 10 s;
    /// the unpacked binaries are cached in `<cache>/k8s-bin`, [`crate::parts::cache_dir`]).
    pub fn start(tools: Tools) -> Result<Self, String> {
        let dir = tempfile::Builder::new().prefix("iop-k8s-").tempdir().map_err(|e| e.to_string())?;
        seed_binaries(&tools.control_plane, dir.path());
        let output = Command::new(&tools.control_plane)
            .arg("start")
            .arg(dir.path())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", tools.control_plane.display()))?;
        // Whatever happened, stop what may have started when this is dropped.
        let mut plane =
            Self { tools, kubeconfig: PathBuf::new(), api: String::new(), ca: PathBuf::new(), watchdog: None, dir };
        plane.watchdog = plane.spawn_watchdog();
        if !output.status.success() {
            return Err(format!(
                "control-plane start failed: {}\n{}",
                String::from_utf8_lossy(&output.stderr),
                plane.logs_tail()
            ));
        }
        cache_binaries(&plane.tools.control_plane, plane.dir.path());
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            match line.split_once('=') {
                Some(("KUBECONFIG", v)) => plane.kubeconfig = v.into(),
                Some(("K8S_API", v)) => plane.api = v.into(),
                Some(("K8S_CA", v)) => plane.ca = v.into(),
                _ => {}
            }
        }
        if plane.api.is_empty() || !plane.kubeconfig.is_file() {
            return Err(format!(
                "control-plane start printed no KUBECONFIG/K8S_API: {}",
                String::from_utf8_lossy(&output.stdout)
            ));
        }
        Ok(plane)
    }

    /// A process that runs the script's `stop` (and removes the directory)
    /// once this test process is gone, however it ended (a drop does both
    /// first in the normal case, and ends it).
    fn spawn_watchdog(&self) -> Option<Child> {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; [ -d \"$1\" ] && \"$0\" stop \"$1\" && rm -rf \"$1\"",
            pid = std::process::id()
        );
        Command::new("sh")
            .args(["-c", &script])
            .arg(&self.tools.control_plane)
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
    }

    /// The last lines of the control plane's logs (for a failure message).
    pub fn logs_tail(&self) -> String {
        let mut out = String::new();
        for name in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            let text =
                std::fs::read_to_string(self.dir.path().join("logs").join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {name}.log (last lines)\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        out
    }

    /// `kubectl` as admin; panics with its output on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_with(&self.kubeconfig, args, None)
    }

    /// `kubectl` as admin with `stdin`; panics on failure.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> String {
        self.kubectl_with(&self.kubeconfig, args, Some(stdin))
    }

    /// `kubectl` with `kubeconfig`, returning its output whatever the status.
    pub fn kubectl_output(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(&self.tools.kubectl)
            .env("KUBECONFIG", kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning kubectl");
        let mut pipe = child.stdin.take().expect("piped stdin");
        if let Some(text) = stdin {
            pipe.write_all(text.as_bytes()).expect("writing kubectl's stdin");
        }
        drop(pipe);
        child.wait_with_output().expect("kubectl")
    }

    fn kubectl_with(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
        let output = self.kubectl_output(kubeconfig, args, stdin);
        assert!(
            output.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("kubectl prints UTF-8")
    }

    /// `kubectl get ... -o json` as admin, parsed; `None` when not found.
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["get", "-o", "json"];
        all.extend_from_slice(args);
        let output = self.kubectl_output(&self.kubeconfig, &all, None);
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(stderr.contains("NotFound") || stderr.contains("not found"), "kubectl {}: {stderr}", all.join(" "));
            return None;
        }
        Some(serde_json::from_slice(&output.stdout).expect("kubectl -o json prints JSON"))
    }

    /// `helm template iop charts/iop --namespace NS` with `args`.
    pub fn helm_template(&self, namespace: &str, args: &[&str]) -> String {
        let chart = repo_root().join("charts/iop");
        let output = Command::new(&self.tools.helm)
            .args(["template", "iop"])
            .arg(&chart)
            .args(["--namespace", namespace])
            .args(args)
            .output()
            .expect("spawning helm");
        assert!(output.status.success(), "helm template failed: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).expect("helm prints UTF-8")
    }

    /// `helm ARGS` as admin (the control plane's kubeconfig), whatever its status.
    pub fn helm(&self, args: &[&str]) -> Output {
        Command::new(&self.tools.helm).env("KUBECONFIG", &self.kubeconfig).args(args).output().expect("spawning helm")
    }

    /// Applies `crds/` (as a user installs them) and waits until established.
    pub fn apply_crds(&self) {
        let crds = repo_root().join("crds");
        self.kubectl(&["apply", "--server-side", "-f", crds.to_str().expect("a UTF-8 path")]);
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/providers.iop.dev",
            "crd/nodecatalogs.iop.dev",
            "crd/workspacetemplates.iop.dev",
        ]);
    }

    /// A fresh namespace with the chart's ServiceAccounts and operator RBAC
    /// (Role, RoleBinding, ClusterRole, ClusterRoleBinding, as `helm
    /// template` renders them for a release `iop` there) and a kubeconfig of
    /// the operator's ServiceAccount.
    pub fn namespace(&self, name: &str) -> Namespace {
        self.kubectl(&["create", "namespace", name]);
        let rbac = self.helm_template(
            name,
            &["--show-only", "templates/serviceaccounts.yaml", "--show-only", "templates/rbac.yaml"],
        );
        self.kubectl_stdin(&["apply", "-n", name, "-f", "-"], &rbac);
        let token = self.kubectl(&["-n", name, "create", "token", OPERATOR_SERVICE_ACCOUNT, "--duration=2h"]);
        let kubeconfig = self.dir.path().join(format!("{name}-operator.kubeconfig"));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {{certificate-authority: {ca}, server: \"{api}\"}}\n  name: test\n\
                 contexts:\n- context: {{cluster: test, user: operator, namespace: {name}}}\n  name: test\ncurrent-context: test\n\
                 users:\n- name: operator\n  user: {{token: {token}}}\n",
                ca = self.ca.display(),
                api = self.api,
                token = token.trim(),
            ),
        )
        .expect("writing the operator's kubeconfig");
        Namespace { name: name.to_string(), operator_kubeconfig: kubeconfig, rbac }
    }

    /// The audit log's entries (requests of service accounts) so far.
    pub fn audit(&self) -> Vec<AuditEvent> {
        let text = std::fs::read_to_string(self.dir.path().join("logs/audit.log")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).map(|v| AuditEvent::from_json(&v)).collect()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // A throwaway control plane needs no graceful shutdown (the script's
        // `stop` gives each process up to 5 s after SIGTERM): SIGKILL the
        // pids it recorded, wait until they are gone, then let `stop` tidy up.
        let run = self.dir.path().join("run");
        let pids: Vec<String> = ["kube-controller-manager", "kube-apiserver", "etcd"]
            .iter()
            .filter_map(|n| std::fs::read_to_string(run.join(format!("{n}.pid"))).ok())
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .collect();
        for pid in &pids {
            let _ = Command::new("kill").args(["-KILL", pid]).stderr(Stdio::null()).status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|p| process_alive(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new(&self.tools.control_plane)
            .arg("stop")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

/// Whether `pid` is a live process (not gone, not a zombie awaiting its parent).
fn process_alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

/// The chart's operator ServiceAccount (release `iop`).
pub const OPERATOR_SERVICE_ACCOUNT: &str = "iop-operator";

/// A namespace made by [`ControlPlane::namespace`].
pub struct Namespace {
    pub name: String,
    /// The operator ServiceAccount's kubeconfig (a bearer token, no admin).
    pub operator_kubeconfig: PathBuf,
    /// The rendered ServiceAccounts and RBAC that were applied.
    pub rbac: String,
}

/// One audit log entry (metadata level).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    pub user: String,
    pub verb: String,
    pub api_group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    pub user_agent: String,
}

impl AuditEvent {
    fn from_json(v: &Value) -> Self {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let o = &v["objectRef"];
        let mut resource = s(&o["resource"]);
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        Self {
            user: s(&v["user"]["username"]),
            verb: s(&v["verb"]),
            api_group: s(&o["apiGroup"]),
            resource,
            namespace: s(&o["namespace"]),
            name: s(&o["name"]),
            code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            user_agent: s(&v["userAgent"]),
        }
    }

    /// A request that changes state (`create`, `update`, `patch`, `delete`,
    /// `deletecollection`).
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection")
    }
}

/// The `(apiGroup, resource, verb)` rights the rendered RBAC grants `user`'s
/// Role and ClusterRole (every rule of every Role/ClusterRole in `rbac`).
pub fn granted_rights(rbac: &str) -> BTreeSet<(String, String, String)> {
    let mut rights = BTreeSet::new();
    for doc in serde_saphyr::from_multiple::<Value>(rbac).expect("the rendered RBAC is YAML") {
        if !matches!(doc["kind"].as_str(), Some("Role" | "ClusterRole")) {
            continue;
        }
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let strings = |key: &str| -> Vec<String> {
                rule[key].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect()
            };
            for group in strings("apiGroups") {
                for resource in strings("resources") {
                    for verb in strings("verbs") {
                        rights.insert((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    rights
}

/// A child process writing stdout and stderr to a log file, killed (and
/// reaped) when dropped.
pub struct Spawned {
    pub child: Child,
    pub log: PathBuf,
}

impl Spawned {
    pub fn spawn(mut command: Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).expect("creating a log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("a second handle"))
            .stderr(file)
            .spawn()
            .expect("spawning a process");
        Self { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `marker`; panics with the log if the
    /// process exits first or `timeout` passes.
    pub fn wait_for_log(&mut self, marker: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log_text().contains(marker) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the process exited ({status}) before logging `{marker}`:\n{}", self.log_text());
            }
            assert!(Instant::now() < deadline, "`{marker}` not logged within {timeout:?}:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits (at most 15 s) for the exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(Instant::now() < deadline, "the process did not exit after SIGTERM:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `condition` every 100 ms until it holds or `timeout` passes.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Cache of the unpacked control-plane binaries, valid for one
/// `SHA256SUMS` (unpacking the xz files takes about 4 s of each start).
fn binary_cache() -> PathBuf {
    crate::parts::cache_dir().join("k8s-bin")
}

const BINARIES: [&str; 3] = ["etcd", "kube-apiserver", "kube-controller-manager"];

fn seed_binaries(script: &Path, dir: &Path) {
    let (cache, Some(sums)) = (binary_cache(), script.parent().map(|d| d.join("SHA256SUMS"))) else { return };
    let (Ok(cached), Ok(wanted)) = (std::fs::read(cache.join("SHA256SUMS")), std::fs::read(&sums)) else { return };
    if cached != wanted {
        return;
    }
    let bin = dir.join("bin");
    if std::fs::create_dir_all(&bin).is_err() {
        return;
    }
    for name in BINARIES {
        // The script checks SHA256SUMS of what it finds (a bad cache fails the start).
        if std::fs::hard_link(cache.join(name), bin.join(name)).is_err() {
            let _ = std::fs::copy(cache.join(name), bin.join(name));
        }
    }
}

fn cache_binaries(script: &Path, dir: &Path) {
    let (cache, Some(sums)) = (binary_cache(), script.parent().map(|d| d.join("SHA256SUMS"))) else { return };
    if std::fs::read(cache.join("SHA256SUMS")).ok() == std::fs::read(&sums).ok() {
        return;
    }
    let partial = cache.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let copied = std::fs::create_dir_all(&partial).is_ok()
        && BINARIES.iter().all(|name| std::fs::copy(dir.join("bin").join(name), partial.join(name)).is_ok())
        && std::fs::copy(&sums, partial.join("SHA256SUMS")).is_ok();
    if copied {
        let _ = std::fs::remove_dir_all(&cache);
        if std::fs::rename(&partial, &cache).is_ok() {
            return;
        }
    }
    let _ = std::fs::remove_dir_all(&partial);
}

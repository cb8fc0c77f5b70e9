//! The real parts some end-to-end tests need beyond the Rust toolchain, where
//! each is found, and the command that brings it.
//!
//! One definition for two readers:
//! - `e2e/build.rs` includes this file and probes every [`Part`] when it
//!   builds the tests. An absent part sets the cfg [`Part::cfg`]
//!   (`iop_absent_<part>`), and the tests that need it carry
//!   `#[cfg_attr(iop_absent_<part>, ignore = "...")]`, so the test runner
//!   reports them as skipped, never as passed. The build prints one line
//!   naming what is absent and its fix ([`summary`]); `scripts/test` repeats
//!   it after the run.
//! - The tests call the same locators ([`python`], [`llama`], [`agent`],
//!   [`kubernetes`], [`haproxy`]) to use the part. A test that was built to
//!   run and then finds its part gone fails, naming the fix.
//!
//! With `IOP_REQUIRE_ALL=1` (CI) nothing is ignored: a missing part fails its
//! tests. The probe runs again when one of the variables below changes or
//! when `scripts/test-deps` touches [`STAMP`] in the cache directory; after
//! installing a part by hand, run `scripts/test-deps` (or touch the stamp).
//!
//! This file is std-only: the build script compiles it on its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Set (CI does) to run every test: a missing part is a failure, not a skip.
pub const REQUIRE_ALL_ENV: &str = "IOP_REQUIRE_ALL";
/// The cache directory: this variable, else `$XDG_CACHE_HOME/iop`, else
/// `~/.cache/iop`. `scripts/test-deps` installs there.
pub const CACHE_ENV: &str = "IOP_CACHE_DIR";
/// The Python that runs the SDK scripts (`e2e/sdk/`): this variable, else
/// the virtualenv `scripts/test-deps` makes (`<cache>/venv`).
pub const PYTHON_ENV: &str = "IOP_PYTHON";
pub const LLAMA_SERVER_ENV: &str = "IOP_LLAMA_SERVER";
pub const LLAMA_MODEL_ENV: &str = "IOP_LLAMA_MODEL";
/// The npm prefix holding Claude Code and Codex (default `<cache>/agents`).
pub const AGENTS_ENV: &str = "IOP_AGENTS_DIR";
/// The `control-plane` script; default `<cache>/k8s/control-plane` (the link
/// `scripts/test-deps --kubernetes` makes to `../shared/k8s`), else
/// `<repo>/../shared/k8s/control-plane`.
pub const CONTROL_PLANE_ENV: &str = "IOP_K8S_CONTROL_PLANE";
/// A directory holding `kubectl` and `helm` (default: the newest
/// `<repo>/target/tools/kubectl-layer-*/`, then `PATH`).
pub const KUBE_TOOLS_ENV: &str = "IOP_KUBE_TOOLS";
/// Touched by `scripts/test-deps` after it installs anything: the build
/// script probes again when it changes.
pub const STAMP: &str = "parts.stamp";
/// Every variable the probe reads (the build script reruns when one changes).
pub const ENV_VARS: [&str; 9] = [
    REQUIRE_ALL_ENV,
    CACHE_ENV,
    "XDG_CACHE_HOME",
    PYTHON_ENV,
    LLAMA_SERVER_ENV,
    LLAMA_MODEL_ENV,
    AGENTS_ENV,
    CONTROL_PLANE_ENV,
    KUBE_TOOLS_ENV,
];

/// A real part that some tests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The official `openai` and `anthropic` Python SDKs.
    PythonSdks,
    /// HAProxy, the load balancer in front of two Edge replicas.
    Haproxy,
    /// llama.cpp's `llama-server` and the Gemma 3 270M model file.
    LlamaCpp,
    /// Claude Code and Codex CLI from npm.
    CodingAgents,
    /// A Kubernetes control plane (etcd, kube-apiserver, controller-manager), kubectl and helm.
    Kubernetes,
}

impl Part {
    pub const ALL: [Part; 5] = [Part::PythonSdks, Part::Haproxy, Part::LlamaCpp, Part::CodingAgents, Part::Kubernetes];

    /// The cfg set when the part is absent (`#[cfg_attr(<cfg>, ignore)]`).
    pub fn cfg(self) -> &'static str {
        match self {
            Part::PythonSdks => "iop_absent_python_sdks",
            Part::Haproxy => "iop_absent_haproxy",
            Part::LlamaCpp => "iop_absent_llama_cpp",
            Part::CodingAgents => "iop_absent_coding_agents",
            Part::Kubernetes => "iop_absent_kubernetes",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Part::PythonSdks => "the openai and anthropic Python SDKs",
            Part::Haproxy => "haproxy",
            Part::LlamaCpp => "llama.cpp's server and model",
            Part::CodingAgents => "Claude Code and Codex",
            Part::Kubernetes => "a Kubernetes control plane",
        }
    }

    /// The command that brings the part (README "Two commands").
    pub fn fix(self) -> &'static str {
        match self {
            Part::PythonSdks => "scripts/test-deps",
            Part::Haproxy => "scripts/test-deps --haproxy",
            Part::LlamaCpp => "scripts/test-deps --llama",
            Part::CodingAgents => "scripts/test-deps --agents",
            Part::Kubernetes => "scripts/test-deps --kubernetes",
        }
    }

    /// Whether the part is here; `Err` says what is missing.
    pub fn probe(self) -> Result<(), String> {
        match self {
            Part::PythonSdks => python_sdks(),
            Part::Haproxy => haproxy().map(drop),
            Part::LlamaCpp => llama().map(drop),
            Part::CodingAgents => agent("claude").and_then(|_| agent("codex")).map(drop),
            Part::Kubernetes => kubernetes().map(drop),
        }
    }

    /// For a test that runs: the part's location, or a panic that names
    /// what is missing and the fix.
    pub fn require<T>(self, found: Result<T, String>) -> T {
        found.unwrap_or_else(|why| panic!("{} is missing ({why}); run `{}`", self.name(), self.fix()))
    }
}

/// Whether `IOP_REQUIRE_ALL` is set (to anything but `0` or empty).
pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The one-line summary of absent parts, or `None` when all are here.
pub fn summary(absent: &[Part]) -> Option<String> {
    if absent.is_empty() {
        return None;
    }
    let parts: Vec<String> = absent.iter().map(|p| format!("{} (`{}`)", p.name(), p.fix())).collect();
    Some(format!("tests skipped for absent real parts: {}", parts.join(", ")))
}

/// The repository root (the e2e crate's parent).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the e2e crate is in the workspace").to_path_buf()
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Where `scripts/test-deps` installs (see [`CACHE_ENV`]).
pub fn cache_dir() -> PathBuf {
    env_path(CACHE_ENV)
        .or_else(|| env_path("XDG_CACHE_HOME").map(|d| d.join("iop")))
        .or_else(|| env_path("HOME").map(|d| d.join(".cache/iop")))
        .unwrap_or_else(|| std::env::temp_dir().join("iop-cache"))
}

/// The Python the SDK scripts run with (see [`PYTHON_ENV`]).
pub fn python() -> PathBuf {
    env_path(PYTHON_ENV).unwrap_or_else(|| cache_dir().join("venv/bin/python3"))
}

fn python_sdks() -> Result<(), String> {
    let python = python();
    let imported = Command::new(&python)
        .args(["-c", "import openai, anthropic"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if imported { Ok(()) } else { Err(format!("{} cannot import openai and anthropic", python.display())) }
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// `haproxy` on `PATH` (Debian installs it in `/usr/sbin`, looked at too).
pub fn haproxy() -> Result<PathBuf, String> {
    on_path("haproxy")
        .or_else(|| Some(PathBuf::from("/usr/sbin/haproxy")).filter(|p| p.is_file()))
        .ok_or_else(|| "no haproxy on PATH".to_string())
}

/// The `llama-server` binary and the model file.
pub fn llama() -> Result<(PathBuf, PathBuf), String> {
    let cache = cache_dir().join("llama");
    let server = env_path(LLAMA_SERVER_ENV)
        .or_else(|| Some(cache.join("llama-server")).filter(|p| p.is_file()))
        .or_else(|| on_path("llama-server"))
        .ok_or_else(|| format!("no llama-server (set {LLAMA_SERVER_ENV}, or put it in {})", cache.display()))?;
    if !server.is_file() {
        return Err(format!("no llama-server at {}", server.display()));
    }
    let model = env_path(LLAMA_MODEL_ENV).unwrap_or_else(|| cache.join("gemma3-270m-q4_k_m.gguf"));
    if !model.is_file() {
        return Err(format!("no model at {} (set {LLAMA_MODEL_ENV})", model.display()));
    }
    Ok((server, model))
}

/// A coding agent's executable (`claude` or `codex`).
pub fn agent(name: &str) -> Result<PathBuf, String> {
    let dir = env_path(AGENTS_ENV).unwrap_or_else(|| cache_dir().join("agents"));
    let path = dir.join("node_modules/.bin").join(name);
    if path.is_file() { Ok(path) } else { Err(format!("no {}", path.display())) }
}

/// What the cluster suite needs.
#[derive(Debug, Clone)]
pub struct KubeTools {
    pub control_plane: PathBuf,
    pub kubectl: PathBuf,
    pub helm: PathBuf,
}

/// The control-plane script, `kubectl` and `helm`.
pub fn kubernetes() -> Result<KubeTools, String> {
    let script = env_path(CONTROL_PLANE_ENV).unwrap_or_else(|| {
        let linked = cache_dir().join("k8s/control-plane");
        if linked.is_file() { linked } else { repo_root().join("../shared/k8s/control-plane") }
    });
    if !script.is_file() {
        return Err(format!("no control-plane script at {} (set {CONTROL_PLANE_ENV})", script.display()));
    }
    let mut dirs: Vec<PathBuf> = env_path(KUBE_TOOLS_ENV).into_iter().collect();
    if let Ok(entries) = std::fs::read_dir(repo_root().join("target/tools")) {
        let mut layers: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("kubectl-layer-")))
            .collect();
        layers.sort();
        dirs.extend(layers.into_iter().rev());
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    let find = |name: &str| dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
    match (find("kubectl"), find("helm")) {
        (Some(kubectl), Some(helm)) => Ok(KubeTools { control_plane: script, kubectl, helm }),
        _ => Err(format!("no kubectl and helm (in target/tools/ or on PATH; or set {KUBE_TOOLS_ENV})")),
    }
}

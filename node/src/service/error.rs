//! Why `iop-node service` failed. A module of its own, below the commands
//! (`service`) and what they check (`spec`).

use crate::config::NodeConfigError;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("iop-node service supports macOS (launchd) and Linux (systemd --user) only")]
    Unsupported,
    #[error("{0}")]
    Environment(String),
    #[error("refusing to install: {0}")]
    Config(#[from] NodeConfigError),
    #[error("{what} {path}: {reason}")]
    Path { what: &'static str, path: String, reason: String },
    #[error("cannot {action} {path}: {source}")]
    Io { action: &'static str, path: String, source: std::io::Error },
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("`{command}` failed ({status}): {stderr}{hint}")]
    Command { command: String, status: String, stderr: String, hint: String },
}

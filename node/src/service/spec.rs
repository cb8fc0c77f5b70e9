//! What the service runs ([`ServiceSpec`]) and the LaunchAgent's label: what
//! the service files are rendered from (`render`) and what installing them
//! needs (`service`). A module of its own, below both.

use std::path::Path;

use super::error::ServiceError;
use crate::config::NodeConfig;

/// The LaunchAgent's label (and plist file name).
pub const LABEL: &str = "dev.iop.node";

/// What the service runs: `<exe> --config <config>`, both absolute,
/// UTF-8 and free of control characters (so both file formats can carry
/// them exactly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    exe: String,
    config: String,
}

impl ServiceSpec {
    /// Refuses a config the node itself would refuse (the loader checks the
    /// file, not the certificates: `iop-node doctor` does) and makes both
    /// paths absolute without resolving symlinks, so a service installed
    /// through a stable link keeps following it.
    pub fn prepare(exe: &Path, config: &Path) -> Result<Self, ServiceError> {
        let absolute = |what, p: &Path| {
            std::path::absolute(p).map_err(|e| ServiceError::Path {
                what,
                path: p.display().to_string(),
                reason: e.to_string(),
            })
        };
        let exe = absolute("executable", exe)?;
        let config = absolute("config file", config)?;
        NodeConfig::load(&config)?;
        Ok(Self { exe: check_path("executable", &exe)?, config: check_path("config file", &config)? })
    }

    pub fn exe(&self) -> &str {
        &self.exe
    }

    pub fn config(&self) -> &str {
        &self.config
    }
}

pub(super) fn check_path(what: &'static str, path: &Path) -> Result<String, ServiceError> {
    let invalid = |reason: &str| ServiceError::Path { what, path: path.display().to_string(), reason: reason.into() };
    let text = path.to_str().ok_or_else(|| invalid("is not valid UTF-8"))?;
    if text.chars().any(char::is_control) {
        return Err(invalid("contains a control character"));
    }
    Ok(text.to_string())
}

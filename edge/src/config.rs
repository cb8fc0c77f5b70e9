//! Loads the Edge config file: parse + validate (in `iop_proto::config`), then
//! resolve relative paths against the file's directory.

use std::path::{Path, PathBuf};

use iop_proto::config::{ConfigError, EdgeConfig};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path}: {source}")]
    Invalid { path: String, source: ConfigError },
}

pub fn load(path: &Path) -> Result<EdgeConfig, LoadError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| LoadError::Read { path: path.display().to_string(), source })?;
    let mut config = EdgeConfig::from_yaml(&text)
        .map_err(|source| LoadError::Invalid { path: path.display().to_string(), source })?;
    let base = path.parent().unwrap_or(Path::new("."));
    for file in [&mut config.tls.ca_file, &mut config.tls.cert_file, &mut config.tls.key_file] {
        *file = resolve(base, file);
    }
    Ok(config)
}

fn resolve(base: &Path, file: &Path) -> PathBuf {
    if file.is_absolute() { file.to_path_buf() } else { base.join(file) }
}

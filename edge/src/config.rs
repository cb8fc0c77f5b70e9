//! Loads the Edge config file: parse + validate (in `iop_proto::config`), then
//! resolve relative paths against the file's directory.

use std::path::{Path, PathBuf};

use iop_proto::config::{ConfigError, EdgeConfig};

use crate::auth::Keys;
use crate::credentials::{CredentialHealth, Credentials};

/// What the Edge holds besides its config: API key hashes and managed
/// provider credentials, loaded from the files the config names and swapped
/// with it.
#[derive(Debug, Default)]
pub struct Secrets {
    pub keys: Keys,
    pub credentials: Credentials,
}

impl Secrets {
    /// Loads every file `config` names for them; the error names the file.
    /// A credential file never fails the load: an unusable one disables
    /// only its profile (see [`Credentials::load`]).
    pub fn load(config: &EdgeConfig) -> Result<Self, String> {
        let keys = Keys::load(&config.auth)?;
        crate::auth::warn_expiring(&keys);
        Ok(Self { keys, credentials: Credentials::load(config) })
    }
}

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
    if let Some(file) = config.auth.keys_file.as_mut() {
        *file = resolve(base, file);
    }
    for credential in &mut config.credentials {
        credential.file = resolve(base, &credential.file);
    }
    Ok(config)
}

fn resolve(base: &Path, file: &Path) -> PathBuf {
    if file.is_absolute() { file.to_path_buf() } else { base.join(file) }
}

/// The Edge's current config and API keys, swapped atomically on reload.
/// Requests read a snapshot (`current()`) once and keep it, so in-flight
/// work keeps the config it was admitted with.
#[derive(Debug)]
pub struct ConfigHandle {
    current: std::sync::RwLock<std::sync::Arc<EdgeConfig>>,
    secrets: std::sync::RwLock<std::sync::Arc<Secrets>>,
    status: std::sync::Mutex<ReloadStatus>,
    /// Installed from the credentials of every config this handle takes.
    credential_health: std::sync::Arc<CredentialHealth>,
    /// The revision, sent once a reload's config and secrets are in place
    /// (running jobs judge their caller again: `crate::job::standing`).
    reloaded: tokio::sync::watch::Sender<u64>,
}

/// What `/admin/v1/config` reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReloadStatus {
    /// 1 for the config loaded at start, +1 per applied reload.
    pub revision: u64,
    /// Why the last rejected reload was rejected (the old config stays).
    pub last_error: Option<String>,
}

impl ConfigHandle {
    pub fn new(config: EdgeConfig, secrets: Secrets) -> Self {
        let credential_health = std::sync::Arc::new(CredentialHealth::default());
        credential_health.install(&secrets.credentials);
        Self {
            current: std::sync::RwLock::new(std::sync::Arc::new(config)),
            secrets: std::sync::RwLock::new(std::sync::Arc::new(secrets)),
            status: std::sync::Mutex::new(ReloadStatus { revision: 1, last_error: None }),
            credential_health,
            reloaded: tokio::sync::watch::Sender::new(1),
        }
    }

    /// What the Edge knows about each managed credential (the loaded
    /// files and the providers' rejections).
    pub fn credential_health(&self) -> &std::sync::Arc<CredentialHealth> {
        &self.credential_health
    }

    pub fn current(&self) -> std::sync::Arc<EdgeConfig> {
        self.current.read().unwrap().clone()
    }

    pub fn secrets(&self) -> std::sync::Arc<Secrets> {
        self.secrets.read().unwrap().clone()
    }

    /// Installs `next` and its secrets and returns the previous config.
    pub fn swap(&self, next: EdgeConfig, secrets: Secrets) -> std::sync::Arc<EdgeConfig> {
        self.credential_health.install(&secrets.credentials);
        *self.secrets.write().unwrap() = std::sync::Arc::new(secrets);
        let previous = std::mem::replace(&mut *self.current.write().unwrap(), std::sync::Arc::new(next));
        let revision = {
            let mut status = self.status.lock().unwrap();
            status.revision += 1;
            status.last_error = None;
            status.revision
        };
        self.reloaded.send_replace(revision);
        previous
    }

    /// Wakes on every applied reload, after the new config and secrets are
    /// in place (a receiver sees only the reloads after this call).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloaded.subscribe()
    }

    pub fn reject(&self, error: String) {
        self.status.lock().unwrap().last_error = Some(error);
    }

    pub fn status(&self) -> ReloadStatus {
        self.status.lock().unwrap().clone()
    }
}

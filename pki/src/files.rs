//! Writing certificates and keys to files. A file is written to a
//! temporary file in its directory and renamed over the old one, so a
//! reader (the Edge's reload polls its TLS files) sees the old content or
//! the new, never a part of it; a private key's file is readable by its
//! owner only (0600) from the moment it exists.

use std::io::Write;
use std::path::Path;

/// Who may read a written file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Certificates and configs: 0644.
    Public,
    /// Private keys: 0600.
    Private,
}

impl Access {
    #[cfg(unix)]
    fn mode(self) -> u32 {
        match self {
            Self::Public => 0o644,
            Self::Private => 0o600,
        }
    }
}

/// Writes `contents` to `path`, replacing what is there.
pub fn write(path: &Path, contents: &str, access: Access) -> std::io::Result<()> {
    temporary(path, contents, access)?.persist(path).map(drop).map_err(|e| e.error)
}

/// Writes `contents` to `path` unless something is there already (then
/// the error is `AlreadyExists` and the file is left as it was).
pub fn write_new(path: &Path, contents: &str, access: Access) -> std::io::Result<()> {
    temporary(path, contents, access)?.persist_noclobber(path).map(drop).map_err(|e| e.error)
}

fn temporary(path: &Path, contents: &str, access: Access) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    // tempfile creates the file 0600 (readable by its owner only).
    let mut file = tempfile::Builder::new().prefix(".iop-").suffix(".tmp").tempfile_in(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.as_file().set_permissions(std::fs::Permissions::from_mode(access.mode()))?;
    }
    #[cfg(not(unix))]
    let _ = access;
    file.write_all(contents.as_bytes())?;
    file.as_file().sync_all()?;
    Ok(file)
}

/// Creates `dir` and its parents, if missing; a directory it creates is
/// its owner's only (0700), for one that holds private keys.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

#[cfg(test)]
mod tests;

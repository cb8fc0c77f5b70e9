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
mod tests {
    use super::*;

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn files_are_replaced_whole_with_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        write(&key, "first", Access::Private).unwrap();
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "first");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(mode(&key), 0o600);
            // One left world-readable is narrowed again by the next write.
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
            write(&key, "second", Access::Private).unwrap();
            assert_eq!(mode(&key), 0o600);
            let cert = dir.path().join("cert.pem");
            write(&cert, "cert", Access::Public).unwrap();
            assert_eq!(mode(&cert), 0o644);
        }
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "second");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(names.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")), "no temporary file is left: {names:?}");
    }

    #[test]
    fn a_new_file_never_replaces_one_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca-key.pem");
        write_new(&path, "mine", Access::Private).unwrap();
        let err = write_new(&path, "other", Access::Private).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "mine");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
    }

    #[test]
    fn a_missing_directory_is_an_error_and_a_private_one_is_created_0700() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing").join("ca.pem");
        assert_eq!(write(&missing, "x", Access::Public).unwrap_err().kind(), std::io::ErrorKind::NotFound);
        let pki = dir.path().join("a").join("pki");
        create_private_dir(&pki).unwrap();
        create_private_dir(&pki).unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&pki), 0o700);
    }
}

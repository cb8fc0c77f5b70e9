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

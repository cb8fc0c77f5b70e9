use super::*;

/// A FIFO at `path`, for the tests of special files: mkfifo(3), since
/// rustix has neither mknodat nor mkfifoat on macOS.
pub(crate) fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo reads it only.
    let made = unsafe { libc::mkfifo(path.as_ptr(), 0o644) };
    assert_eq!(made, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

fn assignment(reference: &str, root: &Path) -> pb::WorkspaceAssignment {
    pb::WorkspaceAssignment { r#ref: reference.into(), root: root.to_str().unwrap().into(), ..Default::default() }
}

fn states(allowed: &[PathBuf], assignments: &[pb::WorkspaceAssignment]) -> Vec<(String, WorkspaceState)> {
    let (_, statuses) = admit(allowed, &|_| false, assignments);
    statuses.into_iter().map(|s| (s.r#ref.clone(), s.state())).collect()
}

#[test]
fn only_real_directories_inside_an_allowed_root_are_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let allowed = base.join("allowed");
    std::fs::create_dir_all(allowed.join("site/src")).unwrap();
    std::fs::write(allowed.join("file"), "x").unwrap();
    std::fs::create_dir(base.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(base.join("elsewhere"), allowed.join("link")).unwrap();
    std::os::unix::fs::symlink(allowed.join("site"), allowed.join("site-link")).unwrap();
    let roots = resolve_allowed_roots(std::slice::from_ref(&allowed));

    let cases = [
        ("site", allowed.join("site"), WorkspaceState::Accepted),
        ("nested", allowed.join("site/src"), WorkspaceState::Accepted),
        ("outside", base.join("elsewhere"), WorkspaceState::OutsideAllowedRoots),
        ("missing-outside", base.join("nope"), WorkspaceState::OutsideAllowedRoots),
        ("missing", allowed.join("nope"), WorkspaceState::NotFound),
        ("file", allowed.join("file"), WorkspaceState::NotADirectory),
        ("under-file", allowed.join("file/x"), WorkspaceState::NotADirectory),
        ("link", allowed.join("link"), WorkspaceState::Symlink),
        ("link-to-inside", allowed.join("site-link"), WorkspaceState::Symlink),
        ("via-link", allowed.join("site-link/src"), WorkspaceState::Symlink),
        ("dotdot", PathBuf::from(format!("{}/site/../file", allowed.display())), WorkspaceState::InvalidPath),
    ];
    let assignments: Vec<_> = cases.iter().map(|(r, p, _)| assignment(r, p)).collect();
    let expected: Vec<_> = cases.iter().map(|(r, _, s)| (r.to_string(), *s)).collect();
    assert_eq!(states(&roots, &assignments), expected);
    let relative = pb::WorkspaceAssignment { r#ref: "rel".into(), root: "site".into(), ..Default::default() };
    assert_eq!(states(&roots, &[relative]), [("rel".to_string(), WorkspaceState::InvalidPath)]);

    let (catalog, _) = admit(&roots, &|_| false, &assignments);
    // A root that holds (or lies in) the node's own files is refused.
    let node_dir = allowed.join("site/src");
    let (_, statuses) =
        admit(&roots, &|root| root.starts_with(&node_dir) || node_dir.starts_with(root), &assignments[..2]);
    let refused: Vec<_> = statuses.iter().map(|s| s.state()).collect();
    assert_eq!(refused, [WorkspaceState::NodeFiles, WorkspaceState::NodeFiles]);
    assert_eq!(catalog.len(), 2);
    assert!(catalog.get("site").unwrap().dir.metadata().unwrap().is_dir());
    assert!(catalog.get("link").is_none());
}

#[test]
fn no_allowed_roots_accept_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let assignments = [assignment("site", tmp.path())];
    assert_eq!(states(&[], &assignments), [("site".to_string(), WorkspaceState::OutsideAllowedRoots)]);
    // An allowed root that does not exist allows nothing either.
    let gone = resolve_allowed_roots(&[tmp.path().join("gone")]);
    assert!(gone.is_empty());
}

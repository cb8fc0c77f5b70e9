use super::*;

fn paths(list: &[&str]) -> Vec<PathBuf> {
    list.iter().map(PathBuf::from).collect()
}

#[test]
fn the_nodes_files_are_denied_and_never_readable() {
    let owner = paths(&["/Users/me/.cargo", "/Users/me/iop", "/Users/me/iop/extra", "relative"]);
    let node_files = paths(&[
        "/Users/me/iop/node.yaml",
        "/Users/me/iop",
        "/Users/me/iop/node-key.pem",
        "/etc/iop/ca.pem",
        "/etc/iop",
        "/",
        "relative",
    ]);
    let authority = Authority {
        root: Path::new("/Users/me/site"),
        network: false,
        owner_read: &owner,
        node_files: &node_files,
        home: Some(Path::new("/Users/me")),
    };
    let p = policy(&authority, &paths(&["/usr", "/etc", "/bin"]));
    assert_eq!(p.root, Path::new("/Users/me/site"));
    assert_eq!(p.reserved, Path::new("/Users/me/site/.iop"));
    let mut want = paths(&[
        "/Users/me/iop",
        "/Users/me/iop/node-key.pem",
        "/Users/me/iop/node.yaml",
        "/etc/iop",
        "/etc/iop/ca.pem",
    ]);
    want.extend(SYSTEM_DENIED.iter().map(PathBuf::from));
    want.extend(OWNER_SECRETS.iter().map(|s| Path::new("/Users/me").join(s)));
    want.sort();
    assert_eq!(p.denied, want);
    for secret in ["/Users/me/.ssh", "/Users/me/Library/Keychains", "/Users/me/.aws", "/etc/ssl/private", "/dev/tty"] {
        assert!(p.denied.contains(&PathBuf::from(secret)), "{secret}");
    }
    // The owner's path to the node's own directory (and below it) is
    // dropped; a relative path is no path, `/` no directory of the
    // node's. `/etc` stays: the renderers leave out what is denied
    // inside it.
    assert_eq!(p.read, paths(&["/Users/me/.cargo", "/bin", "/etc", "/usr"]));
    assert!(!p.network);
    assert!(!overlaps(authority.root, &p.denied));
    assert!(overlaps(Path::new("/Users/me/iop/site"), &p.denied));
    assert!(overlaps(Path::new("/Users/me"), &p.denied));
}

#[test]
fn carving_leaves_out_exactly_the_denied_paths() {
    let tree = |p: &Path| -> Vec<PathBuf> {
        let children: &[&str] = match p.to_str().unwrap() {
            "/etc" => &["/etc/hosts", "/etc/iop", "/etc/shadow", "/etc/ssl"],
            "/etc/iop" => &["/etc/iop/ca.pem", "/etc/iop/other"],
            _ => &[],
        };
        paths(children)
    };
    let carved = carve(&paths(&["/usr", "/etc"]), &paths(&["/etc/iop/ca.pem", "/etc/shadow"]), &tree);
    assert_eq!(carved, paths(&["/usr", "/etc/hosts", "/etc/iop/other", "/etc/ssl"]));
    // A denied directory goes whole.
    let carved = carve(&paths(&["/etc"]), &paths(&["/etc/iop"]), &tree);
    assert_eq!(carved, paths(&["/etc/hosts", "/etc/shadow", "/etc/ssl"]));
    assert!(carve(&paths(&["/etc/iop/x"]), &paths(&["/etc/iop"]), &tree).is_empty());
}

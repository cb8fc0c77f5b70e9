use super::*;

#[test]
fn root_runs_commands_as_an_existing_unprivileged_user_or_not_at_all() {
    assert_eq!(command_user(1000, Some("root")), Ok(None), "not root: the node's own user, whatever is set");
    let nobody = command_user(0, None).unwrap().expect("a user");
    assert!(nobody.uid != 0 && nobody.gid != 0, "{nobody:?}");
    assert_eq!(command_user(0, Some(DEFAULT_COMMAND_USER)), Ok(Some(nobody)));
    assert!(command_user(0, Some("root")).unwrap_err().contains("is root"));
    assert!(command_user(0, Some("iop-no-such-user")).unwrap_err().contains("no user"));
}

#[test]
fn the_nodes_directories_are_protected_but_not_home_or_root() {
    let files = ["/Users/me/bundle/node-key.pem", "/Users/me/bundle/node.yaml", "/Users/me/ca.pem", "/top.pem"]
        .map(PathBuf::from);
    let got = protected(files.into_iter(), Some(Path::new("/Users/me")));
    let want = [
        "/Users/me/bundle",
        "/Users/me/bundle/node-key.pem",
        "/Users/me/bundle/node.yaml",
        "/Users/me/ca.pem",
        "/top.pem",
    ];
    assert_eq!(got, want.map(PathBuf::from));
}

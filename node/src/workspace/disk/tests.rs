use super::*;

#[test]
fn the_walk_counts_files_beneath_the_root_but_not_iop_or_what_a_link_points_to() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, outside) = (tmp.path().join("root"), tmp.path().join("outside"));
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::create_dir_all(root.join(".iop/job")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let dir = File::open(&root).unwrap();
    let empty = usage(&dir);
    assert!(!empty.too_deep);
    std::fs::write(root.join("a/b/c/data"), vec![7u8; 1 << 20]).unwrap();
    std::fs::write(root.join(".iop/job/state"), vec![7u8; 4 << 20]).unwrap();
    std::fs::write(outside.join("big"), vec![7u8; 8 << 20]).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let grown = usage(&dir).bytes - empty.bytes;
    assert!((1 << 20..2 << 20).contains(&grown), "{grown}: the megabyte beneath the root and no more");
    assert!(!over(empty.bytes, usage(&dir), (1 << 20) + (64 << 10)));
    assert!(over(empty.bytes, usage(&dir), 512 << 10));
}

#[test]
fn a_tree_too_deep_to_measure_is_over_any_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let mut path = tmp.path().to_path_buf();
    for _ in 0..=MAX_DEPTH {
        path.push("d");
    }
    std::fs::create_dir_all(&path).unwrap();
    let found = usage(&File::open(tmp.path()).unwrap());
    assert!(found.too_deep);
    assert!(over(found.bytes, found, u64::MAX));
}

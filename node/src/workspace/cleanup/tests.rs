use super::*;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(tmp.path()).unwrap().join("ws");
    std::fs::create_dir_all(ws.join(".iop/job/r1/a/b")).unwrap();
    std::fs::write(ws.join(".iop/job/r1/a/b/out.txt"), "x").unwrap();
    std::fs::write(ws.join(".iop/job/r1/top.txt"), "x").unwrap();
    std::fs::write(ws.join("user.txt"), "mine").unwrap();
    (tmp, ws)
}

fn root(ws: &Path) -> File {
    File::open(ws).unwrap()
}

#[test]
fn a_requests_tree_is_removed_and_nothing_else() {
    let (_tmp, ws) = workspace();
    std::fs::create_dir_all(ws.join(".iop/job/r2")).unwrap();
    assert_eq!(clean(&root(&ws), "r1"), CleanupOutcome::Cleaned { removed: 5 });
    assert!(!ws.join(".iop/job/r1").exists());
    assert!(ws.join(".iop/job/r2").exists(), "another request's state stays");
    assert_eq!(std::fs::read_to_string(ws.join("user.txt")).unwrap(), "mine");
    assert_eq!(clean(&root(&ws), "r1"), CleanupOutcome::NothingToClean);
    assert_eq!(clean(&root(&ws), "../r2"), CleanupOutcome::InvalidRequestId);
    assert_eq!(clean(&root(&ws), ""), CleanupOutcome::InvalidRequestId);
}

#[test]
fn links_and_special_files_are_refused_and_their_targets_untouched() {
    let (tmp, ws) = workspace();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), "keep").unwrap();
    symlink(&outside, ws.join(".iop/job/r1/a/escape")).unwrap();
    symlink(outside.join("precious"), ws.join(".iop/job/r1/file-link")).unwrap();
    crate::workspace::tests::mkfifo(&ws.join(".iop/job/r1/fifo"));
    let outcome = clean(&root(&ws), "r1");
    let CleanupOutcome::Partial { removed, refused } = outcome else { panic!("{outcome:?}") };
    assert_eq!(refused[&Refused::Symlink], 2);
    assert_eq!(refused[&Refused::SpecialFile], 1);
    assert!(refused[&Refused::NotEmpty] >= 1, "{refused:?}");
    assert_eq!(removed, 3, "b/out.txt, b and top.txt; a and r1 keep the refused entries");
    assert_eq!(std::fs::read_to_string(outside.join("precious")).unwrap(), "keep");
    assert!(std::fs::symlink_metadata(ws.join(".iop/job/r1/a/escape")).is_ok(), "refused entries stay");
}

#[test]
fn a_link_in_place_of_the_state_directories_is_not_followed() {
    let (tmp, ws) = workspace();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(outside.join("r9")).unwrap();
    std::fs::write(outside.join("r9/precious"), "keep").unwrap();
    std::fs::remove_dir_all(ws.join(".iop/job")).unwrap();
    symlink(&outside, ws.join(".iop/job")).unwrap();
    assert_eq!(clean(&root(&ws), "r9"), CleanupOutcome::Failed);
    assert!(outside.join("r9/precious").exists());
}

#[test]
fn an_entry_replaced_after_the_inventory_is_left_alone() {
    let (_tmp, ws) = workspace();
    let target = ws.join(".iop/job/r1/top.txt");
    let replace = || {
        std::fs::remove_file(&target).unwrap();
        std::fs::write(&target, "a new file under the same name").unwrap();
    };
    let outcome = clean_with(&root(&ws), "r1", &replace);
    let CleanupOutcome::Partial { removed, refused } = outcome else { panic!("{outcome:?}") };
    assert_eq!(refused[&Refused::Replaced], 1);
    assert_eq!(removed, 3, "a/b/out.txt, a/b and a");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "a new file under the same name");
}

#[tokio::test]
async fn concurrent_and_late_callers_share_one_outcome() {
    let (_tmp, ws) = workspace();
    let cache = CleanupCache::default();
    let root = root(&ws);
    let (a, b) = tokio::join!(cache.clean(&root, "r1"), cache.clean(&root, "r1"));
    assert_eq!(a, CleanupOutcome::Cleaned { removed: 5 });
    assert_eq!(b, a);
    assert_eq!(cache.clean(&root, "r1").await, a, "a late caller gets the same outcome, not nothing_to_clean");
}

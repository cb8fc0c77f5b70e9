use super::*;

#[test]
fn a_workspace_takes_its_limit_of_jobs_and_a_drop_frees_the_slot() {
    let slots = Arc::new(JobSlots::default());
    let first = slots.acquire("site", 1, "a", 4).unwrap();
    assert_eq!(slots.acquire("site", 1, "b", 4).unwrap_err(), JobLimit::Workspace);
    assert_eq!(slots.of_principal("b"), 0, "a refused job holds nothing");
    let other = slots.acquire("docs", 1, "a", 4).expect("another workspace is its own");
    drop(first);
    assert_eq!(slots.in_workspace("site"), 0);
    let again = slots.acquire("site", 1, "b", 4).expect("freed on drop");
    drop((other, again));
    assert!(slots.counts.lock().unwrap().workspaces.is_empty() && slots.counts.lock().unwrap().principals.is_empty());
}

#[test]
fn a_principal_takes_its_limit_across_workspaces() {
    let slots = Arc::new(JobSlots::default());
    let held: Vec<_> = ["w1", "w2"].iter().map(|w| slots.acquire(w, 1, "bot", 2).unwrap()).collect();
    assert_eq!(slots.acquire("w3", 1, "bot", 2).unwrap_err(), JobLimit::Principal);
    assert_eq!(slots.in_workspace("w3"), 0, "both or neither");
    slots.acquire("w3", 1, "other", 2).expect("another principal has its own count");
    drop(held);
    assert_eq!(slots.of_principal("bot"), 0);
    let wide: Vec<_> = (0..3).map(|_| slots.acquire("shared", 3, "bot", 3).unwrap()).collect();
    assert_eq!(slots.acquire("shared", 3, "bot2", 3).unwrap_err(), JobLimit::Workspace);
    assert_eq!(wide.len(), 3);
}

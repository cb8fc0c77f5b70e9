use super::*;

fn set(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[test]
fn dials_until_every_listed_replica_is_held_and_refuses_duplicates() {
    let mut book = ReplicaBook::default();
    assert!(book.wants_dial(), "nothing held yet");
    assert_eq!(book.claim("a", 1, &set(&["a", "b"])), ReplicaClaim::Held);
    assert!(book.wants_dial(), "b is missing");
    assert_eq!(book.claim("a", 2, &set(&["a", "b"])), ReplicaClaim::Duplicate);
    assert_eq!(book.held(), ["a"], "the duplicate took nothing");
    assert_eq!(book.claim("b", 3, &set(&["a", "b"])), ReplicaClaim::Held);
    assert!(!book.wants_dial());
    assert_eq!(book.serving(), 2);

    // A session that ended frees its replica; another session's end does not.
    book.release("b", 2);
    assert!(!book.wants_dial());
    book.release("b", 3);
    assert!(book.wants_dial());
}

#[test]
fn follows_set_changes_and_an_edge_of_one_replica() {
    let mut book = ReplicaBook::default();
    assert_eq!(book.claim("solo", 1, &[]), ReplicaClaim::Held, "an Edge that lists no replicas is one replica");
    assert!(!book.wants_dial());
    book.set_replicas("solo", &set(&["solo", "new"]));
    assert!(book.wants_dial(), "a replica joined");
    book.set_replicas("solo", &set(&["new"]));
    assert!(book.wants_dial(), "the held replica left the set; `new` is still missing");
    assert_eq!(book.claim("new", 2, &set(&["new"])), ReplicaClaim::Held);
    assert!(!book.wants_dial(), "a held replica outside the set is kept until its session ends");
    assert_eq!(book.held(), ["new", "solo"]);
}

#[test]
fn a_draining_replica_stays_held_but_does_not_count_as_serving() {
    let mut book = ReplicaBook::default();
    book.claim("a", 1, &set(&["a", "b"]));
    book.claim("b", 2, &set(&["a", "b"]));
    book.drain("a", 9);
    assert!(!book.wants_dial(), "only the holding session's drain counts");
    book.drain("a", 1);
    assert!(book.wants_dial(), "a replacement for `a` is wanted");
    assert_eq!(book.serving(), 1);
    assert_eq!(book.claim("a", 3, &set(&["a", "b"])), ReplicaClaim::Duplicate, "not a second session to it meanwhile");
    book.release("a", 1);
    assert_eq!(book.claim("a", 4, &set(&["a", "b"])), ReplicaClaim::Held, "its successor with the same id");
    assert!(!book.wants_dial());
}

#[tokio::test]
async fn holds_release_on_drop_and_wake_the_supervisor() {
    let replicas = Replicas::default();
    let hold = replicas.claim("a", 1, &set(&["a"])).expect("first");
    replicas.changed().await;
    assert!(replicas.claim("a", 2, &set(&["a"])).is_none());
    assert!(!replicas.wants_dial());
    drop(hold);
    replicas.changed().await;
    assert!(replicas.wants_dial());
    assert!(replicas.held().is_empty());
}

/// A replica set that grows on a held session (the Edge's `ReplicaSet` on a
/// reload) wakes the supervisor, which then wants to dial.
#[tokio::test]
async fn a_replica_added_on_a_held_session_wakes_the_supervisor() {
    let replicas = Replicas::default();
    let hold = replicas.claim("a", 1, &set(&["a"])).expect("first");
    replicas.changed().await;
    assert!(!replicas.wants_dial());
    hold.set_replicas(&set(&["a", "b"]));
    tokio::time::timeout(std::time::Duration::from_secs(1), replicas.changed()).await.expect("woken");
    assert!(replicas.wants_dial(), "b is listed and not held");
}

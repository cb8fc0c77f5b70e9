#[test]
fn ids_are_version_4_and_distinct() {
    let ids: std::collections::HashSet<_> = (0..10_000).map(|_| super::new_uuid()).collect();
    assert_eq!(ids.len(), 10_000);
    assert!(ids.iter().all(|id| id.get_version_num() == 4));
}

use super::*;

#[test]
fn a_replica_is_read_at_its_pod_ip_and_the_admin_port() {
    let v4 = EdgeAdminUrl::of("10.244.0.7".parse().unwrap(), 8081);
    assert_eq!(v4.join(NODES_PATH), "http://10.244.0.7:8081/admin/v1/nodes");
    let v6 = EdgeAdminUrl::of("fd00:10:244::7".parse().unwrap(), 8081);
    assert_eq!(v6.join(PROVIDERS_PATH), "http://[fd00:10:244::7]:8081/admin/v1/providers");
    assert!(v6.join(PROVIDERS_PATH).parse::<http::Uri>().is_ok());
}

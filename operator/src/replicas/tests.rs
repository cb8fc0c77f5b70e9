use k8s_openapi::api::core::v1::PodStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;

fn pod(name: &str, phase: &str, ip: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        status: Some(PodStatus {
            phase: Some(phase.to_string()),
            pod_ip: ip.map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_000).unwrap()));
    p
}

#[test]
fn the_ids_are_the_names_of_live_pods_sorted() {
    let pods = [
        pod("iop-edge-7d9f-zz9x2", "Running", Some("10.0.0.9")),
        pod("iop-edge-7d9f-abc12", "Running", Some("10.0.0.7")),
        // Starting: a replica before it has an IP.
        pod("iop-edge-8e1a-new01", "Pending", None),
        // Draining, evicted, done: not replicas.
        terminating(pod("iop-edge-6c3b-old01", "Running", Some("10.0.0.5"))),
        pod("iop-edge-6c3b-evict", "Failed", Some("10.0.0.4")),
        pod("iop-edge-6c3b-done1", "Succeeded", None),
    ];
    assert_eq!(replica_ids(&pods), ["iop-edge-7d9f-abc12", "iop-edge-7d9f-zz9x2", "iop-edge-8e1a-new01"]);
    assert_eq!(
        replicas(&pods),
        [
            Replica { id: "iop-edge-7d9f-abc12".into(), ip: Some("10.0.0.7".parse().unwrap()) },
            Replica { id: "iop-edge-7d9f-zz9x2".into(), ip: Some("10.0.0.9".parse().unwrap()) },
            Replica { id: "iop-edge-8e1a-new01".into(), ip: None },
        ]
    );
}

#[test]
fn one_pod_is_listed_too_and_no_pod_is_an_empty_list() {
    assert_eq!(replica_ids(&[pod("iop-edge-1", "Running", Some("10.0.0.1"))]), ["iop-edge-1"]);
    assert!(replica_ids(&[]).is_empty());
    assert!(replica_ids(&[terminating(pod("iop-edge-1", "Running", None))]).is_empty());
}

#[test]
fn odd_pods_never_break_the_config() {
    let mut nameless = pod("x", "Running", None);
    nameless.metadata.name = None;
    let no_status = Pod { metadata: ObjectMeta { name: Some("b".into()), ..Default::default() }, ..Default::default() };
    let pods = [
        nameless,
        no_status,
        pod("a b", "Running", None),
        pod("a", "Running", Some("not-an-ip")),
        pod("a", "Running", Some("fd00::7")),
        pod("c", "Unknown", Some("fd00::8")),
    ];
    // Each id once (the config refuses duplicates), valid ids only.
    assert_eq!(replica_ids(&pods), ["a", "b", "c"]);
    let ips: Vec<Option<IpAddr>> = replicas(&pods).into_iter().map(|r| r.ip).collect();
    assert_eq!(ips, [None, None, Some("fd00::8".parse().unwrap())]);
}

//! Issue 43 D4: replacing the CA with an overlap, as an administrator does
//! it: `iop-operator ca rotate`, new bundles handed out while nodes on old
//! ones keep working, `iop-operator ca finish` refused until every Mac runs
//! a new one, then the old CA trusted no more. One Edge replica (a real
//! `iop-edge` fed its mounts from the cluster, no restart), two real
//! `iop-node` processes, and a deleted `iop-ca` that the operator does not
//! race to replace.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// Runs `iop-operator ARGS` as an administrator (the admin kubeconfig).
fn operator_cli(plane: &ControlPlane, args: &[&str]) -> std::process::Output {
    Command::new(bin("iop-operator")).env("KUBECONFIG", &plane.kubeconfig).args(args).output().unwrap()
}

/// `iop-operator node-bundle NODE` into `out`, with fast reconnects and
/// probes for the test. Returns `node.yaml`.
pub(super) fn node_bundle(plane: &ControlPlane, ns: &str, node: &str, grpc: SocketAddr, out: &Path) -> PathBuf {
    let output = operator_cli(
        plane,
        &[
            "node-bundle",
            node,
            "-n",
            ns,
            "--server-name",
            "iop-edge-grpc",
            "--edge-url",
            &format!("https://{grpc}"),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(output.status.success(), "node-bundle: {}", String::from_utf8_lossy(&output.stderr));
    let node_yaml = out.join("node.yaml");
    let mut text = std::fs::read_to_string(&node_yaml).unwrap();
    text.push_str(
        "reconnect: { initial_backoff_ms: 50, max_backoff_ms: 500 }\n\
         health: { idle_interval_ms: 1000, retry_initial_ms: 50, retry_max_ms: 500 }\n",
    );
    std::fs::write(&node_yaml, text).unwrap();
    node_yaml
}

fn start_node(node_yaml: &Path, log: PathBuf) -> Spawned {
    let mut command = Command::new(bin("iop-node"));
    command.args(["--config", node_yaml.to_str().unwrap()]);
    Spawned::spawn(command, log)
}

fn certificates(pem: &[u8]) -> usize {
    String::from_utf8_lossy(pem).matches("BEGIN CERTIFICATE").count()
}

pub(super) fn a_ca_rotation_cuts_no_node_off(plane: &ControlPlane) {
    let ns = plane.namespace("rotation");
    let dir = plane.dir.path().join("rotation");
    std::fs::create_dir_all(&dir).unwrap();
    let (_mock, mock_addr) = start_mock(&dir, "127.0.0.1:0", &[]);
    for node in ["mac-old", "mac-new"] {
        let catalog = json!({ "apiVersion": "iop.dev/v1alpha1", "kind": "NodeCatalog", "metadata": { "name": node }, "spec": {} });
        let provider = json!({
            "apiVersion": "iop.dev/v1alpha1", "kind": "Provider", "metadata": { "name": node },
            "spec": {
                "node": node, "adapter": "openai",
                "target": { "model": "mock", "baseUrl": format!("http://{mock_addr}") },
                "models": [ { "name": format!("mock-{node}") } ],
            },
        });
        for object in [catalog, provider] {
            plane.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], &object.to_string());
        }
    }
    let [ip, _] = pod_ips();
    stand_in_pod(plane, &ns.name, "iop-edge-a", &ip);
    let operator = Operator::start(plane, &ns, "iop-operator-a");
    wait_until("the config with both nodes and the replica", WAIT, || {
        edge_config(plane, &ns.name).is_some_and(|c| c["nodes"].as_array().is_some_and(|n| n.len() == 2))
    });
    for node in ["mac-old", "mac-new"] {
        wait_until("the node Secrets", WAIT, || {
            plane.get_json(&["-n", &ns.name, "secret", &format!("iop-node-{node}")]).is_some()
        });
    }
    let mut edge = start_edge(plane, &ns.name, "iop-edge-a", &ip);
    let edge_http = edge.http;
    let grpc = {
        let config = std::fs::read_to_string(plane.dir.path().join("iop-edge-a").join("edge.yaml")).unwrap();
        iop_proto::config::EdgeConfig::from_yaml(&config).unwrap().listen.grpc
    };
    let serial = |node: &str| {
        plane.get_json(&["-n", &ns.name, "nodecatalog", node]).map(|n| n["status"]["certificate"]["serial"].clone())
    };
    let bundle_current = |node: &str| {
        plane
            .get_json(&["-n", &ns.name, "nodecatalog", node])
            .map(|n| condition(&n, "BundleCurrent"))
            .unwrap_or_default()
    };
    // Certificates in: the Edge's ca.pem and edge.pem, each node's ca.pem.
    let cas_in_use = || {
        let count = |secret: &str, key: &str| certificates(&secret_value(plane, &ns.name, secret, key));
        [
            count("iop-edge-tls", "ca.pem"),
            count("iop-edge-tls", "edge.pem"),
            count("iop-node-mac-old", "ca.pem"),
            count("iop-node-mac-new", "ca.pem"),
        ]
    };
    // What the kubelet does after a Secret changes; the Edge reloads.
    let refresh_mounts = |edge: &EdgeReplica| {
        let reloads = || edge.process.as_ref().unwrap().log_text().matches("config reloaded").count();
        let before = reloads();
        write_mounts(plane, &ns.name, "iop-edge-a", &ip);
        wait_until("the Edge reloaded", WAIT, || reloads() > before);
    };

    // Before: mac-old runs a bundle of the first CA. Its copy is kept.
    let old_bundle = dir.join("mac-old-first-ca");
    let old_yaml = node_bundle(plane, &ns.name, "mac-old", grpc, &old_bundle);
    let mut mac_old = start_node(&old_yaml, dir.join("mac-old-1.log"));
    wait_until("mock-mac-old answers", WAIT, || chat(edge_http, "mock-mac-old").0 == 200);
    let first_serial = serial("mac-old");

    // Someone deletes iop-ca (to replace it, or by mistake): the operator
    // makes no CA of its own (it used to, racing the user's `kubectl
    // create` and cutting off every node) and says what to do.
    let saved_ca = plane.get_json(&["-n", &ns.name, "secret", "iop-ca"]).unwrap();
    let edge_tls_version =
        || plane.get_json(&["-n", &ns.name, "secret", "iop-edge-tls"]).unwrap()["metadata"]["resourceVersion"].clone();
    let edge_tls_before = edge_tls_version();
    plane.kubectl(&["-n", &ns.name, "delete", "secret", "iop-ca"]);
    let mut operator = operator;
    operator.process.wait_for_log("Secret `iop-ca` is missing while `iop-edge-tls` exists", WAIT);
    assert!(plane.get_json(&["-n", &ns.name, "secret", "iop-ca"]).is_none(), "the operator made a CA");
    let mut restored = saved_ca.clone();
    for field in ["resourceVersion", "uid", "creationTimestamp", "managedFields"] {
        restored["metadata"].as_object_mut().unwrap().remove(field);
    }
    let succeeded = operator.metric("iop_operator_reconciles_total{result=\"ok\"}");
    plane.kubectl_stdin(&["create", "-n", &ns.name, "-f", "-"], &restored.to_string());
    // Restored: the same CA, nothing re-issued.
    operator.wait_reconciled(succeeded + 1.0);
    assert_eq!(edge_tls_version(), edge_tls_before, "iop-edge-tls re-issued after a restore of the same CA");
    assert_eq!(serial("mac-old"), first_serial);

    // Traffic through mac-old for the whole rotation: none may fail.
    let stop = Arc::new(AtomicBool::new(false));
    let load = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut statuses = BTreeMap::<u16, usize>::new();
            while !stop.load(Ordering::Relaxed) {
                *statuses.entry(chat(edge_http, "mock-mac-old").0).or_default() += 1;
            }
            statuses
        }
    });

    // The rotation: one command.
    let output = operator_cli(plane, &["ca", "rotate", "-n", &ns.name]);
    assert!(output.status.success(), "ca rotate: {}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("ca finish"));
    let again = operator_cli(plane, &["ca", "rotate", "-n", &ns.name]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("already under way"));
    wait_until("every certificate re-issued by the new CA, both CAs trusted", WAIT, || {
        cas_in_use() == [2, 2, 2, 2] && serial("mac-old") != first_serial
    });
    // The kubelet refreshes the Edge's mounts; it reloads, no restart.
    refresh_mounts(&edge);

    // mac-new joins with a bundle of the new CA.
    let new_yaml = node_bundle(plane, &ns.name, "mac-new", grpc, &dir.join("mac-new"));
    let _mac_new = start_node(&new_yaml, dir.join("mac-new.log"));
    wait_until("mock-mac-new answers", WAIT, || chat(edge_http, "mock-mac-new").0 == 200);
    stop.store(true, Ordering::Relaxed);
    let statuses = load.join().unwrap();
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [200], "requests during the rotation: {statuses:?}");

    // mac-old restarts on its old bundle: it trusts only the first CA, and
    // verifies the Edge's new certificate through the cross-signed CA.
    assert!(mac_old.terminate().success());
    mac_old = start_node(&old_yaml, dir.join("mac-old-2.log"));
    wait_until("mock-mac-old answers after a restart on the old bundle", WAIT, || {
        chat(edge_http, "mock-mac-old").0 == 200
    });
    wait_until("BundleCurrent: mac-new True, mac-old False", WAIT, || {
        bundle_current("mac-new").0 == "True" && bundle_current("mac-old") == ("False".into(), "OlderBundle".into())
    });

    // `ca finish` refuses while mac-old would be cut off.
    let refused = operator_cli(plane, &["ca", "finish", "-n", &ns.name]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("mac-old") && !stderr.contains("mac-new"), "{stderr}");
    assert_eq!(certificates(&secret_value(plane, &ns.name, "iop-ca", "retiring-ca.pem")), 1, "nothing written");

    // mac-old gets its new bundle; then the overlap ends.
    assert!(mac_old.terminate().success());
    let renewed_yaml = node_bundle(plane, &ns.name, "mac-old", grpc, &dir.join("mac-old-new-ca"));
    let _mac_old = start_node(&renewed_yaml, dir.join("mac-old-3.log"));
    wait_until("BundleCurrent True on both", WAIT, || {
        ["mac-old", "mac-new"].iter().all(|n| bundle_current(n).0 == "True")
    });
    let serials = (serial("mac-old"), serial("mac-new"));
    let output = operator_cli(plane, &["ca", "finish", "-n", &ns.name]);
    assert!(output.status.success(), "ca finish: {}", String::from_utf8_lossy(&output.stderr));
    wait_until("one CA trusted, no cross-signed CA served", WAIT, || cas_in_use() == [1, 1, 1, 1]);
    assert_eq!((serial("mac-old"), serial("mac-new")), serials, "the same certificates, no new bundle needed");
    refresh_mounts(&edge);
    for model in ["mock-mac-old", "mock-mac-new"] {
        assert_eq!(chat(edge_http, model).0, 200, "{model} after the rotation ended");
    }

    // A bundle of the first CA is refused now: the node no longer trusts
    // what the Edge serves (no cross-signed CA), and says why in its log.
    let mut stale = start_node(&old_yaml, dir.join("mac-old-stale.log"));
    stale.wait_for_log("edge_certificate=\"untrusted_issuer\"", WAIT);
    drop(stale);
    edge.process.take();
}

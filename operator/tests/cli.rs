//! The `iop-operator` binary: `crds` and `node-bundle`.

use std::process::Command;
use std::time::Duration;

use iop_operator::certs::Ca;
use iop_proto::identity::NodeIdentity;

fn operator() -> Command {
    Command::new(env!("CARGO_BIN_EXE_iop-operator"))
}

#[test]
fn crds_prints_the_generated_definitions() {
    let out = operator().arg("crds").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), iop_operator::crd::render_yaml());
}

#[test]
fn node_bundle_writes_a_ready_node_directory() {
    let now = time::OffsetDateTime::now_utc();
    let ca = Ca::generate("iop test CA", now, Duration::from_secs(86_400 * 365)).unwrap();
    let node = ca
        .node_client_cert(&NodeIdentity::new("iop.example", "studio-mac").unwrap(), now, Duration::from_secs(86_400))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("secret");
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join("ca.pem"), ca.cert_pem()).unwrap();
    std::fs::write(input.join("node.pem"), &node.cert_pem).unwrap();
    std::fs::write(input.join("node-key.pem"), node.key.expose()).unwrap();
    let out_dir = dir.path().join("bundle");

    let out = operator()
        .args(["node-bundle", "studio-mac", "--edge-url", "https://iop.example.com:7443"])
        .arg("--ca")
        .arg(input.join("ca.pem"))
        .arg("--cert")
        .arg(input.join("node.pem"))
        .arg("--key")
        .arg(input.join("node-key.pem"))
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("spiffe://iop.example/node/studio-mac"), "{stdout}");
    assert!(!stdout.contains("PRIVATE KEY"));

    let config = iop_node::config::NodeConfig::load(&out_dir.join("node.yaml")).unwrap();
    assert_eq!(config.edge.url, "https://iop.example.com:7443");
    assert_eq!(std::fs::read_to_string(config.tls.key_file).unwrap(), node.key.expose());

    // A certificate of another node is refused, and nothing secret is printed.
    let out = operator()
        .args(["node-bundle", "laptop", "--edge-url", "https://iop.example.com:7443"])
        .arg("--ca")
        .arg(input.join("ca.pem"))
        .arg("--cert")
        .arg(input.join("node.pem"))
        .arg("--key")
        .arg(input.join("node-key.pem"))
        .arg("--out")
        .arg(dir.path().join("other"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("belongs to node `studio-mac`, not `laptop`"), "{stderr}");
    assert!(!dir.path().join("other").exists());
}

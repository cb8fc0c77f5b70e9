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

#[test]
fn run_names_the_missing_or_invalid_variable() {
    let out = operator().arg("run").env_clear().output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("IOP_NAMESPACE is not set"), "{stderr}");

    let out = operator()
        .arg("run")
        .env_clear()
        .env("IOP_NAMESPACE", "iop")
        .env("IOP_POD_NAME", "iop-operator-0")
        .env("IOP_EDGE_POD_SELECTOR", "app.kubernetes.io/component in (edge)")
        .env("IOP_EDGE_SERVER_NAMES", "iop-edge-grpc")
        .env("IOP_TRUST_DOMAIN", "iop.example")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("IOP_EDGE_POD_SELECTOR=`app.kubernetes.io/component in (edge)`"), "{stderr}");

    let out = operator()
        .arg("run")
        .env_clear()
        .env("IOP_NAMESPACE", "iop")
        .env("IOP_POD_NAME", "iop-operator-0")
        .env("IOP_EDGE_POD_SELECTOR", "app.kubernetes.io/component=edge")
        .env("IOP_EDGE_SERVER_NAMES", "iop-edge-grpc")
        .env("IOP_TRUST_DOMAIN", "iop.example")
        .env("IOP_METRICS_ADDR", "metrics:9464")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("IOP_METRICS_ADDR=`metrics:9464`: must be IP:PORT"), "{stderr}");
}

#[test]
fn node_bundle_needs_files_or_a_namespace() {
    let out = operator().args(["node-bundle", "mac", "--edge-url", "https://e:7443", "--out", "x"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--ca <CA>") && stderr.contains("--key <KEY>"), "{stderr}");

    let out = operator()
        .args([
            "node-bundle",
            "mac",
            "--edge-url",
            "https://e:7443",
            "--out",
            "x",
            "--namespace",
            "iop",
            "--ca",
            "ca.pem",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

/// Logs of `iop-operator run` (stdout) carry no ANSI colour codes when
/// stdout is not a terminal (a pod's log, a pipe).
#[test]
fn run_logs_without_colour_codes_when_not_on_a_terminal() {
    let home = tempfile::tempdir().unwrap();
    let out = operator()
        .arg("run")
        .env_clear()
        .env("HOME", home.path())
        .env("KUBECONFIG", home.path().join("no-such-kubeconfig"))
        .env("IOP_NAMESPACE", "iop")
        .env("IOP_POD_NAME", "iop-operator-0")
        .env("IOP_EDGE_POD_SELECTOR", "app.kubernetes.io/component=edge")
        .env("IOP_EDGE_SERVER_NAMES", "iop-edge-grpc.iop.svc")
        .env("IOP_TRUST_DOMAIN", "iop.local")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("no Kubernetes API client"), "{stdout}");
    assert!(!stdout.contains('\u{1b}'), "colour codes in {stdout:?}");
}

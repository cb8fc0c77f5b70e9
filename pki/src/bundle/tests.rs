use std::time::Duration;

use iop_node::config::NodeConfig;

use super::*;
use crate::{Ca, CertifiedKey};

const DAY: Duration = Duration::from_secs(86_400);

fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_793_534_400).unwrap()
}

struct Parts {
    ca: Ca,
    node: CertifiedKey,
}

fn parts(name: &str) -> Parts {
    let ca = Ca::generate("iop test CA", now(), 365 * DAY).unwrap();
    let node = ca.node_client_cert(&NodeIdentity::new("iop.example", name).unwrap(), now(), 30 * DAY).unwrap();
    Parts { ca, node }
}

fn input<'a>(p: &'a Parts, node: &'a str) -> Input<'a> {
    Input {
        node,
        edge_url: "https://iop.example.com:7443",
        server_name: None,
        ca_pem: p.ca.cert_pem(),
        cert_pem: &p.node.cert_pem,
        key: &p.node.key,
        written_by: "iop-operator node-bundle studio-mac",
    }
}

#[test]
fn the_written_bundle_is_a_loadable_node_config() {
    let p = parts("studio-mac");
    let bundle = build(&input(&p, "studio-mac"), now()).unwrap();
    assert_eq!(bundle.identity.uri(), "spiffe://iop.example/node/studio-mac");
    assert_eq!(bundle.not_after, now() + 30 * DAY);
    assert!(
        bundle
            .node_yaml
            .contains("# Written by `iop-operator node-bundle studio-mac` for spiffe://iop.example/node/studio-mac.\n"),
        "{}",
        bundle.node_yaml
    );

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    let written = bundle.write(&out).unwrap();
    assert_eq!(written.len(), 4);

    let config = NodeConfig::load(&out.join(CONFIG_FILE)).unwrap();
    assert_eq!(config.edge.url, "https://iop.example.com:7443");
    assert_eq!(config.server_name().as_deref(), Some("iop.example.com"));
    assert_eq!(config.tls.ca_file, out.join(CA_FILE));
    assert_eq!(config.tls.cert_file, out.join(CERT_FILE));
    assert_eq!(config.tls.key_file, out.join(KEY_FILE));
    assert_eq!(std::fs::read_to_string(&config.tls.ca_file).unwrap(), p.ca.cert_pem());
    assert_eq!(std::fs::read_to_string(&config.tls.cert_file).unwrap(), p.node.cert_pem);
    assert_eq!(std::fs::read_to_string(&config.tls.key_file).unwrap(), p.node.key.expose());

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| std::fs::metadata(out.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(KEY_FILE), 0o600);
        assert_eq!(mode(CERT_FILE), 0o644);
        // Rewriting over a key file that was left world-readable narrows it again.
        std::fs::set_permissions(out.join(KEY_FILE), std::fs::Permissions::from_mode(0o644)).unwrap();
        bundle.write(&out).unwrap();
        assert_eq!(mode(KEY_FILE), 0o600);
    }
}

#[test]
fn an_explicit_server_name_is_kept() {
    let p = parts("mac");
    let mut i = input(&p, "mac");
    i.edge_url = "https://203.0.113.9:7443";
    i.server_name = Some("iop-edge.iop.svc");
    let bundle = build(&i, now()).unwrap();
    let config = NodeConfig::from_yaml(&bundle.node_yaml).unwrap();
    assert_eq!(config.server_name().as_deref(), Some("iop-edge.iop.svc"));
}

#[test]
fn parts_that_do_not_belong_together_are_refused() {
    let p = parts("studio-mac");
    assert!(matches!(build(&input(&p, "laptop"), now()), Err(BundleError::WrongNode { .. })));
    assert!(matches!(build(&input(&p, "Bad_Name"), now()), Err(BundleError::Name(_))));

    let other = parts("studio-mac");
    let mut i = input(&p, "studio-mac");
    i.ca_pem = other.ca.cert_pem();
    assert!(matches!(build(&i, now()), Err(BundleError::NotSignedByCa)));

    let mut i = input(&p, "studio-mac");
    i.key = &other.node.key;
    assert!(matches!(build(&i, now()), Err(BundleError::KeyMismatch)));

    let mut i = input(&p, "studio-mac");
    i.cert_pem = p.ca.cert_pem();
    assert!(matches!(build(&i, now()), Err(BundleError::Identity)), "a CA certificate has no node identity");

    assert!(matches!(build(&input(&p, "studio-mac"), now() + 31 * DAY), Err(BundleError::NotCurrent { .. })));

    for url in ["http://iop.example.com:7443", "https://", "https://:7443", "iop.example.com"] {
        let mut i = input(&p, "studio-mac");
        i.edge_url = url;
        assert!(matches!(build(&i, now()), Err(BundleError::EdgeUrl(_))), "{url}");
    }
}

#[test]
fn bundle_debug_does_not_print_the_key() {
    let p = parts("mac");
    let bundle = build(&input(&p, "mac"), now()).unwrap();
    assert!(!format!("{bundle:?}").contains("PRIVATE KEY"));
}

use std::os::unix::fs::PermissionsExt;

use super::*;

const DAY: Duration = Duration::from_secs(86_400);

fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_793_534_400).unwrap()
}

fn options(names: &[&str]) -> InitOptions {
    InitOptions {
        names: names.iter().map(|n| n.to_string()).collect(),
        ca_validity: iop_pki::CA_VALIDITY,
        edge_validity: iop_pki::EDGE_VALIDITY,
        force: false,
    }
}

fn node_options(name: &str) -> NodeOptions {
    NodeOptions {
        name: name.to_string(),
        edge_url: "https://edge.example.lan:7443".to_string(),
        server_name: None,
        trust_domain: "iop.local".to_string(),
        validity: iop_pki::NODE_VALIDITY,
        out: None,
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn init_writes_a_ca_and_the_edge_certificate_with_private_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    let issued = init(&dir, &options(&["edge.example.lan", "192.168.1.10"]), now()).unwrap();
    let files: Vec<_> = issued.written.iter().map(|p| p.file_name().unwrap().to_str().unwrap()).collect();
    assert_eq!(files, ["ca-key.pem", "ca.pem", "edge-key.pem", "edge.pem"]);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(CA_KEY_FILE)), 0o600);
    assert_eq!(mode(&dir.join(EDGE_KEY_FILE)), 0o600);
    assert_eq!(mode(&dir.join(CA_CERT_FILE)), 0o644);
    assert_eq!(issued.ca_not_after, now() + iop_pki::CA_VALIDITY);
    assert_eq!(issued.edge_not_after, now() + iop_pki::EDGE_VALIDITY);

    let ca = load_ca(&dir, now()).unwrap();
    let edge = iop_pki::inspect(&read(&dir.join(EDGE_CERT_FILE))).unwrap();
    assert_eq!(edge.names, ["edge.example.lan", "192.168.1.10"]);
    // The Edge loads the files as its TLS config.
    crate::install_crypto_provider();
    let (ca_file, cert_file, key_file) = (dir.join(CA_CERT_FILE), dir.join(EDGE_CERT_FILE), dir.join(EDGE_KEY_FILE));
    crate::node::tls::server_config(&ca_file, &cert_file, &key_file, "iop.local", &Default::default()).unwrap();
    assert_eq!(ca.cert_pem(), read(&dir.join(CA_CERT_FILE)));

    let report = issued_report(&dir, &issued);
    assert!(report.contains("edge.example.lan, 192.168.1.10"), "{report}");
    assert!(!report.contains("PRIVATE KEY"), "{report}");
}

#[test]
fn an_existing_ca_is_kept_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir, &options(&["edge.example.lan"]), now()).unwrap();
    let (ca, key) = (read(&dir.join(CA_CERT_FILE)), read(&dir.join(CA_KEY_FILE)));
    let edge = read(&dir.join(EDGE_CERT_FILE));

    let err = init(dir, &options(&["other.example.lan"]), now()).unwrap_err();
    assert!(matches!(err, PkiError::CaExists { .. }), "{err}");
    assert!(err.to_string().contains("iop-edge pki edge"), "{err}");
    assert_eq!((read(&dir.join(CA_CERT_FILE)), read(&dir.join(CA_KEY_FILE))), (ca.clone(), key.clone()));
    assert_eq!(read(&dir.join(EDGE_CERT_FILE)), edge, "nothing is written");

    // Either file of a CA is enough to refuse.
    std::fs::remove_file(dir.join(CA_CERT_FILE)).unwrap();
    assert!(matches!(init(dir, &options(&["e"]), now()), Err(PkiError::CaExists { .. })));
    assert_eq!(read(&dir.join(CA_KEY_FILE)), key);

    let forced = InitOptions { force: true, ..options(&["other.example.lan"]) };
    init(dir, &forced, now()).unwrap();
    assert_ne!(read(&dir.join(CA_KEY_FILE)), key);
    assert_ne!(read(&dir.join(CA_CERT_FILE)), ca);
    assert_eq!(mode(&dir.join(CA_KEY_FILE)), 0o600);
}

#[test]
fn bad_input_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    for names in [vec![], vec!["bad name!"], vec!["ok.example", "https://edge.example.lan"]] {
        let err = init(&dir, &options(&names), now()).unwrap_err();
        assert!(matches!(err, PkiError::Name(CertError::InvalidName(_))), "{names:?}: {err}");
    }
    let short = InitOptions { edge_validity: Duration::from_secs(1), ..options(&["e"]) };
    assert!(matches!(init(&dir, &short, now()), Err(PkiError::Certificate(CertError::Validity))));
    assert!(!dir.exists());

    let err = node(&dir, &node_options("mac"), now()).unwrap_err();
    assert!(matches!(err, PkiError::NoCa { .. }), "{err}");
    assert!(err.to_string().contains("iop-edge pki init"), "{err}");
    assert!(!dir.exists());
}

#[test]
fn a_node_bundle_is_the_operators_format_and_names_its_config_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir, &options(&["edge.example.lan"]), now()).unwrap();
    let written = node(dir, &node_options("studio-mac"), now()).unwrap();
    let out = dir.join("nodes").join("studio-mac");
    assert_eq!(written.out, out);
    let files: Vec<_> = written.written.iter().map(|p| p.file_name().unwrap().to_str().unwrap()).collect();
    assert_eq!(files, ["ca.pem", "node.pem", "node-key.pem", "node.yaml"]);
    assert_eq!(mode(&out.join("node-key.pem")), 0o600);
    assert_eq!(written.bundle.identity.uri(), "spiffe://iop.local/node/studio-mac");
    assert_eq!(written.bundle.not_after, now() + iop_pki::NODE_VALIDITY);
    assert_eq!(read(&out.join("ca.pem")), read(&dir.join(CA_CERT_FILE)));
    assert!(read(&out.join("node.yaml")).contains("Written by `iop-edge pki node studio-mac`"));

    let report = node_report(&written);
    assert!(report.contains("  trust_domain: iop.local\n  nodes:\n    - name: studio-mac\n"), "{report}");
    assert!(report.contains("valid until 2026-12-01T12:00:00Z"), "{report}");
    assert!(report.contains("iop-node --config studio-mac/node.yaml"), "{report}");
    assert!(!report.contains("PRIVATE KEY"), "{report}");

    // Again (renewal): a new certificate over the old files.
    let before = read(&out.join("node.pem"));
    let custom = NodeOptions { out: Some(out.clone()), ..node_options("studio-mac") };
    node(dir, &custom, now()).unwrap();
    assert_ne!(read(&out.join("node.pem")), before);
}

#[test]
fn bad_node_input_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir, &options(&["edge.example.lan"]), now()).unwrap();
    let cases = [
        (NodeOptions { name: "Studio_Mac".into(), ..node_options("x") }, "node name"),
        (NodeOptions { trust_domain: "IOP.local".into(), ..node_options("mac") }, "--trust-domain"),
        (NodeOptions { edge_url: "http://edge.example.lan:7443".into(), ..node_options("mac") }, "--edge-url"),
        (NodeOptions { edge_url: "edge.example.lan".into(), ..node_options("mac") }, "--edge-url"),
        (NodeOptions { validity: Duration::from_secs(3), ..node_options("mac") }, "validity"),
    ];
    for (options, says) in cases {
        let err = node(dir, &options, now()).unwrap_err();
        assert!(err.to_string().contains(says), "{options:?}: {err}");
    }
    assert!(!dir.join(NODES_DIR).exists());
}

#[test]
fn the_edge_certificate_is_renewed_for_its_names_from_the_same_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir, &options(&["edge.example.lan", "10.0.0.7"]), now()).unwrap();
    let ca = read(&dir.join(CA_CERT_FILE));
    let old = iop_pki::inspect(&read(&dir.join(EDGE_CERT_FILE))).unwrap();

    let later = now() + 70 * DAY;
    let issued = renew_edge(dir, &[], iop_pki::EDGE_VALIDITY, later).unwrap();
    let new = iop_pki::inspect(&read(&dir.join(EDGE_CERT_FILE))).unwrap();
    assert_eq!(new.names, old.names);
    assert_ne!(new.serial, old.serial);
    assert_eq!(issued.edge_not_after, later + iop_pki::EDGE_VALIDITY);
    assert_eq!(read(&dir.join(CA_CERT_FILE)), ca, "the CA stays");

    renew_edge(dir, &["new.example.lan".to_string()], DAY, later).unwrap();
    assert_eq!(iop_pki::inspect(&read(&dir.join(EDGE_CERT_FILE))).unwrap().names, ["new.example.lan"]);

    std::fs::remove_file(dir.join(EDGE_CERT_FILE)).unwrap();
    assert!(matches!(renew_edge(dir, &[], DAY, later), Err(PkiError::NoNames { .. })));
    let expired = now() + iop_pki::CA_VALIDITY + DAY;
    assert!(matches!(renew_edge(dir, &["e".to_string()], DAY, expired), Err(PkiError::BadCa { .. })));
}

/// CA rotation as docs/standalone.md describes it: a new CA whose
/// `ca.pem` carries the old CA after its own. Bundles issued from it
/// trust both (the Edge's old certificate verifies), and an Edge that
/// trusts it accepts node certificates of either CA.
#[test]
fn a_ca_file_that_carries_the_old_ca_too_issues_bundles_that_trust_both() {
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::server::WebPkiClientVerifier;
    use rustls_pki_types::pem::PemObject;

    let tmp = tempfile::tempdir().unwrap();
    let (old_dir, new_dir) = (tmp.path().join("old"), tmp.path().join("new"));
    init(&old_dir, &options(&["edge.example.lan"]), now()).unwrap();
    init(&new_dir, &options(&["edge.example.lan"]), now()).unwrap();
    let carried = read(&new_dir.join(CA_CERT_FILE)) + &read(&old_dir.join(CA_CERT_FILE));
    std::fs::write(new_dir.join(CA_CERT_FILE), &carried).unwrap();

    let written = node(&new_dir, &node_options("mac"), now()).unwrap();
    let bundle_ca = read(&written.out.join("ca.pem"));
    assert_eq!(bundle_ca, carried);
    let old_bundle = node(&old_dir, &node_options("laptop"), now()).unwrap();

    crate::install_crypto_provider();
    let roots = |pem: &str| {
        let mut roots = rustls::RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(der.unwrap()).unwrap();
        }
        std::sync::Arc::new(roots)
    };
    let der = |path: &Path| CertificateDer::from_pem_file(path).unwrap();
    let at = UnixTime::since_unix_epoch(Duration::from_secs(now().unix_timestamp() as u64 + 60));
    let server = WebPkiServerVerifier::builder(roots(&bundle_ca)).build().unwrap();
    let name = ServerName::try_from("edge.example.lan").unwrap();
    for edge in [old_dir.join(EDGE_CERT_FILE), new_dir.join(EDGE_CERT_FILE)] {
        server.verify_server_cert(&der(&edge), &[], &name, &[], at).unwrap();
    }
    let client = WebPkiClientVerifier::builder(roots(&carried)).build().unwrap();
    for node_cert in [written.out.join("node.pem"), old_bundle.out.join("node.pem")] {
        client.verify_client_cert(&der(&node_cert), &[], at).unwrap();
    }
}

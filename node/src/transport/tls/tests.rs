use super::*;

#[test]
fn key_bytes_never_reach_debug_output() {
    let files = TlsFiles { ca: vec![], cert: vec![], key: KeyPem::new(b"-----BEGIN PRIVATE KEY-----secret".to_vec()) };
    let shown = format!("{files:?}");
    assert!(!shown.contains("secret") && shown.contains("[redacted]"), "{shown}");
}

#[test]
fn a_missing_file_names_its_field_and_path() {
    let tls = NodeTlsConfig {
        ca_file: "/nonexistent/ca.pem".into(),
        cert_file: "/nonexistent/node.pem".into(),
        key_file: "/nonexistent/node-key.pem".into(),
    };
    let err = TlsFiles::read(&tls).unwrap_err().to_string();
    assert!(err.starts_with("tls.ca_file: cannot read /nonexistent/ca.pem"), "{err}");
}

#[test]
fn secret_names_and_keys() {
    assert_eq!(super::node_secret_name("studio-mac"), "iop-node-studio-mac");
    // The keys of the Secrets are the file names of a node bundle and of `iop-edge pki`.
    let keys = [super::CA_CERT_KEY, super::CA_KEY_KEY, super::EDGE_CERT_KEY, super::EDGE_KEY_KEY];
    assert_eq!(keys, ["ca.pem", "ca-key.pem", "edge.pem", "edge-key.pem"]);
    assert_eq!([super::NODE_CERT_KEY, super::NODE_KEY_KEY], ["node.pem", "node-key.pem"]);
}

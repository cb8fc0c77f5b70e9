//! The shipped example config loads and validates. (Being an integration
//! test also makes `cargo test`/`nextest` build the `iop-edge` binary that
//! the end-to-end tests run.)

use std::path::Path;

#[test]
fn example_edge_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/edge.yaml");
    let config = iop_edge::config::load(&path).expect("examples/edge.yaml is valid");
    assert_eq!(config.nodes.len(), 2);
    assert_eq!(config.providers.len(), 2);
    assert!(config.tls.ca_file.is_absolute() || config.tls.ca_file.starts_with(path.parent().unwrap()));
    let names = iop_edge::route::public_models(&config);
    assert_eq!(names, ["llama3.2", "qwen2.5"]);
    let llama: Vec<_> =
        iop_edge::route::candidates(&config, "llama3.2").unwrap().iter().map(|p| p.id.clone()).collect();
    assert_eq!(llama, ["studio-llama", "laptop-lmstudio"]);
    assert_eq!(config.context_fallbacks["llama3.2"], "qwen2.5");
    let website = &config.workspaces[0];
    assert_eq!((website.reference.as_str(), website.node.as_str()), ("website", "studio-mac"));
    assert_eq!((website.stages.max_repairs, website.limits.max_iterations), (1, 16));
    assert!(website.stages.prompts.review.as_deref().is_some_and(|p| p.contains("verdict")));

    // Its keys file loads, and the example key is the example principal's.
    let keys = iop_edge::auth::Keys::load(&config.auth).expect("examples/keys.yaml is valid");
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("authorization", "Bearer iop-example-key-do-not-use".parse().unwrap());
    let caller = keys.authenticate(&headers).expect("the example key is known");
    assert_eq!(caller.name(), "example-client");
    assert!(caller.may_use("llama3.2") && caller.may_use("qwen2.5") && !caller.may_use("mistral"));
}

#[test]
fn missing_config_file_is_a_clear_error() {
    let err = iop_edge::config::load(Path::new("/nonexistent/edge.yaml")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/edge.yaml"), "{err}");
}

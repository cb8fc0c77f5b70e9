use super::*;

const VALID: &str = r#"
listen: { http: "127.0.0.1:8080", grpc: "127.0.0.1:7443" }
tls: { ca_file: ca.pem, cert_file: edge.pem, key_file: edge-key.pem }
trust_domain: iop.local
auth: { mode: disabled }
nodes: [ { name: mac-1 } ]
providers:
  - id: p1
    node: mac-1
    adapter: ollama
    target: { model: "llama3.2", base_url: "http://127.0.0.1:11434" }
    models: [ { name: llama, priority: 0 } ]
"#;

const WS: &str = r#"workspaces:
  - ref: site
    node: mac-1
    root: /Users/dev/site
    operations: [read, list, command]
    commands: [ { id: test, argv: [make, test], timeout_ms: 60000 } ]
    env_allowlist: [PATH, HOME]
    limits: { max_iterations: 16 }
"#;

#[test]
fn context_fallbacks_name_public_models_and_not_themselves() {
    let two =
        VALID.replace("models: [ { name: llama, priority: 0 } ]", "models: [ { name: llama }, { name: llama-long } ]");
    let ok = EdgeConfig::from_yaml(&format!("{two}context_fallbacks: {{ llama: llama-long }}\n")).unwrap();
    assert_eq!(ok.context_fallbacks["llama"], "llama-long");
    assert_eq!(EdgeConfig::from_yaml(&ok.to_yaml()).unwrap(), ok);
    for (fallbacks, reason) in [
        ("{ nope: llama }", "is not a public model"),
        ("{ llama: nope }", "falls back to `nope`"),
        ("{ llama: llama }", "cannot fall back to itself"),
    ] {
        let err = EdgeConfig::from_yaml(&format!("{two}context_fallbacks: {fallbacks}\n")).unwrap_err().to_string();
        assert!(err.contains("context_fallbacks.") && err.contains(reason), "{fallbacks}: {err}");
    }
}

#[test]
fn retry_defaults_to_three_seconds_with_route_overrides_for_public_models() {
    let plain = EdgeConfig::from_yaml(VALID).unwrap();
    assert_eq!(plain.retry.same_provider_max_wait("llama"), std::time::Duration::from_millis(3_000));
    assert!(!plain.to_yaml().contains("retry"), "the default is not written out");
    let yaml = format!(
        "{VALID}retry: {{ same_provider_max_wait_ms: 500, routes: {{ llama: {{ same_provider_max_wait_ms: 0 }} }} }}\n"
    );
    let set = EdgeConfig::from_yaml(&yaml).unwrap();
    assert_eq!(set.retry.same_provider_max_wait("llama"), std::time::Duration::ZERO);
    assert_eq!(set.retry.same_provider_max_wait("other"), std::time::Duration::from_millis(500));
    assert_eq!(EdgeConfig::from_yaml(&set.to_yaml()).unwrap(), set);
    for (retry, field) in [
        ("{ same_provider_max_wait_ms: 60001 }", "retry.same_provider_max_wait_ms"),
        ("{ routes: { nope: { same_provider_max_wait_ms: 1 } } }", "retry.routes.nope"),
        ("{ routes: { llama: { same_provider_max_wait_ms: 60001 } } }", "retry.routes.llama.same_provider_max_wait_ms"),
    ] {
        let err = EdgeConfig::from_yaml(&format!("{VALID}retry: {retry}\n")).unwrap_err().to_string();
        assert!(err.starts_with(field), "{retry}: {err}");
    }
}

/// Issue 41 item 5: the admin listener's extra names are DNS names or `*.`
/// and one; `*.name` matches names below `name`, never `name` itself nor a
/// name that merely ends like it.
#[test]
fn admin_hosts_are_dns_names_and_parents() {
    let ok = EdgeConfig::from_yaml(
        &VALID
            .replace("listen: {", "listen: { admin_hosts: [iop-edge-admin.iop.svc, \"*.iop-edge-replicas.iop.svc\"],"),
    )
    .unwrap();
    assert_eq!(EdgeConfig::from_yaml(&ok.to_yaml()).unwrap(), ok);
    assert!(EdgeConfig::from_yaml(VALID).unwrap().listen.admin_hosts.is_empty());
    assert!(!EdgeConfig::from_yaml(VALID).unwrap().to_yaml().contains("admin_hosts"), "empty is not written out");
    for (name, known) in [
        ("iop-edge-admin.iop.svc", true),
        ("edge-0.iop-edge-replicas.iop.svc", true),
        ("a.b.iop-edge-replicas.iop.svc", true),
        ("iop-edge-replicas.iop.svc", false),
        ("xiop-edge-replicas.iop.svc", false),
        (".iop-edge-replicas.iop.svc", false),
        ("iop-edge-admin.iop.svc.evil.example", false),
        ("evil.example", false),
    ] {
        assert_eq!(ok.listen.is_admin_host(name), known, "{name}");
    }
    for bad in ["Admin.iop", "admin:8081", "*.", "*", "a..b", "-a.b", "a.*.b", "10.0.0.1:80"] {
        let yaml = VALID.replace("listen: {", &format!("listen: {{ admin_hosts: [\"{bad}\"],"));
        let err = EdgeConfig::from_yaml(&yaml).unwrap_err().to_string();
        assert!(err.starts_with("listen.admin_hosts[0]"), "{bad}: {err}");
    }
}

#[test]
fn replicas_are_unique_host_names() {
    let ok = EdgeConfig::from_yaml(&format!("{VALID}replicas: [iop-edge-7d9f-abc12, iop-edge-7d9f-def34]\n")).unwrap();
    assert_eq!(ok.replicas, ["iop-edge-7d9f-abc12", "iop-edge-7d9f-def34"]);
    assert_eq!(EdgeConfig::from_yaml(&ok.to_yaml()).unwrap(), ok);
    assert!(EdgeConfig::from_yaml(VALID).unwrap().replicas.is_empty());
    for (replicas, reason) in
        [("[a, a]", "duplicate replica `a`"), ("[\"\"]", "must be 1-253"), ("[\"a b\"]", "must be 1-253")]
    {
        let err = EdgeConfig::from_yaml(&format!("{VALID}replicas: {replicas}\n")).unwrap_err().to_string();
        assert!(err.contains("replicas[") && err.contains(reason), "{replicas}: {err}");
    }
}

#[test]
fn valid_document_loads_with_defaults() {
    let c = EdgeConfig::from_yaml(VALID).unwrap();
    assert_eq!(c.providers[0].adapter, Adapter::Ollama);
    assert_eq!(c.limits.max_body_bytes, 4 * 1024 * 1024);
    let largest = format!("{VALID}limits: {{ max_body_bytes: 67108864 }}\n");
    assert_eq!(EdgeConfig::from_yaml(&largest).unwrap().limits.max_body_bytes, 64 * 1024 * 1024);
    assert_eq!(c.model_index()["llama"].len(), 1);
    assert_eq!(c.listen.admin, "127.0.0.1:8081".parse().unwrap());
    assert_eq!(EdgeConfig::from_yaml(&c.to_yaml()).unwrap(), c);
    let keyed = VALID.replace("mode: disabled", "mode: required, keys_file: keys.yaml");
    let keyed = EdgeConfig::from_yaml(&keyed).unwrap();
    assert_eq!(keyed.auth.keys_file.as_deref(), Some(std::path::Path::new("keys.yaml")));
    assert_eq!(EdgeConfig::from_yaml(&keyed.to_yaml()).unwrap(), keyed);
    let managed = format!(
        "{VALID}    credential: {{ profile: lmstudio-key }}\ncredentials: [ {{ profile: lmstudio-key, file: key.txt, revision: 3 }} ]\n"
    );
    let managed = EdgeConfig::from_yaml(&managed).unwrap();
    assert_eq!(managed.providers[0].credential.as_ref().unwrap().profile, "lmstudio-key");
    assert_eq!((managed.credentials[0].revision, managed.credentials[0].disabled), (3, false));
    assert_eq!(EdgeConfig::from_yaml(&managed.to_yaml()).unwrap(), managed);
}

#[test]
fn errors_name_the_offending_field() {
    let cases = [
        (VALID.replace("node: mac-1", "node: mac-2"), "providers[0].node"),
        (VALID.replace("http://127.0.0.1:11434", "ftp://x"), "providers[0].target.base_url"),
        (VALID.replace("http://127.0.0.1:11434", "http://"), "providers[0].target.base_url"),
        (VALID.replace("name: mac-1 }", "name: Mac_1 }"), "nodes[0].name"),
        (VALID.replace("trust_domain: iop.local", "trust_domain: \"\""), "trust_domain"),
        (format!("{VALID}limits: {{ max_body_bytes: 67108865 }}\n"), "limits.max_body_bytes"),
        (format!("{VALID}limits: {{ max_body_bytes: 1023 }}\n"), "limits.max_body_bytes"),
        (format!("{VALID}limits: {{ max_response_bytes: 10 }}\n"), "limits.max_response_bytes"),
        (format!("{VALID}limits: {{ max_http_connections: 0 }}\n"), "limits.max_http_connections"),
        (format!("{VALID}limits: {{ http_idle_timeout_ms: 99 }}\n"), "limits.http_idle_timeout_ms"),
        (format!("{VALID}limits: {{ stream_keepalive_ms: 99 }}\n"), "limits.stream_keepalive_ms"),
        // No `auth` section means keys are required, so a keys file is.
        (VALID.replace("auth: { mode: disabled }\n", ""), "auth.keys_file"),
        (VALID.replace("mode: disabled", "mode: required"), "auth.keys_file"),
        (format!("{VALID}{WS}"), "ok"),
        (format!("{VALID}{}", WS.replace("node: mac-1", "node: mac-9")), "workspaces[0].node"),
        (format!("{VALID}{}", WS.replace("/Users/dev/site", "Users/dev")), "workspaces[0].root"),
        (format!("{VALID}{}", WS.replace("/Users/dev/site", "/Users/../etc")), "workspaces[0].root"),
        (format!("{VALID}{}", WS.replace("[read, list, command]", "[read, read]")), "workspaces[0].operations"),
        (format!("{VALID}{}", WS.replace("[read, list, command]", "[read]")), "workspaces[0].commands"),
        (
            format!("{VALID}{}", WS.replace("timeout_ms: 60000", "timeout_ms: 5")),
            "workspaces[0].commands[0].timeout_ms",
        ),
        (format!("{VALID}{}", WS.replace("argv: [make, test]", "argv: []")), "workspaces[0].commands[0].argv"),
        (format!("{VALID}{}", WS.replace("[PATH, HOME]", "[PATH, 1X]")), "workspaces[0].env_allowlist[1]"),
        (
            format!("{VALID}{}", WS.replace("max_iterations: 16", "max_iterations: 0")),
            "workspaces[0].limits.max_iterations",
        ),
        (
            format!("{VALID}{}", WS.replace("max_iterations: 16", "max_concurrent_jobs: 0")),
            "workspaces[0].limits.max_concurrent_jobs",
        ),
        (
            format!("{VALID}{}", WS.replace("max_iterations: 16", "max_concurrent_jobs: 1001")),
            "workspaces[0].limits.max_concurrent_jobs",
        ),
        (format!("{VALID}limits: {{ max_jobs_per_principal: 0 }}\n"), "limits.max_jobs_per_principal"),
        (format!("{VALID}limits: {{ max_jobs_per_principal: 1001 }}\n"), "limits.max_jobs_per_principal"),
        (format!("{VALID}{WS}{}", WS.replace("workspaces:\n", "")), "workspaces[1].ref"),
        (format!("{VALID}    credential: {{ profile: nope }}\n"), "providers[0].credential.profile"),
        (format!("{VALID}credentials: [ {{ profile: k, file: k.txt, revision: 0 }} ]\n"), "credentials[0].revision"),
        (
            format!(
                "{VALID}credentials: [ {{ profile: k, file: a, revision: 1 }}, {{ profile: k, file: b, revision: 1 }} ]\n"
            ),
            "credentials[1].profile",
        ),
    ];
    for (doc, field) in cases {
        if field == "ok" {
            let config = EdgeConfig::from_yaml(&doc).unwrap();
            assert_eq!(config.workspaces[0].limits.max_file_bytes, 16 * 1024 * 1024, "defaults fill the rest");
            assert_eq!(config.workspaces[0].limits.max_concurrent_jobs, 1, "one job per workspace by default");
            assert_eq!(config.limits.max_jobs_per_principal, 4);
            assert!(!config.workspaces[0].network, "no network unless granted");
            assert!(!config.to_yaml().contains("network"), "off is not written");
            let networked =
                EdgeConfig::from_yaml(&doc.replace("env_allowlist:", "network: true\n    env_allowlist:")).unwrap();
            assert!(networked.workspaces[0].network);
            assert_eq!(EdgeConfig::from_yaml(&networked.to_yaml()).unwrap(), networked);
            assert_eq!(EdgeConfig::from_yaml(&config.to_yaml()).unwrap(), config);
            continue;
        }
        match EdgeConfig::from_yaml(&doc) {
            Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected invalid {field}, got {other:?}"),
        }
    }
}

/// Workspaces open to anonymous callers: only with auth disabled, only
/// configured refs, each once; the error names the field.
#[test]
fn anonymous_workspaces_are_configured_refs_with_auth_disabled() {
    let open = |refs: &str| {
        VALID.replace("auth: { mode: disabled }", &format!("auth: {{ mode: disabled, anonymous_workspaces: {refs} }}"))
    };
    let ok = EdgeConfig::from_yaml(&format!("{}{WS}", open("[site]"))).unwrap();
    assert_eq!(ok.auth.anonymous_workspaces, ["site"]);
    assert_eq!(EdgeConfig::from_yaml(&ok.to_yaml()).unwrap(), ok);
    assert!(EdgeConfig::from_yaml(&format!("{VALID}{WS}")).unwrap().auth.anonymous_workspaces.is_empty());
    let keyed = format!("{VALID}{WS}").replace(
        "auth: { mode: disabled }",
        "auth: { mode: required, keys_file: k.yaml, anonymous_workspaces: [site] }",
    );
    for (doc, field) in [
        (format!("{}{WS}", open("[nope]")), "auth.anonymous_workspaces[0]"),
        (format!("{}{WS}", open("[site, site]")), "auth.anonymous_workspaces[1]"),
        (open("[site]"), "auth.anonymous_workspaces[0]"),
        (keyed, "auth.anonymous_workspaces"),
    ] {
        match EdgeConfig::from_yaml(&doc) {
            Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected invalid {field}, got {other:?}"),
        }
    }
}

/// Issue 28 item 6: `outlier` has Envoy's defaults, is not written when
/// default, and its ranges name the field.
#[test]
fn outlier_defaults_and_ranges() {
    let config = EdgeConfig::from_yaml(VALID).unwrap();
    assert_eq!(
        config.outlier,
        OutlierConfig { enabled: true, consecutive_failures: 5, base_ejection_ms: 10_000, max_ejection_ms: 30_000 }
    );
    assert!(!config.to_yaml().contains("outlier"), "defaults are not written");
    let with = |o: &str| EdgeConfig::from_yaml(&format!("{VALID}outlier: {o}\n"));
    let off = with("{ consecutive_failures: 0 }").unwrap();
    assert_eq!(off.outlier.consecutive_failures, 0);
    assert_eq!(EdgeConfig::from_yaml(&off.to_yaml()).unwrap(), off);
    assert!(!with("{ enabled: false }").unwrap().outlier.enabled);
    for (o, field) in [
        ("{ consecutive_failures: 1001 }", "outlier.consecutive_failures"),
        ("{ base_ejection_ms: 99 }", "outlier.base_ejection_ms"),
        ("{ base_ejection_ms: 5000, max_ejection_ms: 4999 }", "outlier.max_ejection_ms"),
        ("{ max_ejection_ms: 86400001 }", "outlier.max_ejection_ms"),
    ] {
        match with(o) {
            Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected invalid {field}, got {other:?}"),
        }
    }
    assert!(matches!(with("{ bogus: 1 }"), Err(ConfigError::Parse(_))));
}

/// Issue 29: `scheduling.load_penalty` defaults to 4 and is not written
/// then; `keep_warm` is Ollama's only.
#[test]
fn scheduling_and_keep_warm() {
    let config = EdgeConfig::from_yaml(VALID).unwrap();
    assert_eq!(config.scheduling.load_penalty, 4);
    assert!(!config.providers[0].keep_warm);
    let yaml = config.to_yaml();
    assert!(!yaml.contains("scheduling") && !yaml.contains("keep_warm"), "defaults are not written");
    let with = |s: &str| EdgeConfig::from_yaml(&format!("{VALID}scheduling: {s}\n"));
    let off = with("{ load_penalty: 0 }").unwrap();
    assert_eq!(off.scheduling.load_penalty, 0);
    assert_eq!(EdgeConfig::from_yaml(&off.to_yaml()).unwrap(), off);
    match with("{ load_penalty: 10001 }") {
        Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "scheduling.load_penalty"),
        other => panic!("expected invalid, got {other:?}"),
    }
    let warm = VALID.replace("    models: [", "    keep_warm: true\n    models: [");
    let config = EdgeConfig::from_yaml(&warm).unwrap();
    assert!(config.providers[0].keep_warm);
    assert_eq!(EdgeConfig::from_yaml(&config.to_yaml()).unwrap(), config);
    match EdgeConfig::from_yaml(&warm.replace("adapter: ollama", "adapter: openai")) {
        Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "providers[0].keep_warm"),
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[test]
fn base_urls_are_checked_with_the_reason() {
    let good = [
        "http://127.0.0.1:11434",
        "http://127.0.0.1:11434/",
        "https://llm.example/openai",
        "http://localhost",
        "http://host.docker.internal:1234",
        "http://my_host:1",
        "http://h:65535/a/b%20c",
        "http://[::1]:8080",
        "http://[fe80::1]",
        "http://0.0.0.0:1",
        "http://255.255.255.255",
        "http://10.0.0.1a",
        "http://1-2:1",
        "http://123.example",
    ];
    for url in good {
        assert_eq!(check_base_url(url), Ok(()), "{url}");
    }
    let bad = [
        ("http://:11434", "must name a host"),
        ("http://", "must name a host"),
        ("http:///v1", "must name a host"),
        ("http://h:99999", "port must be between 1 and 65535"),
        ("http://h:65536", "port must be between 1 and 65535"),
        ("http://h:0", "port must be between 1 and 65535"),
        ("http://h:080", "port must be between 1 and 65535"),
        ("http://h:", "port must be between 1 and 65535"),
        ("http://h:x1", "port must be between 1 and 65535"),
        ("http://user:secret@h:1", "must not carry credentials"),
        ("http://h:1/?x=1", "must not have a query or fragment"),
        ("http://h:1/#top", "must not have a query or fragment"),
        ("http://h:1/a b", "must not contain whitespace or control characters"),
        ("http://h:1/\u{7}", "must not contain whitespace or control characters"),
        ("http://h\n:1", "must not contain whitespace or control characters"),
        ("ftp://h", "must be an http:// or https:// URL"),
        ("HTTP://h", "must be an http:// or https:// URL"),
        ("127.0.0.1:11434", "must be an http:// or https:// URL"),
        ("http://-h:1", "has an invalid host name"),
        ("http://a..b:1", "has an invalid host name"),
        ("http://a.b.:1", "has an invalid host name"),
        ("http://h:1:2", "port must be between 1 and 65535"),
        ("http://[::1", "has an unclosed IPv6 address"),
        ("http://[nope]:1", "has an invalid IPv6 address"),
        ("http://[::1]x", "has characters after the IPv6 address"),
        ("http://999.999.999.999:1", "has an invalid IPv4 address"),
        ("http://256.0.0.1", "has an invalid IPv4 address"),
        ("http://1.2.3:1", "has an invalid IPv4 address"),
        ("http://1.2.3.4.5", "has an invalid IPv4 address"),
        ("http://127.0.0.01:1", "has an invalid IPv4 address"),
        ("http://2130706433:1", "has an invalid IPv4 address"),
        ("http://llm.123", "has an invalid IPv4 address"),
    ];
    for (url, reason) in bad {
        assert_eq!(check_base_url(url), Err(reason), "{url:?}");
    }
    assert!(check_base_url(&format!("http://h/{}", "a".repeat(2048))).is_err());
}

#[test]
fn target_models_are_checked_with_the_reason() {
    for model in ["llama3.2:3b", "qwen2.5-7b-instruct", "hf.co/org/model:Q4_K_M", "My Model"] {
        assert_eq!(check_target_model(model), Ok(()), "{model}");
    }
    assert_eq!(check_target_model(""), Err("must be 1-256 characters"));
    assert_eq!(check_target_model(&"m".repeat(257)), Err("must be 1-256 characters"));
    for model in ["llama\n", "llama\u{0}", "a\tb", "x\u{7f}", "x\u{85}y"] {
        assert_eq!(check_target_model(model), Err("must not contain control characters"), "{model:?}");
    }
    assert_eq!(check_target_model(" llama"), Err("must not start or end with whitespace"));
    assert_eq!(check_target_model("llama "), Err("must not start or end with whitespace"));
}

#[test]
fn provider_urls_and_models_are_refused_naming_the_field() {
    let cases = [
        (VALID.replace("http://127.0.0.1:11434", "http://:11434"), "providers[0].target.base_url"),
        (VALID.replace("http://127.0.0.1:11434", "http://127.0.0.1:99999"), "providers[0].target.base_url"),
        (VALID.replace("http://127.0.0.1:11434", "http://u:p@127.0.0.1:1"), "providers[0].target.base_url"),
        (VALID.replace("model: \"llama3.2\"", "model: \"llama\\n3.2\""), "providers[0].target.model"),
    ];
    for (doc, field) in cases {
        match EdgeConfig::from_yaml(&doc) {
            Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected invalid {field}, got {other:?}"),
        }
    }
}

#[test]
fn unknown_fields_and_enum_values_are_rejected() {
    assert!(matches!(
        EdgeConfig::from_yaml(&VALID.replace("adapter: ollama", "adapter: vllm")),
        Err(ConfigError::Parse(_))
    ));
    assert!(matches!(EdgeConfig::from_yaml(&format!("{VALID}\nbogus: 1\n")), Err(ConfigError::Parse(_))));
}

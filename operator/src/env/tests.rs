use std::collections::HashMap;

use super::*;

fn chart_env() -> HashMap<&'static str, &'static str> {
    HashMap::from([
        (NAMESPACE, "iop"),
        (POD_NAME, "iop-operator-7d9c-abcde"),
        (
            EDGE_POD_SELECTOR,
            "app.kubernetes.io/name=iop,app.kubernetes.io/instance=iop,app.kubernetes.io/component=edge",
        ),
        (EDGE_SERVER_NAMES, "iop-edge-grpc,iop-edge-grpc.iop.svc, edge.example.com,10.0.0.7"),
        (TRUST_DOMAIN, "iop.example"),
    ])
}

fn parse(env: &HashMap<&'static str, &'static str>) -> Result<RunConfig, EnvError> {
    RunConfig::from_lookup(|v| env.get(v).map(|s| s.to_string()))
}

#[test]
fn parses_what_the_chart_sets() {
    let config = parse(&chart_env()).unwrap();
    assert_eq!(config.namespace, "iop");
    assert_eq!(config.pod_name, "iop-operator-7d9c-abcde");
    assert_eq!(
        config.edge_pod_selector,
        "app.kubernetes.io/name=iop,app.kubernetes.io/instance=iop,app.kubernetes.io/component=edge"
    );
    assert_eq!(config.edge_server_names, ["iop-edge-grpc", "iop-edge-grpc.iop.svc", "edge.example.com", "10.0.0.7"]);
    let settings = config.settings();
    assert_eq!(settings.trust_domain, "iop.example");
    assert_eq!(settings.listen.http.port(), 8080);
    assert_eq!(settings.listen.grpc.port(), 7443);
    assert_eq!(settings.listen.admin.port(), 8081);
    assert_eq!(settings.auth.mode, AuthMode::Required, "keys are required unless the chart says otherwise");
    assert_eq!(settings.auth.keys_file.as_deref(), Some(std::path::Path::new(crate::reconcile::EDGE_KEYS_FILE)));
    assert_eq!(config.metrics_addr, "0.0.0.0:9464".parse().unwrap(), "the default when unset");
}

#[test]
fn the_test_clock_offset_is_optional_and_checked() {
    let mut env = chart_env();
    assert_eq!(parse(&env).unwrap().clock_offset_s, 0, "the chart never sets it");
    env.insert(TEST_CLOCK_OFFSET, "90000");
    assert_eq!(parse(&env).unwrap().clock_offset_s, 90_000);
    env.insert(TEST_CLOCK_OFFSET, "-60");
    assert_eq!(parse(&env).unwrap().clock_offset_s, -60);
    for bad in ["1.5", "25h", "99999999999999"] {
        env.insert(TEST_CLOCK_OFFSET, bad);
        assert!(matches!(parse(&env), Err(EnvError::Invalid { var: TEST_CLOCK_OFFSET, .. })), "{bad}");
    }
}

#[test]
fn the_metrics_address_is_optional_and_checked() {
    let mut env = chart_env();
    env.insert(METRICS_ADDR, " 127.0.0.1:9100 ");
    assert_eq!(parse(&env).unwrap().metrics_addr, "127.0.0.1:9100".parse().unwrap());
    env.insert(METRICS_ADDR, "[::]:9464");
    assert_eq!(parse(&env).unwrap().metrics_addr, "[::]:9464".parse().unwrap());
    env.insert(METRICS_ADDR, "");
    assert_eq!(parse(&env).unwrap().metrics_addr.port(), 9464, "blank: the default");
    for bad in ["9464", ":9464", "localhost:9464", "0.0.0.0:http", "0.0.0.0:70000", "0.0.0.0"] {
        env.insert(METRICS_ADDR, bad);
        assert_eq!(
            parse(&env),
            Err(EnvError::Invalid {
                var: METRICS_ADDR,
                value: bad.to_string(),
                reason: "must be IP:PORT, e.g. 0.0.0.0:9464 or [::]:9464"
            }),
            "{bad}"
        );
    }
}

#[test]
fn the_edge_auth_mode_is_optional_and_checked() {
    let mut env = chart_env();
    env.insert(EDGE_AUTH_MODE, " disabled ");
    let settings = parse(&env).unwrap().settings();
    assert_eq!(settings.auth, AuthConfig { mode: AuthMode::Disabled, ..Default::default() });
    env.insert(EDGE_AUTH_MODE, "required");
    assert_eq!(parse(&env).unwrap().settings().auth.mode, AuthMode::Required);
    env.insert(EDGE_AUTH_MODE, "optional");
    assert!(matches!(parse(&env), Err(EnvError::Invalid { var: EDGE_AUTH_MODE, .. })));
}

/// Issue 29: the chart's `edge.scheduling.loadPenalty` reaches the Edge
/// config's `scheduling.load_penalty`; unset is the Edge's default.
#[test]
fn scheduling_load_penalty_setting() {
    let mut env = chart_env();
    assert_eq!(parse(&env).unwrap().settings().empty_config().scheduling, SchedulingConfig::default());
    for (value, penalty) in [("0", 0), (" 12 ", 12), ("10000", 10_000)] {
        env.insert(EDGE_SCHEDULING_LOAD_PENALTY, value);
        assert_eq!(parse(&env).unwrap().settings().empty_config().scheduling.load_penalty, penalty, "{value}");
    }
    for bad in ["10001", "-1", "four", "4.5"] {
        env.insert(EDGE_SCHEDULING_LOAD_PENALTY, bad);
        assert!(matches!(parse(&env), Err(EnvError::Invalid { var: EDGE_SCHEDULING_LOAD_PENALTY, .. })), "{bad}");
    }
}

/// Issue 30: the chart's `edge.telemetry.otlpEndpoint` reaches the Edge
/// config's `telemetry.otlp_endpoint`; unset or empty is off.
#[test]
fn otlp_endpoint_setting() {
    let mut env = chart_env();
    assert_eq!(parse(&env).unwrap().settings().empty_config().telemetry, TelemetryConfig::default());
    env.insert(EDGE_OTLP_ENDPOINT, "  ");
    assert_eq!(parse(&env).unwrap().settings().empty_config().telemetry, TelemetryConfig::default());
    env.insert(EDGE_OTLP_ENDPOINT, " http://otel-collector:4318 ");
    let telemetry = parse(&env).unwrap().settings().empty_config().telemetry;
    assert_eq!(telemetry.otlp_endpoint.as_deref(), Some("http://otel-collector:4318"));
    for bad in ["otel-collector:4318", "ftp://c", "http://a b"] {
        env.insert(EDGE_OTLP_ENDPOINT, bad);
        assert!(matches!(parse(&env), Err(EnvError::Invalid { var: EDGE_OTLP_ENDPOINT, .. })), "{bad}");
    }
}

/// Issue 41 item 5: the chart's admin Service names reach the Edge
/// config's `listen.admin_hosts`; unset is none; a name that is not one is
/// refused naming the variable.
#[test]
fn admin_hosts_setting() {
    let mut env = chart_env();
    assert!(parse(&env).unwrap().settings().listen.admin_hosts.is_empty());
    env.insert(EDGE_ADMIN_HOSTS, "iop-edge-admin, iop-edge-admin.iop.svc,*.iop-edge-replicas.iop.svc,");
    let listen = parse(&env).unwrap().settings().listen;
    assert_eq!(listen.admin_hosts, ["iop-edge-admin", "iop-edge-admin.iop.svc", "*.iop-edge-replicas.iop.svc"]);
    for bad in ["Admin", "admin:8081", "*", "a b"] {
        env.insert(EDGE_ADMIN_HOSTS, bad);
        assert!(matches!(parse(&env), Err(EnvError::Invalid { var: EDGE_ADMIN_HOSTS, .. })), "{bad}");
    }
}

/// Issue 41 item 1: the chart's `edge.limits` reach the Edge config's
/// `limits`; unset keeps the Edge's defaults; a value the Edge would refuse
/// names its variable.
#[test]
fn connection_and_body_limits_setting() {
    let mut env = chart_env();
    assert_eq!(parse(&env).unwrap().settings().limits, Limits::default());
    env.insert("IOP_EDGE_MAX_HTTP_CONNECTIONS", "100");
    env.insert("IOP_EDGE_MIN_BODY_BYTES_PER_S", "0");
    env.insert("IOP_EDGE_MAX_BODY_BYTES_IN_FLIGHT", " 8388608 ");
    let limits = parse(&env).unwrap().settings().limits;
    assert_eq!((limits.max_http_connections, limits.min_body_bytes_per_s), (100, 0));
    assert_eq!(limits.max_body_bytes_in_flight, 8 << 20);
    assert_eq!(limits.http_header_timeout_ms, Limits::default().http_header_timeout_ms);
    for (var, bad) in [
        ("IOP_EDGE_MAX_HTTP_CONNECTIONS", "0"),
        ("IOP_EDGE_HTTP_HEADER_TIMEOUT_MS", "10"),
        ("IOP_EDGE_MAX_BODY_BYTES_IN_FLIGHT", "1024"),
        ("IOP_EDGE_HTTP_IDLE_TIMEOUT_MS", "soon"),
    ] {
        let mut env = env.clone();
        env.insert(var, bad);
        assert!(matches!(parse(&env), Err(EnvError::Invalid { var: v, .. }) if v == var), "{var}={bad}");
    }
}

/// Issue 28 item 6: the chart's `edge.outlier` reaches the Edge config;
/// unset keeps the Edge's defaults; out of range names the variable.
#[test]
fn outlier_ejection_settings() {
    let mut env = chart_env();
    assert_eq!(parse(&env).unwrap().settings().empty_config().outlier, OutlierConfig::default());
    env.insert(EDGE_OUTLIER_CONSECUTIVE_FAILURES, "0");
    env.insert(EDGE_OUTLIER_BASE_EJECTION_MS, "1000");
    env.insert(EDGE_OUTLIER_MAX_EJECTION_MS, "8000");
    let outlier = parse(&env).unwrap().settings().empty_config().outlier;
    assert_eq!((outlier.consecutive_failures, outlier.base_ejection_ms, outlier.max_ejection_ms), (0, 1000, 8000));
    env.insert(EDGE_OUTLIER_MAX_EJECTION_MS, "999");
    assert!(matches!(parse(&env), Err(EnvError::Invalid { var: EDGE_OUTLIER_MAX_EJECTION_MS, .. })));
    env.insert(EDGE_OUTLIER_MAX_EJECTION_MS, "8000");
    env.insert(EDGE_OUTLIER_CONSECUTIVE_FAILURES, "five");
    assert!(matches!(parse(&env), Err(EnvError::Invalid { var: EDGE_OUTLIER_CONSECUTIVE_FAILURES, .. })));
}

#[test]
fn hosted_tools_are_dropped_unless_refused() {
    let mut env = chart_env();
    assert_eq!(parse(&env).unwrap().settings().api.hosted_tools, HostedTools::Drop);
    env.insert(EDGE_HOSTED_TOOLS, "refuse");
    assert_eq!(parse(&env).unwrap().settings().api.hosted_tools, HostedTools::Refuse);
    env.insert(EDGE_HOSTED_TOOLS, "ignore");
    assert!(matches!(parse(&env), Err(EnvError::Invalid { var: EDGE_HOSTED_TOOLS, .. })));
}

#[test]
fn every_missing_variable_is_named() {
    for var in [NAMESPACE, POD_NAME, EDGE_POD_SELECTOR, EDGE_SERVER_NAMES, TRUST_DOMAIN] {
        let mut env = chart_env();
        env.remove(var);
        assert_eq!(parse(&env), Err(EnvError::Missing { var }));
        env.insert(var, "  ");
        assert_eq!(parse(&env), Err(EnvError::Missing { var }), "blank counts as missing");
        assert!(EnvError::Missing { var }.to_string().starts_with(var));
    }
}

#[test]
fn invalid_values_name_the_variable() {
    let cases = [
        (NAMESPACE, "Not_A_Namespace"),
        (EDGE_POD_SELECTOR, "app.kubernetes.io/component"),
        (EDGE_POD_SELECTOR, "app in (edge)"),
        (EDGE_POD_SELECTOR, "app!=edge"),
        (EDGE_POD_SELECTOR, "app==edge"),
        (EDGE_POD_SELECTOR, "app=edge,"),
        (EDGE_POD_SELECTOR, "=edge"),
        (EDGE_POD_SELECTOR, "/app=edge"),
        (EDGE_SERVER_NAMES, ",,"),
        (EDGE_SERVER_NAMES, "iop-edge,bad name"),
        (TRUST_DOMAIN, "IOP.Example"),
        // The Edge config refuses `_`, so the operator does too.
        (TRUST_DOMAIN, "iop_local"),
    ];
    for (var, value) in cases {
        let mut env = chart_env();
        env.insert(var, value);
        match parse(&env) {
            Err(e @ EnvError::Invalid { var: named, .. }) => {
                assert_eq!(named, var, "{value}");
                assert!(e.to_string().starts_with(&format!("{var}=`")), "{e}");
            }
            other => panic!("{var}={value}: {other:?}"),
        }
    }
}

#[test]
fn the_pod_selector_takes_equality_terms() {
    let mut env = chart_env();
    for ok in ["app=edge", "app.kubernetes.io/component=edge", "a=b,c=d", "example.com/tier=", "k_1=v.2-x"] {
        env.insert(EDGE_POD_SELECTOR, ok);
        assert_eq!(parse(&env).unwrap().edge_pod_selector, ok);
    }
}

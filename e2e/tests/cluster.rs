//! The operator on a real Kubernetes API server (issue 26): etcd,
//! kube-apiserver v1.36 (RBAC, audit log) and kube-controller-manager
//! started by `../shared/k8s/control-plane` ([`iop_e2e::cluster`]), the
//! CRDs of `crds/` applied as a user applies them, the chart's RBAC
//! rendered by `helm template`, and `iop-operator run` as a real process
//! with its ServiceAccount's token (never as admin).
//!
//! One test runs the steps in sequence against one control plane (starting
//! one takes about 10 s; nextest runs each test in a process of its own, so
//! one test per file keeps that cost to one start). Each step works in a
//! namespace of its own.
//!
//! Reported as skipped without the control-plane script, kubectl, helm or
//! haproxy (`iop_e2e::parts`; `IOP_REQUIRE_ALL=1` makes that a failure).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use iop_e2e::cluster::{self, AuditEvent, ControlPlane, Namespace, Spawned, wait_until};
use iop_e2e::harness::bin;
use iop_e2e::parts::{self, Part};
use serde_json::{Value, json};

#[path = "cluster/ca_rotation.rs"]
mod ca_rotation;

const WAIT: Duration = Duration::from_secs(30);

/// One step of the suite: its name and what it runs.
type Step = (&'static str, fn(&ControlPlane));

#[test]
#[cfg_attr(
    any(iop_absent_kubernetes, iop_absent_haproxy),
    ignore = "needs a Kubernetes control plane and haproxy: scripts/test-deps --kubernetes --haproxy"
)]
fn operator_on_a_real_api_server() {
    let tools = Part::Kubernetes.require(parts::kubernetes());
    let started = Instant::now();
    let plane = ControlPlane::start(tools).unwrap_or_else(|e| panic!("{e}"));
    plane.apply_crds();
    eprintln!("control plane up, CRDs established in {:.1} s", started.elapsed().as_secs_f64());

    // Each step, in sequence on the one control plane, timed.
    let steps: [Step; 8] = [
        ("CRD validation", crds_refuse_the_documented_invalid_objects),
        ("operator steps", operator_reconciles_as_its_service_account),
        ("own CA", a_short_lived_ca_of_ones_own),
        ("certificate renewal", a_node_certificate_renewed_in_its_window),
        ("Edge replicas and node", edges_and_a_node_fed_from_the_cluster),
        ("CA rotation", ca_rotation::a_ca_rotation_cuts_no_node_off),
        ("namespace deletion", deleting_the_namespace_completes),
        ("refused chart values", helm_install_refuses_what_the_operator_would),
    ];
    for (what, step) in steps {
        let at = Instant::now();
        step(&plane);
        eprintln!("{what}: {:.1} s", at.elapsed().as_secs_f64());
    }
    eprintln!("cluster suite: {:.1} s in all", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------
// CRD validation: every invalid example of docs/crds.md, refused by the real
// API server with the message the doc gives.

fn provider() -> Value {
    json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "Provider",
        "metadata": { "name": "valid" },
        "spec": {
            "node": "mac-1", "adapter": "openai",
            "target": { "model": "qwen2.5-7b-instruct", "baseUrl": "http://127.0.0.1:1234" },
            "models": [ { "name": "qwen2.5" } ],
        },
    })
}

fn node_catalog() -> Value {
    json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "NodeCatalog",
        "metadata": { "name": "valid" },
        "spec": {
            "certificate": { "validityHours": 720, "renewBeforeHours": 240 },
            "workspaces": [ { "ref": "website", "rootPath": "/Users/dev/src/website", "template": "repo-tools" } ],
        },
    })
}

fn workspace_template() -> Value {
    json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "WorkspaceTemplate",
        "metadata": { "name": "valid" },
        "spec": { "operations": ["read", "command"], "commands": [ { "id": "test", "argv": ["make", "test"] } ] },
    })
}

/// `base` with the JSON pointer `at` set to `value` (`null` removes it).
fn with(mut base: Value, at: &str, value: Value) -> Value {
    let (parent, key) = at.rsplit_once('/').expect("a pointer");
    let parent = base.pointer_mut(parent).expect("the pointer's parent exists");
    match (parent, value) {
        (Value::Object(map), Value::Null) => {
            map.remove(key);
        }
        (Value::Object(map), value) => {
            map.insert(key.to_string(), value);
        }
        (Value::Array(items), value) => items[key.parse::<usize>().expect("an index")] = value,
        (other, _) => panic!("{at}: not a container: {other}"),
    }
    base
}

/// One invalid example: the object, and what the API server must say
/// (the field and the message of docs/crds.md).
struct Invalid {
    what: &'static str,
    object: Value,
    field: &'static str,
    message: &'static str,
}

/// The messages of the CRDs' CEL rules, as docs/crds.md gives them.
const BASE_URL_MESSAGE: &str = "must be http(s)://host[:port][/path]: a DNS name, an IPv4 address or a [bracketed] IPv6 \
                                address, a port of 1-65535, no user:password@, query (?) or fragment (#), no spaces or \
                                control characters";
const MODEL_MESSAGE: &str =
    "must be 1-256 characters without control characters, not starting or ending with whitespace";
const NAME_TOO_LONG: &str = "Too long: may not be more than 63 bytes";

/// docs/crds.md, section by section. Where the doc gives a CEL message, that
/// message; where it gives a range or pattern, the API server's own
/// message for it (the doc says which it is: "Notation").
fn invalid_examples() -> Vec<Invalid> {
    let long = "a".repeat(64);
    let url = |u: &str| with(provider(), "/spec/target/baseUrl", json!(u));
    vec![
        // Provider `metadata.name`: at most 63 characters.
        Invalid {
            what: "a 64-character Provider name",
            object: with(provider(), "/metadata/name", json!(long)),
            field: "metadata.name",
            message: NAME_TOO_LONG,
        },
        // `target.model`: no whitespace at either end.
        Invalid {
            what: "a model name with a leading space",
            object: with(provider(), "/spec/target/model", json!(" qwen")),
            field: "spec.target.model",
            message: MODEL_MESSAGE,
        },
        Invalid {
            what: "a model name with a control character",
            object: with(provider(), "/spec/target/model", json!("qw\u{7}en")),
            field: "spec.target.model",
            message: MODEL_MESSAGE,
        },
        // `target.baseUrl`: the examples the doc names (issue 25 item 10's
        // `http://999.999.999.999:1` among them), and each forbidden part.
        Invalid {
            what: "an IPv4 address out of range",
            object: url("http://999.999.999.999:1"),
            field: "spec.target.baseUrl",
            message: BASE_URL_MESSAGE,
        },
        // Issue 43 item 6: the node adds `/v1` itself.
        Invalid {
            what: "a base URL ending in /v1",
            object: url("http://127.0.0.1:1234/v1"),
            field: "spec.target.baseUrl",
            message: "must not end in /v1",
        },
        Invalid {
            what: "a base URL ending in /v1/",
            object: url("http://lmstudio.local:1234/v1/"),
            field: "spec.target.baseUrl",
            message: "must not end in /v1",
        },
        Invalid {
            what: "a URL without a host",
            object: url("http://:11434"),
            field: "spec.target.baseUrl",
            message: BASE_URL_MESSAGE,
        },
        Invalid {
            what: "a port above 65535",
            object: url("http://host:99999"),
            field: "spec.target.baseUrl",
            message: BASE_URL_MESSAGE,
        },
        Invalid {
            what: "credentials in the URL",
            object: url("http://user:pass@host:1234"),
            field: "spec.target.baseUrl",
            message: BASE_URL_MESSAGE,
        },
        Invalid {
            what: "a query",
            object: url("http://host:1234/?key=1"),
            field: "spec.target.baseUrl",
            message: BASE_URL_MESSAGE,
        },
        Invalid {
            what: "a fragment",
            object: url("http://host:1234/#x"),
            field: "spec.target.baseUrl",
            message: BASE_URL_MESSAGE,
        },
        Invalid {
            what: "an IPv4 address with a leading zero",
            object: url("http://127.0.0.01:1234"),
            field: "spec.target.baseUrl",
            message: BASE_URL_MESSAGE,
        },
        Invalid {
            what: "a scheme other than http(s)",
            object: url("ftp://host:21"),
            field: "spec.target.baseUrl",
            message: BASE_URL_MESSAGE,
        },
        // `responseStallTimeoutMs`: 0 or 1000-3600000.
        Invalid {
            what: "a stall timeout of 500 ms",
            object: with(provider(), "/spec/responseStallTimeoutMs", json!(500)),
            field: "spec.responseStallTimeoutMs",
            message: "must be 0 (default) or between 1000 and 3600000",
        },
        // `credentialSecretRef` only with `openai`.
        Invalid {
            what: "a credentialSecretRef on an ollama Provider",
            object: with(
                with(provider(), "/spec/adapter", json!("ollama")),
                "/spec/credentialSecretRef",
                json!({ "name": "keys", "key": "api-key" }),
            ),
            field: "spec.credentialSecretRef",
            message: "credentialSecretRef applies only to the openai adapter (ollama takes no API key)",
        },
        // `keepWarm` only with `ollama` (the base is `openai`).
        Invalid {
            what: "keepWarm on an openai Provider",
            object: with(provider(), "/spec/keepWarm", json!(true)),
            field: "spec.keepWarm",
            message: "keepWarm applies only to the ollama adapter (Ollama's keep_alive)",
        },
        // `models[].contextFallback`: never the model itself.
        Invalid {
            what: "a model falling back to itself",
            object: with(provider(), "/spec/models", json!([ { "name": "qwen2.5", "contextFallback": "qwen2.5" } ])),
            field: "spec.models[0].contextFallback",
            message: "a model cannot fall back to itself",
        },
        // Ranges, patterns and list rules: the API server's own messages.
        Invalid {
            what: "capacity 0",
            object: with(provider(), "/spec/capacity", json!(0)),
            field: "spec.capacity",
            message: "should be greater than or equal to 1",
        },
        Invalid {
            what: "capacity 1025",
            object: with(provider(), "/spec/capacity", json!(1025)),
            field: "spec.capacity",
            message: "should be less than or equal to 1024",
        },
        Invalid {
            what: "no models",
            object: with(provider(), "/spec/models", json!([])),
            field: "spec.models",
            message: "should have at least 1 items",
        },
        Invalid {
            what: "a public model listed twice",
            object: with(provider(), "/spec/models", json!([ { "name": "a" }, { "name": "a", "priority": 1 } ])),
            field: "spec.models[1]",
            message: "Duplicate value",
        },
        Invalid {
            what: "a public model name with a space",
            object: with(provider(), "/spec/models", json!([ { "name": "qwen 2.5" } ])),
            field: "spec.models[0].name",
            message: "should match",
        },
        Invalid {
            what: "priority 1001",
            object: with(provider(), "/spec/models", json!([ { "name": "a", "priority": 1001 } ])),
            field: "spec.models[0].priority",
            message: "should be less than or equal to 1000",
        },
        Invalid {
            what: "an unknown mode",
            object: with(provider(), "/spec/mode", json!("passthrough")),
            field: "spec.mode",
            message: "Unsupported value",
        },
        Invalid {
            what: "an unknown adapter",
            object: with(provider(), "/spec/adapter", json!("vllm")),
            field: "spec.adapter",
            message: "Unsupported value",
        },
        Invalid {
            what: "a node name with upper case",
            object: with(provider(), "/spec/node", json!("Mac-1")),
            field: "spec.node",
            message: "should match",
        },
        Invalid {
            what: "a queue timeout of 0",
            object: with(provider(), "/spec/queue", json!({ "timeoutMs": 0 })),
            field: "spec.queue.timeoutMs",
            message: "should be greater than or equal to 1",
        },
        // NodeCatalog `metadata.name`: a DNS label, 1-63 characters.
        Invalid {
            what: "a NodeCatalog name with a dot",
            object: with(node_catalog(), "/metadata/name", json!("mac.one")),
            field: "metadata.name",
            message: "the name is the node identity: 1-63 of a-z, 0-9 and '-', starting and ending with a letter or digit",
        },
        Invalid {
            what: "a 64-character NodeCatalog name",
            object: with(node_catalog(), "/metadata/name", json!(long)),
            field: "metadata.name",
            message: NAME_TOO_LONG,
        },
        // `certificate`: renewBeforeHours < validityHours.
        Invalid {
            what: "renewal window as long as the validity",
            object: with(node_catalog(), "/spec/certificate", json!({ "validityHours": 24, "renewBeforeHours": 24 })),
            field: "spec.certificate.renewBeforeHours",
            message: "renewBeforeHours must be less than validityHours",
        },
        // Issue 43 item 6: at least one hour (a reconcile interval).
        Invalid {
            what: "no renewal window",
            object: with(node_catalog(), "/spec/certificate", json!({ "validityHours": 24, "renewBeforeHours": 0 })),
            field: "spec.certificate.renewBeforeHours",
            message: "should be greater than or equal to 1",
        },
        Invalid {
            what: "a validity of 8761 hours",
            object: with(node_catalog(), "/spec/certificate", json!({ "validityHours": 8761, "renewBeforeHours": 1 })),
            field: "spec.certificate.validityHours",
            message: "should be less than or equal to 8760",
        },
        // `workspaces[].rootPath`: absolute, not `/` itself.
        Invalid {
            what: "the root directory as a workspace",
            object: with(node_catalog(), "/spec/workspaces/0/rootPath", json!("/")),
            field: "spec.workspaces[0].rootPath",
            message: "should be at least 2 chars long",
        },
        Invalid {
            what: "a relative workspace root",
            object: with(node_catalog(), "/spec/workspaces/0/rootPath", json!("src/website")),
            field: "spec.workspaces[0].rootPath",
            message: "should match",
        },
        // WorkspaceTemplate: commands exactly with the `command` operation.
        Invalid {
            what: "commands without the command operation",
            object: with(workspace_template(), "/spec/operations", json!(["read"])),
            field: "spec.commands",
            message: "commands are required with the command operation and allowed only with it",
        },
        Invalid {
            what: "the command operation without commands",
            object: with(workspace_template(), "/spec/commands", Value::Null),
            field: "spec.commands",
            message: "commands are required with the command operation and allowed only with it",
        },
        Invalid {
            what: "an unknown operation",
            object: with(workspace_template(), "/spec/operations", json!(["read", "exec"])),
            field: "spec.operations[1]",
            message: "Unsupported value",
        },
    ]
}

fn crds_refuse_the_documented_invalid_objects(plane: &ControlPlane) {
    let ns = "validation";
    plane.kubectl(&["create", "namespace", ns]);
    let apply = |object: &Value| {
        plane.kubectl_output(
            &plane.kubeconfig,
            &["apply", "--dry-run=server", "-n", ns, "-f", "-"],
            Some(&object.to_string()),
        )
    };
    // The bases are valid: each refusal below is the one change's.
    for base in [provider(), node_catalog(), workspace_template()] {
        let output = apply(&base);
        assert!(output.status.success(), "{base} refused: {}", String::from_utf8_lossy(&output.stderr));
    }
    let mut wrong = Vec::new();
    for case in invalid_examples() {
        let output = apply(&case.object);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said = stderr.lines().any(|l| l.contains(&format!("{}:", case.field)) && l.contains(case.message));
        if output.status.success() || !said {
            wrong.push(format!(
                "{}: expected `{}: ... {}`, got {}: {}",
                case.what,
                case.field,
                case.message,
                if output.status.success() { "accepted" } else { "refused" },
                stderr.trim()
            ));
        }
    }
    assert!(wrong.is_empty(), "the API server and docs/crds.md disagree:\n{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------
// The operator, as its ServiceAccount.

/// `GET path` on a plain HTTP listener, the body ("" when unreachable).
fn http_get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else { return String::new() };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// A sample's value in Prometheus text, 0 when absent.
fn sample(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

/// `iop-operator run` as the chart runs it: the environment of the chart's
/// Deployment (literal values), the namespace and pod name its fieldRefs
/// give, and the ServiceAccount's kubeconfig.
struct Operator {
    process: Spawned,
    metrics: SocketAddr,
}

impl Operator {
    /// Starts one and waits until it leads.
    fn start(plane: &ControlPlane, ns: &Namespace, pod: &str) -> Self {
        Self::start_until(plane, ns, pod, "leading: reconciling")
    }

    /// Starts one and returns once it logged `marker`.
    fn start_until(plane: &ControlPlane, ns: &Namespace, pod: &str, marker: &str) -> Self {
        Self::start_with(plane, ns, pod, marker, &[])
    }

    /// Starts one with `env` added and returns once it logged `marker`.
    fn start_with(plane: &ControlPlane, ns: &Namespace, pod: &str, marker: &str, env: &[(&str, &str)]) -> Self {
        let rendered = plane.helm_template(&ns.name, &["--show-only", "templates/operator-deployment.yaml"]);
        let deployment: Value = serde_saphyr::from_str(&rendered).expect("the operator Deployment renders");
        let metrics = iop_e2e::harness::free_port();
        let mut command = Command::new(bin("iop-operator"));
        command.arg("run").env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"].as_array().expect("env") {
            if let (Some(name), Some(value)) = (var["name"].as_str(), var["value"].as_str()) {
                command.env(name, value);
            }
        }
        command
            .env("IOP_NAMESPACE", &ns.name)
            .env("IOP_POD_NAME", pod)
            .env("IOP_METRICS_ADDR", metrics.to_string())
            .env("RUST_LOG", "info,iop_operator=debug")
            .env("KUBECONFIG", &ns.operator_kubeconfig)
            .envs(env.iter().copied());
        let log = plane.dir.path().join(format!("{}-{pod}.log", ns.name));
        let mut process = Spawned::spawn(command, log);
        process.wait_for_log(marker, WAIT);
        Self { process, metrics }
    }

    fn metric(&self, name: &str) -> f64 {
        sample(&http_get(self.metrics, "/metrics"), name)
    }

    /// Waits until `n` reconciles have succeeded.
    fn wait_reconciled(&self, n: f64) {
        wait_until(&format!("{n} successful reconciles"), WAIT, || {
            self.metric("iop_operator_reconciles_total{result=\"ok\"}") >= n
        });
    }
}

/// The rendered Edge config in the ConfigMap, as YAML values.
fn edge_config(plane: &ControlPlane, ns: &str) -> Option<Value> {
    let text = edge_config_text(plane, ns)?;
    let text = text.as_str();
    // It is what the Edge loads.
    iop_proto::config::EdgeConfig::from_yaml(text).expect("the Edge accepts the rendered config");
    Some(serde_saphyr::from_str(text).expect("YAML"))
}

/// Key `edge.yaml` of the ConfigMap, as it is.
fn edge_config_text(plane: &ControlPlane, ns: &str) -> Option<String> {
    let cm = plane.get_json(&["-n", ns, "configmap", "iop-edge-config"])?;
    Some(cm["data"]["edge.yaml"].as_str().expect("key edge.yaml").to_string())
}

fn names(list: &Value) -> Vec<String> {
    list.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect()
}

fn condition(object: &Value, kind: &str) -> (String, String) {
    let found = object["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == kind);
    match found {
        Some(c) => (c["status"].as_str().unwrap_or("").to_string(), c["reason"].as_str().unwrap_or("").to_string()),
        None => (String::new(), String::new()),
    }
}

/// `name -> resourceVersion` of every object the operator reads or writes
/// in `ns` (the leader Lease aside: renewing it is the election).
fn resource_versions(plane: &ControlPlane, ns: &str) -> BTreeMap<String, String> {
    let list =
        plane.get_json(&["-n", ns, "configmaps,secrets,providers,nodecatalogs,workspacetemplates"]).expect("a list");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| {
            (
                format!("{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()),
                o["metadata"]["resourceVersion"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn operator_reconciles_as_its_service_account(plane: &ControlPlane) {
    let ns = plane.namespace("iop");
    let user = format!("system:serviceaccount:{}:{}", ns.name, cluster::OPERATOR_SERVICE_ACCOUNT);
    let examples = cluster::repo_root().join("examples/k8s");
    plane.kubectl(&["apply", "-n", &ns.name, "-f", examples.to_str().unwrap()]);

    // The operator's identity is the ServiceAccount's, never admin.
    let whoami = plane.kubectl_output(&ns.operator_kubeconfig, &["auth", "whoami", "-o", "json"], None);
    let whoami: Value = serde_json::from_slice(&whoami.stdout).expect("kubectl auth whoami");
    assert_eq!(whoami["status"]["userInfo"]["username"], user.as_str());
    let admin = plane.kubectl_output(&ns.operator_kubeconfig, &["auth", "can-i", "create", "clusterroles"], None);
    assert!(!admin.status.success(), "the operator's token must not be an admin's");

    let operator = Operator::start(plane, &ns, "iop-operator-a");

    // Provider + NodeCatalog + WorkspaceTemplate -> ConfigMap and Secrets.
    wait_until("the Edge config with the node and both providers", WAIT, || {
        edge_config(plane, &ns.name).is_some_and(|c| {
            let ids: Vec<_> = c["providers"].as_array().into_iter().flatten().map(|p| p["id"].clone()).collect();
            c["nodes"][0]["name"] == "studio-mac"
                && ids == [json!("studio-llama"), json!("studio-qwen-tunnel")]
                && c["workspaces"][0]["ref"] == "website"
        })
    });
    for secret in ["iop-ca", "iop-edge-tls", "iop-node-studio-mac", "iop-edge-credentials"] {
        wait_until(&format!("Secret {secret}"), WAIT, || plane.get_json(&["-n", &ns.name, "secret", secret]).is_some());
    }
    let node_secret = plane.get_json(&["-n", &ns.name, "secret", "iop-node-studio-mac"]).unwrap();
    for key in ["ca.pem", "node.pem", "node-key.pem"] {
        assert!(node_secret["data"][key].is_string(), "iop-node-studio-mac has {key}");
    }
    wait_until("every object Ready", WAIT, || {
        [
            "provider/studio-llama",
            "provider/studio-qwen-tunnel",
            "nodecatalog/studio-mac",
            "workspacetemplate/repo-tools",
        ]
        .iter()
        .all(|o| plane.get_json(&["-n", &ns.name, o]).is_some_and(|o| condition(&o, "Ready").0 == "True"))
    });
    let node = plane.get_json(&["-n", &ns.name, "nodecatalog", "studio-mac"]).unwrap();
    assert_eq!(names(&node["metadata"]["finalizers"]), ["iop.dev/node-identity"]);
    assert!(node["status"]["certificate"]["notAfter"].is_string(), "CERT-EXPIRY is set: {node}");

    // A deleted ConfigMap or node Secret is restored within seconds (issue 25
    // item 10, on the real server: the metadata watches by name and label).
    for (kind, name) in
        [("configmap", "iop-edge-config"), ("secret", "iop-node-studio-mac"), ("secret", "iop-edge-tls")]
    {
        let before = plane.get_json(&["-n", &ns.name, kind, name]).unwrap()["metadata"]["uid"].clone();
        let deleted = Instant::now();
        plane.kubectl(&["-n", &ns.name, "delete", kind, name, "--wait=true"]);
        wait_until(&format!("{kind} {name} restored"), Duration::from_secs(10), || {
            plane.get_json(&["-n", &ns.name, kind, name]).is_some_and(|o| o["metadata"]["uid"] != before)
        });
        eprintln!("{kind} {name} restored {:.2} s after its deletion", deleted.elapsed().as_secs_f64());
    }
    // An edit of the config is overwritten.
    plane.kubectl(&[
        "-n",
        &ns.name,
        "patch",
        "configmap",
        "iop-edge-config",
        "--type=merge",
        "-p",
        r#"{"data":{"edge.yaml":"edited: true\n"}}"#,
    ]);
    wait_until("the edited config overwritten", Duration::from_secs(10), || {
        edge_config_text(plane, &ns.name).is_some_and(|text| !text.contains("edited"))
    });
    edge_config(plane, &ns.name).expect("the config");

    // A key someone else adds to the credentials Secret is kept, and is no
    // reason to write at every reconcile (issue 43 item 6): the restart below
    // sends no write with it there.
    plane.kubectl(&[
        "-n",
        &ns.name,
        "patch",
        "secret",
        "iop-edge-credentials",
        "-p",
        r#"{"stringData":{"note":"kept"}}"#,
    ]);
    // A restart of the operator writes nothing: every object keeps its
    // resourceVersion, and the new process sends no write request but its
    // Lease's.
    operator.wait_reconciled(1.0);
    assert!(operator.process.terminate().success(), "the operator exits cleanly on SIGTERM");
    let versions = resource_versions(plane, &ns.name);
    let mark = plane.audit().len();
    let operator = Operator::start(plane, &ns, "iop-operator-b");
    // Its first reconcile has run (and, with no Edge pod, the status mirror
    // has nothing to write).
    operator.wait_reconciled(1.0);
    assert_eq!(resource_versions(plane, &ns.name), versions, "an operator restart changed objects");
    assert_eq!(secret_value(plane, &ns.name, "iop-edge-credentials", "note"), b"kept");
    let writes: Vec<AuditEvent> = plane.audit()[mark..]
        .iter()
        .filter(|e| e.user == user && e.is_write() && e.resource != "leases")
        .cloned()
        .collect();
    // Not even a server-side apply that would change nothing: the
    // operator compares with what it watches first.
    assert!(
        writes.is_empty(),
        "the restarted operator sent write requests: {:?}",
        writes.iter().map(|e| format!("{} {}/{}", e.verb, e.resource, e.name)).collect::<Vec<_>>()
    );

    // Leader failover: a second replica waits on the Lease while the first
    // leads; when the leader stops (SIGTERM releases the Lease) it takes
    // over and acts (a deleted ConfigMap is restored by it).
    let standby = Operator::start_until(plane, &ns, "iop-operator-c", "CRDs established");
    let holder = || {
        plane.get_json(&["-n", &ns.name, "lease", "iop-operator-leader"]).expect("the Lease")["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(holder(), "iop-operator-b");
    assert!(!standby.process.log_text().contains("leading:"), "two leaders");
    assert!(operator.process.terminate().success());
    let mut operator = standby;
    operator.process.wait_for_log("leading: reconciling", WAIT);
    assert_eq!(holder(), "iop-operator-c");
    plane.kubectl(&["-n", &ns.name, "delete", "configmap", "iop-edge-config"]);
    wait_until("the new leader restores the ConfigMap", Duration::from_secs(10), || {
        edge_config(plane, &ns.name).is_some()
    });
    // A leader that dies without releasing (SIGKILL) is replaced once its
    // Lease has gone unrenewed for the lease duration (15 s) by the standby's
    // own clock.
    let standby = Operator::start_until(plane, &ns, "iop-operator-d", "CRDs established");
    let killed = Instant::now();
    let mut crashed = operator;
    crashed.process.child.kill().unwrap();
    crashed.process.child.wait().unwrap();
    let mut operator = standby;
    wait_until("the standby leading after the crash", Duration::from_secs(40), || holder() == "iop-operator-d");
    operator.process.wait_for_log("leading: reconciling", WAIT);
    eprintln!("leader crash: the standby leads {:.1} s after", killed.elapsed().as_secs_f64());
    operator.wait_reconciled(1.0);
    drop(crashed);

    // Finalizers released on delete: the NodeCatalog goes once its node is out
    // of the applied config; its Provider reports NodeNotFound; the garbage
    // collector removes its Secret (owner reference).
    plane.kubectl(&["-n", &ns.name, "delete", "nodecatalog", "studio-mac", "--wait=false"]);
    wait_until("the NodeCatalog deleted (finalizer released)", WAIT, || {
        plane.get_json(&["-n", &ns.name, "nodecatalog", "studio-mac"]).is_none()
    });
    let config = edge_config(plane, &ns.name).expect("the config");
    assert!(config["nodes"].as_array().is_none_or(|n| n.is_empty()), "node left the config: {config}");
    wait_until("the Provider NodeNotFound", WAIT, || {
        plane
            .get_json(&["-n", &ns.name, "provider", "studio-llama"])
            .is_some_and(|p| condition(&p, "Ready") == ("False".into(), "NodeNotFound".into()))
    });
    wait_until("the node Secret garbage-collected", WAIT, || {
        plane.get_json(&["-n", &ns.name, "secret", "iop-node-studio-mac"]).is_none()
    });

    // Every right the chart's Role grants is used, or named here with why it
    // is kept.
    let failures = forbidden(&plane.audit(), &user);
    assert!(failures.is_empty(), "requests the chart's RBAC refused: {failures:#?}");
    rights_used_or_explained(&ns, &plane.audit(), &user);
    drop(operator);
}

/// Requests of `user` that RBAC refused (403).
fn forbidden(audit: &[AuditEvent], user: &str) -> Vec<String> {
    audit
        .iter()
        .filter(|e| e.user == user && e.code == 403)
        .map(|e| format!("{} {}/{} {}", e.verb, e.resource, e.name, e.user_agent))
        .collect()
}

/// Rights the chart grants that this test does not exercise, and why each
/// is kept. Everything else granted must appear in the audit log.
const KEPT_UNUSED: &[(&str, &str, &str, &str)] = &[];

fn rights_used_or_explained(ns: &Namespace, audit: &[AuditEvent], user: &str) {
    let granted = cluster::granted_rights(&ns.rbac);
    let mut used: BTreeSet<(String, String, String)> = BTreeSet::new();
    // The operator's own requests (the test's `kubectl auth` checks with the
    // same token are not the operator's).
    let operator = audit.iter().filter(|e| e.user == user && e.user_agent.starts_with("iop-operator/"));
    for e in operator.filter(|e| e.code < 400) {
        used.insert((e.api_group.clone(), e.resource.clone(), e.verb.clone()));
        // A server-side apply that creates the object is authorized as
        // `create` too (and audited as `patch`, answered 201).
        if e.verb == "patch" && e.code == 201 {
            used.insert((e.api_group.clone(), e.resource.clone(), "create".into()));
        }
    }
    let kept: BTreeSet<(String, String, String)> =
        KEPT_UNUSED.iter().map(|(g, r, v, _)| (g.to_string(), r.to_string(), v.to_string())).collect();
    let unused: Vec<_> = granted.iter().filter(|r| !used.contains(*r) && !kept.contains(*r)).collect();
    assert!(unused.is_empty(), "rights the chart grants that the operator never used: {unused:?}\nused: {used:?}");
    let beyond: Vec<_> = used.iter().filter(|r| !granted.contains(*r)).collect();
    eprintln!(
        "rights used: {} of {} granted; used beyond the Role (system roles): {beyond:?}",
        used.len(),
        granted.len()
    );
}

// ---------------------------------------------------------------------------
// A CA of one's own (docs/kubernetes.md "Your own CA") that expires in 20
// days: a clock-dependent case without waiting, since the CA's own dates
// put it inside the renewal window now.

fn a_short_lived_ca_of_ones_own(plane: &ControlPlane) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ns = plane.namespace("own-ca");
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let not_after = now + time::Duration::days(20);
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "test CA, 20 days");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = now - time::Duration::hours(1);
    params.not_after = not_after;
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let dir = plane.dir.path().join("own-ca");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("ca-key.pem"), key.serialize_pem()).unwrap();
    // As the doc says: a kubernetes.io/tls Secret, before the operator runs.
    plane.kubectl(&[
        "-n",
        &ns.name,
        "create",
        "secret",
        "tls",
        "iop-ca",
        &format!("--cert={}", dir.join("ca.pem").display()),
        &format!("--key={}", dir.join("ca-key.pem").display()),
    ]);
    let version = |plane: &ControlPlane| {
        plane.get_json(&["-n", &ns.name, "secret", "iop-ca"]).unwrap()["metadata"]["resourceVersion"].clone()
    };
    let created = version(plane);
    let node =
        json!({ "apiVersion": "iop.dev/v1alpha1", "kind": "NodeCatalog", "metadata": { "name": "mac-2" }, "spec": {} });
    plane.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], &node.to_string());
    let _operator = Operator::start(plane, &ns, "iop-operator-a");
    let ca_end = not_after.format(&time::format_description::well_known::Rfc3339).unwrap();
    wait_until("CAExpiring True and the node certificate ending with the CA", WAIT, || {
        plane.get_json(&["-n", &ns.name, "nodecatalog", "mac-2"]).is_some_and(|n| {
            condition(&n, "CAExpiring") == ("True".into(), "WithinRenewalWindow".into())
                && n["status"]["certificate"]["notAfter"] == ca_end.as_str()
        })
    });
    // The operator never touches a CA it did not make.
    assert_eq!(version(plane), created, "iop-ca was written");
}

/// A node certificate of 48 hours, renewed 24 hours before it ends: the
/// operator restarted with its clock 25 hours ahead (`IOP_TEST_CLOCK_OFFSET_S`)
/// issues a new one into the Secret; the Edge certificate (90 days, renewed
/// 30 days before) is left as it is.
fn a_node_certificate_renewed_in_its_window(plane: &ControlPlane) {
    let ns = plane.namespace("renewal");
    let node = json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "NodeCatalog", "metadata": { "name": "mac-3" },
        "spec": { "certificate": { "validityHours": 48, "renewBeforeHours": 24 } },
    });
    plane.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], &node.to_string());
    let certificate = || {
        plane
            .get_json(&["-n", &ns.name, "nodecatalog", "mac-3"])
            .map(|n| n["status"]["certificate"].clone())
            .unwrap_or_default()
    };
    let version = |name: &str| {
        plane
            .get_json(&["-n", &ns.name, "secret", name])
            .map(|s| s["metadata"]["resourceVersion"].clone())
            .unwrap_or_default()
    };
    let operator = Operator::start(plane, &ns, "iop-operator-a");
    wait_until("the first node certificate", WAIT, || certificate()["serial"].is_string());
    operator.wait_reconciled(1.0);
    let first = certificate();
    let (node_secret, edge_secret) = (version("iop-node-mac-3"), version("iop-edge-tls"));
    assert!(operator.process.terminate().success());

    let ahead = (25 * 3600).to_string();
    let operator = Operator::start_with(
        plane,
        &ns,
        "iop-operator-b",
        "leading: reconciling",
        &[("IOP_TEST_CLOCK_OFFSET_S", &ahead)],
    );
    wait_until("a new node certificate", WAIT, || {
        certificate()["serial"].is_string() && certificate()["serial"] != first["serial"]
    });
    let renewed = certificate();
    assert!(renewed["notAfter"].as_str() > first["notAfter"].as_str(), "{first} -> {renewed}");
    assert_ne!(version("iop-node-mac-3"), node_secret, "the Secret holds the new certificate");
    operator.wait_reconciled(1.0);
    assert_eq!(version("iop-edge-tls"), edge_secret, "the Edge certificate is outside its window");
}

// ---------------------------------------------------------------------------
// Two stand-in Edge pods (Pod objects whose status is patched: there is no
// kubelet), two real `iop-edge` processes fed the ConfigMap and Secrets read
// back from the API server, a real `iop-node` with a bundle from
// `iop-operator node-bundle` behind a TCP load balancer (the gRPC Service's
// part), and a real mock provider.

/// The chart's Edge pod labels (`IOP_EDGE_POD_SELECTOR`).
const EDGE_LABELS: [(&str, &str); 3] =
    [("app.kubernetes.io/name", "iop"), ("app.kubernetes.io/instance", "iop"), ("app.kubernetes.io/component", "edge")];
/// The client API key of the Edge's keys file (the Secret
/// `edge.auth.keysSecret` the chart mounts), and that file.
const API_KEY: &str = "iop-example-key-do-not-use";
const KEYS_FILE: &str = "principals:\n  - name: cluster-test\n    \
    key_sha256: dc30dbe25602db5b51f1eba47aafb28349f3cd40a1dc4b8827e420127987a3dd\n    models: [\"mock-*\"]\n";
/// The admin port the operator reads each replica at (`<pod IP>:8081`).
const ADMIN_PORT: u16 = 8081;

fn stand_in_pod(plane: &ControlPlane, ns: &str, name: &str, ip: &str) {
    let labels: serde_json::Map<String, Value> = EDGE_LABELS.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": labels },
        "spec": { "containers": [ { "name": "edge", "image": "iop-edge:0.1.0" } ] },
    });
    plane.kubectl_stdin(&["apply", "-n", ns, "-f", "-"], &pod.to_string());
    let status = json!({ "status": {
        "phase": "Running", "podIP": ip, "podIPs": [ { "ip": ip } ],
        "conditions": [ { "type": "Ready", "status": "True" } ],
    }});
    plane.kubectl(&["-n", ns, "patch", "pod", name, "--subresource=status", "--type=merge", "-p", &status.to_string()]);
}

/// A key of a Secret, decoded.
fn secret_value(plane: &ControlPlane, ns: &str, secret: &str, key: &str) -> Vec<u8> {
    use base64::Engine as _;
    let object = plane.get_json(&["-n", ns, "secret", secret]).unwrap_or_else(|| panic!("Secret {secret}"));
    let encoded = object["data"][key].as_str().unwrap_or_else(|| panic!("{secret} has no {key}"));
    base64::engine::general_purpose::STANDARD.decode(encoded).expect("base64")
}

/// Two loopback addresses of this run's own for the stand-in Edge pods
/// (Linux answers on all of 127.0.0.0/8), each with [`ADMIN_PORT`] free:
/// the operator reads every replica at `<pod IP>:ADMIN_PORT`, and a fixed
/// pair (127.0.0.2, .3) collided with whatever else held that port there.
fn pod_ips() -> [String; 2] {
    loop {
        let (a, b, c) = (fastrand::u8(16..=250), fastrand::u8(..), fastrand::u8(1..=250));
        let ips = [format!("127.{a}.{b}.{c}"), format!("127.{a}.{b}.{}", c + 1)];
        if ips.iter().all(|ip| std::net::TcpListener::bind((ip.as_str(), ADMIN_PORT)).is_ok()) {
            return ips;
        }
    }
}

fn free_port_on(ip: &str) -> SocketAddr {
    std::net::TcpListener::bind(format!("{ip}:0")).unwrap().local_addr().unwrap()
}

/// One Edge replica: the pod's mounts (config, TLS, keys) written from the
/// cluster's objects, its listeners on the pod's IP.
struct EdgeReplica {
    http: SocketAddr,
    process: Option<Spawned>,
}

/// What the kubelet does for an Edge pod: writes its mounts from the
/// cluster's objects (the ConfigMap's config, Secrets `iop-edge-tls` and
/// `iop-edge-credentials`, the keys Secret), the config with its listeners
/// on the pod's IP (`http`, `grpc`: ports chosen once; admin: [`ADMIN_PORT`]).
/// Called again after a change, as the kubelet refreshes mounted objects.
fn write_mounts(plane: &ControlPlane, ns: &str, pod: &str, ip: &str) -> PathBuf {
    let dir = plane.dir.path().join(pod);
    std::fs::create_dir_all(dir.join("credentials")).unwrap();
    for key in ["ca.pem", "edge.pem", "edge-key.pem"] {
        std::fs::write(dir.join(key), secret_value(plane, ns, "iop-edge-tls", key)).unwrap();
    }
    let path = dir.join("edge.yaml");
    let ports = std::fs::read_to_string(&path)
        .ok()
        .map(|text| iop_proto::config::EdgeConfig::from_yaml(&text).expect("written here").listen);
    // The config as the operator rendered it; only what the pod's mounts
    // and network give differs here (paths, the pod IP).
    let text = edge_config_text(plane, ns).expect("the Edge config");
    let mut config = iop_proto::config::EdgeConfig::from_yaml(&text).expect("the Edge accepts it");
    config.listen.http = ports.as_ref().map_or_else(|| free_port_on(ip), |p| p.http);
    config.listen.grpc = ports.as_ref().map_or_else(|| free_port_on(ip), |p| p.grpc);
    config.listen.admin = format!("{ip}:{ADMIN_PORT}").parse().unwrap();
    config.tls.ca_file = dir.join("ca.pem");
    config.tls.cert_file = dir.join("edge.pem");
    config.tls.key_file = dir.join("edge-key.pem");
    assert_eq!(config.auth.keys_file.as_deref(), Some(Path::new("/etc/iop/keys/keys.yaml")));
    std::fs::write(dir.join("keys.yaml"), KEYS_FILE).unwrap();
    config.auth.keys_file = Some(dir.join("keys.yaml"));
    for credential in &mut config.credentials {
        assert_eq!(credential.file, Path::new("/etc/iop/credentials").join(&credential.profile));
        let file = dir.join("credentials").join(&credential.profile);
        std::fs::write(&file, secret_value(plane, ns, "iop-edge-credentials", &credential.profile)).unwrap();
        credential.file = file;
    }
    std::fs::write(&path, config.to_yaml()).unwrap();
    path
}

fn start_edge(plane: &ControlPlane, ns: &str, pod: &str, ip: &str) -> EdgeReplica {
    let path = write_mounts(plane, ns, pod, ip);
    let config = iop_proto::config::EdgeConfig::from_yaml(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut command = Command::new(bin("iop-edge"));
    command.args(["--config", path.to_str().unwrap(), "--replica-id", pod, "--reload-interval-ms", "100"]);
    let mut process = Spawned::spawn(command, path.with_file_name("edge.log"));
    process.wait_for_log("iop-edge listening", WAIT);
    EdgeReplica { http: config.listen.http, process: Some(process) }
}

/// The mock provider on `addr` (`127.0.0.1:0` for any port).
fn start_mock(dir: &Path, addr: &str, args: &[&str]) -> (Spawned, SocketAddr) {
    let log = dir.join(format!("mock-{}-{}.log", addr.replace(':', "_"), args.len()));
    let mut command = Command::new(bin("iop-mock-provider"));
    command.args(["--listen", addr]).args(args);
    let mut process = Spawned::spawn(command, log);
    process.wait_for_log("listening on", WAIT);
    let line = process.log_text().lines().find(|l| l.contains("listening on")).unwrap().to_string();
    let url = line.split_whitespace().last().unwrap().to_string();
    let addr = url.trim_start_matches("http://").trim_end_matches('/').parse().expect("the mock's address");
    (process, addr)
}

/// `POST /v1/chat/completions` with the example key: the status and body.
fn chat(edge: SocketAddr, model: &str) -> (u16, String) {
    let body = json!({ "model": model, "messages": [ { "role": "user", "content": "hello" } ] }).to_string();
    let Ok(mut stream) = TcpStream::connect_timeout(&edge, Duration::from_secs(2)) else { return (0, String::new()) };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
    let _ = write!(
        stream,
        "POST /v1/chat/completions HTTP/1.0\r\nHost: {edge}\r\nAuthorization: Bearer {API_KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn edges_and_a_node_fed_from_the_cluster(plane: &ControlPlane) {
    // The gRPC Service's stand-in.
    let haproxy = Part::Haproxy.require(parts::haproxy());
    let ns = plane.namespace("fleet");
    let dir = plane.dir.path().join("fleet");
    std::fs::create_dir_all(&dir).unwrap();
    let (mock, mock_addr) = start_mock(&dir, "127.0.0.1:0", &[]);
    // A provider that needs an API key, from a Secret labelled for it.
    let (_keyed, keyed_addr) = start_mock(&dir, "127.0.0.1:0", &["--api-key", "sk-old"]);
    let key_secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "mock-key", "labels": { "iop.dev/credential": "true" } },
        "stringData": { "api-key": "sk-old" },
    });
    let keyed = json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "Provider", "metadata": { "name": "keyed" },
        "spec": {
            "node": "mac-1", "adapter": "openai",
            "target": { "model": "mock", "baseUrl": format!("http://{keyed_addr}") },
            "models": [ { "name": "mock-keyed" } ],
            "credentialSecretRef": { "name": "mock-key", "key": "api-key" },
        },
    });
    // Two workspaces: one inside the node's allowed root, one outside it
    // (the node refuses it: WorkspacesReady=False).
    let allowed = dir.join("allowed");
    std::fs::create_dir_all(allowed.join("site")).unwrap();
    let template = json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "WorkspaceTemplate", "metadata": { "name": "files" },
        "spec": { "operations": ["read", "list"] },
    });
    let site = json!({ "ref": "site", "rootPath": allowed.join("site"), "template": "files" });
    let outside = json!({ "ref": "outside", "rootPath": dir.join("outside"), "template": "files" });
    let node_catalog = json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "NodeCatalog", "metadata": { "name": "mac-1" },
        "spec": { "workspaces": [site, outside] },
    });
    let provider = json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "Provider", "metadata": { "name": "mock" },
        "spec": {
            "node": "mac-1", "adapter": "openai",
            "target": { "model": "mock", "baseUrl": format!("http://{mock_addr}") },
            "models": [ { "name": "mock-openai" } ],
        },
    });
    for object in [&template, &node_catalog, &provider, &key_secret, &keyed] {
        plane.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], &object.to_string());
    }
    let [ip_a, ip_b] = pod_ips();
    let pods = [("iop-edge-a", ip_a.as_str()), ("iop-edge-b", ip_b.as_str())];
    for (pod, ip) in pods {
        stand_in_pod(plane, &ns.name, pod, ip);
    }
    let _operator = Operator::start(plane, &ns, "iop-operator-a");
    wait_until("the config with both replicas, the node and the provider", WAIT, || {
        edge_config(plane, &ns.name).is_some_and(|c| {
            names(&c["replicas"]) == ["iop-edge-a", "iop-edge-b"]
                && c["nodes"][0]["name"] == "mac-1"
                && c["providers"][0]["id"] == "keyed"
                && c["providers"][1]["id"] == "mock"
                && c["credentials"][0]["revision"].as_u64().is_some_and(|r| r >= 1)
                && c["workspaces"].as_array().is_some_and(|w| w.len() == 2)
        })
    });
    // A first revision is the time it was given (issue 43 D1: never reused).
    let first_revision = edge_config(plane, &ns.name).unwrap()["credentials"][0]["revision"].as_u64().unwrap();
    wait_until("Secret iop-node-mac-1", WAIT, || {
        plane.get_json(&["-n", &ns.name, "secret", "iop-node-mac-1"]).is_some()
    });
    let mut edges: Vec<EdgeReplica> = pods.iter().map(|(pod, ip)| start_edge(plane, &ns.name, pod, ip)).collect();

    // The gRPC Service: TCP passthrough to both replicas.
    let lb = iop_e2e::harness::free_port();
    let grpc_ports: Vec<SocketAddr> = pods
        .iter()
        .map(|(pod, _)| {
            let config = std::fs::read_to_string(plane.dir.path().join(pod).join("edge.yaml")).unwrap();
            iop_proto::config::EdgeConfig::from_yaml(&config).unwrap().listen.grpc
        })
        .collect();
    let servers: String = grpc_ports
        .iter()
        .enumerate()
        .map(|(i, a)| format!("  server e{i} {a} check inter 100ms fall 1 rise 1\n"))
        .collect();
    let haproxy_file = dir.join("haproxy.cfg");
    std::fs::write(
        &haproxy_file,
        format!(
            "global\n  maxconn 256\ndefaults\n  retries 0\n  timeout connect 2s\n  timeout client 1h\n  timeout server 1h\n\
             frontend grpc\n  mode tcp\n  bind {lb}\n  default_backend edges\nbackend edges\n  mode tcp\n  balance roundrobin\n{servers}"
        ),
    )
    .unwrap();
    let mut command = Command::new(&haproxy);
    command.args(["-db", "-f", haproxy_file.to_str().unwrap()]);
    let _haproxy = Spawned::spawn(command, dir.join("haproxy.log"));
    wait_until("haproxy listening", WAIT, || TcpStream::connect(lb).is_ok());

    // The node's bundle, as an administrator makes it (the admin kubeconfig
    // reads the node's Secret), with a fast probe for the test.
    let node_yaml = ca_rotation::node_bundle(plane, &ns.name, "mac-1", lb, &dir.join("bundle"));
    let mut text = std::fs::read_to_string(&node_yaml).unwrap();
    text.push_str(&format!("workspaces: {{ allowed_roots: [{:?}] }}\n", allowed));
    std::fs::write(&node_yaml, text).unwrap();
    let mut command = Command::new(bin("iop-node"));
    command.args(["--config", node_yaml.to_str().unwrap()]);
    let _node = Spawned::spawn(command, dir.join("node.log"));

    // NodeCatalog REPLICAS 2/2: the node holds a session with each replica.
    let node_status = |field: &str| {
        plane
            .get_json(&["-n", &ns.name, "nodecatalog", "mac-1"])
            .map(|n| n["status"][field].clone())
            .unwrap_or_default()
    };
    wait_until("REPLICAS 2/2", Duration::from_secs(60), || node_status("replicasSummary") == "2/2");
    assert_eq!(node_status("connected"), true);
    // The HEALTH column of `kubectl get providers`, as an operator reads it.
    let health = || {
        let table = plane.kubectl(&["-n", &ns.name, "get", "providers"]);
        let mut lines = table.lines().map(|l| l.split_whitespace().collect::<Vec<_>>());
        let header = lines.next().unwrap_or_default();
        let column = header.iter().position(|h| *h == "HEALTH").expect("a HEALTH column");
        let row = lines.find(|r| r.first() == Some(&"mock")).unwrap_or_default();
        // An empty cell shifts the rest: only a known value counts.
        row.get(column)
            .filter(|v| ["available", "degraded", "unavailable", "unknown"].contains(*v))
            .map(|v| v.to_string())
            .unwrap_or_default()
    };
    wait_until("HEALTH available", WAIT, || health() == "available");
    // Status has one writer (issue 43 item 6): a hand edit of the health is
    // corrected at the next poll of the status mirror, and a classification
    // the mirror does not set (another field manager's: server-side apply
    // alone would leave it) is removed.
    plane.kubectl(&[
        "-n",
        &ns.name,
        "patch",
        "provider",
        "mock",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"health":"unavailable","classification":"provider_unhealthy"}}"#,
    ]);
    let status = || plane.get_json(&["-n", &ns.name, "provider", "mock"]).map(|p| p["status"].clone());
    wait_until("the hand-edited HEALTH corrected and CLASSIFICATION removed", WAIT, || {
        status().is_some_and(|s| s["health"] == "available" && s.get("classification").is_none())
    });

    // WorkspacesReady is what the node accepted: it refuses the workspace
    // outside its allowed root, naming it and its reason.
    let node_condition = |kind: &str| {
        let node = plane.get_json(&["-n", &ns.name, "nodecatalog", "mac-1"]).unwrap_or_default();
        let (status, reason) = condition(&node, kind);
        let found = node["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == kind);
        (status, reason, found.and_then(|c| c["message"].as_str()).unwrap_or_default().to_string())
    };
    wait_until("WorkspacesReady=False WorkspaceRefused", WAIT, || {
        let (status, reason, message) = node_condition("WorkspacesReady");
        status == "False"
            && reason == "WorkspaceRefused"
            && message.contains("workspace `outside`: the node refused it (outside_allowed_roots)")
    });
    assert!(!node_condition("WorkspacesReady").2.contains("`site`"), "{:?}", node_condition("WorkspacesReady"));
    // Without it (the Edges' mounts refreshed as the kubelet does): every
    // workspace accepted, True.
    let only_site = json!({ "spec": { "workspaces": [site] } }).to_string();
    plane.kubectl(&["-n", &ns.name, "patch", "nodecatalog", "mac-1", "--type=merge", "-p", &only_site]);
    wait_until("the config without the refused workspace", WAIT, || {
        edge_config(plane, &ns.name).is_some_and(|c| c["workspaces"].as_array().is_some_and(|w| w.len() == 1))
    });
    for (pod, ip) in pods {
        write_mounts(plane, &ns.name, pod, ip);
    }
    wait_until("WorkspacesReady=True", WAIT, || node_condition("WorkspacesReady").0 == "True");
    wait_until("REPLICAS 2/2 after the node's reconnect", Duration::from_secs(60), || {
        node_status("replicasSummary") == "2/2"
    });

    // BundleCurrent: the node's sessions present the certificate issued
    // last. Its Secret deleted, the operator issues another (a new
    // serial) while the Mac still runs the old bundle: False, naming the
    // serial in use and what to do.
    wait_until("BundleCurrent=True", WAIT, || node_condition("BundleCurrent").1 == "Current");
    let issued = node_status("certificate")["serial"].as_str().unwrap_or_default().to_string();
    plane.kubectl(&["-n", &ns.name, "delete", "secret", "iop-node-mac-1"]);
    wait_until("BundleCurrent=False OlderBundle", WAIT, || {
        let (status, reason, message) = node_condition("BundleCurrent");
        status == "False"
            && reason == "OlderBundle"
            && message.contains(&format!("serial {issued} "))
            && message.contains("make a new bundle (iop-operator node-bundle mac-1) and restart iop-node")
    });
    let columns = plane.kubectl(&["-n", &ns.name, "get", "nodecatalog", "mac-1"]);
    assert!(columns.lines().next().unwrap_or_default().contains("BUNDLE-CURRENT"), "{columns}");
    assert!(columns.lines().nth(1).unwrap_or_default().contains("False"), "{columns}");
    // NODE-VERSION: what the running iop-node reported at registration (the
    // workspace's version, shared by this crate), so an operator sees which
    // Macs run an older release.
    assert!(columns.lines().next().unwrap_or_default().contains("NODE-VERSION"), "{columns}");
    assert_eq!(node_status("version"), env!("CARGO_PKG_VERSION"), "{columns}");
    assert!(columns.lines().nth(1).unwrap_or_default().contains(env!("CARGO_PKG_VERSION")), "{columns}");

    // A chat through each replica, on the plain and the keyed provider.
    for edge in &edges {
        for model in ["mock-openai", "mock-keyed"] {
            let (status, body) = chat(edge.http, model);
            assert_eq!(status, 200, "{model} through {}: {body}", edge.http);
        }
    }

    // Credential rotation: the provider takes only a new key; the Secret
    // gets it; the operator raises the revision; the Edges, their mounts
    // refreshed, send the new key.
    let post = format!("POST /mock/api-key HTTP/1.0\r\nHost: {keyed_addr}\r\nContent-Length: 6\r\n\r\nsk-new");
    let mut stream = TcpStream::connect(keyed_addr).unwrap();
    stream.write_all(post.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.0 2") || answer.starts_with("HTTP/1.1 2"), "{answer}");
    assert_ne!(chat(edges[0].http, "mock-keyed").0, 200, "the old key is refused");
    plane.kubectl(&["-n", &ns.name, "patch", "secret", "mock-key", "-p", r#"{"stringData":{"api-key":"sk-new"}}"#]);
    let revision = || edge_config(plane, &ns.name).and_then(|c| c["credentials"][0]["revision"].as_u64());
    wait_until("a later revision in the Edge config", WAIT, || revision() > Some(first_revision));
    let rotated = revision().unwrap();
    for (pod, ip) in pods {
        write_mounts(plane, &ns.name, pod, ip);
    }
    for edge in &edges {
        wait_until("the new key through the replica", WAIT, || chat(edge.http, "mock-keyed").0 == 200);
    }
    // Issue 43 D1: `iop-edge-credentials` deleted (documented as restorable):
    // restored with a revision that still goes up, so the node, which has
    // seen the last one, takes the next lease instead of refusing them all.
    plane.kubectl(&["-n", &ns.name, "delete", "secret", "iop-edge-credentials"]);
    wait_until("the credentials restored with a later revision", WAIT, || revision() > Some(rotated));
    for (pod, ip) in pods {
        write_mounts(plane, &ns.name, pod, ip);
    }
    for edge in &edges {
        wait_until("the key through the replica after the restore", WAIT, || chat(edge.http, "mock-keyed").0 == 200);
    }

    // The provider dies: HEALTH unavailable; it comes back: available.
    drop(mock);
    for edge in &edges {
        chat(edge.http, "mock-openai");
    }
    wait_until("HEALTH unavailable", WAIT, || health() == "unavailable");
    let (_mock, _) = start_mock(&dir, &mock_addr.to_string(), &[]);
    wait_until("HEALTH available again", WAIT, || health() == "available");

    // One replica stops: REPLICAS 1/2 (its pod is still listed).
    let stopped = edges[1].process.take().expect("running");
    assert!(stopped.terminate().success());
    wait_until("REPLICAS 1/2", WAIT, || node_status("replicasSummary") == "1/2");
    edges.clear();
}

// ---------------------------------------------------------------------------
// Issue 43 D2: `kubectl delete namespace` completes with NodeCatalogs in it,
// and takes the operator's cluster-scoped RBAC with it.

fn deleting_the_namespace_completes(plane: &ControlPlane) {
    let ns = plane.namespace("doomed");
    for name in ["mac-1", "mac-2"] {
        let catalog = json!({
            "apiVersion": "iop.dev/v1alpha1", "kind": "NodeCatalog", "metadata": { "name": name }, "spec": {},
        });
        plane.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], &catalog.to_string());
    }
    let operator = Operator::start(plane, &ns, "iop-operator-a");
    wait_until("both NodeCatalogs holding the finalizer, in the config", WAIT, || {
        ["mac-1", "mac-2"].iter().all(|n| {
            plane
                .get_json(&["-n", &ns.name, "nodecatalog", n])
                .is_some_and(|o| names(&o["metadata"]["finalizers"]) == ["iop.dev/node-identity"])
        }) && edge_config(plane, &ns.name).is_some_and(|c| c["nodes"].as_array().is_some_and(|n| n.len() == 2))
    });
    // The chart's cluster-scoped objects are owned by the namespace.
    let rbac_name = format!("{}-iop-operator", ns.name);
    let uid = plane.get_json(&["namespace", &ns.name]).unwrap()["metadata"]["uid"].clone();
    for kind in ["clusterrole", "clusterrolebinding"] {
        wait_until(&format!("{kind} {rbac_name} owned by the namespace"), WAIT, || {
            plane.get_json(&[kind, &rbac_name]).is_some_and(|o| {
                o["metadata"]["ownerReferences"].as_array().is_some_and(|refs| {
                    refs.iter().any(|r| r["kind"] == "Namespace" && r["uid"] == uid && r["name"] == ns.name.as_str())
                })
            })
        });
    }
    // As Kubernetes deletes a namespace: its pods first (the kubelet sends
    // the operator SIGTERM), everything else once they are gone.
    let deleted = Instant::now();
    plane.kubectl(&["delete", "namespace", &ns.name, "--wait=false"]);
    wait_until("the operator sees its namespace terminating", WAIT, || {
        operator.process.log_text().contains("namespace terminating: finalizer released")
    });
    assert!(operator.process.terminate().success(), "the operator exits cleanly");
    wait_until("the namespace gone", Duration::from_secs(120), || plane.get_json(&["namespace", &ns.name]).is_none());
    eprintln!("namespace deleted in {:.1} s", deleted.elapsed().as_secs_f64());
    for kind in ["clusterrole", "clusterrolebinding"] {
        wait_until(&format!("{kind} {rbac_name} collected"), Duration::from_secs(60), || {
            plane.get_json(&[kind, &rbac_name]).is_none()
        });
    }

    // The operator stopped before it saw the deletion (the kubelet was
    // first): releasing at shutdown is what lets the namespace go.
    let ns = plane.namespace("doomed-fast");
    let catalog =
        json!({ "apiVersion": "iop.dev/v1alpha1", "kind": "NodeCatalog", "metadata": { "name": "mac-1" }, "spec": {} });
    plane.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], &catalog.to_string());
    let operator = Operator::start(plane, &ns, "iop-operator-a");
    wait_until("the finalizer held", WAIT, || {
        plane
            .get_json(&["-n", &ns.name, "nodecatalog", "mac-1"])
            .is_some_and(|o| names(&o["metadata"]["finalizers"]) == ["iop.dev/node-identity"])
    });
    plane.kubectl(&["delete", "namespace", &ns.name, "--wait=false"]);
    assert!(operator.process.terminate().success(), "the operator exits cleanly");
    wait_until("the namespace gone", Duration::from_secs(120), || plane.get_json(&["namespace", &ns.name]).is_none());
}

// ---------------------------------------------------------------------------
// Issue 43 D5: every value of charts/iop/ci/refused-values.txt is refused by
// a real `helm install`, and nothing is installed.

fn helm_install_refuses_what_the_operator_would(plane: &ControlPlane) {
    let ns = "refused";
    plane.kubectl(&["create", "namespace", ns]);
    let chart = cluster::repo_root().join("charts/iop");
    let cases = std::fs::read_to_string(chart.join("ci/refused-values.txt")).expect("the refused values");
    let mut tried = 0;
    for line in cases.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let [what, pattern, args] = line.splitn(3, '\t').collect::<Vec<_>>()[..] else {
            panic!("not 3 fields: {line}")
        };
        let mut command = vec!["install", "iop", chart.to_str().unwrap(), "--namespace", ns];
        command.extend(args.split(' '));
        let output = plane.helm(&command);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "helm install accepted {what}: {}", String::from_utf8_lossy(&output.stdout));
        assert!(matches_extended(pattern, &stderr), "{what}: the error does not match `{pattern}`: {stderr}");
        tried += 1;
    }
    assert!(tried >= 30, "only {tried} cases");
    let releases = plane.helm(&["list", "--namespace", ns, "--short"]);
    assert!(releases.status.success(), "helm list: {}", String::from_utf8_lossy(&releases.stderr));
    assert_eq!(String::from_utf8_lossy(&releases.stdout).trim(), "", "nothing was installed");
    let left = plane.get_json(&["-n", ns, "deployments,secrets,configmaps,services"]).expect("a list");
    let names: Vec<&str> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .filter(|n| *n != "kube-root-ca.crt")
        .collect();
    assert!(names.is_empty(), "objects left by refused installs: {names:?}");
}

/// Whether `text` matches the extended regular expression `pattern` (the
/// file's patterns are `grep -E`'s, as scripts/chart-check reads them).
fn matches_extended(pattern: &str, text: &str) -> bool {
    let mut grep =
        Command::new("grep").args(["-Eq", "--", pattern]).stdin(std::process::Stdio::piped()).spawn().expect("grep");
    grep.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    grep.wait().unwrap().success()
}

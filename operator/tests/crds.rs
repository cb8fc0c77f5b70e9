//! The generated CRDs: drift against `crds/`, printer columns, CEL rules, and
//! the example objects in `examples/k8s/` validated against the schema the
//! way the API server would (structure, enums, ranges and patterns with a
//! JSON-schema validator; unknown fields; CEL rules with kube-cel).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use iop_operator::crd::{self, NodeCatalog, Provider, WorkspaceTemplate};
use iop_operator::reconcile::{self, Settings, Snapshot, validate};
use iop_proto::config::ListenConfig;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn crd_of(kind: &str) -> CustomResourceDefinition {
    crd::all().into_iter().find(|c| c.spec.names.kind == kind).unwrap_or_else(|| panic!("no CRD for {kind}"))
}

fn schema_of(kind: &str) -> Value {
    let crd = crd_of(kind);
    serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap()
}

#[test]
fn committed_crds_match_the_generated_ones() {
    let path = repo_root().join(crd::CRDS_FILE);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = crd::render_yaml();
    assert!(
        committed == generated,
        "{} is out of date with the CRD types; regenerate it with\n  cargo run -p iop-operator -- crds > {}",
        path.display(),
        crd::CRDS_FILE
    );
    // The YAML says exactly what the types say (quoting, numbers, rules).
    let parsed: Vec<Value> = serde_saphyr::from_multiple(&committed).unwrap();
    let expected: Vec<Value> = crd::all().iter().map(|c| serde_json::to_value(c).unwrap()).collect();
    assert_eq!(parsed, expected);
}

#[test]
fn definitions_are_namespaced_v1alpha1_with_status() {
    let kinds: Vec<String> = crd::all().iter().map(|c| c.spec.names.kind.clone()).collect();
    assert_eq!(kinds, ["NodeCatalog", "Provider", "WorkspaceTemplate"]);
    for c in crd::all() {
        assert_eq!(c.spec.group, "iop.dev");
        assert_eq!(c.spec.scope, "Namespaced");
        assert_eq!(c.spec.versions.len(), 1);
        let v = &c.spec.versions[0];
        assert_eq!((v.name.as_str(), v.served, v.storage), ("v1alpha1", true, true));
        assert!(
            v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            "{} has a status subresource",
            c.spec.names.kind
        );
        let conditions = &schema_of(&c.spec.names.kind)["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
        assert_eq!(conditions["items"]["required"].as_array().unwrap().iter().filter(|r| *r == "type").count(), 1);
    }
}

/// The schema node a printer-column JSONPath reaches, or why it reaches none.
fn resolve<'a>(schema: &'a Value, path: &str) -> Result<&'a Value, String> {
    // A filter (`[?(@.type=="Ready")]`) selects items of a list, as `[*]` does.
    let mut path = path.to_string();
    while let Some(start) = path.find("[?(") {
        let end = path[start..].find(")]").ok_or("an unclosed filter")? + start;
        path.replace_range(start..end + 2, "[*]");
    }
    let mut node = schema;
    for segment in path.strip_prefix('.').ok_or("must start with '.'")?.split('.') {
        let (name, each) = match segment.strip_suffix("[*]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        node = node.get("properties").and_then(|p| p.get(name)).ok_or_else(|| format!("no field `{name}`"))?;
        if each {
            node = node.get("items").ok_or_else(|| format!("`{name}` is not a list"))?;
        }
    }
    Ok(node)
}

#[test]
fn printer_columns_point_into_the_schema() {
    let expected = BTreeMap::from([
        (
            "NodeCatalog",
            vec!["Connected", "Replicas", "Node-Version", "Generation", "Cert-Expiry", "Bundle-Current", "Age"],
        ),
        ("Provider", vec!["Node", "Model", "Health", "Classification", "Ejected", "Loaded", "Age", "Public"]),
        ("WorkspaceTemplate", vec!["Operations", "Age"]),
    ]);
    for c in crd::all() {
        let kind = c.spec.names.kind.clone();
        let schema = schema_of(&kind);
        let columns = c.spec.versions[0].additional_printer_columns.clone().unwrap_or_default();
        assert_eq!(columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), expected[kind.as_str()]);
        for col in columns {
            if let Some(field) = col.json_path.strip_prefix(".metadata.") {
                assert!(["creationTimestamp", "name", "namespace"].contains(&field), "{kind}: {}", col.json_path);
                continue;
            }
            let node = resolve(&schema, &col.json_path)
                .unwrap_or_else(|e| panic!("{kind} column {}: {}: {e}", col.name, col.json_path));
            let ty = node["type"].as_str().unwrap_or_default();
            let fits = match col.type_.as_str() {
                "integer" => ty == "integer",
                "boolean" => ty == "boolean",
                "number" => ty == "number" || ty == "integer",
                "date" => ty == "string" && node["format"] == "date-time",
                "string" => ty == "string" || ty == "array",
                other => panic!("unknown column type {other}"),
            };
            assert!(fits, "{kind} column {} is {} but {} is {ty}", col.name, col.type_, col.json_path);
        }
    }
    // The walker is not vacuous.
    assert!(resolve(&schema_of("Provider"), ".status.helth").is_err());
    assert!(resolve(&schema_of("Provider"), ".spec.node[*]").is_err());
    assert!(resolve(&schema_of("NodeCatalog"), r#".status.conditions[?(@.type=="X")].stat"#).is_err());
}

fn rules(schema: &Value, out: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Array(v)) = map.get("x-kubernetes-validations") {
                out.extend(v.iter().map(|r| r["rule"].as_str().unwrap().to_string()));
            }
            map.iter().filter(|(k, _)| *k != "x-kubernetes-validations").for_each(|(_, v)| rules(v, out));
        }
        Value::Array(v) => v.iter().for_each(|v| rules(v, out)),
        _ => {}
    }
}

fn compilation_errors(compiled: &kube_cel::CompiledSchema, out: &mut Vec<String>) {
    out.extend(compiled.compilation_errors().iter().map(|e| e.to_string()));
    for child in
        compiled.properties.values().chain(compiled.items.as_deref()).chain(compiled.additional_properties.as_deref())
    {
        compilation_errors(child, out);
    }
}

#[test]
fn every_cel_rule_compiles_and_stays_in_scope() {
    let mut count = 0;
    for kind in ["NodeCatalog", "Provider", "WorkspaceTemplate"] {
        let schema = schema_of(kind);
        let mut found = Vec::new();
        rules(&schema, &mut found);
        count += found.len();
        let compiled = kube_cel::compile_schema(&schema);
        let mut errors = Vec::new();
        compilation_errors(&compiled, &mut errors);
        assert!(errors.is_empty(), "{kind}: {errors:?}");
        for rule in &found {
            let scope = kube_cel::check_rule_scope(rule, kube_cel::ScopeContext::CrdValidation);
            assert!(scope.is_empty(), "{kind}: {scope:?}");
        }
    }
    assert_eq!(
        count, 12,
        "names of nodes and providers, stall and first-byte timeouts, credentials, keepWarm, contextFallback, \
         renewBefore, commands, target model and base URL (and its /v1 suffix)"
    );
}

/// Everything the API server would say about `object` (empty: accepted).
fn admission_errors(object: &Value) -> Vec<String> {
    let kind = object["kind"].as_str().expect("a kind");
    assert_eq!(object["apiVersion"], "iop.dev/v1alpha1");
    let schema = schema_of(kind);
    let mut errors = Vec::new();
    let structural = jsonschema::draft4::new(&schema).expect("the CRD schema compiles as JSON schema");
    errors.extend(structural.iter_errors(object).map(|e| format!("{}: {e}", e.instance_path())));
    for (key, value) in object.as_object().unwrap() {
        match key.as_str() {
            "apiVersion" | "kind" | "metadata" => {}
            _ => match schema["properties"].get(key) {
                Some(s) => unknown_fields(s, value, key, &mut errors),
                None => errors.push(format!("{key}: unknown field")),
            },
        }
    }
    if let Err(cel) = kube_cel::Validator::new().validate(&schema, object, None) {
        errors.extend(cel.iter().map(|e| format!("CEL: {e}")));
    }
    errors
}

/// The API server prunes (and `kubectl apply` refuses) fields the schema does not know.
fn unknown_fields(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    if schema["x-kubernetes-preserve-unknown-fields"] == true {
        return;
    }
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            for (k, v) in map {
                match (props.and_then(|p| p.get(k)), schema.get("additionalProperties")) {
                    (Some(s), _) | (None, Some(s)) => unknown_fields(s, v, &format!("{path}.{k}"), errors),
                    (None, None) => errors.push(format!("{path}.{k}: unknown field")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                items.iter().enumerate().for_each(|(i, v)| unknown_fields(s, v, &format!("{path}[{i}]"), errors));
            }
        }
        _ => {}
    }
}

/// Every document of every file in `examples/k8s/`, with its file name.
fn examples() -> Vec<(String, Value)> {
    let dir = repo_root().join("examples/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        assert_eq!(file.extension().and_then(|e| e.to_str()), Some("yaml"), "{} is not YAML", file.display());
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        docs.extend(parsed.into_iter().map(|d| (name.clone(), d)));
    }
    docs
}

fn example(kind: &str, name: &str) -> Value {
    examples()
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no example {kind}/{name}"))
}

#[derive(Default)]
struct Typed {
    providers: Vec<Provider>,
    nodes: Vec<NodeCatalog>,
    templates: Vec<WorkspaceTemplate>,
}

fn typed(docs: &[(String, Value)]) -> Typed {
    let mut t = Typed::default();
    for (file, doc) in docs {
        fn read<K: serde::de::DeserializeOwned>(file: &str, doc: &Value) -> K {
            serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{file}: {e}"))
        }
        match doc["kind"].as_str().unwrap() {
            "Provider" => t.providers.push(read(file, doc)),
            "NodeCatalog" => t.nodes.push(read(file, doc)),
            "WorkspaceTemplate" => t.templates.push(read(file, doc)),
            other => panic!("{file}: unexpected kind {other}"),
        }
    }
    t
}

#[test]
fn examples_are_accepted_by_the_schema_and_read_into_the_types() {
    let docs = examples();
    for (file, doc) in &docs {
        let errors = admission_errors(doc);
        assert!(errors.is_empty(), "{file} {}/{}: {errors:#?}", doc["kind"], doc["metadata"]["name"]);
    }
    let t = typed(&docs);
    assert_eq!((t.nodes.len(), t.providers.len(), t.templates.len()), (1, 2, 1));
    assert!(t.providers.iter().any(|p| p.spec.mode == crd::provider::ProviderMode::Tunnel));
    assert!(t.providers.iter().any(|p| p.spec.mode == crd::provider::ProviderMode::Normalized));
}

fn settings() -> Settings {
    let addr = |a: &str| a.parse().unwrap();
    let listen = ListenConfig::new(addr("0.0.0.0:8080"), addr("0.0.0.0:7443"), addr("0.0.0.0:8081"));
    Settings::new("iop.example", listen)
}

#[test]
fn examples_render_a_valid_edge_config() {
    let t = typed(&examples());
    let snapshot = Snapshot {
        namespace: "iop".into(),
        providers: t.providers,
        nodes: t.nodes,
        templates: t.templates,
        ..Default::default()
    };
    let prepared = reconcile::build(&snapshot, &settings(), Timestamp::from_second(1_793_534_400).unwrap()).unwrap();
    assert!(prepared.excluded.is_empty(), "{:?}", prepared.excluded);
    let all_conditions = prepared
        .providers
        .iter()
        .flat_map(|u| &u.status.conditions)
        .chain(prepared.nodes.iter().flat_map(|u| &u.status.conditions))
        .chain(prepared.templates.iter().flat_map(|u| &u.status.conditions));
    for c in all_conditions {
        assert_eq!(c.status, "True", "{c:?}");
    }
    let yaml = &prepared.config_map.data.as_ref().unwrap()[reconcile::CONFIG_KEY];
    let config = iop_proto::config::EdgeConfig::from_yaml(yaml).unwrap();
    assert_eq!(config, prepared.config);
    assert_eq!(config.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["studio-mac"]);
    assert_eq!(
        config.providers.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        ["studio-llama", "studio-qwen-tunnel"]
    );
    assert_eq!(config.model_index()["llama3.2"].len(), 2, "studio-qwen-tunnel is the priority-1 fallback");
    assert_eq!(config.context_fallbacks.get("qwen2.5").map(String::as_str), Some("llama3.2"));
    // studio-llama sets no queue (defaults 64 / 30000), studio-qwen-tunnel asks for 128 / 45000.
    assert_eq!((config.limits.queue_depth, config.limits.queue_timeout_ms), (128, 45_000));
    // repo-tools' stages: the defaults but for its own review prompt.
    let stages = &config.workspaces[0].stages;
    assert_eq!((stages.plan, stages.review, stages.max_repairs, stages.stage_timeout_ms), (true, true, 1, 300_000));
    assert!(stages.prompts.review.as_deref().is_some_and(|p| p.contains(r#"{"verdict":"repair""#)));
    assert_eq!(stages.prompts.plan, None);
}

fn set(doc: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = doc.pointer_mut(parent).unwrap_or_else(|| panic!("no {parent}"));
    match parent {
        Value::Object(map) => {
            map.insert(key.to_string(), value);
        }
        Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
        _ => panic!("{pointer} is not inside an object or array"),
    }
}

/// What the pure validate stage says about a typed object (None: it cannot be typed).
fn pure_verdict(doc: &Value) -> Option<Result<(), validate::Invalid>> {
    let nodes: validate::Readiness<'_> = [("studio-mac", true)].into();
    let templates: validate::Readiness<'_> = [("repo-tools", true)].into();
    Some(match doc["kind"].as_str().unwrap() {
        "Provider" => validate::provider(&serde_json::from_value(doc.clone()).ok()?, &nodes, &settings()).map(drop),
        "NodeCatalog" => validate::node_catalog(&serde_json::from_value(doc.clone()).ok()?, &templates).map(drop),
        "WorkspaceTemplate" => validate::workspace_template(&serde_json::from_value(doc.clone()).ok()?, &settings()),
        other => panic!("{other}"),
    })
}

#[test]
fn the_schema_and_the_validate_stage_reject_the_same_mistakes() {
    // (kind, name, JSON pointer, value, what the API server says)
    let cases: &[(&str, &str, &str, Value, &str)] = &[
        ("Provider", "studio-llama", "/spec/capacity", json!(0), "/spec/capacity: 0 is less than the minimum"),
        ("Provider", "studio-llama", "/spec/capacity", json!(1025), "/spec/capacity: 1025 is greater than the maximum"),
        ("Provider", "studio-llama", "/spec/adapter", json!("vllm"), "/spec/adapter: \"vllm\" is not one of"),
        ("Provider", "studio-llama", "/spec/mode", json!("raw"), "/spec/mode: \"raw\" is not one of"),
        ("Provider", "studio-llama", "/spec/responseStallTimeoutMs", json!(500), "CEL: spec.responseStallTimeoutMs"),
        ("Provider", "studio-llama", "/spec/firstByteTimeoutMs", json!(500), "CEL: spec.firstByteTimeoutMs"),
        (
            "Provider",
            "studio-llama",
            "/spec/responseStallTimeoutMs",
            json!(3_600_001),
            "CEL: spec.responseStallTimeoutMs",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/baseUrl",
            json!("http://u:pw@127.0.0.1:1"),
            "CEL: spec.target.baseUrl: must be http(s)://host[:port][/path]",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/baseUrl",
            json!("127.0.0.1:11434"),
            "CEL: spec.target.baseUrl: must be http(s)://host[:port][/path]",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/baseUrl",
            json!("http://h:1/v1?key=x"),
            "CEL: spec.target.baseUrl: must be http(s)://host[:port][/path]",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/baseUrl",
            json!("http://:11434"),
            "CEL: spec.target.baseUrl: must be http(s)://host[:port][/path]",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/baseUrl",
            json!("http://h:99999"),
            "CEL: spec.target.baseUrl: must be http(s)://host[:port][/path]",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/baseUrl",
            json!("http://h:0"),
            "CEL: spec.target.baseUrl: must be http(s)://host[:port][/path]",
        ),
        ("Provider", "studio-llama", "/spec/target/model", json!(""), "/spec/target/model: \"\" is shorter"),
        (
            "Provider",
            "studio-llama",
            "/spec/target/model",
            json!("llama\n3.2"),
            "CEL: spec.target.model: must be 1-256",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/model",
            json!("llama\u{1b}[0m"),
            "CEL: spec.target.model: must be 1-256",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/baseUrl",
            json!("http://999.999.999.999:1"),
            "CEL: spec.target.baseUrl: must be http(s)://host[:port][/path]",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/target/baseUrl",
            json!("http://127.0.0.1:1234/v1"),
            "CEL: spec.target.baseUrl: must not end in /v1",
        ),
        (
            "NodeCatalog",
            "studio-mac",
            "/spec/certificate/renewBeforeHours",
            json!(0),
            "/spec/certificate/renewBeforeHours: ",
        ),
        ("Provider", "studio-llama", "/spec/models", json!([]), "/spec/models: [] has less than 1 item"),
        ("Provider", "studio-llama", "/spec/models/0/name", json!("two words"), "/spec/models/0/name: "),
        ("Provider", "studio-llama", "/spec/node", json!("Studio_Mac"), "/spec/node: "),
        ("Provider", "studio-llama", "/spec/models/0/contextFallback", json!(""), "/spec/models/0/contextFallback: "),
        (
            "Provider",
            "studio-llama",
            "/spec/models/0/contextFallback",
            json!("two words"),
            "/spec/models/0/contextFallback: ",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/models/0/contextFallback",
            json!("x".repeat(257)),
            "/spec/models/0/contextFallback: ",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/models/0/contextFallback",
            json!("llama3.2"),
            "CEL: spec.models[0].contextFallback",
        ),
        (
            "Provider",
            "studio-llama",
            "/spec/credentialSecretRef",
            json!({"name": "s", "key": "k"}),
            "CEL: spec.credentialSecretRef",
        ),
        ("Provider", "studio-qwen-tunnel", "/spec/keepWarm", json!(true), "CEL: spec.keepWarm"),
        ("Provider", "studio-llama", "/metadata/name", json!("p".repeat(64)), "/metadata/name: "),
        ("Provider", "studio-qwen-tunnel", "/spec/queue/depth", json!(100_001), "/spec/queue/depth: 100001 is greater"),
        ("Provider", "studio-qwen-tunnel", "/spec/queue/timeoutMs", json!(0), "/spec/queue/timeoutMs: 0 is less"),
        (
            "NodeCatalog",
            "studio-mac",
            "/metadata/name",
            json!("studio.mac"),
            "CEL: .metadata.name: the name is the node identity",
        ),
        (
            "NodeCatalog",
            "studio-mac",
            "/spec/certificate/renewBeforeHours",
            json!(720),
            "CEL: spec.certificate.renewBeforeHours",
        ),
        (
            "NodeCatalog",
            "studio-mac",
            "/spec/certificate/validityHours",
            json!(0),
            "/spec/certificate/validityHours: 0 is less",
        ),
        (
            "NodeCatalog",
            "studio-mac",
            "/spec/workspaces/0/rootPath",
            json!("relative/path"),
            "/spec/workspaces/0/rootPath: ",
        ),
        ("WorkspaceTemplate", "repo-tools", "/spec/operations", json!(["read", "list"]), "CEL: spec.commands"),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/operations",
            json!(["read", "exec"]),
            "/spec/operations/1: \"exec\" is not one of",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/commands/0/argv",
            json!([]),
            "/spec/commands/0/argv: [] has less than 1 item",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/commands/0/timeoutMs",
            json!(10),
            "/spec/commands/0/timeoutMs: 10 is less",
        ),
        ("WorkspaceTemplate", "repo-tools", "/spec/envAllowlist/0", json!("1PATH"), "/spec/envAllowlist/0: "),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/limits/maxIterations",
            json!(0),
            "/spec/limits/maxIterations: 0 is less",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/limits/maxIterations",
            json!(1001),
            "/spec/limits/maxIterations: 1001 is greater",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/limits/maxConcurrentJobs",
            json!(0),
            "/spec/limits/maxConcurrentJobs: 0 is less",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/stages/maxRepairs",
            json!(11),
            "/spec/stages/maxRepairs: 11 is greater",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/stages/stageTimeoutMs",
            json!(999),
            "/spec/stages/stageTimeoutMs: 999 is less",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/stages/prompts/review",
            json!(""),
            "/spec/stages/prompts/review: \"\" is shorter",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/stages/prompts/review",
            json!(" \n "),
            "/spec/stages/prompts/review: ",
        ),
        (
            "WorkspaceTemplate",
            "repo-tools",
            "/spec/stages/prompts/plan",
            json!("x".repeat(16_385)),
            "/spec/stages/prompts/plan: ",
        ),
    ];
    for (kind, name, pointer, value, expected) in cases {
        let mut doc = example(kind, name);
        set(&mut doc, pointer, value.clone());
        let case = format!("{kind}/{name} {pointer} = {value}");
        let errors = admission_errors(&doc);
        assert!(errors.iter().any(|e| e.starts_with(expected)), "{case}: expected `{expected}...`, got {errors:?}");
        if let Some(verdict) = pure_verdict(&doc) {
            assert!(verdict.is_err(), "the validate stage accepts {case}");
        }
    }
}

#[test]
fn credentials_are_schema_valid_only_with_the_openai_adapter() {
    let mut doc = example("Provider", "studio-qwen-tunnel");
    set(&mut doc, "/spec/credentialSecretRef", json!({"name": "lmstudio", "key": "api-key"}));
    assert_eq!(admission_errors(&doc), Vec::<String>::new());
    set(&mut doc, "/spec/adapter", json!("ollama"));
    let errors = admission_errors(&doc);
    assert!(errors.iter().any(|e| e.contains("only to the openai adapter")), "{errors:?}");
}

/// Issue 29: `keepWarm` is Ollama's `keep_alive`.
#[test]
fn keep_warm_is_schema_valid_only_with_the_ollama_adapter() {
    let mut doc = example("Provider", "studio-llama");
    set(&mut doc, "/spec/keepWarm", json!(true));
    assert_eq!(admission_errors(&doc), Vec::<String>::new());
    set(&mut doc, "/spec/adapter", json!("openai"));
    let errors = admission_errors(&doc);
    assert!(errors.iter().any(|e| e.contains(iop_operator::crd::provider::KEEP_WARM_MESSAGE)), "{errors:?}");
    set(&mut doc, "/spec/keepWarm", json!(false));
    assert_eq!(admission_errors(&doc), Vec::<String>::new());
}

#[test]
fn unknown_fields_are_refused() {
    let mut doc = example("Provider", "studio-llama");
    set(&mut doc, "/spec/capcity", json!(3));
    assert_eq!(admission_errors(&doc), ["spec.capcity: unknown field"]);
    let mut doc = example("NodeCatalog", "studio-mac");
    set(&mut doc, "/spec/workspaces/0/path", json!("/x"));
    assert_eq!(admission_errors(&doc), ["spec.workspaces[0].path: unknown field"]);
}

/// The CRD's patterns and the shared checks (`iop_proto::config`) the Edge
/// and the operator apply give the same verdict, so a value the API server
/// admits is never refused later with a silent `unavailable`.
#[test]
fn the_target_patterns_agree_with_the_shared_checks() {
    let urls = [
        "http://127.0.0.1:11434",
        "http://127.0.0.1:11434/",
        "https://llm.example/openai",
        "http://localhost",
        "http://host.docker.internal:1234",
        "http://my_host:1",
        "http://h:65535/a/b%20c",
        "http://h:1/",
        "http://[::1]:8080",
        "http://[fe80::1]",
        "http://:11434",
        "http://",
        "http:///v1",
        "http://h:99999",
        "http://h:65536",
        "http://h:0",
        "http://h:080",
        "http://h:",
        "http://u:p@h:1",
        "http://h:1/?x=1",
        "http://h:1/#x",
        "http://h:1/a b",
        "http://h:1/\u{7}",
        "http://h:1/\u{85}",
        "ftp://h",
        "HTTP://h",
        "127.0.0.1:11434",
        "http://-h:1",
        "http://h-:1",
        "http://a..b:1",
        "http://a.b.:1",
        "http://h:1:2",
        "http://[::1",
        "http://[::1]x",
        "http://999.999.999.999:1",
        "http://256.0.0.1",
        "http://1.2.3:1",
        "http://1.2.3.4.5",
        "http://127.0.0.01:1",
        "http://2130706433:1",
        "http://llm.123",
        "http://0.0.0.0:1",
        "http://255.255.255.255",
        "http://10.0.0.1a",
        "http://1-2:1",
        "http://1_a",
        "http://123.example",
        "http://a.1b",
    ];
    let models =
        ["llama3.2:3b", "hf.co/org/m:Q4_K_M", "My Model", "", "llama\n", "a\tb", "x\u{7f}", "x\u{85}y", " m", "m "];
    let field = |value: &str, pointer: &str| {
        let mut doc = example("Provider", "studio-llama");
        set(&mut doc, pointer, json!(value));
        let errors = admission_errors(&doc);
        let cel = format!("CEL: {}:", pointer.trim_start_matches('/').replace('/', "."));
        errors.iter().all(|e| !e.starts_with(pointer) && !e.starts_with(&cel))
    };
    for url in urls {
        let shared = iop_proto::config::check_base_url(url);
        assert_eq!(field(url, "/spec/target/baseUrl"), shared.is_ok(), "{url:?}: shared check says {shared:?}");
    }
    for model in models {
        let shared = iop_proto::config::check_target_model(model);
        assert_eq!(field(model, "/spec/target/model"), shared.is_ok(), "{model:?}: shared check says {shared:?}");
    }
}

#[test]
fn target_fields_are_described_for_kubectl_explain() {
    let schema = schema_of("Provider");
    let target = &schema["properties"]["spec"]["properties"]["target"];
    for (name, node) in [
        ("target", target),
        ("target.model", &target["properties"]["model"]),
        ("target.baseUrl", &target["properties"]["baseUrl"]),
    ] {
        let description = node["description"].as_str().unwrap_or_default();
        assert!(!description.is_empty(), "{name} has no description");
    }
    assert!(target["properties"]["baseUrl"]["description"].as_str().unwrap().contains("Without `/v1`"));
}

/// The API server warns on every apply about formats it does not know
/// (schemars writes `uint32`/`uint64`), and prints a `pattern` in its error
/// and `<nil>` for a root rule without a field path: none of that is left.
#[test]
fn the_schemas_apply_without_warnings_and_speak_plainly() {
    fn walk(schema: &Value, path: &str, out: &mut Vec<String>) {
        match schema {
            Value::Object(map) => {
                if let Some(format) = map.get("format").and_then(Value::as_str)
                    && !["int32", "int64", "float", "double", "byte", "date", "date-time"].contains(&format)
                {
                    out.push(format!("{path}: format {format}"));
                }
                if let Some(pattern) = map.get("pattern").and_then(Value::as_str)
                    && pattern.len() > 40
                {
                    out.push(format!("{path}: a {}-character pattern an error message would print", pattern.len()));
                }
                for (k, v) in map {
                    walk(v, &format!("{path}.{k}"), out);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, path, out)),
            _ => {}
        }
    }
    for kind in ["NodeCatalog", "Provider", "WorkspaceTemplate"] {
        let schema = schema_of(kind);
        let mut problems = Vec::new();
        walk(&schema, kind, &mut problems);
        assert!(problems.is_empty(), "{problems:#?}");
        assert_eq!(schema["properties"]["metadata"]["properties"]["name"]["maxLength"], 63, "{kind}");
        for rule in schema["x-kubernetes-validations"].as_array().into_iter().flatten() {
            if rule["rule"].as_str().unwrap().contains("self.metadata.name") {
                assert_eq!(rule["fieldPath"], ".metadata.name", "{kind}: {rule}");
            }
        }
    }
    let long_name = |kind: &str, name: &str| {
        let mut doc = example(kind, name);
        set(&mut doc, "/metadata/name", json!("n".repeat(64)));
        admission_errors(&doc)
    };
    for (kind, name) in
        [("Provider", "studio-llama"), ("NodeCatalog", "studio-mac"), ("WorkspaceTemplate", "repo-tools")]
    {
        let errors = long_name(kind, name);
        assert!(errors.iter().any(|e| e.starts_with("/metadata/name: ")), "{kind}: {errors:?}");
    }
}

/// A command's limits have one set of ranges: the CRD's schema says what
/// `iop_proto::config::CommandLimits::ranges` (the Edge config's check)
/// says, field for field, and both default to the same values.
#[test]
fn command_limit_ranges_and_defaults_are_the_edge_configs() {
    let schema = schema_of("WorkspaceTemplate");
    let limits = &schema["properties"]["spec"]["properties"]["commands"]["items"]["properties"]["limits"]["properties"];
    let defaults = iop_proto::config::CommandLimits::default();
    for (field, default, min, max) in defaults.ranges() {
        let camel: String = field
            .split('_')
            .enumerate()
            .map(|(i, w)| if i == 0 { w.to_string() } else { w[..1].to_uppercase() + &w[1..] })
            .collect();
        let property = &limits[&camel];
        // The schema writes its bounds as numbers with a fraction.
        let bounds = (property["minimum"].as_f64(), property["maximum"].as_f64());
        assert_eq!(bounds, (Some(min as f64), Some(max as f64)), "{camel}");
        assert_eq!(property["default"].as_u64(), Some(default), "{camel}");
    }
    assert_eq!(iop_proto::config::CommandLimits::from(crd::workspace_template::CommandLimits::default()), defaults);
}

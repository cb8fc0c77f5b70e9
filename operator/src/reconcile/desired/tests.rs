use iop_proto::config::EdgeConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::crd::provider::QueueLimits;
use crate::reconcile::fixtures::{NS, at, node, node_with_workspace, provider, settings, snapshot, template};

fn ready_of(conditions: &[Condition]) -> (&str, &str) {
    let c = conditions.iter().find(|c| c.type_ == READY).expect("a Ready condition");
    (c.status.as_str(), c.reason.as_str())
}

fn provider_ready<'a>(p: &'a Prepared, name: &str) -> (&'a str, &'a str) {
    ready_of(&p.providers.iter().find(|u| u.name == name).unwrap().status.conditions)
}

#[test]
fn renders_one_valid_config_map_from_the_namespace() {
    let s = snapshot(
        vec![provider("b-provider", "mac-1"), provider("a-provider", "mac-2")],
        vec![node("mac-2"), node("mac-1")],
        vec![],
    );
    let prepared = build(&s, &settings(), at(1000)).unwrap();

    // Sorted by name whatever the read order, so unchanged objects render byte-identical configs.
    assert_eq!(prepared.config.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["mac-1", "mac-2"]);
    assert_eq!(
        prepared.config.providers.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        ["a-provider", "b-provider"]
    );
    assert_eq!(prepared.config.trust_domain, "iop.example");
    assert_eq!(prepared.config.tls.ca_file, std::path::Path::new("/etc/iop/tls/ca.pem"));
    assert_eq!(prepared.config.tls.cert_file, std::path::Path::new("/etc/iop/tls/edge.pem"));
    assert_eq!(prepared.config.tls.key_file, std::path::Path::new("/etc/iop/tls/edge-key.pem"));
    assert!(prepared.excluded.is_empty());

    let cm = &prepared.config_map;
    assert_eq!(cm.metadata.name.as_deref(), Some(CONFIG_MAP_NAME));
    assert_eq!(cm.metadata.namespace.as_deref(), Some(NS));
    let yaml = &cm.data.as_ref().unwrap()[CONFIG_KEY];
    assert_eq!(
        EdgeConfig::from_yaml(yaml).unwrap(),
        prepared.config,
        "the ConfigMap holds the config the Edge will load"
    );

    // No owner references: changing them would need `delete` on it
    // (OwnerReferencesPermissionEnforcement), a right the operator does not hold.
    assert!(cm.metadata.owner_references.is_none());

    let shuffled = snapshot(
        vec![provider("a-provider", "mac-2"), provider("b-provider", "mac-1")],
        vec![node("mac-1"), node("mac-2")],
        vec![],
    );
    assert_eq!(build(&shuffled, &settings(), at(1000)).unwrap(), prepared);
}

#[test]
fn managed_credentials_go_to_their_own_secret_never_to_the_config_map() {
    use crate::crd::provider::{Adapter, SecretKeyRef};
    let keyed = |name: &str, secret: &str| {
        let mut p = provider(name, "mac-1");
        p.spec.adapter = Adapter::Openai;
        p.spec.credential_secret_ref = Some(SecretKeyRef { name: secret.into(), key: "api-key".into() });
        p
    };
    let mut s = snapshot(vec![keyed("keyed", "lmstudio"), keyed("orphan", "nope")], vec![node("mac-1")], vec![]);
    s.secrets.insert("lmstudio".into(), credential_secret(true, b"sk-secret-1"));
    let prepared = build(&s, &settings(), at(1000)).unwrap();

    assert_eq!(prepared.config.providers.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["keyed"]);
    assert_eq!(prepared.config.providers[0].credential.as_ref().unwrap().profile, "keyed");
    let profile = &prepared.config.credentials[0];
    assert_eq!((profile.profile.as_str(), profile.revision), ("keyed", 1000), "a new profile: the time");
    assert_eq!(profile.file, std::path::Path::new("/etc/iop/credentials/keyed"));
    assert_eq!(provider_ready(&prepared, "orphan"), ("False", "CredentialSecretMissing"));
    let yaml = &prepared.config_map.data.as_ref().unwrap()[CONFIG_KEY];
    assert!(!yaml.contains("sk-secret-1"), "the key never reaches the ConfigMap");
    let stored = prepared.credentials.data.as_ref().unwrap();
    assert_eq!(stored["keyed"].0, b"sk-secret-1");
    assert_eq!(prepared.credentials.metadata.name.as_deref(), Some("iop-edge-credentials"));

    // Rotated in the referenced Secret: the same profile, a later revision.
    s.edge_credentials = Some(prepared.credentials.clone());
    s.edge_config_map = Some(prepared.config_map.clone());
    s.secrets.insert("lmstudio".into(), credential_secret(true, b"sk-secret-2"));
    let rotated = build(&s, &settings(), at(1000)).unwrap();
    assert_eq!(rotated.config.credentials[0].revision, 1001, "one more, even within the same second");

    // Issue 43 D1: `iop-edge-credentials` deleted; the revision still goes
    // up (the Edge config remembers it), never back to a first one.
    s.edge_credentials = None;
    s.edge_config_map = Some(rotated.config_map.clone());
    assert_eq!(build(&s, &settings(), at(1000)).unwrap().config.credentials[0].revision, 1002);
}

/// A Secret with `api-key`, labelled `iop.dev/credential: "true"` or not.
fn credential_secret(labelled: bool, value: &[u8]) -> k8s_openapi::api::core::v1::Secret {
    use k8s_openapi::ByteString;
    let labels = labelled.then(|| [(credentials::CREDENTIAL_LABEL.to_string(), "true".to_string())].into());
    k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta { name: Some("s".into()), labels, ..Default::default() },
        data: Some([("api-key".to_string(), ByteString(value.to_vec()))].into()),
        ..Default::default()
    }
}

#[test]
fn an_unlabelled_secret_or_a_bad_value_is_never_copied_and_only_its_provider_is_left_out() {
    use crate::crd::provider::{Adapter, SecretKeyRef};
    let keyed = |name: &str, secret: &str| {
        let mut p = provider(name, "mac-1");
        p.spec.adapter = Adapter::Openai;
        p.spec.credential_secret_ref = Some(SecretKeyRef { name: secret.into(), key: "api-key".into() });
        p
    };
    let mut s = snapshot(
        vec![
            keyed("good", "ours"),
            // Another team's key: a Provider author must not receive it at their own baseUrl.
            keyed("thief", "other-team"),
            keyed("spaced", "bad-space"),
            keyed("control", "bad-control"),
            keyed("too-long", "bad-long"),
            provider("plain", "mac-1"),
        ],
        vec![node("mac-1")],
        vec![],
    );
    s.secrets.insert("ours".into(), credential_secret(true, b"sk-ours\n"));
    s.secrets.insert("other-team".into(), credential_secret(false, b"sk-other-team"));
    s.secrets.insert("bad-space".into(), credential_secret(true, b"sk secret-space"));
    s.secrets.insert("bad-control".into(), credential_secret(true, b"sk-\x1bsecret-control"));
    let long = vec![b'k'; iop_proto::lease::MAX_CREDENTIAL_BYTES + 1];
    s.secrets.insert("bad-long".into(), credential_secret(true, &long));
    let prepared = build(&s, &settings(), at(1000)).unwrap();

    let ids: Vec<&str> = prepared.config.providers.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["good", "plain"], "everything else reconciles");
    let stored = prepared.credentials.data.as_ref().unwrap();
    assert_eq!(stored.keys().collect::<Vec<_>>(), ["good"], "only the usable value is copied");
    assert_eq!(stored["good"].0, b"sk-ours", "as the Edge loads it: trimmed");
    assert_eq!(prepared.config.credentials.iter().map(|c| c.profile.as_str()).collect::<Vec<_>>(), ["good"]);

    assert_eq!(provider_ready(&prepared, "thief"), ("False", "SecretNotLabelled"));
    for name in ["spaced", "control", "too-long"] {
        assert_eq!(provider_ready(&prepared, name), ("False", "InvalidCredentialValue"), "{name}");
    }
    let message = |name: &str| {
        let u = prepared.providers.iter().find(|u| u.name == name).unwrap();
        u.status.conditions.iter().find(|c| c.type_ == READY).unwrap().message.clone()
    };
    assert!(message("thief").contains("Secret `other-team` is not labelled `iop.dev/credential: \"true\"`"));
    assert!(message("spaced").contains("Secret `bad-space` key `api-key`: the value must be printable ASCII"));
    assert!(message("too-long").contains("longer than 8192 bytes"));
    // No message, log field or condition carries a value.
    let everything = format!("{:?}", (&prepared.providers, &prepared.excluded, &prepared.config_map));
    for secret in ["sk-other-team", "secret-space", "secret-control", "sk-ours"] {
        assert!(!everything.contains(secret), "{secret} leaked");
    }
}

#[test]
fn one_bad_object_never_breaks_the_others() {
    let mut bad_capacity = provider("bad-capacity", "mac-1");
    bad_capacity.spec.capacity = 0;
    let s = snapshot(
        vec![
            provider("good", "mac-1"),
            bad_capacity,
            provider("orphan", "no-such-node"),
            provider("on-bad-node", "Bad.Node"),
        ],
        vec![node("mac-1"), node("Bad.Node")],
        vec![],
    );
    let prepared = build(&s, &settings(), at(1000)).unwrap();
    assert_eq!(prepared.config.providers.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["good"]);
    assert_eq!(prepared.config.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["mac-1"]);

    assert_eq!(provider_ready(&prepared, "good"), ("True", "Accepted"));
    assert_eq!(provider_ready(&prepared, "bad-capacity"), ("False", "InvalidSpec"));
    assert_eq!(provider_ready(&prepared, "orphan"), ("False", "NodeNotFound"));
    assert_eq!(provider_ready(&prepared, "on-bad-node"), ("False", "InvalidSpec"), "spec.node breaks the name rule");
    let bad_node = prepared.nodes.iter().find(|u| u.name == "Bad.Node").unwrap();
    assert_eq!(ready_of(&bad_node.status.conditions), ("False", "InvalidName"));

    let excluded: Vec<(&str, &str, Reason)> =
        prepared.excluded.iter().map(|e| (e.kind, e.name.as_str(), e.reason)).collect();
    assert_eq!(
        excluded,
        [
            ("NodeCatalog", "Bad.Node", Reason::InvalidName),
            ("Provider", "bad-capacity", Reason::InvalidSpec),
            ("Provider", "on-bad-node", Reason::InvalidSpec),
            ("Provider", "orphan", Reason::NodeNotFound),
        ]
    );
}

#[test]
fn a_provider_on_an_invalid_node_is_not_ready() {
    let mut n = node("mac-1");
    n.spec.certificate.renew_before_hours = 10_000;
    let prepared = build(&snapshot(vec![provider("p", "mac-1")], vec![n], vec![]), &settings(), at(1)).unwrap();
    assert_eq!(provider_ready(&prepared, "p"), ("False", "NodeNotReady"));
    assert!(prepared.config.nodes.is_empty() && prepared.config.providers.is_empty());
}

#[test]
fn deleting_a_node_removes_its_identity_and_its_providers() {
    let mut leaving = node("mac-1");
    leaving.metadata.deletion_timestamp = Some(Time(at(50)));
    let s = snapshot(vec![provider("p1", "mac-1"), provider("p2", "mac-2")], vec![leaving, node("mac-2")], vec![]);
    let prepared = build(&s, &settings(), at(100)).unwrap();
    assert_eq!(prepared.config.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["mac-2"]);
    assert_eq!(prepared.config.providers.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["p2"]);
    assert_eq!(provider_ready(&prepared, "p1"), ("False", "NodeNotFound"));
    let n = prepared.nodes.iter().find(|u| u.name == "mac-1").unwrap();
    assert_eq!(ready_of(&n.status.conditions), ("False", "Deleting"));
}

#[test]
fn conditions_keep_their_transition_time_until_the_status_flips() {
    let s = snapshot(vec![provider("p", "mac-1")], vec![], vec![]);
    let first = build(&s, &settings(), at(100)).unwrap();
    let c = &first.providers[0].status.conditions[0];
    assert_eq!((c.status.as_str(), c.last_transition_time.clone()), ("False", Time(at(100))));
    assert_eq!(c.observed_generation, Some(1));
    assert_eq!(first.providers[0].status.observed_generation, Some(1));

    // The status written last time is read back; still not ready, for the same reason.
    let mut p = provider("p", "mac-1");
    p.status = Some(first.providers[0].status.clone());
    p.metadata.generation = Some(2);
    let again = build(&snapshot(vec![p.clone()], vec![], vec![]), &settings(), at(200)).unwrap();
    let c = &again.providers[0].status.conditions[0];
    assert_eq!(
        (c.status.as_str(), c.last_transition_time.clone(), c.observed_generation),
        ("False", Time(at(100)), Some(2))
    );

    // Its node appears: Ready flips to True at 300.
    let flipped = build(&snapshot(vec![p], vec![node("mac-1")], vec![]), &settings(), at(300)).unwrap();
    let c = &flipped.providers[0].status.conditions[0];
    assert_eq!((c.status.as_str(), c.last_transition_time.clone()), ("True", Time(at(300))));
}

#[test]
fn only_the_fields_reconcile_owns_are_in_the_status_updates() {
    let prepared =
        build(&snapshot(vec![provider("p", "mac-1")], vec![node("mac-1")], vec![]), &settings(), at(1)).unwrap();
    let status = &prepared.providers[0].status;
    assert!(status.health.is_none() && status.classification.is_none() && status.generation.is_none());
    let json = serde_json::to_value(status).unwrap();
    assert_eq!(
        json.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["conditions", "observedGeneration", "publicModels"]
    );
    let node = &prepared.nodes[0].status;
    assert!(node.connected.is_none() && node.certificate.is_none());
}

/// `kubectl get providers -o wide` shows every public name (a printer
/// column on `.spec.models[*].name` showed only the first).
#[test]
fn public_models_are_every_name_comma_joined_in_spec_order() {
    let mut p = provider("p", "mac-1");
    p.spec.models = ["llama3.2", "llama", "default"]
        .iter()
        .enumerate()
        .map(|(i, n)| crate::crd::provider::PublicModel {
            name: n.to_string(),
            priority: i as u32,
            context_fallback: None,
        })
        .collect();
    // Invalid or not, the names are what the spec says.
    for nodes in [vec![node("mac-1")], vec![]] {
        let prepared = build(&snapshot(vec![p.clone()], nodes, vec![]), &settings(), at(1)).unwrap();
        assert_eq!(prepared.providers[0].status.public_models.as_deref(), Some("llama3.2,llama,default"));
    }
}

/// The problems [`node_workspaces`] reports for node `name`: the first
/// problem's reason (`""` without one), every message, the assigned refs.
fn workspaces_of(s: &Snapshot, name: &str) -> (String, String, Vec<String>) {
    let all = node_workspaces(s, &settings());
    let w = all.get(name).unwrap_or_else(|| panic!("{name} is rendered"));
    let reason = w.problems.first().map_or("", |p| p.reason.as_str()).to_string();
    let messages = w.problems.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; ");
    (reason, messages, w.assigned.clone())
}

#[test]
fn workspace_problems_are_reported_without_taking_the_node_out() {
    let mut bad_template = template("broken");
    bad_template.spec.commands.clear();
    let s = snapshot(
        vec![provider("p", "mac-1")],
        vec![
            node_with_workspace("mac-1", "broken"),
            node_with_workspace("mac-2", "tools"),
            node_with_workspace("mac-3", "absent"),
        ],
        vec![bad_template, template("tools")],
    );
    let prepared = build(&s, &settings(), at(1)).unwrap();
    assert_eq!(prepared.config.nodes.len(), 3);
    assert_eq!(provider_ready(&prepared, "p"), ("True", "Accepted"));
    for n in &prepared.nodes {
        // `WorkspacesReady` is the status mirror's.
        assert_eq!(n.status.conditions.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["Ready"]);
        assert_eq!(ready_of(&n.status.conditions), ("True", "Accepted"));
    }
    let reason = |name: &str| workspaces_of(&s, name).0;
    assert_eq!(reason("mac-1"), "TemplateNotReady");
    assert_eq!(reason("mac-2"), "");
    assert_eq!(workspaces_of(&s, "mac-2").2, ["site"]);
    assert_eq!(reason("mac-3"), "TemplateNotFound");
    assert!(workspaces_of(&s, "mac-3").2.is_empty());
    let t = prepared.templates.iter().find(|u| u.name == "broken").unwrap();
    assert_eq!(ready_of(&t.status.conditions), ("False", "InvalidSpec"));

    let mut leaving = template("tools");
    leaving.metadata.deletion_timestamp = Some(Time(at(1)));
    let s = snapshot(vec![], vec![node_with_workspace("mac-2", "tools")], vec![leaving]);
    assert_eq!(workspaces_of(&s, "mac-2").0, "TemplateNotFound");

    // A node left out of the config has no workspaces to report.
    let s = snapshot(vec![], vec![node_with_workspace("Bad_Name", "tools")], vec![template("tools")]);
    assert!(node_workspaces(&s, &settings()).is_empty());
}

#[test]
fn a_template_with_invalid_stages_is_not_ready_and_its_workspaces_stay_out() {
    let mut bad = template("tools");
    bad.spec.stages.max_repairs = 11;
    let s = snapshot(vec![], vec![node_with_workspace("mac-1", "tools")], vec![bad]);
    let prepared = build(&s, &settings(), at(1)).unwrap();
    assert!(prepared.config.workspaces.is_empty());
    let t = &prepared.templates[0].status.conditions;
    assert_eq!(ready_of(t), ("False", "InvalidSpec"));
    let message = &t.iter().find(|c| c.type_ == "Ready").unwrap().message;
    assert!(message.contains("spec.stages.maxRepairs"), "{message}");
    assert_eq!(workspaces_of(&s, "mac-1").0, "TemplateNotReady");

    let mut good = template("tools");
    good.spec.stages.review = false;
    good.spec.stages.prompts.work = Some("Keep changes small.".into());
    let s = snapshot(vec![], vec![node_with_workspace("mac-1", "tools")], vec![good]);
    let prepared = build(&s, &settings(), at(1)).unwrap();
    let stages = &prepared.config.workspaces[0].stages;
    assert!(!stages.review && stages.plan);
    assert_eq!(stages.prompts.work.as_deref(), Some("Keep changes small."));
    // What the Edge reads back from the ConfigMap.
    let yaml = &prepared.config_map.data.as_ref().unwrap()[CONFIG_KEY];
    assert_eq!(&EdgeConfig::from_yaml(yaml).unwrap().workspaces[0].stages, stages);
}

#[test]
fn workspaces_with_ready_templates_are_rendered_with_the_edges_own_rules() {
    let mut dotted = node_with_workspace("mac-3", "tools");
    dotted.spec.workspaces[0].reference = "other".into();
    dotted.spec.workspaces[0].root_path = "/Users/../etc".into();
    let s = snapshot(
        vec![],
        vec![node_with_workspace("mac-2", "tools"), node_with_workspace("mac-1", "tools"), dotted],
        vec![template("tools")],
    );
    let prepared = build(&s, &settings(), at(1)).unwrap();
    assert_eq!(prepared.config.workspaces.len(), 1, "{:?}", prepared.config.workspaces);
    let w = &prepared.config.workspaces[0];
    assert_eq!((w.reference.as_str(), w.node.as_str(), w.root.as_str()), ("site", "mac-1", "/Users/dev/site"));
    use iop_proto::config::WorkspaceOperation as Op;
    assert_eq!(w.operations, [Op::Read, Op::List, Op::Command]);
    assert_eq!((w.commands[0].id.as_str(), w.commands[0].argv.len()), ("git-status", 2));
    assert_eq!(w.env_allowlist, ["PATH"]);
    let (reason, message, assigned) = workspaces_of(&s, "mac-2");
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("already used by another NodeCatalog"), "{message}");
    assert!(assigned.is_empty());
    let (reason, message, _) = workspaces_of(&s, "mac-3");
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("root"), "{message}");
    assert_eq!(workspaces_of(&s, "mac-1"), (String::new(), String::new(), vec!["site".to_string()]));
}

#[test]
fn edge_queue_limits_are_the_largest_any_valid_provider_asks_for() {
    let defaults = settings().limits;
    let with_queue = |name: &str, depth: Option<u32>, timeout_ms: Option<u64>| {
        let mut p = provider(name, "mac-1");
        p.spec.queue = Some(QueueLimits { depth, timeout_ms });
        p
    };
    let limits =
        |providers| build(&snapshot(providers, vec![node("mac-1")], vec![]), &settings(), at(1)).unwrap().config.limits;

    // No provider: the operator defaults.
    assert_eq!(limits(vec![]), defaults);
    // A provider that sets nothing counts with the defaults, so a smaller ask cannot lower them.
    let l = limits(vec![provider("plain", "mac-1"), with_queue("small", Some(8), Some(1_000))]);
    assert_eq!((l.queue_depth, l.queue_timeout_ms), (defaults.queue_depth, defaults.queue_timeout_ms));
    // Alone, a provider's own values apply, even below the defaults.
    let l = limits(vec![with_queue("small", Some(8), Some(1_000))]);
    assert_eq!((l.queue_depth, l.queue_timeout_ms), (8, 1_000));
    // Each limit is maximised on its own.
    let l = limits(vec![with_queue("deep", Some(500), Some(1_000)), with_queue("patient", Some(8), Some(90_000))]);
    assert_eq!((l.queue_depth, l.queue_timeout_ms), (500, 90_000));
    assert_eq!(l.max_body_bytes, defaults.max_body_bytes);
    // An invalid provider does not count.
    let mut invalid = with_queue("invalid", Some(9_999), Some(99_999));
    invalid.spec.capacity = 0;
    let l = limits(vec![with_queue("small", Some(8), Some(1_000)), invalid]);
    assert_eq!((l.queue_depth, l.queue_timeout_ms), (8, 1_000));
}

#[test]
fn invalid_settings_stop_the_build() {
    let mut bad = settings();
    bad.trust_domain = "Not A Domain".into();
    let err = build(&snapshot(vec![], vec![node("mac-1")], vec![]), &bad, at(1)).unwrap_err();
    assert!(matches!(err, BuildError::Settings(_)), "{err}");
}

#[test]
fn an_empty_namespace_renders_an_empty_config_without_owners() {
    let prepared = build(&snapshot(vec![], vec![], vec![]), &settings(), at(1)).unwrap();
    assert!(prepared.config.nodes.is_empty() && prepared.config.providers.is_empty());
    assert!(prepared.config_map.metadata.owner_references.is_none());
    EdgeConfig::from_yaml(&prepared.config_map.data.unwrap()[CONFIG_KEY]).unwrap();
}

#[test]
fn the_edge_pods_are_the_rendered_replicas() {
    let mut s = snapshot(vec![provider("a", "mac-1")], vec![node("mac-1")], vec![]);
    let none = build(&s, &settings(), at(1)).unwrap();
    assert!(none.config.replicas.is_empty(), "no Edge pod yet: one replica, whatever its id");
    assert!(!none.config_map.data.as_ref().unwrap()[CONFIG_KEY].contains("replicas"));

    // One pod is listed too; the ConfigMap carries what the Edge will load.
    for ids in [vec!["iop-edge-7d9f-abc12"], vec!["iop-edge-7d9f-abc12", "iop-edge-7d9f-def34"]] {
        s.replicas = ids.iter().map(|s| s.to_string()).collect();
        let prepared = build(&s, &settings(), at(1)).unwrap();
        assert_eq!(prepared.config.replicas, ids);
        let yaml = &prepared.config_map.data.as_ref().unwrap()[CONFIG_KEY];
        assert_eq!(EdgeConfig::from_yaml(yaml).unwrap().replicas, ids);
    }
}

/// A provider on `node` serving `models`, each `(public name, contextFallback)`.
fn serving(name: &str, node: &str, models: &[(&str, Option<&str>)]) -> crate::crd::Provider {
    let mut p = provider(name, node);
    p.spec.models = models
        .iter()
        .map(|(m, to)| crate::crd::provider::PublicModel {
            name: m.to_string(),
            priority: 0,
            context_fallback: to.map(str::to_string),
        })
        .collect();
    p
}

fn fallbacks_condition<'a>(p: &'a Prepared, name: &str) -> Option<(&'a str, &'a str, &'a str)> {
    let u = p.providers.iter().find(|u| u.name == name).unwrap();
    let c = u.status.conditions.iter().find(|c| c.type_ == CONTEXT_FALLBACKS_READY)?;
    Some((c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

fn fallbacks_of(p: &Prepared) -> Vec<(&str, &str)> {
    p.config.context_fallbacks.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[test]
fn a_context_fallback_is_rendered_for_the_public_model_of_every_provider() {
    let s = snapshot(
        vec![
            serving("small", "mac-1", &[("llama3.2", Some("llama-long"))]),
            // Also serves llama3.2, sets no fallback: the route's applies to it too.
            serving("large", "mac-1", &[("llama-long", None), ("llama3.2", None)]),
        ],
        vec![node("mac-1")],
        vec![],
    );
    let prepared = build(&s, &settings(), at(1)).unwrap();
    assert_eq!(fallbacks_of(&prepared), [("llama3.2", "llama-long")]);
    assert_eq!(fallbacks_condition(&prepared, "small"), Some(("True", "Accepted", "rendered into the Edge config")));
    assert_eq!(fallbacks_condition(&prepared, "large"), None, "written only where a fallback is set");
    assert_eq!(provider_ready(&prepared, "small"), ("True", "Accepted"));
    let yaml = &prepared.config_map.data.as_ref().unwrap()[crate::reconcile::CONFIG_KEY];
    assert_eq!(EdgeConfig::from_yaml(yaml).unwrap().context_fallbacks, prepared.config.context_fallbacks);
}

#[test]
fn a_context_fallback_to_no_rendered_public_model_is_reported_and_not_rendered() {
    let s = snapshot(
        vec![
            serving("typo", "mac-1", &[("llama3.2", None), ("qwen", Some("no-such-model"))]),
            // `llama-long` exists, but only on a provider left out of the config.
            serving("to-absent", "mac-1", &[("mistral", Some("llama-long"))]),
            serving("orphan", "no-such-node", &[("llama-long", None)]),
        ],
        vec![node("mac-1")],
        vec![],
    );
    let prepared = build(&s, &settings(), at(1)).unwrap();
    assert!(prepared.config.context_fallbacks.is_empty());
    let (status, reason, message) = fallbacks_condition(&prepared, "typo").unwrap();
    assert_eq!((status, reason), ("False", "ContextFallbackNotFound"));
    assert!(message.starts_with("spec.models[1].contextFallback: `no-such-model`"), "{message}");
    assert_eq!(fallbacks_condition(&prepared, "to-absent").unwrap().1, "ContextFallbackNotFound");
    assert_eq!(fallbacks_condition(&prepared, "orphan"), None, "not rendered: no fallback condition");
    // The providers themselves stay in.
    assert_eq!(provider_ready(&prepared, "typo"), ("True", "Accepted"));
    assert_eq!(provider_ready(&prepared, "to-absent"), ("True", "Accepted"));
    assert_eq!(prepared.excluded.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["orphan"]);
}

#[test]
fn a_context_fallback_to_the_model_itself_is_an_invalid_spec() {
    // The CRD's CEL rule refuses it; an object stored before the rule was
    // is refused the same way here.
    let s = snapshot(
        vec![serving("p", "mac-1", &[("llama3.2", Some("llama3.2")), ("llama-long", None)])],
        vec![node("mac-1")],
        vec![],
    );
    let prepared = build(&s, &settings(), at(1)).unwrap();
    assert!(prepared.config.context_fallbacks.is_empty());
    assert!(prepared.config.providers.is_empty());
    assert_eq!(provider_ready(&prepared, "p"), ("False", "InvalidSpec"));
}

#[test]
fn providers_naming_different_context_fallbacks_for_one_model_render_neither() {
    let s = snapshot(
        vec![
            serving("a", "mac-1", &[("llama3.2", Some("llama-long"))]),
            serving("b", "mac-1", &[("llama3.2", Some("qwen-long"))]),
            // Agrees with `a`, but the model's fallback is still contested.
            serving("c", "mac-1", &[("llama3.2", Some("llama-long"))]),
            // An uncontested fallback of another model is still rendered.
            serving("d", "mac-1", &[("llama-long", Some("qwen-long")), ("qwen-long", None)]),
        ],
        vec![node("mac-1")],
        vec![],
    );
    let prepared = build(&s, &settings(), at(1)).unwrap();
    assert_eq!(fallbacks_of(&prepared), [("llama-long", "qwen-long")]);
    for name in ["a", "b", "c"] {
        let (status, reason, message) = fallbacks_condition(&prepared, name).unwrap();
        assert_eq!((status, reason), ("False", "ContextFallbackConflict"), "{name}");
        assert!(
            message.starts_with("spec.models[0].contextFallback:")
                && message.contains("`llama-long` (`a`, `c`), `qwen-long` (`b`)"),
            "{name}: {message}"
        );
        assert_eq!(provider_ready(&prepared, name), ("True", "Accepted"));
    }
    assert_eq!(fallbacks_condition(&prepared, "d").unwrap().0, "True");
}

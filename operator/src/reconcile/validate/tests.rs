use iop_proto::config::MAX_STAGE_PROMPT_BYTES;
use serde_json::json;

use super::*;
use crate::crd::provider::{Adapter, QueueLimits, SecretKeyRef};
use crate::crd::workspace_template::{StagePrompts as CrdPrompts, WorkspaceStages as CrdStages};
use crate::reconcile::fixtures::{node, node_with_workspace, provider, settings, template};
use crate::reconcile::validate;

type Mutation<T> = Box<dyn Fn(&mut T)>;

fn ready_nodes<'a>(names: &[(&'a str, bool)]) -> Readiness<'a> {
    names.iter().copied().collect()
}

fn reason_of<T: std::fmt::Debug>(r: Result<T, Invalid>) -> Reason {
    r.expect_err("expected the object to be invalid").reason
}

#[test]
fn a_valid_provider_becomes_its_edge_entry() {
    let mut p = provider("studio-llama", "studio-mac");
    p.spec.mode = crate::crd::provider::ProviderMode::Tunnel;
    p.spec.response_stall_timeout_ms = 120_000;
    p.spec.first_byte_timeout_ms = 90_000;
    let entry = validate::provider(&p, &ready_nodes(&[("studio-mac", true)]), &settings()).unwrap();
    assert_eq!(entry.id, "studio-llama");
    assert_eq!(entry.node, "studio-mac");
    assert_eq!(entry.adapter, iop_proto::config::Adapter::Ollama);
    assert_eq!(entry.mode, iop_proto::config::ProviderMode::Tunnel);
    assert_eq!(entry.response_stall_timeout_ms, 120_000);
    assert_eq!(entry.first_byte_timeout_ms, 90_000);
    assert_eq!(entry.capacity, 4);
    assert_eq!(entry.models[0].name, "llama3.2");
    assert_eq!(entry.continuation, None, "unset: as the node detects the server");
    p.spec.continuation = Some(false);
    let entry = validate::provider(&p, &ready_nodes(&[("studio-mac", true)]), &settings()).unwrap();
    assert_eq!(entry.continuation, Some(false), "turned off by the spec");
}

#[test]
fn provider_node_references_are_checked() {
    let p = provider("p", "studio-mac");
    assert_eq!(reason_of(validate::provider(&p, &ready_nodes(&[]), &settings())), Reason::NodeNotFound);
    assert_eq!(
        reason_of(validate::provider(&p, &ready_nodes(&[("studio-mac", false)]), &settings())),
        Reason::NodeNotReady
    );
}

#[test]
fn provider_spec_errors_name_the_crd_field() {
    let nodes = ready_nodes(&[("studio-mac", true)]);
    let cases: Vec<(Mutation<Provider>, Reason, &str)> = vec![
        (Box::new(|p| p.spec.capacity = 0), Reason::InvalidSpec, "spec.capacity:"),
        (Box::new(|p| p.spec.capacity = 1025), Reason::InvalidSpec, "spec.capacity:"),
        (Box::new(|p| p.spec.response_stall_timeout_ms = 999), Reason::InvalidSpec, "spec.responseStallTimeoutMs:"),
        (Box::new(|p| p.spec.first_byte_timeout_ms = 999), Reason::InvalidSpec, "spec.firstByteTimeoutMs:"),
        (Box::new(|p| p.spec.target.base_url = "ftp://x".into()), Reason::InvalidSpec, "spec.target.baseUrl:"),
        // Stored before the CRD's `/v1` rule (issue 43 item 6).
        (
            Box::new(|p| p.spec.target.base_url = "http://127.0.0.1:1234/v1/".into()),
            Reason::InvalidSpec,
            "spec.target.baseUrl: must not end in /v1",
        ),
        (
            Box::new(|p| p.spec.target.base_url = "http://u:pw@h:1".into()),
            Reason::InvalidSpec,
            "spec.target.baseUrl: must not carry credentials",
        ),
        (
            Box::new(|p| p.spec.target.base_url = "http://h/v1?x=1".into()),
            Reason::InvalidSpec,
            "spec.target.baseUrl: must not have a query",
        ),
        (
            Box::new(|p| p.spec.target.base_url = "http://:11434".into()),
            Reason::InvalidSpec,
            "spec.target.baseUrl: must name a host",
        ),
        (
            Box::new(|p| p.spec.target.base_url = "http://127.0.0.1:99999".into()),
            Reason::InvalidSpec,
            "spec.target.baseUrl: port must be between 1 and 65535",
        ),
        (
            Box::new(|p| p.spec.target.base_url = "http://127.0.0.1:0".into()),
            Reason::InvalidSpec,
            "spec.target.baseUrl: port must be between 1 and 65535",
        ),
        (Box::new(|p| p.spec.target.model = String::new()), Reason::InvalidSpec, "spec.target.model:"),
        (
            Box::new(|p| p.spec.target.model = "llama3.2\n".into()),
            Reason::InvalidSpec,
            "spec.target.model: must not contain control characters",
        ),
        (Box::new(|p| p.spec.models.clear()), Reason::InvalidSpec, "spec.models:"),
        (Box::new(|p| p.spec.models[0].name = "two words".into()), Reason::InvalidSpec, "spec.models[0].name:"),
        (
            Box::new(|p| p.spec.models.push(p.spec.models[0].clone())),
            Reason::InvalidSpec,
            "spec.models[1].name: duplicate",
        ),
        (
            Box::new(|p| p.spec.queue = Some(QueueLimits { depth: Some(100_001), timeout_ms: None })),
            Reason::InvalidSpec,
            "spec.queue.depth:",
        ),
        (
            Box::new(|p| p.spec.queue = Some(QueueLimits { depth: None, timeout_ms: Some(0) })),
            Reason::InvalidSpec,
            "spec.queue.timeoutMs:",
        ),
        (Box::new(|p| p.spec.node = "Studio_Mac".into()), Reason::InvalidSpec, "spec.node:"),
        (Box::new(|p| p.metadata.name = Some("x".repeat(64))), Reason::InvalidName, "metadata.name:"),
    ];
    for (i, (mutate, reason, prefix)) in cases.into_iter().enumerate() {
        let mut p = provider("p", "studio-mac");
        mutate(&mut p);
        let err = validate::provider(&p, &nodes, &settings()).expect_err(&format!("case {i} should fail"));
        assert_eq!(err.reason, reason, "case {i}: {err}");
        assert!(err.message.starts_with(prefix), "case {i}: `{}` should start with `{prefix}`", err.message);
    }
}

#[test]
fn a_credential_secret_ref_becomes_the_providers_own_profile() {
    let mut p = provider("p", "studio-mac");
    p.spec.adapter = Adapter::Openai;
    p.spec.credential_secret_ref = Some(SecretKeyRef { name: "openai".into(), key: "api-key".into() });
    let nodes = ready_nodes(&[("studio-mac", true)]);
    let entry = validate::provider(&p, &nodes, &settings()).unwrap();
    assert_eq!(entry.credential.unwrap().profile, "p");
}

/// Issue 29: `keepWarm` reaches the Edge entry, and only on an Ollama
/// provider (the CRD's CEL rule, restated for objects admitted before it).
#[test]
fn keep_warm_is_carried_for_ollama_and_refused_elsewhere() {
    let nodes = ready_nodes(&[("studio-mac", true)]);
    let mut p = provider("p", "studio-mac");
    assert!(!validate::provider(&p, &nodes, &settings()).unwrap().keep_warm, "off by default");
    p.spec.keep_warm = true;
    assert!(validate::provider(&p, &nodes, &settings()).unwrap().keep_warm);
    p.spec.adapter = Adapter::Openai;
    let err = validate::provider(&p, &nodes, &settings()).unwrap_err();
    assert_eq!(err.reason, Reason::InvalidSpec);
    assert_eq!(err.message, "spec.keepWarm: applies only to the ollama adapter (Ollama's keep_alive)");
    p.spec.keep_warm = false;
    assert!(validate::provider(&p, &nodes, &settings()).is_ok());
}

#[test]
fn objects_being_deleted_are_out() {
    let deleting = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::reconcile::fixtures::at(1)));
    let mut p = provider("p", "studio-mac");
    p.metadata.deletion_timestamp = deleting.clone();
    assert_eq!(reason_of(validate::provider(&p, &ready_nodes(&[("studio-mac", true)]), &settings())), Reason::Deleting);
    let mut n = node("studio-mac");
    n.metadata.deletion_timestamp = deleting.clone();
    assert_eq!(reason_of(validate::node_catalog(&n, &Readiness::new())), Reason::Deleting);
    let mut t = template("tools");
    t.metadata.deletion_timestamp = deleting;
    assert_eq!(reason_of(validate::workspace_template(&t, &settings())), Reason::Deleting);
}

#[test]
fn node_names_must_be_identities() {
    for bad in ["mac.studio", "Mac", "-mac", "mac-", &"m".repeat(64)] {
        assert_eq!(reason_of(validate::node_catalog(&node(bad), &Readiness::new())), Reason::InvalidName, "{bad}");
    }
    let (entry, problems) = validate::node_catalog(&node("studio-mac"), &Readiness::new()).unwrap();
    assert_eq!(entry.name, "studio-mac");
    assert!(problems.is_empty());
}

#[test]
fn node_certificate_and_workspace_rules() {
    let mut n = node("mac");
    n.spec.certificate.renew_before_hours = n.spec.certificate.validity_hours;
    assert_eq!(reason_of(validate::node_catalog(&n, &Readiness::new())), Reason::InvalidSpec);
    n.spec.certificate.renew_before_hours = 0;
    let err = validate::node_catalog(&n, &Readiness::new()).unwrap_err();
    assert!(err.message.contains("renewBeforeHours: must be at least 1"), "{err}");

    let mut n = node_with_workspace("mac", "tools");
    n.spec.workspaces[0].root_path = "relative/path".into();
    assert_eq!(reason_of(validate::node_catalog(&n, &Readiness::new())), Reason::InvalidSpec);

    let mut n = node_with_workspace("mac", "tools");
    n.spec.workspaces.push(n.spec.workspaces[0].clone());
    let err = validate::node_catalog(&n, &Readiness::new()).unwrap_err();
    assert!(err.message.contains("duplicate ref"), "{err}");
}

#[test]
fn workspace_template_problems_leave_the_node_ready() {
    let n = node_with_workspace("mac", "tools");
    let (_, problems) = validate::node_catalog(&n, &[("tools", true)].into()).unwrap();
    assert!(problems.is_empty());
    let (_, problems) = validate::node_catalog(&n, &[("tools", false)].into()).unwrap();
    assert_eq!(problems.iter().map(|p| p.reason).collect::<Vec<_>>(), [Reason::TemplateNotReady]);
    let (_, problems) = validate::node_catalog(&n, &Readiness::new()).unwrap();
    assert_eq!(problems.iter().map(|p| p.reason).collect::<Vec<_>>(), [Reason::TemplateNotFound]);
    assert!(problems[0].message.contains("`site`") && problems[0].message.contains("`tools`"));
}

#[test]
fn workspace_template_rules() {
    assert_eq!(validate::workspace_template(&template("t"), &settings()), Ok(()));
    let cases: Vec<(Mutation<WorkspaceTemplate>, &str)> = vec![
        (Box::new(|t| t.spec.operations.clear()), "spec.operations:"),
        (Box::new(|t| t.spec.operations.push(Operation::Read)), "spec.operations:"),
        (Box::new(|t| t.spec.operations.retain(|o| *o != Operation::Command)), "spec.commands:"),
        (Box::new(|t| t.spec.commands.clear()), "spec.commands:"),
        (Box::new(|t| t.spec.commands.push(t.spec.commands[0].clone())), "spec.commands[1].id: duplicate"),
        (Box::new(|t| t.spec.commands[0].argv = vec![String::new()]), "spec.commands[0].argv:"),
        (Box::new(|t| t.spec.commands[0].timeout_ms = 10), "spec.commands[0].timeoutMs:"),
        (Box::new(|t| t.spec.commands[0].id = "Bad Id".into()), "spec.commands[0].id:"),
        (Box::new(|t| t.spec.env_allowlist.push("1PATH".into())), "spec.envAllowlist[1]:"),
        (Box::new(|t| t.spec.limits.max_iterations = 0), "spec.limits.maxIterations:"),
        (Box::new(|t| t.spec.limits.max_iterations = 1_001), "spec.limits.maxIterations: must be between 1 and 1000"),
        (Box::new(|t| t.spec.limits.max_concurrent_jobs = 0), "spec.limits.maxConcurrentJobs: must be between 1"),
        (Box::new(|t| t.spec.limits.max_concurrent_jobs = 1_001), "spec.limits.maxConcurrentJobs:"),
        (Box::new(|t| t.spec.stages.max_repairs = 11), "spec.stages.maxRepairs: must be between 0 and 10"),
        (Box::new(|t| t.spec.stages.stage_timeout_ms = 999), "spec.stages.stageTimeoutMs: must be between 1000"),
        (Box::new(|t| t.spec.stages.stage_timeout_ms = 86_400_001), "spec.stages.stageTimeoutMs:"),
        (Box::new(|t| t.spec.stages.prompts.review = Some(String::new())), "spec.stages.prompts.review: must be"),
        (Box::new(|t| t.spec.stages.prompts.plan = Some(" \n\t".into())), "spec.stages.prompts.plan: must be"),
        (
            Box::new(|t| t.spec.stages.prompts.finalize = Some("x".repeat(MAX_STAGE_PROMPT_BYTES + 1))),
            "spec.stages.prompts.finalize: must be non-empty and at most 16384 bytes",
        ),
    ];
    for (i, (mutate, prefix)) in cases.into_iter().enumerate() {
        let mut t = template("t");
        mutate(&mut t);
        let err = validate::workspace_template(&t, &settings()).expect_err(&format!("case {i} should fail"));
        assert_eq!(err.reason, Reason::InvalidSpec);
        assert!(err.message.starts_with(prefix), "case {i}: `{}` should start with `{prefix}`", err.message);
    }
}

#[test]
fn template_stages_render_into_the_workspace_entry() {
    let mut t = template("t");
    let review = "Review strictly. Answer {\"verdict\":\"approve\"|\"repair\",\"notes\":\"...\"} only.";
    t.spec.stages = CrdStages {
        plan: false,
        review: true,
        max_repairs: 3,
        stage_timeout_ms: 60_000,
        prompts: CrdPrompts {
            review: Some(review.into()),
            finalize: Some("Summarize in one line.".into()),
            ..Default::default()
        },
    };
    assert_eq!(validate::workspace_template(&t, &settings()), Ok(()));
    let n = node_with_workspace("mac", "t");
    let entry = validate::workspace("mac", &n.spec.workspaces[0], &t.spec, &BTreeSet::new(), &settings()).unwrap();
    let expected = WorkspaceStages {
        plan: false,
        review: true,
        max_repairs: 3,
        stage_timeout_ms: 60_000,
        prompts: StagePrompts {
            review: Some(review.into()),
            finalize: Some("Summarize in one line.".into()),
            ..Default::default()
        },
    };
    assert_eq!(entry.stages, expected);
}

/// `network` and `limits.maxConcurrentJobs` reach the Edge config entry;
/// absent, they are off and one job at a time.
#[test]
fn network_and_job_concurrency_render_into_the_workspace_entry() {
    let n = node_with_workspace("mac", "t");
    let mut t = template("t");
    let entry = validate::workspace("mac", &n.spec.workspaces[0], &t.spec, &BTreeSet::new(), &settings()).unwrap();
    assert!(!entry.network);
    assert_eq!(entry.limits.max_concurrent_jobs, 1);
    t.spec.network = true;
    t.spec.limits.max_concurrent_jobs = 3;
    let entry = validate::workspace("mac", &n.spec.workspaces[0], &t.spec, &BTreeSet::new(), &settings()).unwrap();
    assert!(entry.network);
    assert_eq!(entry.limits.max_concurrent_jobs, 3);
    let spec: WorkspaceTemplateSpec =
        serde_json::from_value(json!({"operations": ["read"], "network": true, "limits": {"maxConcurrentJobs": 2}}))
            .unwrap();
    assert!(spec.network && spec.limits.max_concurrent_jobs == 2, "camelCase on the CRD");
    assert!(serde_json::to_value(&template("t").spec).unwrap().get("network").is_none(), "off is not written");
}

#[test]
fn absent_stages_render_the_edge_defaults() {
    let n = node_with_workspace("mac", "t");
    let rendered = |spec: serde_json::Value| {
        let spec: WorkspaceTemplateSpec = serde_json::from_value(spec).unwrap();
        validate::workspace("mac", &n.spec.workspaces[0], &spec, &BTreeSet::new(), &settings()).unwrap().stages
    };
    assert_eq!(rendered(json!({"operations": ["read"]})), WorkspaceStages::default());
    // A partial `stages` keeps the defaults of what it leaves out.
    assert_eq!(
        rendered(json!({"operations": ["read"], "stages": {"review": false, "prompts": {"work": "Be brief."}}})),
        WorkspaceStages {
            review: false,
            prompts: StagePrompts { work: Some("Be brief.".into()), ..Default::default() },
            ..Default::default()
        }
    );
    assert_eq!(template("t").spec.stages, CrdStages::default());
    let spec: WorkspaceTemplateSpec = serde_json::from_value(json!({"operations": ["read"]})).unwrap();
    assert_eq!(spec.stages, CrdStages::default());
}

#[test]
fn invalid_stages_are_refused_naming_the_field() {
    let mut t = template("t");
    t.spec.stages.max_repairs = 11;
    let err = validate::workspace_template(&t, &settings()).unwrap_err();
    assert_eq!(err, invalid(Reason::InvalidSpec, "spec.stages.maxRepairs: must be between 0 and 10"));
    let mut t = template("t");
    t.spec.stages.prompts.repair = Some(String::new());
    let err = validate::workspace_template(&t, &settings()).unwrap_err();
    assert_eq!(
        err,
        invalid(Reason::InvalidSpec, "spec.stages.prompts.repair: must be non-empty and at most 16384 bytes")
    );
    // A template admitted anyway never reaches a workspace: the Edge's rules refuse it there too.
    let n = node_with_workspace("mac", "t");
    let err = validate::workspace("mac", &n.spec.workspaces[0], &t.spec, &BTreeSet::new(), &settings()).unwrap_err();
    assert!(err.message.contains("stages.prompts.repair"), "{err}");
}

#[test]
fn reasons_are_valid_condition_reasons() {
    // ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$ (meta/v1 Condition.reason)
    let all = [
        Reason::InvalidSpec,
        Reason::InvalidName,
        Reason::Deleting,
        Reason::NodeNotFound,
        Reason::NodeNotReady,
        Reason::TemplateNotFound,
        Reason::TemplateNotReady,
        Reason::CredentialSecretMissing,
    ];
    for r in all.iter().map(|r| r.as_str()).chain([ACCEPTED]) {
        assert!(r.bytes().next().unwrap().is_ascii_alphabetic() && r.bytes().all(|b| b.is_ascii_alphanumeric()), "{r}");
    }
}

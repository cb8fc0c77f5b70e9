//! Objects for the pure-stage tests.

use std::net::SocketAddr;

use k8s_openapi::jiff::Timestamp;

use iop_proto::config::ListenConfig;

use super::{Settings, Snapshot};
use crate::crd::node_catalog::{NodeCatalogSpec, Workspace};
use crate::crd::provider::{Adapter, ProviderMode, ProviderTarget, PublicModel};
use crate::crd::workspace_template::{CommandTemplate, Operation, WorkspaceLimits, WorkspaceStages};
use crate::crd::{NodeCatalog, Provider, ProviderSpec, WorkspaceTemplate, WorkspaceTemplateSpec};

pub const NS: &str = "iop";

pub fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

pub fn settings() -> Settings {
    let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
    let listen = ListenConfig::new(addr("0.0.0.0:8080"), addr("0.0.0.0:7443"), addr("0.0.0.0:8081"));
    Settings::new("iop.example", listen)
}

fn meta<K: kube::Resource>(object: &mut K, name: &str) {
    let meta = object.meta_mut();
    meta.namespace = Some(NS.to_string());
    meta.uid = Some(format!("uid-{name}"));
    meta.generation = Some(1);
}

pub fn provider(name: &str, node: &str) -> Provider {
    let mut p = Provider::new(
        name,
        ProviderSpec {
            node: node.to_string(),
            adapter: Adapter::Ollama,
            target: ProviderTarget { model: "llama3.2:3b".to_string(), base_url: "http://127.0.0.1:11434".to_string() },
            models: vec![PublicModel { name: "llama3.2".to_string(), priority: 0, context_fallback: None }],
            capacity: 4,
            queue: None,
            response_stall_timeout_ms: 0,
            first_byte_timeout_ms: 0,
            mode: ProviderMode::Normalized,
            continuation: None,
            context_window: None,
            accepts_images: None,
            keep_warm: false,
            credential_secret_ref: None,
        },
    );
    meta(&mut p, name);
    p
}

pub fn node(name: &str) -> NodeCatalog {
    let mut n = NodeCatalog::new(name, NodeCatalogSpec::default());
    meta(&mut n, name);
    n
}

pub fn node_with_workspace(name: &str, template: &str) -> NodeCatalog {
    let mut n = node(name);
    n.spec.workspaces = vec![Workspace {
        reference: "site".to_string(),
        root_path: "/Users/dev/site".to_string(),
        template: template.to_string(),
    }];
    n
}

pub fn template(name: &str) -> WorkspaceTemplate {
    let mut t = WorkspaceTemplate::new(
        name,
        WorkspaceTemplateSpec {
            operations: vec![Operation::Read, Operation::List, Operation::Command],
            commands: vec![CommandTemplate {
                id: "git-status".to_string(),
                argv: vec!["git".to_string(), "status".to_string()],
                timeout_ms: 10_000,
                limits: Default::default(),
            }],
            env_allowlist: vec!["PATH".to_string()],
            limits: WorkspaceLimits::default(),
            network: false,
            stages: WorkspaceStages::default(),
        },
    );
    meta(&mut t, name);
    t
}

pub fn snapshot(providers: Vec<Provider>, nodes: Vec<NodeCatalog>, templates: Vec<WorkspaceTemplate>) -> Snapshot {
    Snapshot { namespace: NS.to_string(), providers, nodes, templates, ..Default::default() }
}

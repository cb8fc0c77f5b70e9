use serde_json::json;

use super::*;

fn provider() -> EdgeProvider {
    EdgeProvider {
        accepts_images: Some(false),
        adapter: Some(Adapter::Ollama),
        capacity: 4,
        consecutive_failures: 0,
        credential: Some(EdgeCredential {
            node_refusal: None,
            problem: Some("the value must be printable ASCII without spaces".into()),
            profile: "lm".into(),
            state: CredentialState::Invalid,
        }),
        dispatchable: false,
        ejected_until: Some("2026-11-01T12:00:00.250Z".into()),
        ejections: 1,
        health: EdgeHealth::Unavailable,
        id: "llama".into(),
        in_flight: 2,
        last_load_at: Some("2026-11-01T11:59:00.750Z".into()),
        last_load_seconds: Some(18.25),
        learned_stall_ms: None,
        model_memory: Some(ModelMemory { size_bytes: 42_000_000_000, vram_bytes: 41_000_000_000 }),
        models: vec![ProviderModel { name: "llama3.2".into(), priority: 0 }],
        node: "mac-1".into(),
        node_ready: true,
        on_trial: false,
        overlay: Some(Overlay { generation: 3, sequence: 7, since_ms: 1_700_000_000_000, state: EdgeHealth::Unknown }),
        prefill_ms_per_1k_tokens: None,
        residency: Some(Residency::NotLoaded),
        target_model: "llama3.2:3b".into(),
    }
}

fn node() -> EdgeNode {
    EdgeNode {
        certificate_serial: None,
        command_sandbox: Some("landlock".into()),
        connected: true,
        connected_at_ms: Some(1_700_000_000_123),
        generation: Some(1_700_000_000_123_456),
        name: "mac-1".into(),
        phase: Some(SessionPhase::Ready),
        providers: BTreeMap::from([("llama".into(), EdgeHealth::Unavailable)]),
        sandbox_gaps: vec!["tcp".into()],
        version: Some("0.1.0".into()),
        workspaces: BTreeMap::from([("site".into(), "accepted".into())]),
    }
}

/// Every field written, `null` where none, keys in alphabetical order,
/// and read back as it was.
#[test]
fn snapshots_are_written_in_full_and_read_back() {
    let providers = ProvidersSnapshot {
        in_flight_runs: 2,
        leases: Leases { acquired: 5, double_releases: 0, released: 3 },
        providers: vec![provider()],
        queued: BTreeMap::from([("llama3.2".into(), 1)]),
        workspace_calls: 0,
    };
    let text = serde_json::to_string(&providers).unwrap();
    assert_eq!(
        text,
        concat!(
            r#"{"in_flight_runs":2,"leases":{"acquired":5,"double_releases":0,"released":3},"providers":[{"#,
            r#""accepts_images":false,"adapter":"ollama","capacity":4,"consecutive_failures":0,"credential":{"node_refusal":null,"problem":"the value "#,
            r#"must be printable ASCII without spaces","profile":"lm","state":"invalid"},"dispatchable":false,"#,
            r#""ejected_until":"2026-11-01T12:00:00.250Z","ejections":1,"health":"unavailable","id":"llama","#,
            r#""in_flight":2,"last_load_at":"2026-11-01T11:59:00.750Z","last_load_seconds":18.25,"learned_stall_ms":null,"#,
            r#""model_memory":{"size_bytes":42000000000,"vram_bytes":41000000000},"models":[{"name":"llama3.2","#,
            r#""priority":0}],"node":"mac-1","node_ready":true,"on_trial":false,"overlay":{"generation":3,"sequence":7,"#,
            r#""since_ms":1700000000000,"state":"unknown"},"prefill_ms_per_1k_tokens":null,"residency":"not_loaded","target_model":"llama3.2:3b"}],"#,
            r#""queued":{"llama3.2":1},"workspace_calls":0}"#,
        )
    );
    assert_eq!(serde_json::from_str::<ProvidersSnapshot>(&text).unwrap(), providers);

    let none = EdgeProvider {
        accepts_images: None,
        credential: None,
        ejected_until: None,
        last_load_at: None,
        last_load_seconds: None,
        learned_stall_ms: None,
        model_memory: None,
        overlay: None,
        prefill_ms_per_1k_tokens: None,
        ..provider()
    };
    let value = serde_json::to_value(&none).unwrap();
    for field in [
        "accepts_images",
        "credential",
        "ejected_until",
        "last_load_at",
        "last_load_seconds",
        "model_memory",
        "overlay",
    ] {
        assert_eq!(value[field], json!(null), "{field} is written as null");
    }
    // A whole number of seconds stays a float.
    let whole = serde_json::to_value(EdgeProvider { last_load_seconds: Some(3.0), ..provider() }).unwrap();
    assert_eq!(whole["last_load_seconds"].to_string(), "3.0");

    let nodes = NodesSnapshot {
        nodes: vec![
            node(),
            EdgeNode {
                certificate_serial: None,
                command_sandbox: None,
                connected: false,
                connected_at_ms: None,
                generation: None,
                name: "mac-2".into(),
                phase: None,
                providers: BTreeMap::new(),
                sandbox_gaps: vec![],
                version: None,
                workspaces: BTreeMap::new(),
            },
        ],
    };
    let text = serde_json::to_string(&nodes).unwrap();
    assert_eq!(
        text,
        concat!(
            r#"{"nodes":[{"certificate_serial":null,"command_sandbox":"landlock","connected":true,"#,
            r#""connected_at_ms":1700000000123,"#,
            r#""generation":1700000000123456,"name":"mac-1","phase":"ready","providers":{"llama":"unavailable"},"#,
            r#""sandbox_gaps":["tcp"],"version":"0.1.0","workspaces":{"site":"accepted"}},"#,
            r#"{"certificate_serial":null,"command_sandbox":null,"connected":false,"connected_at_ms":null,"#,
            r#""generation":null,"#,
            r#""name":"mac-2","phase":null,"providers":{},"sandbox_gaps":[],"version":null,"workspaces":{}}]}"#,
        )
    );
    assert_eq!(serde_json::from_str::<NodesSnapshot>(&text).unwrap(), nodes);
}

/// A newer Edge: fields this reader does not know, and values it does
/// not know or in another shape where it reads leniently. Each is no
/// information; the rest of the snapshot still counts.
#[test]
fn a_newer_edge_is_read_leniently() {
    let providers: ProvidersSnapshot = serde_json::from_value(json!({
        "providers": [{
            "id": "llama", "node": "mac-1", "node_ready": true, "health": "available",
            "overlay": {"state": "available", "generation": 4, "sequence": 2, "since_ms": 5000, "source": "probe"},
            "adapter": "llama_cpp", "capacity": "four", "credential": {"profile": "lm", "state": "expiring"},
            "dispatchable": "yes", "ejected_until": 17, "residency": "warming", "last_load_seconds": "12",
            "last_load_at": {"at": 1}, "model_memory": "2 GB", "models": [{"name": "llama"}],
            "target_model": null, "in_flight": -1, "weight": 0.5
        }],
        "queued": [], "leases": {"acquired": "many", "released": 1}, "in_flight_runs": null, "draining": true
    }))
    .unwrap();
    let p = &providers.providers[0];
    assert_eq!(
        (p.id.as_str(), p.node.as_str(), p.node_ready, p.health),
        ("llama", "mac-1", true, EdgeHealth::Available)
    );
    assert_eq!(p.overlay, Some(Overlay { generation: 4, sequence: 2, since_ms: 5000, state: EdgeHealth::Available }));
    assert_eq!((p.adapter, p.capacity, p.credential.as_ref(), p.dispatchable), (None, 0, None, false));
    assert_eq!(
        (p.ejected_until.as_ref(), p.residency, p.last_load_seconds, p.last_load_at.as_ref()),
        (None, None, None, None)
    );
    assert_eq!((p.model_memory, p.models.as_slice(), p.target_model.as_str(), p.in_flight), (None, &[][..], "", 0));
    assert_eq!(providers.queued, BTreeMap::new());
    assert_eq!(providers.leases, Leases { acquired: 0, double_releases: 0, released: 1 });
    assert_eq!(providers.in_flight_runs, 0);

    let nodes: NodesSnapshot = serde_json::from_value(json!({"nodes": [{
        "name": "mac-1", "connected": true, "phase": "ready", "generation": 4, "connected_at_ms": 5000,
        "version": "9.0.0", "providers": {"llama": "degraded"}, "workspaces": {"site": {"verdict": "accepted"}},
        "command_sandbox": {"kind": "landlock"}, "sandbox_gaps": "tcp", "os": "linux"
    }]}))
    .unwrap();
    let n = &nodes.nodes[0];
    assert_eq!(
        (n.name.as_str(), n.connected, n.phase, n.generation),
        ("mac-1", true, Some(SessionPhase::Ready), Some(4))
    );
    assert_eq!((n.connected_at_ms, n.version.as_deref()), (Some(5000), Some("9.0.0")));
    assert!(n.providers.is_empty() && n.workspaces.is_empty() && n.sandbox_gaps.is_empty());
    assert_eq!(n.command_sandbox, None);
}

/// An older Edge: only what the reader requires. Absent or `null`.
#[test]
fn an_older_edge_is_read_with_what_it_wrote() {
    let providers: ProvidersSnapshot = serde_json::from_value(json!({
        "providers": [{"id": "llama", "node": "mac-1", "node_ready": false, "health": "unknown"},
                      {"id": "qwen", "node": "mac-1", "node_ready": true, "health": "available", "overlay": null}]
    }))
    .unwrap();
    let p = &providers.providers[0];
    assert_eq!((p.overlay.as_ref(), p.credential.as_ref(), p.residency, p.adapter), (None, None, None, None));
    assert_eq!(providers.providers[1].overlay, None);
    let nodes: NodesSnapshot = serde_json::from_value(json!({"nodes": [
        {"name": "mac-1", "connected": false},
        {"name": "mac-2", "connected": false, "phase": null, "generation": null, "connected_at_ms": null, "version": null}
    ]}))
    .unwrap();
    for n in &nodes.nodes {
        assert_eq!((n.phase, n.generation, n.connected_at_ms, n.version.as_deref()), (None, None, None, None));
    }
}

/// What health and identity rest on is read closed: a health, overlay
/// state or phase this reader does not know fails the snapshot (an
/// error, never a guess), and so does a missing id or overlay field.
#[test]
fn health_and_identity_are_read_closed() {
    let provider = |fields: serde_json::Value| {
        let mut p = json!({"id": "a", "node": "n", "node_ready": true, "health": "available"});
        p.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        serde_json::from_value::<ProvidersSnapshot>(json!({ "providers": [p] }))
    };
    assert!(provider(json!({})).is_ok());
    for bad in [
        json!({"health": "degraded"}),
        json!({"health": null}),
        json!({"id": null}),
        json!({"node_ready": "yes"}),
        json!({"overlay": {"state": "degraded", "generation": 1, "sequence": 1, "since_ms": 1}}),
        json!({"overlay": {"state": "available", "generation": 1, "sequence": 1}}),
    ] {
        assert!(provider(bad.clone()).is_err(), "{bad}");
    }
    assert!(serde_json::from_value::<ProvidersSnapshot>(json!({})).is_err(), "no providers");

    let node = |fields: serde_json::Value| {
        let mut n = json!({"name": "mac-1", "connected": true});
        n.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        serde_json::from_value::<NodesSnapshot>(json!({ "nodes": [n] }))
    };
    assert!(node(json!({})).is_ok());
    for bad in [json!({"phase": "draining"}), json!({"generation": "4"}), json!({"connected": null})] {
        assert!(node(bad.clone()).is_err(), "{bad}");
    }
}

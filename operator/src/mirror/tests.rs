use iop_proto::admin::Overlay;
use serde_json::json;

use super::*;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

fn time(seconds: i64) -> Option<Time> {
    Some(Time(at(seconds)))
}

fn edge_provider(node_ready: bool, health: EdgeHealth, overlay: Option<Overlay>) -> EdgeProvider {
    EdgeProvider {
        accepts_images: None,
        id: "llama".to_string(),
        node: "mac-1".to_string(),
        node_ready,
        on_trial: false,
        health,
        overlay,
        prefill_ms_per_1k_tokens: None,
        credential: None,
        ejected_until: None,
        residency: None,
        last_load_seconds: None,
        learned_stall_ms: None,
        last_load_at: None,
        adapter: None,
        capacity: 0,
        consecutive_failures: 0,
        dispatchable: false,
        ejections: 0,
        in_flight: 0,
        model_memory: None,
        models: vec![],
        target_model: String::new(),
    }
}

fn overlay(state: EdgeHealth, generation: u64, sequence: u64, since_s: u64) -> Option<Overlay> {
    Some(Overlay { state, generation, sequence, since_ms: since_s * 1000 + 250 })
}

/// One replica that answered.
fn one(providers: &ProvidersSnapshot, nodes: &NodesSnapshot) -> EdgeView {
    EdgeView::one("edge", providers.clone(), nodes.clone())
}

fn edge_node(connected: bool, generation: Option<u64>, connected_at_s: Option<u64>) -> EdgeNode {
    EdgeNode {
        certificate_serial: None,
        name: "mac-1".to_string(),
        connected,
        phase: connected.then_some(SessionPhase::Ready),
        generation,
        connected_at_ms: connected_at_s.map(|s| s * 1000 + 999),
        version: connected.then(|| "0.1.0".to_string()),
        command_sandbox: None,
        providers: BTreeMap::new(),
        sandbox_gaps: vec![],
        workspaces: BTreeMap::new(),
    }
}

#[test]
fn parses_the_edge_admin_snapshots() {
    // As `edge/src/http/admin.rs` writes them, extra fields included.
    let providers: ProvidersSnapshot = serde_json::from_value(json!({
        "providers": [
            {"id": "llama", "node": "mac-1", "adapter": "ollama", "target_model": "llama3.2:3b",
             "models": [{"name": "llama3.2", "priority": 0}], "node_ready": true, "health": "available",
             "dispatchable": true, "capacity": 4, "overlay": null, "in_flight": 0},
            {"id": "qwen", "node": "mac-2", "node_ready": false, "health": "unknown",
             "overlay": {"state": "unavailable", "generation": 3, "sequence": 7, "since_ms": 1_700_000_000_000u64}}
        ],
        "queued": 0, "in_flight_runs": 0, "leases": {"acquired": 0, "released": 0, "double_releases": 0}
    }))
    .unwrap();
    assert_eq!(
        providers.providers[0],
        EdgeProvider {
            accepts_images: None,
            adapter: Some(iop_proto::config::Adapter::Ollama),
            target_model: "llama3.2:3b".into(),
            models: vec![iop_proto::admin::ProviderModel { name: "llama3.2".into(), priority: 0 }],
            dispatchable: true,
            capacity: 4,
            ..edge_provider(true, EdgeHealth::Available, None)
        }
    );
    assert_eq!(
        providers.providers[1].overlay,
        Some(Overlay { state: EdgeHealth::Unavailable, generation: 3, sequence: 7, since_ms: 1_700_000_000_000 })
    );

    // The overlay's `unknown` (a probe that could not tell), as the Edge writes it.
    let unknown: ProvidersSnapshot = serde_json::from_value(json!({
        "providers": [{"id": "llama", "node": "mac-1", "node_ready": true, "health": "unknown",
                       "dispatchable": true,
                       "overlay": {"state": "unknown", "generation": 4, "sequence": 2, "since_ms": 5000}}]
    }))
    .unwrap();
    assert_eq!(unknown.providers[0].overlay.as_ref().unwrap().state, EdgeHealth::Unknown);
    assert_eq!(unknown.providers[0].health, EdgeHealth::Unknown);

    let nodes: NodesSnapshot = serde_json::from_value(json!({
        "nodes": [
            {"name": "mac-1", "connected": true, "phase": "ready", "generation": 4, "connected_at_ms": 5000,
             "providers": {"llama": "available"}},
            {"name": "mac-2", "connected": false, "phase": null, "generation": null, "connected_at_ms": null,
             "providers": {}}
        ]
    }))
    .unwrap();
    assert_eq!(nodes.nodes[0].phase, Some(SessionPhase::Ready));
    assert_eq!(
        nodes.nodes[1],
        EdgeNode {
            certificate_serial: None,
            name: "mac-2".into(),
            connected: false,
            phase: None,
            generation: None,
            connected_at_ms: None,
            version: None,
            command_sandbox: None,
            providers: BTreeMap::new(),
            sandbox_gaps: vec![],
            workspaces: BTreeMap::new(),
        }
    );

    // Closed enums: an unknown value is an error, never a guess.
    let unknown = json!({"providers": [{"id": "a", "node": "n", "node_ready": true, "health": "degraded"}]});
    assert!(serde_json::from_value::<ProvidersSnapshot>(unknown).is_err());
}

#[test]
fn the_health_table() {
    let none = ProviderMirror::default();
    let node = edge_node(true, Some(4), Some(100));
    // The Edge's `health` is the effective one (config, readiness and
    // overlay combined): taken as it is; the overlay gives the evidence position.
    let cases = [
        (
            edge_provider(true, EdgeHealth::Unavailable, overlay(EdgeHealth::Unavailable, 4, 2, 50)),
            (Health::Unavailable, Some(Classification::ProviderUnhealthy), Some(4), Some(2)),
        ),
        (
            edge_provider(true, EdgeHealth::Unavailable, None),
            (Health::Unavailable, Some(Classification::ProviderUnhealthy), Some(4), None),
        ),
        // Node not ready (disconnected, or registered but not ready): unknown,
        // whatever the overlay of its last connection said.
        (
            edge_provider(false, EdgeHealth::Unknown, None),
            (Health::Unknown, Some(Classification::HealthUnknown), Some(4), None),
        ),
        (
            edge_provider(false, EdgeHealth::Unknown, overlay(EdgeHealth::Unavailable, 3, 7, 50)),
            (Health::Unknown, Some(Classification::HealthUnknown), Some(3), Some(7)),
        ),
        // The node's probe could not tell: the overlay says `unknown`.
        (
            edge_provider(true, EdgeHealth::Unknown, overlay(EdgeHealth::Unknown, 4, 9, 50)),
            (Health::Unknown, Some(Classification::HealthUnknown), Some(4), Some(9)),
        ),
        (edge_provider(true, EdgeHealth::Available, None), (Health::Available, None, Some(4), None)),
        // A recovered overlay is available again, with its evidence position.
        (
            edge_provider(true, EdgeHealth::Available, overlay(EdgeHealth::Available, 4, 12, 50)),
            (Health::Available, None, Some(4), Some(12)),
        ),
    ];
    for (p, (health, classification, generation, sequence)) in cases {
        let m = provider(&p, Some(&node), &none, at(1000));
        assert_eq!(
            (m.health, m.classification, m.generation, m.last_observation_sequence),
            (Some(health), classification, generation, sequence),
            "{p:?}"
        );
    }
}

#[test]
fn provider_transition_time_moves_only_when_health_changes() {
    let node = edge_node(true, Some(4), Some(100));
    let up = edge_provider(true, EdgeHealth::Available, overlay(EdgeHealth::Available, 4, 0, 900));
    let first = provider(&up, Some(&node), &ProviderMirror::default(), at(1000));
    assert_eq!(first.last_transition_time, time(900), "the overlay's own time (whole seconds)");

    // Same health later: unchanged, so nothing to write.
    let again = provider(&up, Some(&node), &first, at(2000));
    assert_eq!(again, first);

    // The overlay lowers it: the overlay's own time.
    let down = edge_provider(true, EdgeHealth::Unavailable, overlay(EdgeHealth::Unavailable, 4, 3, 1500));
    let lowered = provider(&down, Some(&node), &again, at(3000));
    assert_eq!((lowered.health, lowered.last_transition_time.clone()), (Some(Health::Unavailable), time(1500)));

    // New evidence, same health: sequence moves, time stays.
    let still_down = edge_provider(true, EdgeHealth::Unavailable, overlay(EdgeHealth::Unavailable, 4, 5, 2900));
    let later = provider(&still_down, Some(&node), &lowered, at(4000));
    assert_eq!((later.last_observation_sequence, later.last_transition_time.clone()), (Some(5), time(1500)));

    // Node gone: Unknown at `now`.
    let away = edge_provider(false, EdgeHealth::Unknown, overlay(EdgeHealth::Unavailable, 4, 6, 1500));
    let unknown = provider(&away, None, &later, at(5000));
    assert_eq!((unknown.health, unknown.last_transition_time.clone()), (Some(Health::Unknown), time(5000)));

    // Back, and available again: the overlay's `since` (kept across
    // connections while its state did not change) is older than the last
    // transition, so the transition is `now`, never a step back in time.
    let back = edge_provider(true, EdgeHealth::Available, overlay(EdgeHealth::Available, 6, 0, 900));
    let recovered = provider(&back, Some(&edge_node(true, Some(6), Some(5500))), &unknown, at(6000));
    assert_eq!((recovered.health, recovered.last_transition_time), (Some(Health::Available), time(6000)));
}

/// A provider that stays unavailable is probed again and again; each probe
/// moves the overlay's sequence. Only what a user sees is written (every
/// sequence used to be written, each write a full reconcile).
#[test]
fn a_new_observation_sequence_alone_is_not_written() {
    let node = edge_node(true, Some(4), Some(100));
    let down = |sequence| ProvidersSnapshot {
        providers: vec![edge_provider(
            true,
            EdgeHealth::Unavailable,
            overlay(EdgeHealth::Unavailable, 4, sequence, 1500),
        )],
        ..Default::default()
    };
    let nodes = NodesSnapshot { nodes: vec![node] };
    let mut current = BTreeMap::from([("llama".to_string(), ProviderMirror::default())]);
    let none = BTreeMap::new();
    let writes = plan(&one(&down(3), &nodes), &current, &none, &BTreeMap::new(), at(2000));
    assert_eq!(writes.providers.len(), 1);
    current.insert("llama".into(), writes.providers[0].1.clone());

    for (i, sequence) in (4..40).enumerate() {
        let t = at(2000 + 30 * i as i64);
        assert_eq!(
            plan(&one(&down(sequence), &nodes), &current, &none, &BTreeMap::new(), t),
            Writes::default(),
            "sequence {sequence}"
        );
    }

    // Health changes: written, with the sequence of that evidence.
    let up = ProvidersSnapshot {
        providers: vec![edge_provider(true, EdgeHealth::Available, overlay(EdgeHealth::Available, 4, 41, 3300))],
        ..Default::default()
    };
    let writes = plan(&one(&up, &nodes), &current, &none, &BTreeMap::new(), at(3400));
    assert_eq!(writes.providers.len(), 1);
    let m = &writes.providers[0].1;
    assert_eq!((m.health, m.last_observation_sequence), (Some(Health::Available), Some(41)));
    assert!(visible_change(&current["llama"], m));
    let only_sequence = ProviderMirror { last_observation_sequence: Some(99), ..current["llama"].clone() };
    assert!(!visible_change(&current["llama"], &only_sequence));
}

#[test]
fn node_connection_and_since() {
    let fresh = NodeMirror::default();
    let up = node(&edge_node(true, Some(4), Some(100)), &fresh, at(1000));
    let v = Some("0.1.0".to_string());
    let one_of_one = NodeMirror {
        connected_replicas: Some(1),
        replicas: Some(1),
        replicas_summary: Some("1/1".into()),
        ..Default::default()
    };
    let none_of_one =
        NodeMirror { connected_replicas: Some(0), replicas_summary: Some("0/1".into()), ..one_of_one.clone() };
    assert_eq!(
        up,
        NodeMirror {
            connected: Some(true),
            generation: Some(4),
            since: time(100),
            version: v.clone(),
            ..one_of_one.clone()
        }
    );
    assert_eq!(node(&edge_node(true, Some(4), Some(100)), &up, at(2000)), up, "unchanged");

    // Away: keeps the last generation and version, since = now.
    let away = node(&edge_node(false, None, None), &up, at(3000));
    assert_eq!(
        away,
        NodeMirror {
            connected: Some(false),
            generation: Some(4),
            since: time(3000),
            version: v.clone(),
            ..none_of_one
        }
    );
    assert_eq!(node(&edge_node(false, None, None), &away, at(4000)), away, "unchanged");

    // A reconnect between two polls (new generation) moves `since`.
    let back = node(&edge_node(true, Some(6), Some(3500)), &up, at(4000));
    assert_eq!(
        back,
        NodeMirror { connected: Some(true), generation: Some(6), since: time(3500), version: v, ..one_of_one }
    );
}

#[test]
fn plan_writes_only_what_changed_and_only_existing_objects() {
    let providers = ProvidersSnapshot {
        providers: vec![
            edge_provider(true, EdgeHealth::Available, None),
            EdgeProvider { id: "orphan".into(), ..edge_provider(true, EdgeHealth::Available, None) },
        ],
        ..Default::default()
    };
    let nodes = NodesSnapshot { nodes: vec![edge_node(true, Some(4), Some(100))] };
    let mut current_providers = BTreeMap::from([
        ("llama".to_string(), ProviderMirror::default()),
        // Not in the Edge's config and never mirrored: nothing to clear.
        ("pending".to_string(), ProviderMirror::default()),
    ]);
    let mut current_nodes = BTreeMap::from([("mac-1".to_string(), NodeMirror::default())]);

    let writes = plan(&one(&providers, &nodes), &current_providers, &current_nodes, &BTreeMap::new(), at(1000));
    assert_eq!(writes.providers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["llama"], "no object: no write");
    assert_eq!(writes.nodes.len(), 1);

    // Once written, the same Edge view plans nothing.
    for (name, m) in writes.providers {
        current_providers.insert(name, m);
    }
    for (name, m) in writes.nodes {
        current_nodes.insert(name, m);
    }
    assert_eq!(
        plan(&one(&providers, &nodes), &current_providers, &current_nodes, &BTreeMap::new(), at(2000)),
        Writes::default()
    );

    // The Edge no longer has them (left out of its config): cleared.
    let empty = (ProvidersSnapshot::default(), NodesSnapshot { nodes: vec![] });
    let writes = plan(&one(&empty.0, &empty.1), &current_providers, &current_nodes, &BTreeMap::new(), at(3000));
    assert_eq!(writes.providers, [("llama".to_string(), ProviderMirror::default())]);
    assert_eq!(writes.nodes, [("mac-1".to_string(), NodeMirror::default())]);
}

#[test]
fn status_round_trip_keeps_only_the_mirrored_fields() {
    let m = ProviderMirror {
        health: Some(Health::Unavailable),
        classification: Some(Classification::ProviderUnhealthy),
        last_observation_sequence: Some(7),
        generation: Some(3),
        last_transition_time: time(10),
        credential: None,
        ejected_until: time(20),
        residency: None,
        last_load_seconds: None,
        last_load_time: None,
    };
    let status = m.to_status();
    assert!(status.conditions.is_empty() && status.observed_generation.is_none());
    assert_eq!(ProviderMirror::of(Some(&status)), m);
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
        json!({"health": "unavailable", "classification": "provider_unhealthy", "lastObservationSequence": 7,
               "generation": 3, "lastTransitionTime": "1970-01-01T00:00:10Z",
               "ejectedUntil": "1970-01-01T00:00:20Z"})
    );
    let n = NodeMirror {
        connected: Some(true),
        connected_replicas: Some(1),
        replicas: Some(2),
        replicas_summary: Some("1/2".into()),
        generation: Some(2),
        since: time(20),
        version: None,
        ..Default::default()
    };
    let status = n.to_status();
    assert!(status.conditions.is_empty() && status.certificate.is_none());
    assert_eq!(NodeMirror::of(Some(&status)), n);
    assert_eq!(
        serde_json::to_value(status).unwrap(),
        json!({"connected": true, "connectedReplicas": 1, "replicas": 2, "replicasSummary": "1/2",
               "generation": 2, "since": "1970-01-01T00:00:20Z"})
    );
}

// --- Several replicas ---------------------------------------------------------

use EdgeHealth::{Available as Up, Unavailable as Down, Unknown as Unsure};

#[test]
fn the_merge_table() {
    let unhealthy = Some(Classification::ProviderUnhealthy);
    let unknown = Some(Classification::HealthUnknown);
    type Merged = (Health, Option<Classification>);
    let cases: [(&[EdgeHealth], Merged); 12] = [
        // Nobody with a say (no replica answers or is connected to the node).
        (&[], (Health::Unknown, unknown)),
        // Unanimous: the one replica's mapping (`classify`).
        (&[Up], (Health::Available, None)),
        (&[Up, Up], (Health::Available, None)),
        (&[Down, Down], (Health::Unavailable, unhealthy)),
        (&[Unsure], (Health::Unknown, unknown)),
        (&[Unsure, Unsure, Unsure], (Health::Unknown, unknown)),
        // Some may route to it, some may not: degraded, with the worse classification.
        (&[Up, Down], (Health::Degraded, unhealthy)),
        (&[Down, Up, Up], (Health::Degraded, unhealthy)),
        (&[Up, Unsure], (Health::Degraded, unknown)),
        (&[Up, Unsure, Down], (Health::Degraded, unhealthy)),
        // Nobody may route to it, and one has evidence it is down.
        (&[Down, Unsure], (Health::Unavailable, unhealthy)),
        (&[Unsure, Unsure, Down], (Health::Unavailable, unhealthy)),
    ];
    for (seen, expected) in cases {
        assert_eq!(merge_health(seen), expected, "{seen:?}");
    }
    // One replica: exactly the single-replica mapping.
    for h in [Up, Down, Unsure] {
        assert_eq!(merge_health(&[h]), classify(h));
    }
}

fn replica_provider(health: EdgeHealth, overlay: Option<Overlay>) -> EdgeProvider {
    edge_provider(health != Unsure, health, overlay)
}

/// Two replicas as `plan` reads them: (id, answered snapshots) each.
fn two(a: Option<(EdgeProvider, EdgeNode)>, b: Option<(EdgeProvider, EdgeNode)>) -> EdgeView {
    let answer = |x: Option<(EdgeProvider, EdgeNode)>| {
        x.map(|(p, n)| {
            (ProvidersSnapshot { providers: vec![p], ..Default::default() }, NodesSnapshot { nodes: vec![n] })
        })
    };
    EdgeView { replicas: BTreeMap::from([("edge-a".to_string(), answer(a)), ("edge-b".to_string(), answer(b))]) }
}

fn planned(edge: &EdgeView) -> (ProviderMirror, NodeMirror) {
    let providers = BTreeMap::from([("llama".to_string(), ProviderMirror::default())]);
    let nodes = BTreeMap::from([("mac-1".to_string(), NodeMirror::default())]);
    let writes = plan(edge, &providers, &nodes, &BTreeMap::new(), at(1000));
    let p = writes.providers.first().map_or_else(ProviderMirror::default, |(_, m)| m.clone());
    let n = writes.nodes.first().map_or_else(NodeMirror::default, |(_, m)| m.clone());
    (p, n)
}

#[test]
fn two_replicas_are_merged_into_one_status() {
    let connected = |generation: u64| edge_node(true, Some(generation), Some(generation * 10));
    let away = edge_node(false, None, None);
    let up = |g| overlay(EdgeHealth::Available, g, 1, 50);
    let down = |g, seq| overlay(EdgeHealth::Unavailable, g, seq, 60);

    // Both connected, both see it available.
    let (p, n) = planned(&two(
        Some((replica_provider(Up, up(4)), connected(4))),
        Some((replica_provider(Up, up(7)), connected(7))),
    ));
    assert_eq!((p.health, p.classification), (Some(Health::Available), None));
    assert_eq!((p.generation, p.last_observation_sequence), (Some(7), Some(1)), "the newest evidence");
    assert_eq!(p.last_transition_time, time(50), "the overlay's own time: it holds this health");
    assert_eq!(
        (n.connected, n.connected_replicas, n.replicas, n.replicas_summary.as_deref()),
        (Some(true), Some(2), Some(2), Some("2/2"))
    );
    assert_eq!((n.generation, n.since.clone()), (Some(7), time(70)), "the newest session");

    // One sees it down: degraded, at `now` (no overlay holds "degraded").
    let (p, _) = planned(&two(
        Some((replica_provider(Up, up(4)), connected(4))),
        Some((replica_provider(Down, down(7, 3)), connected(7))),
    ));
    assert_eq!((p.health, p.classification), (Some(Health::Degraded), Some(Classification::ProviderUnhealthy)));
    assert_eq!((p.generation, p.last_observation_sequence), (Some(7), Some(3)));
    assert_eq!(p.last_transition_time, time(1000));

    // Both see it down.
    let (p, _) = planned(&two(
        Some((replica_provider(Down, down(4, 9)), connected(4))),
        Some((replica_provider(Down, down(7, 3)), connected(7))),
    ));
    assert_eq!((p.health, p.classification), (Some(Health::Unavailable), Some(Classification::ProviderUnhealthy)));
    assert_eq!((p.generation, p.last_observation_sequence), (Some(7), Some(3)), "newest by generation first");

    // A replica without a session to the node has no say: available, on 1 of 2.
    let (p, n) = planned(&two(
        Some((replica_provider(Up, up(4)), connected(4))),
        Some((replica_provider(Unsure, None), away.clone())),
    ));
    assert_eq!((p.health, p.classification), (Some(Health::Available), None));
    assert_eq!((n.connected, n.replicas_summary.as_deref()), (Some(true), Some("1/2")));

    // A replica whose session has registered but not reached `ready` (it
    // has heard nothing of the providers yet) has no say either: a
    // restarting replica does not make the provider flicker `degraded`.
    let registered = EdgeNode { phase: Some(SessionPhase::Registered), ..connected(9) };
    let (p, n) = planned(&two(
        Some((replica_provider(Up, up(4)), connected(4))),
        Some((replica_provider(Unsure, None), registered)),
    ));
    assert_eq!((p.health, p.classification), (Some(Health::Available), None));
    assert_eq!(n.replicas_summary.as_deref(), Some("2/2"), "it is connected all the same");

    // A replica that does not answer sees nothing: the same.
    let (p, n) = planned(&two(Some((replica_provider(Up, up(4)), connected(4))), None));
    assert_eq!((p.health, p.classification), (Some(Health::Available), None));
    assert_eq!(
        (n.connected, n.connected_replicas, n.replicas, n.replicas_summary.as_deref()),
        (Some(true), Some(1), Some(2), Some("1/2")),
        "a silent replica is still one of the replicas"
    );

    // No replica connected to the node: unknown, and the node is away (0 of 2).
    let (p, n) = planned(&two(
        Some((replica_provider(Unsure, down(4, 2)), away.clone())),
        Some((replica_provider(Unsure, None), away)),
    ));
    assert_eq!((p.health, p.classification), (Some(Health::Unknown), Some(Classification::HealthUnknown)));
    assert_eq!((p.generation, p.last_observation_sequence), (Some(4), Some(2)), "the last evidence still");
    assert_eq!((n.connected, n.replicas_summary.as_deref()), (Some(false), Some("0/2")));

    // No replica answers: nothing is written at all (the last status stays).
    assert_eq!(
        plan(
            &two(None, None),
            &BTreeMap::from([("llama".to_string(), ProviderMirror::default())]),
            &BTreeMap::from([("mac-1".to_string(), NodeMirror::default())]),
            &BTreeMap::new(),
            at(1000)
        ),
        Writes::default()
    );
}

#[test]
fn a_node_keeps_its_newest_session_while_a_replica_restarts() {
    let connected = |generation: u64| edge_node(true, Some(generation), Some(generation * 10));
    let both = merged_node(&[&connected(4), &connected(7)], 2, &NodeMirror::default(), &NodeFacts::default(), at(1000));
    assert_eq!(
        (both.generation, both.since.clone(), both.replicas_summary.as_deref()),
        (Some(7), time(70), Some("2/2"))
    );

    // Replica b (generation 7) restarts: still connected through a; the
    // generation does not go back and `since` stays.
    let away = edge_node(false, None, None);
    let one = merged_node(&[&connected(4), &away], 2, &both, &NodeFacts::default(), at(2000));
    assert_eq!((one.connected, one.generation, one.since.clone()), (Some(true), Some(7), time(70)));
    assert_eq!(one.replicas_summary.as_deref(), Some("1/2"));

    // Back with a new session: a newer generation, and `since` moves to it.
    let back = merged_node(&[&connected(4), &connected(90)], 2, &one, &NodeFacts::default(), at(3000));
    assert_eq!(
        (back.generation, back.since.clone(), back.replicas_summary.as_deref()),
        (Some(90), time(900), Some("2/2"))
    );

    // Gone from both: away since now, the last generation kept.
    let gone = merged_node(&[&away, &away], 2, &back, &NodeFacts::default(), at(4000));
    assert_eq!((gone.connected, gone.generation, gone.since), (Some(false), Some(90), time(4000)));
}

// --- Managed credential -------------------------------------------------------

/// `GET /admin/v1/providers` of one replica listing `llama` with this
/// `credential` field (JSON as the Edge writes it; `None`: no field).
fn snapshot_with_credential(credential: Option<serde_json::Value>) -> ProvidersSnapshot {
    let mut p = json!({"id": "llama", "node": "mac-1", "node_ready": true, "health": "available", "overlay": null});
    if let Some(c) = credential {
        p["credential"] = c;
    }
    serde_json::from_value(json!({ "providers": [p] })).unwrap()
}

fn credential_condition(view: &EdgeView, previous: &ProviderMirror, now: i64) -> Option<Condition> {
    let providers = BTreeMap::from([("llama".to_string(), previous.clone())]);
    let writes = plan(view, &providers, &BTreeMap::new(), &BTreeMap::new(), at(now));
    match writes.providers.first() {
        Some((_, m)) => m.credential.clone(),
        None => previous.credential.clone(),
    }
}

fn ready_node() -> NodesSnapshot {
    NodesSnapshot { nodes: vec![edge_node(true, Some(4), Some(40))] }
}

#[test]
fn the_credential_field_is_parsed_tolerantly() {
    let parsed = |c: Option<serde_json::Value>| snapshot_with_credential(c).providers[0].credential.clone();
    assert_eq!(parsed(None), None, "absent: the provider has no managed credential");
    assert_eq!(parsed(Some(json!(null))), None);
    for (state, expected) in [
        ("ok", CredentialState::Ok),
        ("disabled", CredentialState::Disabled),
        ("invalid", CredentialState::Invalid),
        ("rejected", CredentialState::Rejected),
        ("refused_by_node", CredentialState::RefusedByNode),
    ] {
        assert_eq!(
            parsed(Some(json!({"profile": "llama", "state": state, "revision": 3}))),
            Some(EdgeCredential { problem: None, node_refusal: None, profile: "llama".into(), state: expected })
        );
    }
    assert_eq!(
        parsed(Some(json!({"profile": "llama", "state": "refused_by_node", "node_refusal": "revoked"})))
            .and_then(|c| c.node_refusal),
        Some("revoked".to_string())
    );
    // A state or shape this operator does not know: no information, and the rest still parses.
    for odd in [json!({"profile": "llama", "state": "expiring"}), json!({"state": "ok"}), json!("ok"), json!(3)] {
        let snapshot = snapshot_with_credential(Some(odd.clone()));
        assert_eq!(snapshot.providers[0].credential, None, "{odd}");
        assert_eq!(snapshot.providers[0].health, EdgeHealth::Available);
    }
}

#[test]
fn one_replica_credential_states_become_the_credential_accepted_condition() {
    let cases = [
        ("ok", "True", "Accepted"),
        ("disabled", "False", "CredentialDisabled"),
        ("invalid", "False", "CredentialInvalid"),
        ("rejected", "False", "CredentialRejected"),
        ("refused_by_node", "False", "CredentialRefusedByNode"),
    ];
    for (state, status, reason) in cases {
        let view = one(&snapshot_with_credential(Some(json!({"profile": "llama", "state": state}))), &ready_node());
        let c = credential_condition(&view, &ProviderMirror::default(), 1000).expect("a condition");
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            (CREDENTIAL_ACCEPTED, status, reason),
            "{state}"
        );
        assert!(c.message.contains("`llama`"), "names the profile: {}", c.message);
        assert_eq!(c.last_transition_time, Time(at(1000)));
    }
    // No credential field: no condition (an earlier one is removed).
    let view = one(&snapshot_with_credential(None), &ready_node());
    let before = ProviderMirror {
        credential: credential_condition(
            &one(&snapshot_with_credential(Some(json!({"profile": "llama", "state": "ok"}))), &ready_node()),
            &ProviderMirror::default(),
            1000,
        ),
        ..Default::default()
    };
    assert!(before.credential.is_some());
    assert_eq!(credential_condition(&view, &before, 2000), None);
}

#[test]
fn a_rejected_credential_is_written_once_and_keeps_its_transition_time() {
    let state = |s: &str| one(&snapshot_with_credential(Some(json!({"profile": "llama", "state": s}))), &ready_node());
    let providers = |m: &ProviderMirror| BTreeMap::from([("llama".to_string(), m.clone())]);
    let first =
        plan(&state("ok"), &providers(&ProviderMirror::default()), &BTreeMap::new(), &BTreeMap::new(), at(1000));
    let ok = first.providers[0].1.clone();
    // Rejected: a change a user sees.
    let writes = plan(&state("rejected"), &providers(&ok), &BTreeMap::new(), &BTreeMap::new(), at(2000));
    let rejected = writes.providers[0].1.clone();
    let c = rejected.credential.clone().unwrap();
    assert_eq!((c.status.as_str(), c.last_transition_time.clone()), ("False", Time(at(2000))));
    // Still rejected at the next poll: nothing to write.
    assert!(
        plan(&state("rejected"), &providers(&rejected), &BTreeMap::new(), &BTreeMap::new(), at(3000))
            .providers
            .is_empty()
    );
    // Invalid is False too: the reason changes, the transition time does not.
    let invalid = plan(&state("invalid"), &providers(&rejected), &BTreeMap::new(), &BTreeMap::new(), at(4000))
        .providers[0]
        .1
        .clone();
    let c = invalid.credential.unwrap();
    assert_eq!((c.reason.as_str(), c.last_transition_time), ("CredentialInvalid", Time(at(2000))));

    // Through status and back, as the mirror reads an object it did not write.
    let status = rejected.to_status();
    assert_eq!(status.conditions.len(), 1);
    assert_eq!(ProviderMirror::of(Some(&status)), rejected);
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["conditions"][0]["type"], "CredentialAccepted");
    assert_eq!(json["conditions"][0]["reason"], "CredentialRejected");
}

#[test]
fn across_replicas_any_replicas_rejected_or_invalid_wins() {
    let replica = |state: Option<&str>| {
        let credential = state.map(|s| json!({"profile": "llama", "state": s}));
        Some((snapshot_with_credential(credential), ready_node()))
    };
    let view = |a: Option<&str>, b: Option<&str>| EdgeView {
        replicas: BTreeMap::from([("edge-a".to_string(), replica(a)), ("edge-b".to_string(), replica(b))]),
    };
    let reason = |v: &EdgeView| credential_condition(v, &ProviderMirror::default(), 1000).map(|c| c.reason);
    assert_eq!(reason(&view(Some("ok"), Some("ok"))).as_deref(), Some("Accepted"));
    assert_eq!(reason(&view(Some("ok"), Some("rejected"))).as_deref(), Some("CredentialRejected"));
    assert_eq!(reason(&view(Some("rejected"), Some("ok"))).as_deref(), Some("CredentialRejected"));
    assert_eq!(reason(&view(Some("rejected"), Some("invalid"))).as_deref(), Some("CredentialInvalid"));
    assert_eq!(reason(&view(Some("disabled"), Some("ok"))).as_deref(), Some("CredentialDisabled"));
    assert_eq!(reason(&view(Some("ok"), Some("invalid"))).as_deref(), Some("CredentialInvalid"));
    assert_eq!(reason(&view(Some("rejected"), Some("refused_by_node"))).as_deref(), Some("CredentialRefusedByNode"));
    assert_eq!(reason(&view(Some("refused_by_node"), Some("invalid"))).as_deref(), Some("CredentialInvalid"));
    // A replica without the field (an older Edge mid-rollout) says nothing.
    assert_eq!(reason(&view(None, Some("rejected"))).as_deref(), Some("CredentialRejected"));
    assert_eq!(reason(&view(None, None)), None);
    // A replica that does not answer says nothing either.
    let half = EdgeView {
        replicas: BTreeMap::from([("edge-a".to_string(), replica(Some("ok"))), ("edge-b".to_string(), None)]),
    };
    assert_eq!(reason(&half).as_deref(), Some("Accepted"));
    let c = credential_condition(&view(Some("ok"), Some("rejected")), &ProviderMirror::default(), 1000).unwrap();
    assert!(c.message.contains("on 1 of 2 Edge replicas"), "{}", c.message);
}

/// Issue 28 item 6: `ejected_until` from `/admin/v1/providers` becomes
/// `status.ejectedUntil` (the latest of the replicas', whole seconds),
/// whatever the health; it is written when it appears and when it clears.
#[test]
fn outlier_ejection_is_mirrored_from_every_answering_replica() {
    let parsed: ProvidersSnapshot = serde_json::from_value(json!({
        "providers": [
            {"id": "llama", "node": "mac-1", "node_ready": true, "health": "available",
             "ejected_until": "1970-01-01T00:16:40.250Z", "consecutive_failures": 0, "ejections": 1},
            {"id": "qwen", "node": "mac-1", "node_ready": true, "health": "available", "ejected_until": null},
            {"id": "old", "node": "mac-1", "node_ready": true, "health": "available", "ejected_until": 17}
        ]
    }))
    .unwrap();
    let ejected = parsed.providers[0].ejected_until.clone();
    assert_eq!(ejected.as_deref().and_then(parse_time).map(|t| t.0.as_millisecond()), Some(1_000_250));
    assert_eq!(parsed.providers[1].ejected_until, None);
    assert_eq!(parsed.providers[2].ejected_until, None, "read tolerantly");

    let node = edge_node(true, Some(4), Some(1));
    let with = |until: Option<String>| EdgeProvider { ejected_until: until, ..replica_provider(Up, None) };
    let healthy = ProviderMirror::default();
    let view = two(
        Some((with(ejected.clone()), node.clone())),
        Some((with(Some("1970-01-01T00:15:00Z".into())), node.clone())),
    );
    let current = BTreeMap::from([("llama".to_string(), healthy.clone())]);
    let writes = plan(&view, &current, &BTreeMap::new(), &BTreeMap::new(), at(950));
    let (_, mirrored) = &writes.providers[0];
    assert_eq!(mirrored.health, Some(Health::Available), "health is untouched");
    assert_eq!(mirrored.ejected_until, time(1000), "the latest, in whole seconds");
    assert_eq!(mirrored.to_status().ejected_until, time(1000));

    // Nothing new: no write. Back in selection everywhere: cleared.
    let current = BTreeMap::from([("llama".to_string(), mirrored.clone())]);
    assert!(plan(&view, &current, &BTreeMap::new(), &BTreeMap::new(), at(960)).providers.is_empty());
    let back = two(Some((with(None), node.clone())), Some((with(None), node)));
    let writes = plan(&back, &current, &BTreeMap::new(), &BTreeMap::new(), at(1001));
    assert_eq!(writes.providers[0].1.ejected_until, None);
}

/// Issue 29: `residency`, `last_load_seconds` and `last_load_at` from
/// `/admin/v1/providers`, read tolerantly.
#[test]
fn residency_fields_are_read_tolerantly() {
    let parsed: ProvidersSnapshot = serde_json::from_value(json!({
        "providers": [
            {"id": "a", "node": "mac-1", "node_ready": true, "health": "available", "residency": "loaded",
             "model_memory": {"size_bytes": 2_000_000_000u64, "vram_bytes": 2_000_000_000u64},
             "last_load_seconds": 12.3456, "last_load_at": "2026-11-01T12:00:00.750Z"},
            {"id": "b", "node": "mac-1", "node_ready": true, "health": "available", "residency": "not_loaded",
             "model_memory": null, "last_load_seconds": null, "last_load_at": null},
            {"id": "c", "node": "mac-1", "node_ready": false, "health": "unknown", "residency": "unknown"},
            // An Edge older than the fields, or a value this operator does not know.
            {"id": "d", "node": "mac-1", "node_ready": true, "health": "available"},
            {"id": "e", "node": "mac-1", "node_ready": true, "health": "available", "residency": "warming",
             "last_load_seconds": "12", "last_load_at": 17},
            {"id": "f", "node": "mac-1", "node_ready": true, "health": "available", "last_load_seconds": -1.0}
        ]
    }))
    .unwrap();
    let fields: Vec<_> = parsed
        .providers
        .iter()
        .map(|p| {
            (
                p.residency.map(Residency::from),
                last_load_ms(p),
                p.last_load_at.as_deref().and_then(parse_time).is_some(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            (Some(Residency::Loaded), Some(12_346), true),
            (Some(Residency::NotLoaded), None, false),
            (Some(Residency::Unknown), None, false),
            (None, None, false),
            (None, None, false),
            (None, None, false),
        ]
    );
}

#[test]
fn the_residency_merge_table() {
    use Residency::{Loaded, NotLoaded, Unknown};
    let cases: [(&[Option<Residency>], Option<Residency>); 9] = [
        (&[], None),
        (&[None], None),
        (&[None, None], None),
        (&[Some(Unknown)], Some(Unknown)),
        (&[None, Some(Unknown)], Some(Unknown)),
        // A replica that knows beats one that does not.
        (&[Some(Unknown), Some(NotLoaded)], Some(NotLoaded)),
        (&[Some(Loaded), Some(Unknown), None], Some(Loaded)),
        // They differ only between two reports: loaded is the newer news.
        (&[Some(NotLoaded), Some(Loaded)], Some(Loaded)),
        (&[Some(NotLoaded), Some(NotLoaded)], Some(NotLoaded)),
    ];
    for (seen, expected) in cases {
        assert_eq!(merge_residency(seen), expected, "{seen:?}");
    }
}

/// Residency and the latest load are mirrored from every answering replica
/// (the latest `last_load_at` wins, with its duration), written when they
/// change and not otherwise, and round-trip through `status`.
#[test]
fn residency_and_the_latest_load_are_mirrored_across_replicas() {
    let node = edge_node(true, Some(4), Some(1));
    let with = |residency: Option<Residency>, load: Option<(u64, i64)>| EdgeProvider {
        residency: residency.map(|r| match r {
            Residency::Loaded => admin::Residency::Loaded,
            Residency::NotLoaded => admin::Residency::NotLoaded,
            Residency::Unknown => admin::Residency::Unknown,
        }),
        last_load_seconds: load.map(|(ms, _)| ms as f64 / 1000.0),
        learned_stall_ms: None,
        last_load_at: load.map(|(_, seconds)| at(seconds).to_string()),
        ..replica_provider(Up, None)
    };
    // edge-a: not connected to the node yet (unknown), holds an older load;
    // edge-b: loaded, with the newer one.
    let view = two(
        Some((with(Some(Residency::Unknown), Some((30_000, 500))), node.clone())),
        Some((with(Some(Residency::Loaded), Some((12_345, 900))), node.clone())),
    );
    let (mirrored, _) = planned(&view);
    assert_eq!(mirrored.residency, Some(Residency::Loaded));
    assert_eq!((mirrored.last_load_seconds, mirrored.last_load_time.clone()), (Some(12.345), time(900)));
    let status = mirrored.to_status();
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(
        (&json["residency"], &json["lastLoadSeconds"], &json["lastLoadTime"]),
        (&json!("loaded"), &json!(12.345), &json!("1970-01-01T00:15:00Z"))
    );
    let read_back: ProviderStatus = serde_json::from_value(json).unwrap();
    assert_eq!(ProviderMirror::of(Some(&read_back)), mirrored);

    // The same again: nothing to write.
    let current = BTreeMap::from([("llama".to_string(), mirrored.clone())]);
    assert!(plan(&view, &current, &BTreeMap::new(), &BTreeMap::new(), at(1000)).providers.is_empty());

    // Evicted everywhere: written, the last load stays.
    let evicted = two(
        Some((with(Some(Residency::NotLoaded), Some((12_345, 900))), node.clone())),
        Some((with(Some(Residency::NotLoaded), Some((12_345, 900))), node.clone())),
    );
    let writes = plan(&evicted, &current, &BTreeMap::new(), &BTreeMap::new(), at(1100));
    let (_, next) = &writes.providers[0];
    assert_eq!((next.residency, next.last_load_seconds), (Some(Residency::NotLoaded), Some(12.345)));
    assert_eq!(next.health, Some(Health::Available), "residency never changes health");

    // A new load (its time in ms, written in whole seconds): written.
    let current = BTreeMap::from([("llama".to_string(), next.clone())]);
    let reloaded = two(
        Some((
            EdgeProvider {
                last_load_at: Some(Timestamp::from_millisecond(2_000_400).unwrap().to_string()),
                ..with(Some(Residency::Loaded), Some((20_500, 0)))
            },
            node.clone(),
        )),
        None,
    );
    let writes = plan(&reloaded, &current, &BTreeMap::new(), &BTreeMap::new(), at(2100));
    let (_, next) = &writes.providers[0];
    assert_eq!((next.residency, next.last_load_seconds), (Some(Residency::Loaded), Some(20.5)));
    assert_eq!(next.last_load_time, time(2000));

    // An Edge without the fields: nothing about residency.
    let (older, _) = planned(&two(Some((with(None, None), node)), None));
    assert_eq!((older.residency, older.last_load_seconds, older.last_load_time), (None, None, None));
}

/// Issue 43 D1: a provider whose node refuses its credential's leases is
/// shown so: `unavailable`, classification `credential_refused_by_node`,
/// `CredentialAccepted=False` with the node's reason.
#[test]
fn a_node_refusing_the_credential_is_the_classification_and_the_condition() {
    let mut snapshot = snapshot_with_credential(Some(
        json!({"profile": "llama", "state": "refused_by_node", "node_refusal": "revoked"}),
    ));
    snapshot.providers[0].health = EdgeHealth::Unavailable;
    let view = one(&snapshot, &ready_node());
    let providers = BTreeMap::from([("llama".to_string(), ProviderMirror::default())]);
    let writes = plan(&view, &providers, &BTreeMap::new(), &BTreeMap::new(), at(1000));
    let mirror = &writes.providers[0].1;
    assert_eq!(mirror.health, Some(Health::Unavailable));
    assert_eq!(mirror.classification, Some(Classification::CredentialRefusedByNode));
    let c = mirror.credential.clone().unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "CredentialRefusedByNode"));
    assert!(c.message.contains("(revoked)"), "{}", c.message);
    // The node accepts again: available, no classification, Accepted.
    let view = one(&snapshot_with_credential(Some(json!({"profile": "llama", "state": "ok"}))), &ready_node());
    let providers = BTreeMap::from([("llama".to_string(), mirror.clone())]);
    let writes = plan(&view, &providers, &BTreeMap::new(), &BTreeMap::new(), at(2000));
    let mirror = &writes.providers[0].1;
    assert_eq!((mirror.health, mirror.classification), (Some(Health::Available), None));
    assert_eq!(mirror.credential.as_ref().unwrap().reason, "Accepted");
}

// --- Node conditions: WorkspacesReady and BundleCurrent -------------------------

/// A ready session of a replica with the node, with its verdicts on the
/// workspaces and the serial its certificate has.
fn session(verdicts: &[(&str, &str)], serial: Option<&str>) -> EdgeNode {
    EdgeNode {
        workspaces: verdicts.iter().map(|(r, v)| (r.to_string(), v.to_string())).collect(),
        certificate_serial: serial.map(str::to_string),
        ..edge_node(true, Some(4), Some(100))
    }
}

fn assigned(refs: &[&str]) -> NodeWorkspaces {
    NodeWorkspaces { assigned: refs.iter().map(|r| r.to_string()).collect(), problems: vec![], generation: Some(3) }
}

fn status_of(c: &Condition) -> (&str, &str) {
    (c.status.as_str(), c.reason.as_str())
}

#[test]
fn workspaces_ready_follows_the_nodes_verdicts() {
    let both = assigned(&["site", "tmp"]);
    let ready = |w: &NodeWorkspaces, seen: &[&EdgeNode]| workspaces_ready(w, seen, None, at(1000));

    // Every assigned workspace accepted: True, at the spec's generation.
    let ok = session(&[("site", "accepted"), ("tmp", "accepted")], None);
    let c = ready(&both, &[&ok]);
    assert_eq!(status_of(&c), ("True", "Accepted"));
    assert_eq!((c.observed_generation, c.last_transition_time.clone()), (Some(3), Time(at(1000))));

    // One refused on one replica of two: False, naming the workspace and the node's reason.
    let refused = session(&[("site", "accepted"), ("tmp", "outside_allowed_roots")], None);
    let c = ready(&both, &[&ok, &refused]);
    assert_eq!(status_of(&c), ("False", "WorkspaceRefused"));
    assert!(c.message.starts_with("workspace `tmp`: the node refused it (outside_allowed_roots)"), "{}", c.message);
    assert!(!c.message.contains("`site`"), "{}", c.message);
    // The Edge's own verdicts for a node that did not answer are refusals too.
    let c = ready(&both, &[&session(&[("site", "not_reported"), ("tmp", "accepted")], None)]);
    assert_eq!(status_of(&c), ("False", "WorkspaceRefused"));
    assert!(c.message.contains("`site`: the node refused it (not_reported)"), "{}", c.message);

    // No session, or sessions not ready yet (no verdicts before readiness): not known.
    let registered = EdgeNode { phase: Some(SessionPhase::Registered), ..refused.clone() };
    let away = edge_node(false, None, None);
    for seen in [vec![], vec![&away], vec![&registered]] {
        assert_eq!(status_of(&ready(&both, &seen)), ("Unknown", "NotConnected"), "{seen:?}");
    }
    // A replica that does not report a workspace (config not reloaded, older Edge): not known.
    let c = ready(&both, &[&session(&[("site", "accepted")], None)]);
    assert_eq!(status_of(&c), ("Unknown", "NotReported"));
    assert!(c.message.contains("`tmp`"), "{}", c.message);
    // ... unless another replica does.
    assert_eq!(status_of(&ready(&both, &[&session(&[("site", "accepted")], None), &ok])), ("True", "Accepted"));
    // Verdicts on workspaces the node no longer has do not count.
    let c = ready(&assigned(&["site"]), &[&session(&[("site", "accepted"), ("old", "not_found")], None)]);
    assert_eq!(status_of(&c), ("True", "Accepted"));

    // No workspaces: True, connected or not.
    assert_eq!(status_of(&ready(&assigned(&[]), &[])), ("True", "Accepted"));

    // A workspace left out by the build: its problem first, whatever the node says.
    let mut problems = assigned(&["site"]);
    problems.problems = vec![crate::reconcile::Invalid {
        reason: crate::reconcile::Reason::TemplateNotFound,
        message: "workspace `tools`: WorkspaceTemplate `x` does not exist".into(),
    }];
    for seen in [vec![], vec![&refused]] {
        let c = ready(&problems, &seen);
        assert_eq!(status_of(&c), ("False", "TemplateNotFound"));
        assert!(c.message.starts_with("workspace `tools`: WorkspaceTemplate `x` does not exist"), "{}", c.message);
    }
    let problems = NodeWorkspaces { assigned: vec!["tmp".into()], ..problems };
    let c = ready(&problems, &[&refused]);
    assert!(c.message.contains("; workspace `tmp`: the node refused it (outside_allowed_roots)"), "{}", c.message);

    // The transition time moves only when the status flips.
    let first = ready(&both, &[&ok]);
    let same = workspaces_ready(&both, &[&ok], Some(&first), at(2000));
    assert_eq!(same.last_transition_time, Time(at(1000)));
    let flipped = workspaces_ready(&both, &[&refused], Some(&first), at(3000));
    assert_eq!(flipped.last_transition_time, Time(at(3000)));
}

#[test]
fn bundle_current_compares_each_sessions_serial_with_the_issued_one() {
    let current = |seen: &[&EdgeNode]| bundle_current("mac-1", "0af3", seen, None, at(1000));

    let issued = session(&[], Some("0af3"));
    let c = current(&[&issued, &issued]);
    assert_eq!(status_of(&c), ("True", "Current"));
    assert!(c.message.contains("0af3"), "{}", c.message);
    // The same number however written (case, a DER zero byte, colons).
    assert_eq!(status_of(&current(&[&session(&[], Some("00:0A:F3"))])), ("True", "Current"));

    // One replica's session presents another serial: False, naming it and what to do.
    let old = session(&[], Some("7b"));
    let c = current(&[&issued, &old]);
    assert_eq!(status_of(&c), ("False", "OlderBundle"));
    assert!(c.message.contains("serial 7b (on 1 of 2 Edge replicas"), "{}", c.message);
    assert!(
        c.message.contains("make a new bundle (iop-operator node-bundle mac-1) and restart iop-node"),
        "{}",
        c.message
    );

    // No session: not known. A session without a serial (an older Edge): not known either.
    let away = edge_node(false, None, None);
    for seen in [vec![], vec![&away]] {
        assert_eq!(status_of(&current(&seen)), ("Unknown", "NotConnected"));
    }
    assert_eq!(status_of(&current(&[&session(&[], Some(""))])), ("Unknown", "NotConnected"), "empty: none");
    let older_edge = session(&[], None);
    let c = current(&[&issued, &older_edge]);
    assert_eq!(status_of(&c), ("Unknown", "NotConnected"));
    assert!(c.message.contains("older"), "{}", c.message);
    // ... but an older bundle seen by another replica is still an older bundle.
    assert_eq!(status_of(&current(&[&old, &older_edge])), ("False", "OlderBundle"));
    // A session that has not reached readiness presented its certificate all the same.
    let registered = EdgeNode { phase: Some(SessionPhase::Registered), ..old.clone() };
    assert_eq!(status_of(&current(&[&registered])), ("False", "OlderBundle"));

    // Renewed and the node restarted with the new bundle: True again, at that time.
    let before = current(&[&old]);
    let after = bundle_current("mac-1", "0af3", &[&issued], Some(&before), at(2000));
    assert_eq!((status_of(&after), after.last_transition_time.clone()), (("True", "Current"), Time(at(2000))));
}

/// The plan: a rendered node gets `WorkspacesReady` (even while no replica
/// lists it), `BundleCurrent` once a certificate is issued and a replica
/// lists it; a node the build leaves out gets neither.
#[test]
fn node_conditions_in_the_plan() {
    let nodes = BTreeMap::from([("mac-1".to_string(), NodeMirror::default())]);
    let facts = |workspaces: Option<NodeWorkspaces>, serial: Option<&str>| {
        BTreeMap::from([("mac-1".to_string(), NodeFacts { issued_serial: serial.map(str::to_string), workspaces })])
    };
    let listed = NodesSnapshot { nodes: vec![session(&[("site", "accepted")], Some("0af3"))] };
    let view = one(&ProvidersSnapshot::default(), &listed);
    let planned = |facts: &BTreeMap<String, NodeFacts>, view: &EdgeView| {
        let writes = plan(view, &BTreeMap::new(), &nodes, facts, at(1000));
        writes.nodes.into_iter().next().map(|(_, m)| m).unwrap_or_default()
    };

    let m = planned(&facts(Some(assigned(&["site"])), Some("0af3")), &view);
    assert_eq!(m.workspaces_ready.as_ref().map(status_of), Some(("True", "Accepted")));
    assert_eq!(m.bundle_current.as_ref().map(status_of), Some(("True", "Current")));
    let types: Vec<String> = m.to_status().conditions.into_iter().map(|c| c.type_).collect();
    assert_eq!(types, ["WorkspacesReady", "BundleCurrent"]);
    assert_eq!(NodeMirror::of(Some(&m.to_status())), m, "read back as written");
    // Written: the same view plans nothing.
    let written = BTreeMap::from([("mac-1".to_string(), m)]);
    let writes = plan(&view, &BTreeMap::new(), &written, &facts(Some(assigned(&["site"])), Some("0af3")), at(2000));
    assert!(writes.nodes.is_empty());

    // Not rendered (no workspaces fact), no certificate: neither condition.
    let m = planned(&facts(None, None), &view);
    assert_eq!((m.workspaces_ready, m.bundle_current, m.connected), (None, None, Some(true)));

    // No answering replica lists the node: the connection fields are
    // cleared, the workspaces judged without a session.
    let unlisted = one(&ProvidersSnapshot::default(), &NodesSnapshot::default());
    let m = planned(&facts(Some(assigned(&["site"])), Some("0af3")), &unlisted);
    assert_eq!(m.workspaces_ready.as_ref().map(status_of), Some(("Unknown", "NotConnected")));
    assert_eq!(NodeMirror { workspaces_ready: None, ..m }, NodeMirror::default());
}

/// Status has one writer: what a status holds of the mirror's fields
/// beyond what the mirror applied is removed, and only that.
#[test]
fn leftovers_are_the_mirror_fields_the_apply_left_out() {
    let applied = ProviderMirror { health: Some(Health::Available), generation: Some(4), ..Default::default() };
    // After the apply: someone else's classification and sequence, and
    // other writers' fields (reconcile's Ready, publicModels).
    let other = crate::reconcile::conditions::next(
        &[],
        "Ready",
        crate::reconcile::conditions::Status::True,
        "Accepted",
        "",
        Some(1),
        at(1),
    );
    let held = ProviderStatus {
        classification: Some(Classification::ProviderUnhealthy),
        last_observation_sequence: Some(9),
        conditions: vec![other.clone()],
        observed_generation: Some(1),
        public_models: Some("llama".into()),
        ..applied.to_status()
    };
    let left = leftovers(Some(&held), &applied);
    assert_eq!(
        left,
        Leftovers { fields: vec!["classification".into(), "lastObservationSequence".into()], conditions: vec![] }
    );
    assert_eq!(
        removal(&json!({}), &left),
        json!({"status": {"classification": null, "lastObservationSequence": null}})
    );
    // Nothing beyond: nothing to remove (the steady state).
    assert!(leftovers(Some(&applied.to_status()), &applied).is_empty());
    assert!(leftovers(None, &applied).is_empty());

    // A condition of the mirror's the apply left out: the list without it,
    // guarded by the resourceVersion.
    let foreign = crate::reconcile::conditions::next(
        &[],
        "CredentialAccepted",
        crate::reconcile::conditions::Status::False,
        "CredentialRejected",
        "",
        None,
        at(1),
    );
    let held = ProviderStatus { conditions: vec![other.clone(), foreign.clone()], ..applied.to_status() };
    let left = leftovers(Some(&held), &applied);
    assert_eq!(left, Leftovers { fields: vec![], conditions: vec!["CredentialAccepted".into()] });
    let object = json!({"metadata": {"name": "llama", "resourceVersion": "42"},
                        "status": serde_json::to_value(&held).unwrap()});
    assert_eq!(
        removal(&object, &left),
        json!({"metadata": {"resourceVersion": "42"},
               "status": {"conditions": [serde_json::to_value(&other).unwrap()]}})
    );

    // The same for a NodeCatalog: its connection fields and its conditions.
    let node = NodeMirror { connected: Some(false), ..Default::default() };
    let held = NodeCatalogStatus { version: Some("0.1.0".into()), ..node.to_status() };
    assert_eq!(leftovers(Some(&held), &node), Leftovers { fields: vec!["version".into()], conditions: vec![] });
}

#[test]
fn a_sequence_where_none_belongs_is_a_visible_change() {
    let applied = ProviderMirror { health: Some(Health::Available), generation: Some(4), ..Default::default() };
    let with_sequence = ProviderMirror { last_observation_sequence: Some(3), ..applied.clone() };
    assert!(visible_change(&with_sequence, &applied));
    assert!(visible_change(&applied, &with_sequence));
    let newer = ProviderMirror { last_observation_sequence: Some(4), ..applied.clone() };
    assert!(!visible_change(&with_sequence, &newer), "a newer sequence alone is not written");
}

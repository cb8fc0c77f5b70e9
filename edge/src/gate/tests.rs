use super::*;

/// Issue 8 item 5: a held answer is bounded.
#[test]
fn answer_budget_counts_content_and_fails_past_the_limit() {
    let mut budget = AnswerBudget::new(10);
    let text = |t: &str| Event::Text(pb::TextDelta { text: t.into() });
    assert!(budget.charge(&text("12345")).is_ok());
    assert!(
        budget
            .charge(&Event::Usage(pb::Usage { prompt_tokens: 9, completion_tokens: 9, ..Default::default() }))
            .is_ok()
    );
    assert!(budget.charge(&text("12345")).is_ok(), "exactly the limit is fine");
    let call = Event::ToolCall(pb::ToolCallDelta {
        index: 0,
        id: "c".into(),
        name: String::new(),
        arguments_delta: String::new(),
    });
    let failure = budget.charge(&call).unwrap_err();
    assert_eq!(failure.kind(), FailureKind::ResponseTooLarge);
    assert!(!retryable(&failure), "the same request would only grow as large again");
}

#[test]
fn commit_points() {
    let text = Event::Text(pb::TextDelta { text: "a".into() });
    let started = Event::Started(pb::RunStarted { model: "m".into(), ..Default::default() });
    assert!(is_commit(&text, CommitPoint::FirstContent));
    assert!(!is_commit(&started, CommitPoint::FirstContent), "headers alone commit nothing");
    assert!(!is_commit(&text, CommitPoint::Terminal));
}

/// Issue 29: a run to a provider whose node reports its model
/// `not_loaded` carries the first-byte timeout extended by the last
/// measured load, as the node receives it; the same provider loaded, or
/// its report from another connection, carries the configured value.
#[tokio::test]
async fn the_node_receives_the_extended_first_byte_timeout_for_a_cold_model() {
    use crate::dispatch::RunTable;
    use crate::metrics::EdgeMetrics;
    use crate::residency::ResidencyTable;

    let mut config = crate::testing::one_provider_config("n1");
    config.providers[0].first_byte_timeout_ms = 30_000;
    let provider = config.providers[0].clone();
    let registry = crate::node::registry::NodeRegistry::default();
    let (control, _rx) = tokio::sync::mpsc::channel(1);
    registry.register("n1", crate::node::registry::Session::registered(5, control));
    let report = |residency: pb::ModelResidency| pb::ProviderResidency {
        provider_id: "p".into(),
        residency: residency.into(),
        last_load_ms: 25_000,
        last_loaded_at_unix_ms: 1_700_000_000_000,
        ..Default::default()
    };
    let sent = |residency: &ResidencyTable, generation: u64| {
        let lease = crate::testing::lease("r1", "n1", generation);
        let mut request = pb::RunRequest::default();
        address_run(&mut request, Some(&provider), lease.lease(), residency);
        let (control, mut control_rx) = tokio::sync::mpsc::channel(8);
        let handoff = Arc::new(crate::overlay::StallHandoff {
            registry: Default::default(),
            overlay: Default::default(),
            metrics: EdgeMetrics::new(),
        });
        async move {
            let table = Arc::new(RunTable::<pb::RunEvent>::default());
            let _run = dispatch::start_run(&table, &EdgeMetrics::new(), &handoff, lease, control, request, None)
                .await
                .unwrap();
            match control_rx.try_recv() {
                Ok(Ok(pb::EdgeToNode { msg: Some(pb::edge_to_node::Msg::RunAssign(a)) })) => {
                    a.request.expect("a small request rides the assignment").first_byte_timeout_ms
                }
                other => panic!("expected the assignment, got {other:?}"),
            }
        }
    };
    let residency = ResidencyTable::default();
    assert_eq!(sent(&residency, 5).await, 30_000, "no report: as configured");
    residency.apply(&config, &registry, "n1", 5, &[report(pb::ModelResidency::NotLoaded)]);
    assert_eq!(sent(&residency, 5).await, 55_000, "cold: configured + the last load");
    assert_eq!(sent(&residency, 6).await, 30_000, "a lease on another connection");
    residency.apply(&config, &registry, "n1", 5, &[report(pb::ModelResidency::Loaded)]);
    assert_eq!(sent(&residency, 5).await, 30_000, "loaded again");

    // The tunnel's own first-frame bound reads the same value.
    assert_eq!(first_byte_timeout(55_000), Duration::from_secs(55) + NODE_STALL_EVIDENCE_BUDGET);
    assert_eq!(first_byte_timeout(0), Duration::from_secs(60) + NODE_STALL_EVIDENCE_BUDGET);
}

/// Property tests: the tunnel path's only parse of a client body.
mod fuzz {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;
    use crate::ingress::fuzz::json_value;

    proptest! {
        /// Any bytes: a rewritten body or an invalid-request failure.
        #[test]
        fn fuzz_rewrite_model_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..256), target in ".*") {
            if let Err(failure) = rewrite_model(&body, &target, "/v1/messages") {
                prop_assert_eq!(failure.kind(), FailureKind::InvalidRequest);
            }
        }

        /// A JSON object gets exactly its `model` replaced (added if it
        /// had none); every other field is kept as it was.
        #[test]
        fn fuzz_rewrite_model_replaces_only_model(
            fields in prop::collection::vec((".*", json_value()), 0..8),
            model in prop::option::of(json_value()),
            target in ".*",
            pretty in any::<bool>(),
        ) {
            let mut object: serde_json::Map<String, Value> = fields.into_iter().collect();
            if let Some(model) = model {
                object.insert("model".into(), model);
            }
            let body = if pretty { serde_json::to_vec_pretty(&object) } else { serde_json::to_vec(&object) };
            let rewritten = rewrite_model(&body.unwrap(), &target, "/v1/messages");
            prop_assert!(rewritten.is_ok(), "{:?}", rewritten);
            let rewritten: Value = serde_json::from_slice(&rewritten.unwrap().0).unwrap();
            object.insert("model".into(), Value::String(target));
            prop_assert_eq!(rewritten, Value::Object(object));
        }

        /// Any other JSON value is an invalid request.
        #[test]
        fn fuzz_rewrite_model_rejects_non_objects(value in json_value().prop_filter("not an object", |v| !v.is_object())) {
            let failure = rewrite_model(&serde_json::to_vec(&value).unwrap(), "t", "/v1/messages").unwrap_err();
            prop_assert_eq!(failure.kind(), FailureKind::InvalidRequest);
        }
    }
}

/// A Chat Completions stream is asked for usage unless it asked itself;
/// anything else is left as the client sent it.
#[test]
fn a_chat_stream_is_asked_for_its_usage() {
    let rewrite = |body: serde_json::Value, path| {
        let (bytes, strip) = rewrite_model(body.to_string().as_bytes(), "t", path).unwrap();
        (serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(), strip)
    };
    let chat = "/v1/chat/completions";
    let (body, strip) = rewrite(serde_json::json!({ "model": "m", "stream": true }), chat);
    assert_eq!((body["stream_options"]["include_usage"].as_bool(), strip), (Some(true), true));
    let (body, strip) = rewrite(serde_json::json!({ "stream": true, "stream_options": { "x": 1 } }), chat);
    assert_eq!((&body["stream_options"], strip), (&serde_json::json!({ "x": 1, "include_usage": true }), true));
    let (body, strip) = rewrite(serde_json::json!({ "stream": true, "stream_options": null }), chat);
    assert_eq!((body["stream_options"]["include_usage"].as_bool(), strip), (Some(true), true));
    let asked = serde_json::json!({ "stream": true, "stream_options": { "include_usage": true } });
    assert!(!rewrite(asked, chat).1, "the client asked: its chunk is its own");
    for (body, path) in [
        (serde_json::json!({ "stream": false }), chat),
        (serde_json::json!({}), chat),
        (serde_json::json!({ "stream": true }), "/v1/messages"),
        (serde_json::json!({ "stream": true, "stream_options": "odd" }), chat),
    ] {
        let (rewritten, strip) = rewrite(body.clone(), path);
        assert!(!strip, "{body}");
        assert_eq!(rewritten.get("stream_options"), body.get("stream_options"), "{body}");
    }
}

use super::*;
use crate::adapter::fake::{self, Reply};
use crate::adapter::http_client;
use ModelResidency::{Loaded, NotLoaded, Unknown};

fn obs(residency: ModelResidency, size_bytes: u64, vram_bytes: u64) -> Observation {
    Observation { residency, size_bytes, vram_bytes, context_window: 0, image_input: pb::ImageInput::Unknown }
}

/// `obs` with what the server said of image input.
fn images(observation: Observation, image_input: pb::ImageInput) -> Observation {
    Observation { image_input, ..observation }
}

/// `obs` with the context window the server said.
fn window(observation: Observation, context_window: u32) -> Observation {
    Observation { context_window, ..observation }
}

// A real `ollama ps` answer (0.5.x).
const PS: &str = r#"{"models":[{"name":"llama3.2:latest","model":"llama3.2:latest","size":3622320128,
        "digest":"a80c4f17acd5","details":{"parent_model":"","format":"gguf","family":"llama"},
        "expires_at":"2026-12-04T06:40:07.543Z","size_vram":3622320128,"context_length":8192},
        {"name":"qwen2.5:32b","model":"qwen2.5:32b","size":21500000000,"size_vram":20000000000,
        "expires_at":"2026-12-04T06:45:00Z"}]}"#;

#[test]
fn ollama_ps_table() {
    let cases: &[(&str, &str, Option<Observation>)] = &[
        (PS, "llama3.2", Some(window(obs(Loaded, 3622320128, 3622320128), 8192))),
        (PS, "llama3.2:latest", Some(window(obs(Loaded, 3622320128, 3622320128), 8192))),
        (PS, "qwen2.5:32b", Some(obs(Loaded, 21500000000, 20000000000))),
        (PS, "qwen2.5", Some(obs(NotLoaded, 0, 0))),
        (PS, "qwen2.5:7b", Some(obs(NotLoaded, 0, 0))),
        (PS, "llama3.2:1b", Some(obs(NotLoaded, 0, 0))),
        (r#"{"models":[]}"#, "llama3.2", Some(obs(NotLoaded, 0, 0))),
        (r#"{"models":[{"model":"m:latest"}]}"#, "m", Some(obs(Loaded, 0, 0))),
        (r#"{"object":"list","data":[]}"#, "m", None),
        (r#"{"models":"no"}"#, "m", None),
        ("[]", "m", None),
        ("not json", "m", None),
    ];
    for (body, target, want) in cases {
        assert_eq!(ollama_ps(body.as_bytes(), target), *want, "{target} in {body}");
    }
}

#[test]
fn expires_at_alone_changes_nothing() {
    let later = PS.replace("2026-12-04T06:40:07.543Z", "2026-12-04T06:50:00Z");
    assert_eq!(ollama_ps(PS.as_bytes(), "llama3.2"), ollama_ps(later.as_bytes(), "llama3.2"));
}

#[test]
fn lm_studio_and_llama_cpp_tables() {
    // LM Studio 0.3 `/api/v0/models/{id}`.
    let lms_loaded = r#"{"id":"qwen2-vl-7b-instruct","object":"model","type":"vlm","publisher":"mlx-community",
            "arch":"qwen2_vl","compatibility_type":"mlx","quantization":"4bit","state":"loaded","max_context_length":32768}"#;
    let lms_cold = lms_loaded.replace(r#""state":"loaded""#, r#""state":"not-loaded""#);
    let vlm = |o| images(o, pb::ImageInput::Accepted);
    let cases: &[(u16, &str, Option<Observation>)] = &[
        (200, lms_loaded, Some(vlm(window(obs(Loaded, 0, 0), 32768)))),
        (200, &lms_cold, Some(vlm(window(obs(NotLoaded, 0, 0), 32768)))),
        (
            200,
            &lms_loaded.replace("}", r#","loaded_context_length":4096}"#),
            Some(vlm(window(obs(Loaded, 0, 0), 4096))),
        ),
        (
            200,
            &lms_loaded.replace(r#""type":"vlm""#, r#""type":"llm""#),
            Some(images(window(obs(Loaded, 0, 0), 32768), pb::ImageInput::Refused)),
        ),
        (200, &lms_loaded.replace(r#""type":"vlm""#, r#""type":"embeddings""#), Some(window(obs(Loaded, 0, 0), 32768))),
        (200, r#"{"state":"loading"}"#, None),
        (404, r#"{"error":"Model not found"}"#, None),
        (200, r#"{"default_generation_settings":{}}"#, None),
    ];
    for (status, body, want) in cases {
        assert_eq!(lm_studio(*status, body.as_bytes()), *want, "{status} {body}");
    }
    // llama.cpp server `/props`.
    let cases: &[(u16, &str, Option<Observation>)] = &[
        (
            200,
            r#"{"default_generation_settings":{"n_ctx":4096,"params":{}},"total_slots":1,
                "model_path":"/models/qwen.gguf","chat_template":"{{ x }}","build_info":"b4600"}"#,
            Some(window(obs(Loaded, 0, 0), 4096)),
        ),
        (200, r#"{"model_path":"m.gguf"}"#, Some(obs(Loaded, 0, 0))),
        // A text-only model, and one with a projector (`--mmproj`).
        (
            200,
            r#"{"model_path":"m.gguf","modalities":{"vision":false,"audio":false}}"#,
            Some(images(obs(Loaded, 0, 0), pb::ImageInput::Refused)),
        ),
        (
            200,
            r#"{"model_path":"m.gguf","modalities":{"vision":true,"audio":false}}"#,
            Some(images(obs(Loaded, 0, 0), pb::ImageInput::Accepted)),
        ),
        (
            503,
            r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
            Some(obs(NotLoaded, 0, 0)),
        ),
        (503, r#"{"error":{"code":503,"message":"Service Unavailable"}}"#, None),
        (200, r#"{"state":"loaded"}"#, None),
        (404, r#"{"error":"not found"}"#, None),
        (401, r#"{"error":{"message":"Invalid API Key"}}"#, None),
    ];
    for (status, body, want) in cases {
        assert_eq!(llama_cpp_props(*status, body.as_bytes()), *want, "{status} {body}");
    }
}

#[test]
fn reports_are_owed_once_per_change() {
    let mut reports = ResidencyReports::default();
    let cold = residency_of("p1", obs(NotLoaded, 0, 0), Load::default(), true);
    assert!(reports.owed(cold.clone()).is_some(), "the first is always owed");
    assert!(reports.owed(cold.clone()).is_none());
    assert_eq!(reports.residency("p1"), Some(NotLoaded));
    let warm = residency_of("p1", obs(Loaded, 10, 8), Load::default(), true);
    assert!(reports.owed(warm.clone()).is_some());
    let loaded_after = residency_of("p1", obs(Loaded, 10, 8), Load { ms: 1500, at_unix_ms: 7 }, true);
    assert!(reports.owed(loaded_after).is_some(), "a new load is owed");
    assert!(reports.owed(residency_of("p2", obs(Unknown, 0, 0), Load::default(), true)).is_some());
    let detected_otherwise = residency_of("p1", obs(Loaded, 10, 8), Load { ms: 1500, at_unix_ms: 7 }, false);
    assert!(reports.owed(detected_otherwise).is_some(), "what the server continues is owed too");
    let said_images = residency_of(
        "p1",
        images(obs(Loaded, 10, 8), pb::ImageInput::Refused),
        Load { ms: 1500, at_unix_ms: 7 },
        false,
    );
    assert!(reports.owed(said_images).is_some(), "what the model reads is owed too");
}

/// Which servers are asked to continue a prefilled answer.
#[test]
fn ollama_and_llama_cpp_continue_prefills() {
    use AdapterKind::{Ollama, OpenAi};
    for (adapter, dialect, continues) in [
        (Ollama, Dialect::Ollama, true),
        (OpenAi, Dialect::LlamaCpp, true),
        (OpenAi, Dialect::Ollama, true),
        (OpenAi, Dialect::LmStudio, false),
        (OpenAi, Dialect::Silent, false),
    ] {
        assert_eq!(continues_prefill(adapter, dialect), continues, "{adapter:?} {dialect:?}");
    }
}

#[tokio::test]
async fn ollama_adapter_asks_api_ps_only() {
    let client = http_client();
    let mut server =
        fake::serve(Reply::json(200, r#"{"models":[{"name":"test-model","size":5,"size_vram":4}]}"#)).await;
    let target = fake::target(AdapterKind::Ollama, &server.base_url);
    assert_eq!(observe(&client, &target, None).await, (obs(Loaded, 5, 4), Dialect::Ollama));
    let req = server.request().await;
    assert_eq!((req.method.as_str(), req.path.as_str()), ("GET", "/api/ps"));
    assert!(server.received().is_none(), "one call");

    // A managed-credential provider asked without a key: unknown.
    let keyed = fake::serve(Reply::json(401, r#"{"error":"unauthorized"}"#)).await;
    let mut target = fake::target(AdapterKind::Ollama, &keyed.base_url);
    target.credential_profile = Some("key".into());
    assert_eq!(observe(&client, &target, None).await.0, Observation::UNKNOWN);
}

#[tokio::test]
async fn openai_adapter_detects_in_order_and_remembers() {
    let client = http_client();
    // Nothing answers in shape: three calls in order, then silence.
    let mut server = fake::serve(Reply::json(404, r#"{"error":"not found"}"#)).await;
    let target = fake::target(AdapterKind::OpenAi, &server.base_url);
    assert_eq!(observe(&client, &target, None).await, (Observation::UNKNOWN, Dialect::Silent));
    let paths: Vec<_> = [server.request().await, server.request().await, server.request().await]
        .into_iter()
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(
        paths,
        [
            ("GET".into(), "/api/v0/models/test-model".into()),
            ("GET".into(), "/props".into()),
            ("GET".into(), "/api/ps".into())
        ]
    );
    assert_eq!(observe(&client, &target, Some(Dialect::Silent)).await.0, Observation::UNKNOWN);
    assert!(server.received().is_none(), "a silent target is not asked again");

    // llama.cpp: LM Studio's path 404s first, then /props answers.
    let app = axum::Router::new()
        .route("/props", axum::routing::get(|| async { axum::Json(serde_json::json!({"model_path": "m.gguf"})) }));
    let base = fake::serve_router(app).await;
    let target = fake::target(AdapterKind::OpenAi, &base);
    assert_eq!(observe(&client, &target, None).await, (obs(Loaded, 0, 0), Dialect::LlamaCpp));

    // A refused server: unknown and silent.
    let refused = fake::refused_base_url().await;
    let target = fake::target(AdapterKind::OpenAi, &refused);
    assert_eq!(observe(&client, &target, None).await, (Observation::UNKNOWN, Dialect::Silent));
}

#[test]
fn a_model_name_is_one_path_segment() {
    assert_eq!(percent_encode_segment("lmstudio-community/qwen:7b"), "lmstudio-community%2Fqwen%3A7b");
}

/// A monitor of provider `p1` (an Ollama target served by `app`), polling
/// hourly (the tests refresh it), sending its reports to the receiver.
async fn monitoring(app: axum::Router) -> (Arc<ResidencyMonitor>, mpsc::Receiver<pb::NodeToEdge>, CancellationToken) {
    let base = fake::serve_router(app).await;
    let target = fake::target(AdapterKind::Ollama, &base);
    let monitor = ResidencyMonitor::new(Duration::from_secs(3600));
    let (out, rx) = mpsc::channel(8);
    let stop = CancellationToken::new();
    tokio::spawn(monitor.clone().run(http_client(), vec![target], out, stop.clone()));
    (monitor, rx, stop)
}

async fn next_report(rx: &mut mpsc::Receiver<pb::NodeToEdge>) -> pb::ProviderResidencyReport {
    match rx.recv().await.unwrap().msg {
        Some(pb::node_to_edge::Msg::ResidencyReport(r)) => r,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn monitor_reports_all_once_then_only_changes() {
    let state = Arc::new(Mutex::new(r#"{"models":[]}"#.to_string()));
    let shared = state.clone();
    let app = axum::Router::new().route(
        "/api/ps",
        axum::routing::get(move || {
            let body = shared.lock().unwrap().clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    );
    let (monitor, mut rx, stop) = monitoring(app).await;
    let first = next_report(&mut rx).await;
    assert_eq!(first.providers.len(), 1);
    assert_eq!(first.providers[0].residency(), NotLoaded);
    assert!(monitor.cold("p1"));

    // Unchanged figures are owed nothing: the next report is the change.
    monitor.refresh("p1");
    *state.lock().unwrap() = r#"{"models":[{"name":"test-model","size":9,"size_vram":9}]}"#.into();
    monitor.refresh("p1");
    let next = next_report(&mut rx).await;
    assert_eq!((next.providers[0].residency(), next.providers[0].size_bytes), (Loaded, 9));
    assert!(!monitor.cold("p1"));
    stop.cancel();
}

/// Ollama's `/api/show` is asked for the model's image input until it
/// answers (a server that starts after its node), then remembered for the
/// connection; the report carries what it said.
#[tokio::test]
async fn ollama_image_input_is_asked_until_said_then_remembered() {
    let ps = Arc::new(Mutex::new(serde_json::json!({"models": []})));
    let shows = Arc::new(Mutex::new(0u32));
    let (listed, counted) = (ps.clone(), shows.clone());
    let app = axum::Router::new()
        .route("/api/ps", axum::routing::get(move || std::future::ready(axum::Json(listed.lock().unwrap().clone()))))
        .route(
            "/api/show",
            axum::routing::post(move || {
                let mut shows = counted.lock().unwrap();
                *shows += 1;
                // Not up yet, then a text-only model.
                std::future::ready(match *shows {
                    1 => (axum::http::StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({}))),
                    _ => (axum::http::StatusCode::OK, axum::Json(serde_json::json!({"capabilities": ["completion"]}))),
                })
            }),
        );
    let (monitor, mut rx, stop) = monitoring(app).await;
    let mut next = async || {
        let report = next_report(&mut rx).await;
        (report.providers[0].residency(), report.providers[0].image_input())
    };
    assert_eq!(next().await, (NotLoaded, pb::ImageInput::Unknown));
    monitor.refresh("p1");
    assert_eq!(next().await, (NotLoaded, pb::ImageInput::Refused));
    // The next change is observed without asking `/api/show` again.
    *ps.lock().unwrap() = serde_json::json!({"models": [{"name": "test-model"}]});
    monitor.refresh("p1");
    assert_eq!(next().await, (Loaded, pb::ImageInput::Refused));
    assert_eq!(*shows.lock().unwrap(), 2, "remembered once said");
    stop.cancel();
}

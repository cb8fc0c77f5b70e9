use super::*;
use crate::adapter::fake::{self, Reply};
use crate::adapter::http_client;

#[test]
fn honoured_only_on_ollama_when_allowed() {
    use AdapterKind::{Ollama, OpenAi};
    let table = [
        (true, Ollama, true, true),
        (true, Ollama, false, false),
        (false, Ollama, true, false),
        (true, OpenAi, true, false),
        (true, OpenAi, false, false),
    ];
    for (asked, adapter, allowed, want) in table {
        assert_eq!(honoured(asked, adapter, allowed), want, "{asked} {adapter:?} {allowed}");
    }
    assert!(TOUCH_INTERVAL < Duration::from_secs(10 * 60), "touches come before keep_alive expires");
}

#[tokio::test]
async fn opted_in_runs_carry_keep_alive_and_touches_arrive() {
    let mut server = fake::serve(Reply::json(200, r#"{"model":"test-model","done":true}"#)).await;
    let mut target = fake::target(AdapterKind::Ollama, &server.base_url);
    apply(&mut target, true, true);
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(run(http_client(), vec![target.clone()], Duration::from_millis(20), stop.clone()));
    for _ in 0..2 {
        let req = server.request().await;
        assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", "/api/generate"));
        assert_eq!(req.json(), serde_json::json!({"model": "test-model", "keep_alive": "10m"}));
    }
    stop.cancel();

    let mut chat = ollama_chat().await;
    let mut target = fake::target(AdapterKind::Ollama, &chat.base_url);
    apply(&mut target, true, true);
    let _ = fake::run(&target, &fake::request(vec![fake::user("hi")])).await;
    assert_eq!(chat.request().await.json()["keep_alive"], "10m");
}

/// An Ollama server that answers one chat with `hi`.
async fn ollama_chat() -> fake::FakeProvider {
    let done = r#"{"model":"test-model","message":{"role":"assistant","content":"hi"},"done":true}"#;
    fake::serve(Reply::chunks(200, "application/x-ndjson", [done.to_owned() + "\n"])).await
}

#[tokio::test]
async fn not_opted_in_neither_touches_nor_keep_alive() {
    let mut chat = ollama_chat().await;
    let mut target = fake::target(AdapterKind::Ollama, &chat.base_url);
    apply(&mut target, true, false);
    assert!(!target.keep_warm);
    // The loop has nothing to touch and ends at once.
    tokio::time::timeout(
        Duration::from_secs(5),
        run(http_client(), vec![target.clone()], Duration::from_millis(1), CancellationToken::new()),
    )
    .await
    .expect("no touch loop without a kept-warm target");
    let _ = fake::run(&target, &fake::request(vec![fake::user("hi")])).await;
    let req = chat.request().await;
    assert_eq!(req.path, "/api/chat");
    assert!(req.json().get("keep_alive").is_none());
    assert!(chat.received().is_none(), "only the run reached the server");
}

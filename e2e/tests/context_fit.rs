//! Issue 46 item 5: a context overflow inside one public model, without a
//! declaration of another model. The providers of a route differ in context
//! window (one declared in the config, one read by the node from the
//! server's own `/api/ps`): a prompt too long for the preferred provider
//! goes to the one whose window fits, never to the small one, and the
//! response says so (`iop-context-window`); a short prompt stays where it
//! was.

mod common;

use common::*;
use iop_e2e::harness::{ProviderSpec, wait_until};
use iop_proto::config::Adapter;

const MODEL: &str = "fit";
/// The small provider's target: the mock refuses prompts over 50 words.
const SMALL_TARGET: &str = "mock@context_window=50";

#[tokio::test]
async fn a_prompt_too_long_for_one_provider_goes_to_the_one_whose_window_fits() {
    let small = ProviderSpec { priority: 0, ..provider("small", Adapter::Ollama, SMALL_TARGET, MODEL, "") };
    let large = ProviderSpec { priority: 1, ..provider("large", Adapter::Ollama, "mock", MODEL, "") };
    let stack = Stack::start(StackOptions { extra_providers: vec![small, large], ..Default::default() }).await;
    // The small one's window is declared (tokens); the large one's is what
    // its server says (the mock's `/api/ps`: 8192 while its model is loaded).
    stack.edit_providers(&["small"], |p| p.context_window = Some(64)).await;
    wait_until("the large provider's window read", WAIT, || async {
        stack.provider_admin("large").await["residency"] == "loaded"
    })
    .await;

    let long = "word ".repeat(200);
    let response = stack.post("/v1/chat/completions", &chat_body(MODEL, &long, false)).await;
    let window = response.headers().get("iop-context-window").map(|v| v.to_str().unwrap().to_string());
    let (status, body) = json_body(response).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "mock", "the large provider answered: {body}");
    assert_eq!(window.as_deref(), Some("8192"), "the answering provider's window");
    assert_eq!(
        stack.mock_requests(&stack.mock_url, "/api/chat", Some(SMALL_TARGET)).await,
        0,
        "never sent where it does not fit"
    );

    let response = stack.post("/v1/chat/completions", &chat_body(MODEL, "hi", false)).await;
    assert!(response.headers().get("iop-context-window").is_none());
    let (status, body) = json_body(response).await;
    assert_eq!((status, body["model"].as_str()), (200, Some(SMALL_TARGET)), "a short prompt stays: {body}");
}

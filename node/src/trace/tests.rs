use super::*;

#[test]
fn closed_codes() {
    assert_eq!(failure_code(pb::FailureKind::ResponseStalled), "response_stalled");
    assert_eq!(failure_code(pb::FailureKind::ProviderHttpStatus), "provider_http_status");
    assert_eq!(provider_name(pb::AdapterKind::Ollama.into()), "ollama");
    assert_eq!(provider_name(pb::AdapterKind::Openai.into()), "openai");
    assert_eq!(provider_name(99), "unknown");
}

#[tokio::test]
async fn notes_reach_the_call_and_nothing_outside_it() {
    note_usage(&pb::Usage::default()); // outside any call: ignored
    let notes = Arc::new(Mutex::new(Notes::default()));
    NOTES
        .scope(notes.clone(), async {
            note_first_byte(tokio::time::Instant::now());
            note_usage(&pb::Usage { prompt_tokens: 4, completion_tokens: 2, ..Default::default() });
            note_failure(&pb::ExecutionFailure::new(pb::FailureKind::ResponseStalled, "x"));
        })
        .await;
    let notes = notes.lock().unwrap();
    assert!(notes.first_byte.is_some());
    assert_eq!(notes.usage.as_ref().map(|u| u.completion_tokens), Some(2));
    assert_eq!(notes.failure, Some("response_stalled"));
}

use super::*;
use crate::adapter::fake::assignment;

#[test]
fn from_assignment_accepts_and_normalizes() {
    let t = ProviderTarget::from_assignment(&assignment(1, "llama3.2:3b", "http://127.0.0.1:11434/")).unwrap();
    assert_eq!(t.adapter, AdapterKind::Ollama);
    assert_eq!(t.base_url, "http://127.0.0.1:11434");
    assert_eq!(t.target_model, "llama3.2:3b");
    let t = ProviderTarget::from_assignment(&assignment(2, "m", "https://llm.example/openai//")).unwrap();
    assert_eq!(t.adapter, AdapterKind::OpenAi);
    assert_eq!(t.base_url, "https://llm.example/openai");
}

#[test]
fn from_assignment_rejects_bad_assignments() {
    let bad = [
        assignment(0, "m", "http://h:1"),
        assignment(99, "m", "http://h:1"),
        assignment(1, " ", "http://h:1"),
        assignment(1, "m", "ftp://h:1"),
        assignment(1, "m", "127.0.0.1:11434"),
        assignment(1, "m", ""),
        assignment(1, "m", "http://user:secret@h:1"),
        assignment(1, "m", "http://h:1/?x=1"),
        pb::ProviderAssignment { provider_id: String::new(), ..assignment(1, "m", "http://h:1") },
    ];
    for a in bad {
        match ProviderTarget::from_assignment(&a) {
            Err(AdapterError::InvalidRequest(msg)) => assert!(!msg.contains("secret"), "{msg}"),
            other => panic!("{a:?} gave {other:?}"),
        }
    }
}

use super::*;
use serde_json::json;

#[test]
fn pieces_concatenate_to_the_text() {
    assert_eq!(split_pieces("a b  c"), ["a", " b", " ", " c"]);
    assert_eq!(split_pieces(" x"), [" x"]);
    assert!(split_pieces("").is_empty());
}

/// Issue 28 item 4: prefill + continuation is `w1 … wN` exactly.
#[test]
fn words_continue_a_prefilled_assistant_turn() {
    let message = |role: &str, text: &str| ChatMessage { role: role.into(), content: json!(text), images: None };
    let user = || message("user", "count");
    assert_eq!(words_reply(&[user()], 3), "w1 w2 w3");
    for prefill in ["w1 w2 w3 w4", "w1 w2 w3 w4 "] {
        let reply = words_reply(&[user(), message("assistant", prefill)], 6);
        assert_eq!(format!("{prefill}{reply}"), "w1 w2 w3 w4 w5 w6", "{prefill:?}");
    }
    assert_eq!(words_reply(&[user(), message("assistant", "w1 w2")], 2), "", "nothing left");
    // Not a prefill of this reply: the whole reply.
    assert_eq!(words_reply(&[user(), message("assistant", "Sure:")], 2), "w1 w2");
    assert_eq!(words_reply(&[message("assistant", "w1"), user()], 2), "w1 w2", "the last message is the user's");
}

use super::*;

fn norm(vector: &[f32]) -> f32 {
    vector.iter().map(|x| x * x).sum::<f32>().sqrt()
}

#[test]
fn embeddings_are_deterministic_unit_vectors_and_base64_is_standard() {
    let hello = embedding("hello");
    assert_eq!(hello, embedding("hello"));
    assert_ne!(hello, embedding("hello!"));
    assert_ne!(embedding(""), embedding(" "));
    assert!((norm(&hello) - 1.0).abs() < 1e-5, "{hello:?}");

    let short = shortened_embedding("hello", 3);
    assert_eq!(short.len(), 3);
    assert!((norm(&short) - 1.0).abs() < 1e-5);
    let prefix = norm(&hello[..3]);
    assert!(short.iter().zip(&hello).all(|(s, h)| (s - h / prefix).abs() < 1e-6), "{short:?} vs {hello:?}");
    assert_eq!(shortened_embedding("hello", EMBEDDING_DIMENSIONS), hello);

    // 1.0 and -2.0 as little-endian f32s.
    assert_eq!(base64_f32s(&[1.0, -2.0]), "AACAPwAAAMA=");
}

#[test]
fn tokens_are_one_hash_per_word() {
    let tokens = tokenize("  the cat\tsat on the\nmat ");
    assert_eq!(tokens.len(), 6);
    assert_eq!(tokens[0], tokens[4]);
    assert_ne!(tokens[0], tokens[1]);
    assert!(tokens.iter().all(|t| *t < TOKEN_VOCABULARY));
    assert_eq!(tokens, tokenize("the cat sat on the mat"));
    assert!(tokenize(" \n").is_empty());
}

use super::*;

#[test]
fn requests_parse_strictly() {
    let r = parse_request(br#"{"model":"m","input":["a","b"],"encoding_format":"base64","dimensions":4}"#).unwrap();
    assert_eq!((r.embed.inputs.len(), r.embed.dimensions, r.base64), (2, 4, true));
    assert_eq!(parse_request(br#"{"model":"m","input":"a"}"#).unwrap().embed.inputs, ["a"]);
    for (bad, param) in [
        (r#"{"model":"m"}"#, "input"),
        (r#"{"model":"m","input":[]}"#, "input"),
        (r#"{"model":"m","input":[[1,2]]}"#, "input[0]"),
        (r#"{"model":"m","input":"a","encoding_format":"hex"}"#, "encoding_format"),
        (r#"{"model":"m","input":"a","dimensions":0}"#, "dimensions"),
    ] {
        let err = parse_request(bad.as_bytes()).unwrap_err();
        assert!(matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == param), "{bad}: {err:?}");
    }
}

#[test]
fn answers_keep_input_order_and_encode_base64() {
    let request = parse_request(br#"{"model":"m","input":["a","b"],"encoding_format":"base64"}"#).unwrap();
    let events = [
        Event::Embeddings(pb::EmbeddingResult {
            embeddings: vec![pb::Embedding { values: vec![1.0] }, pb::Embedding { values: vec![-2.0] }],
        }),
        Event::Usage(pb::Usage { prompt_tokens: 2, completion_tokens: 0, ..Default::default() }),
        Event::Completed(pb::RunCompleted { finish_reason: pb::FinishReason::Stop.into() }),
    ];
    let answer = answer(&request, &events).unwrap();
    assert_eq!(answer["data"][0]["embedding"], "AACAPw==");
    assert_eq!(answer["data"][1]["index"], 1);
    assert_eq!(answer["usage"]["total_tokens"], 2);
    let failed = [Event::Failed(pb::RunFailed { failure: None })];
    assert!(super::answer(&request, &failed).is_err());
}

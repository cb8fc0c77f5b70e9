use super::*;

#[test]
fn parse_faults_accepts_all_knobs_and_rejects_bad_ones() {
    let faults = parse_faults(
        "headers_delay_ms=1, first_token_delay_ms=2,chunk_delay_ms=3,end_delay_ms=10,stall_after=4,cut_after=5,\
         malformed_at=6,malformed_run=2,malformed_end,no_done,status=429,retry_after=7,fail_times=2,never_answer=false,exit=0,words=8,hold=h1,\
         context_window=9,sse_line_end=CR,echo_auth,set_cookie=false,error_code=content_policy_violation,text_only",
    )
    .unwrap();
    assert_eq!(
        faults,
        Faults {
            headers_delay_ms: Some(1),
            first_token_delay_ms: Some(2),
            chunk_delay_ms: Some(3),
            end_delay_ms: Some(10),
            stall_after: Some(4),
            cut_after: Some(5),
            malformed_at: Some(6),
            malformed_run: Some(2),
            malformed_end: Some(true),
            no_done: Some(true),
            status: Some(429),
            retry_after: Some(7),
            error_code: Some("content_policy_violation".into()),
            fail_times: Some(2),
            never_answer: Some(false),
            exit: Some(false),
            words: Some(8),
            hold: Some("h1".into()),
            context_window: Some(9),
            sse_line_end: Some(LineEnd::Cr),
            echo_auth: Some(true),
            set_cookie: Some(false),
            repeat_prefill: None,
            text_only: Some(true),
        }
    );
    assert_eq!(parse_faults("").unwrap(), Faults::default());
    assert!(matches!(parse_faults("bogus=1"), Err(FaultError::UnknownKnob(k)) if k == "bogus"));
    assert!(matches!(parse_faults("words=x"), Err(FaultError::BadValue { .. })));
    assert!(matches!(parse_faults("words"), Err(FaultError::BadValue { .. })));
    assert!(matches!(parse_faults("no_done=maybe"), Err(FaultError::BadValue { .. })));
    assert!(matches!(parse_faults("status=200"), Err(FaultError::BadValue { .. })));
    assert!(matches!(parse_faults("malformed_at=0"), Err(FaultError::BadValue { .. })));
    assert!(matches!(parse_faults("malformed_run=0"), Err(FaultError::BadValue { .. })));
    assert!(matches!(parse_faults("sse_line_end=lfcr"), Err(FaultError::BadValue { .. })));
    assert!(matches!(parse_faults("sse_line_end"), Err(FaultError::BadValue { .. })));
}

use super::*;

/// `m` malformed, `g` good, `$` the end of the stream: the verdict of
/// each malformed event and of the end, and how many were skipped.
#[test]
fn verdicts() {
    use Verdict::{Fail, Skip};
    for (events, verdicts, skipped) in [
        ("$", &[Skip][..], 0),
        ("gmg$", &[Skip, Skip], 1),
        ("mg$", &[Skip, Skip], 1),
        ("gmgmgmgmg$", &[Skip, Skip, Skip, Skip, Skip], 4),
        ("gmmg$", &[Skip, Skip, Skip], 2),
        ("gmmm", &[Skip, Skip, Fail], 2),
        ("mmm", &[Skip, Skip, Fail], 2),
        ("gmmgmmm", &[Skip, Skip, Skip, Skip, Fail], 4),
        ("gm$", &[Skip, Fail], 1),
        ("gmm$", &[Skip, Skip, Fail], 2),
        ("m$", &[Skip, Fail], 1),
    ] {
        let mut run = MalformedRun::default();
        let mut got = Vec::new();
        for event in events.chars() {
            match event {
                'm' => got.push(run.on_malformed()),
                'g' => run.on_good(),
                _ => got.push(run.at_end()),
            }
        }
        assert_eq!(got, verdicts, "{events}");
        assert_eq!(run.skipped(), skipped, "{events}");
    }
}

#[test]
fn errors_name_the_rule_not_the_payload() {
    let mut run = MalformedRun::default();
    assert!(run.malformed("NDJSON line", "syntax error at line 1 column 9").is_ok());
    assert!(
        matches!(run.end("NDJSON line"), Err(AdapterError::Protocol(m)) if m == "stream ended right after an invalid NDJSON line")
    );
    assert!(run.malformed("NDJSON line", "x").is_ok());
    match run.malformed("NDJSON line", "syntax error at line 1 column 9") {
        Err(e @ AdapterError::Protocol(_)) => {
            assert_eq!(e.to_failure().kind(), iop_proto::pb::FailureKind::ProviderProtocol);
            assert_eq!(
                e.to_string(),
                "provider protocol error: provider sent 3 invalid NDJSON lines in a row (last: syntax error at line 1 column 9)"
            );
        }
        other => panic!("{other:?}"),
    }
}

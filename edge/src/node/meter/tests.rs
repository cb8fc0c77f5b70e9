use super::*;

fn prefix(compressed: bool, len: u32) -> Vec<u8> {
    let mut p = vec![u8::from(compressed)];
    p.extend_from_slice(&len.to_be_bytes());
    p
}

fn steps(chunks: &[&[u8]]) -> Vec<Step> {
    let mut framing = Framing::default();
    let mut seen = Vec::new();
    for chunk in chunks {
        framing
            .feed(chunk, |s| {
                seen.push(s);
                Ok::<_, ()>(())
            })
            .unwrap();
    }
    seen
}

#[test]
fn framing_finds_every_message_however_the_chunks_cut_it() {
    let mut body = prefix(false, 3);
    body.extend_from_slice(b"abc");
    body.extend(prefix(false, 0));
    body.extend(prefix(true, 2));
    body.extend_from_slice(b"xy");
    body.extend(prefix(false, 1 << 30));
    body.extend_from_slice(b"partial");
    let expected = vec![
        Step::Announced { compressed: false, len: 3 },
        Step::Completed(3),
        Step::Announced { compressed: false, len: 0 },
        Step::Completed(0),
        Step::Announced { compressed: true, len: 2 },
        Step::Completed(2),
        Step::Announced { compressed: false, len: 1 << 30 },
    ];
    assert_eq!(steps(&[&body]), expected, "one chunk");
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(steps(&bytes), expected, "byte by byte");
    for cut in 1..body.len() {
        assert_eq!(steps(&[&body[..cut], &body[cut..]]), expected, "cut at {cut}");
    }
}

#[test]
fn framing_stops_at_the_first_refusal() {
    let mut body = prefix(false, 100);
    body.extend(vec![0; 100]);
    let mut framing = Framing::default();
    let mut seen = Vec::new();
    let result = framing.feed(&body, |s| {
        seen.push(s);
        if matches!(s, Step::Announced { len: 100, .. }) { Err("too large") } else { Ok(()) }
    });
    assert_eq!(result, Err("too large"));
    assert_eq!(seen, [Step::Announced { compressed: false, len: 100 }]);
}

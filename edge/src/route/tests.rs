use super::*;

fn config() -> EdgeConfig {
    crate::testing::config(
        r#"
nodes: [ { name: n1 }, { name: n2 } ]
providers:
  - { id: backup, node: n2, adapter: openai, target: { model: m, base_url: "http://x" }, models: [ { name: chat, priority: 1 } ] }
  - { id: main, node: n1, adapter: ollama, target: { model: m, base_url: "http://x" }, models: [ { name: chat, priority: 0 }, { name: other } ] }
"#,
    )
}

#[test]
fn candidates_are_ordered_by_priority() {
    let c = config();
    let ids: Vec<_> = candidates(&c, "chat").unwrap().iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["main", "backup"]);
    assert!(candidates(&c, "nope").is_none());
}

#[test]
fn public_models_are_unique() {
    assert_eq!(public_models(&config()), ["chat", "other"]);
}

/// Within a route, a prompt goes to the providers whose window fits it;
/// windows unknown fit anything; when none would be left, all stay.
#[test]
fn a_prompt_goes_to_the_providers_whose_window_fits() {
    let all = admission_candidates(&config(), "chat").unwrap();
    let windows = |main: Option<u32>, backup: Option<u32>| {
        move |c: &Candidate| if c.provider.id == "main" { main } else { backup }
    };
    let ids = |kept: &Arc<[Candidate]>| kept.iter().map(|c| c.provider.id.clone()).collect::<Vec<_>>();
    // (prompt, main's window, backup's window, kept, any left out)
    type Case<'a> = (u64, Option<u32>, Option<u32>, &'a [&'a str], bool);
    let cases: &[Case] = &[
        (1_000, Some(2_048), Some(32_768), &["main", "backup"], false),
        (4_000, Some(2_048), Some(32_768), &["backup"], true),
        (4_000, Some(2_048), None, &["backup"], true),
        (2_048, Some(2_048), Some(1_024), &["main"], true),
        (40_000, Some(2_048), Some(32_768), &["main", "backup"], false),
        (40_000, None, None, &["main", "backup"], false),
    ];
    for &(prompt, main, backup, kept, left_out) in cases {
        let (got, skipped) = fit_context(&all, prompt, windows(main, backup));
        assert_eq!(
            (ids(&got), skipped),
            (kept.iter().map(|s| s.to_string()).collect(), left_out),
            "{prompt} {main:?} {backup:?}"
        );
    }
}

/// Within a route, a request with images goes to the providers not known
/// to refuse them; none left is `None` (the client's 400); a request
/// without images keeps every provider.
#[test]
fn images_go_to_the_providers_that_read_them() {
    let all = admission_candidates(&config(), "chat").unwrap();
    let said = |main: Option<bool>, backup: Option<bool>| {
        move |c: &Candidate| if c.provider.id == "main" { main } else { backup }
    };
    // (images, main reads them, backup reads them, kept)
    type Case<'a> = (bool, Option<bool>, Option<bool>, Option<&'a [&'a str]>);
    let cases: &[Case] = &[
        (true, Some(false), Some(true), Some(&["backup"])),
        (true, Some(false), None, Some(&["backup"])),
        (true, None, None, Some(&["main", "backup"])),
        (true, Some(true), Some(false), Some(&["main"])),
        (true, Some(false), Some(false), None),
        (false, Some(false), Some(false), Some(&["main", "backup"])),
    ];
    for &(images, main, backup, want) in cases {
        let got = fit_inputs(all.clone(), images, said(main, backup));
        let ids = got.map(|kept| kept.iter().map(|c| c.provider.id.clone()).collect::<Vec<_>>());
        assert_eq!(
            ids.as_deref(),
            want.map(|w| w.iter().map(|s| s.to_string()).collect::<Vec<_>>()).as_deref(),
            "{images} {main:?} {backup:?}"
        );
    }
}

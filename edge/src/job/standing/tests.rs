use super::*;
use crate::auth::{sha256, to_hex};
use axum::http::{HeaderMap, HeaderValue};

const CONFIG: &str = r#"
auth: { mode: disabled, anonymous_workspaces: [site] }
nodes: [ { name: n1 } ]
providers:
  - { id: a, node: n1, adapter: ollama, target: { model: m, base_url: "http://x" }, models: [ { name: chat } ] }
workspaces:
  - { ref: site, node: n1, root: /srv/site, operations: [read] }
  - { ref: docs, node: n1, root: /srv/docs, operations: [read] }
"#;

fn at(text: &str) -> OffsetDateTime {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap()
}

fn keys(entries: &[&str]) -> Keys {
    let mut text = "principals:\n".to_string();
    for entry in entries {
        text.push_str(&format!("  - {entry}\n"));
    }
    Keys::parse(&text).unwrap()
}

/// `bot`'s entry with `extra` fields; its key is `k-bot`.
fn bot(extra: &str) -> String {
    format!("{{ name: bot, key_sha256: {}, models: ['*'], workspaces: ['si*']{extra} }}", to_hex(&sha256(b"k-bot")))
}

fn caller(keys: &Keys) -> Caller {
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_static("k-bot"));
    keys.authenticate_at(&headers, at("2027-01-01T00:00:00Z")).unwrap()
}

fn config(edit: impl FnOnce(&mut EdgeConfig)) -> EdgeConfig {
    let mut config = crate::testing::config(CONFIG);
    edit(&mut config);
    config
}

/// Every way a running job's caller loses the workspace, and the ways
/// it keeps it: one table over the keys and config after a reload.
#[test]
fn a_reload_keeps_or_revokes_with_its_reason() {
    let admitted = keys(&[&bot("")]);
    let job = caller(&admitted);
    let now = at("2027-01-01T00:00:00Z");
    let same = config(|_| {});
    let other = format!("{{ name: other, key_sha256: {}, models: ['*'] }}", to_hex(&sha256(b"k-other")));
    let cases: Vec<(&str, Keys, EdgeConfig, Result<(), Revocation>)> = vec![
        ("nothing changed", keys(&[&bot("")]), same.clone(), Ok(())),
        ("another principal changed", keys(&[&bot(""), &other]), same.clone(), Ok(())),
        (
            "a wider grant",
            keys(&[&format!(
                "{{ name: bot, key_sha256: {}, models: ['*'], workspaces: ['*'] }}",
                to_hex(&sha256(b"k-bot"))
            )]),
            same.clone(),
            Ok(()),
        ),
        (
            "another workspace removed",
            keys(&[&bot("")]),
            config(|c| c.workspaces.retain(|w| w.reference != "docs")),
            Ok(()),
        ),
        ("disabled", keys(&[&bot(", disabled: true")]), same.clone(), Err(Revocation::Key(AuthFailure::Disabled))),
        (
            "expired by a reload",
            keys(&[&bot(", expires_at: '2026-12-31T00:00:00Z'")]),
            same.clone(),
            Err(Revocation::Key(AuthFailure::Expired)),
        ),
        ("key removed", keys(&[&other]), same.clone(), Err(Revocation::Key(AuthFailure::Unknown))),
        (
            "grant removed",
            keys(&[&format!("{{ name: bot, key_sha256: {}, models: ['*'] }}", to_hex(&sha256(b"k-bot")))]),
            same.clone(),
            Err(Revocation::GrantRemoved),
        ),
        (
            "grant narrowed",
            keys(&[&format!(
                "{{ name: bot, key_sha256: {}, models: ['*'], workspaces: [docs] }}",
                to_hex(&sha256(b"k-bot"))
            )]),
            same.clone(),
            Err(Revocation::GrantRemoved),
        ),
        (
            "workspace removed",
            keys(&[&bot("")]),
            config(|c| c.workspaces.retain(|w| w.reference != "site")),
            Err(Revocation::WorkspaceRemoved),
        ),
        (
            "disabled and workspace removed: the key first",
            keys(&[&bot(", disabled: true")]),
            config(|c| c.workspaces.clear()),
            Err(Revocation::Key(AuthFailure::Disabled)),
        ),
        ("keys no longer required: anonymous, and site is open", Keys::Disabled, same.clone(), Ok(())),
        (
            "keys no longer required, site not open to anonymous callers",
            Keys::Disabled,
            config(|c| c.auth.anonymous_workspaces.clear()),
            Err(Revocation::GrantRemoved),
        ),
    ];
    for (case, keys, config, expected) in cases {
        assert_eq!(judge(&keys, &config, &job, "site", now), expected, "{case}");
    }
}

/// A key's expiry ends its job when the time passes, with no reload:
/// the earlier of the key's own and its principal's, at the instant.
#[test]
fn expiry_revokes_at_the_instant_and_the_earlier_time_wins() {
    let keys = keys(&[&format!(
        "{{ name: bot, keys: [ {{ sha256: {}, expires_at: '2027-03-01T00:00:00Z' }} ], expires_at: '2027-02-01T00:00:00Z', models: ['*'], workspaces: [site] }}",
        to_hex(&sha256(b"k-bot"))
    )]);
    let job = caller(&keys);
    let config = config(|_| {});
    assert_eq!(keys.expires_at(job.credential()), Some(at("2027-02-01T00:00:00Z")));
    assert_eq!(judge(&keys, &config, &job, "site", at("2027-01-31T23:59:59Z")), Ok(()));
    assert_eq!(
        judge(&keys, &config, &job, "site", at("2027-02-01T00:00:00Z")),
        Err(Revocation::Key(AuthFailure::Expired))
    );
    assert_eq!(Keys::Disabled.expires_at(job.credential()), None);
    assert_eq!(keys.expires_at(None), None, "anonymous callers have no key to expire");
}

/// Anonymous jobs: their grant is `auth.anonymous_workspaces`; once
/// keys are required they have none.
#[test]
fn an_anonymous_job_keeps_its_workspace_while_the_config_opens_it() {
    let anyone = Caller::Anonymous;
    let now = at("2027-01-01T00:00:00Z");
    assert_eq!(judge(&Keys::Disabled, &config(|_| {}), &anyone, "site", now), Ok(()));
    assert_eq!(judge(&Keys::Disabled, &config(|_| {}), &anyone, "docs", now), Err(Revocation::GrantRemoved));
    assert_eq!(
        judge(&keys(&[&bot("")]), &config(|_| {}), &anyone, "site", now),
        Err(Revocation::Key(AuthFailure::Missing))
    );
}

fn secrets(keys: Keys) -> crate::config::Secrets {
    crate::config::Secrets { keys, ..Default::default() }
}

/// Drives `watch` until it waits (paused time: the timeout fires only
/// once nothing else can run), then says whether it cancelled the job.
async fn settle(watch: std::pin::Pin<&mut impl std::future::Future>, cancel: &CancellationToken, wait: u64) -> bool {
    assert!(tokio::time::timeout(Duration::from_secs(wait), watch).await.is_err(), "the watch never returns");
    cancel.is_cancelled()
}

/// The I/O around the rule: a reload that leaves the caller its
/// workspace changes nothing; the reload that disables its key cancels
/// the job, once, with the reason.
#[tokio::test(start_paused = true)]
async fn the_watch_cancels_the_job_at_the_reload_that_revokes_it() {
    let handle = ConfigHandle::new(config(|_| {}), secrets(keys(&[&bot("")])));
    let job = caller(&handle.secrets().keys);
    let standing = Standing::new(&handle, &job, "site");
    let cancel = CancellationToken::new();
    let mut watch = std::pin::pin!(standing.watch(&cancel));
    assert!(!settle(watch.as_mut(), &cancel, 1).await, "admitted, and nothing changed");
    handle.swap(config(|c| c.workspaces.retain(|w| w.reference != "docs")), secrets(keys(&[&bot("")])));
    assert!(!settle(watch.as_mut(), &cancel, 1).await, "a reload that keeps the grant");
    assert!(standing.holds());
    handle.swap(config(|_| {}), secrets(keys(&[&bot(", disabled: true")])));
    assert!(settle(watch.as_mut(), &cancel, 1).await, "the reload that disables the key");
    assert_eq!(standing.revocation(), Some(Revocation::Key(AuthFailure::Disabled)));
    handle.swap(config(|_| {}), secrets(keys(&[&bot("")])));
    assert!(!standing.holds(), "a job once revoked stays revoked");
    assert_eq!(standing.revocation(), Some(Revocation::Key(AuthFailure::Disabled)), "the first reason stays");
}

/// A key's expiry ends its job by time alone: the watch wakes when the
/// earlier of the key's and the principal's `expires_at` passes, with
/// no reload; a reload that moves the expiry moves the wake-up.
#[tokio::test(start_paused = true)]
async fn the_watch_cancels_the_job_when_its_key_expires() {
    let entry = |expires_at: &str| {
        keys(&[&format!(
            "{{ name: bot, keys: [ {{ sha256: {}, expires_at: '{expires_at}' }} ], models: ['*'], workspaces: [site] }}",
            to_hex(&sha256(b"k-bot"))
        )])
    };
    let handle = ConfigHandle::new(config(|_| {}), secrets(entry("2027-01-01T00:01:00Z")));
    let job = caller(&handle.secrets().keys);
    let start = tokio::time::Instant::now();
    let clock: Clock = Box::new(move || at("2027-01-01T00:00:00Z") + (tokio::time::Instant::now() - start));
    let standing = Standing::new(&handle, &job, "site").with_clock(clock);
    let cancel = CancellationToken::new();
    let mut watch = std::pin::pin!(standing.watch(&cancel));
    assert!(!settle(watch.as_mut(), &cancel, 30).await, "30 s before the expiry");
    handle.swap(config(|_| {}), secrets(entry("2027-01-01T00:02:00Z")));
    assert!(!settle(watch.as_mut(), &cancel, 60).await, "the reload gave it another minute");
    assert!(settle(watch.as_mut(), &cancel, 31).await, "its new expiry passed");
    assert_eq!(standing.revocation(), Some(Revocation::Key(AuthFailure::Expired)));
    assert!(tokio::time::Instant::now() - start >= Duration::from_secs(120));
}

#[test]
fn labels_are_the_closed_set_the_metric_documents() {
    let all = [
        Revocation::Key(AuthFailure::Missing),
        Revocation::Key(AuthFailure::Unknown),
        Revocation::Key(AuthFailure::Disabled),
        Revocation::Key(AuthFailure::Expired),
        Revocation::GrantRemoved,
        Revocation::WorkspaceRemoved,
    ];
    let labels: Vec<&str> = all.iter().map(|r| r.label()).collect();
    assert_eq!(
        labels,
        [
            "missing_api_key",
            "invalid_api_key",
            "api_key_disabled",
            "api_key_expired",
            "workspace_grant_removed",
            "workspace_removed"
        ]
    );
}

//! Whether a job's caller may still run it: the one rule of "may this
//! caller run jobs in this workspace", judged at admission and again, for
//! a running job, on every reload, when its key's `expires_at` passes and
//! between the job's steps.
//!
//! The rule is [`judge`], pure: the keys and config as they are now, the
//! key the job was admitted with, the workspace and the time in; keep, or
//! the [`Revocation`] that ends the job, out. Its two halves are the ones
//! admission already applies: the key is refused at the door
//! ([`Keys::caller_at`]: disabled, expired, removed) and
//! [`workspace_grant`] (the workspace is still configured, and the
//! caller's `workspaces` patterns, or for anonymous callers
//! `auth.anonymous_workspaces`, still name it).
//!
//! [`Standing`] is the thin I/O around it: it reads the current keys and
//! config, and [`Standing::watch`] cancels the job through its ordinary
//! cancel path (the pending command's process tree ends, then the one
//! cleanup) as soon as the rule says revoke.
//!
//! What the client sees: a key that no longer passes is the `401` the door
//! gives it (`api_key_disabled`, `api_key_expired`, `invalid_api_key` when
//! the key was removed, `missing_api_key` when keys became required); a
//! workspace no longer granted, or no longer configured, is `403
//! workspace_revoked` (the same answer for both: the caller learns no more
//! than that its job may not go on). Counted in
//! `iop_edge_job_revoked_total{reason}`.

use std::sync::OnceLock;
use std::time::Duration;

use iop_proto::config::EdgeConfig;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthFailure, Caller, Keys};
use crate::config::ConfigHandle;

/// Why a caller may not (or no longer) run jobs in a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revocation {
    /// Its key is refused at the door now.
    Key(AuthFailure),
    /// Its grant no longer names the workspace.
    GrantRemoved,
    /// The Edge config no longer lists the workspace.
    WorkspaceRemoved,
}

impl Revocation {
    /// `iop_edge_job_revoked_total{reason}` (closed: the key's refusal
    /// labels and the two below).
    pub fn label(self) -> &'static str {
        match self {
            Self::Key(failure) => failure.label(),
            Self::GrantRemoved => "workspace_grant_removed",
            Self::WorkspaceRemoved => "workspace_removed",
        }
    }
}

/// Whether `caller` may run jobs in the workspace `reference` under
/// `config`: the workspace is configured and the caller is granted it. At
/// admission either refusal is the `404 workspace_not_found` an unknown
/// ref gets (a forbidden ref reads exactly as an unknown one).
pub fn workspace_grant(caller: &Caller, config: &EdgeConfig, reference: &str) -> Result<(), Revocation> {
    if !config.workspaces.iter().any(|w| w.reference == reference) {
        return Err(Revocation::WorkspaceRemoved);
    }
    if !caller.may_use_workspace(reference, &config.auth.anonymous_workspaces) {
        return Err(Revocation::GrantRemoved);
    }
    Ok(())
}

/// Whether the caller of a job admitted in `reference` may go on at `now`
/// under `keys` and `config` as they are now: its key still passes the
/// door, and the workspace is still configured and granted to whom the key
/// names now.
pub fn judge(
    keys: &Keys,
    config: &EdgeConfig,
    caller: &Caller,
    reference: &str,
    now: OffsetDateTime,
) -> Result<(), Revocation> {
    let current = keys.caller_at(caller.credential(), now).map_err(Revocation::Key)?;
    workspace_grant(&current, config, reference)
}

/// The time a key's expiry is judged against (the wall clock; tests
/// derive it from tokio's paused clock).
pub type Clock = Box<dyn Fn() -> OffsetDateTime + Send + Sync>;

/// A running job's standing: [`judge`] over the Edge's current keys and
/// config, and the first revocation found (kept: a job once revoked stays
/// revoked).
pub struct Standing<'a> {
    config: &'a ConfigHandle,
    caller: &'a Caller,
    reference: &'a str,
    now: Clock,
    revoked: OnceLock<Revocation>,
}

impl<'a> Standing<'a> {
    pub fn new(config: &'a ConfigHandle, caller: &'a Caller, reference: &'a str) -> Self {
        Self { config, caller, reference, now: Box::new(OffsetDateTime::now_utc), revoked: OnceLock::new() }
    }

    /// The same, judged against `now`.
    pub fn with_clock(self, now: Clock) -> Self {
        Self { now, ..self }
    }

    /// Judges the caller now; false (the revocation recorded) when the job
    /// must end.
    pub fn holds(&self) -> bool {
        if self.revoked.get().is_some() {
            return false;
        }
        let (secrets, config) = (self.config.secrets(), self.config.current());
        match judge(&secrets.keys, &config, self.caller, self.reference, (self.now)()) {
            Ok(()) => true,
            Err(revocation) => {
                let _ = self.revoked.set(revocation);
                false
            }
        }
    }

    /// Why the job was revoked, if it was.
    pub fn revocation(&self) -> Option<Revocation> {
        self.revoked.get().copied()
    }

    /// Judges the caller at once, after every reload and when its key's
    /// expiry passes; cancels the job (`cancel`) the first time it no
    /// longer holds. Never returns: poll it beside the job's work.
    pub async fn watch(&self, cancel: &CancellationToken) -> std::convert::Infallible {
        // Subscribed before the first judgement: no reload goes unseen.
        let mut reloads = self.config.subscribe();
        loop {
            if !self.holds() {
                cancel.cancel();
                return std::future::pending().await;
            }
            let expires_at = self.config.secrets().keys.expires_at(self.caller.credential());
            let until_expiry = expires_at.map(|at| Duration::try_from(at - (self.now)()).unwrap_or(Duration::ZERO));
            tokio::select! {
                changed = reloads.changed() => {
                    if changed.is_err() {
                        // The config handle went away: no reload comes.
                        return std::future::pending().await;
                    }
                }
                _ = tokio::time::sleep(until_expiry.unwrap_or_default()), if until_expiry.is_some() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{sha256, to_hex};
    use axum::http::{HeaderMap, HeaderValue};

    const CONFIG: &str = r#"
listen: { http: "127.0.0.1:0", grpc: "127.0.0.1:0" }
tls: { ca_file: a, cert_file: b, key_file: c }
trust_domain: t
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
        let mut config = EdgeConfig::from_yaml(CONFIG).unwrap();
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
    async fn settle(
        watch: std::pin::Pin<&mut impl std::future::Future>,
        cancel: &CancellationToken,
        wait: u64,
    ) -> bool {
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
}

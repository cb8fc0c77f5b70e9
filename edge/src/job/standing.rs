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
mod tests;

//! Client authentication: an API key names a principal, a principal names the
//! public models it may use and the workspaces it may run jobs in.
//!
//! Keys live only as SHA-256 hashes in a keys file (`auth.keys_file`,
//! reloaded with the config; a Kubernetes Secret in the chart):
//!
//! ```yaml
//! principals:
//!   - { name: ci-bot, key_sha256: <64 hex>, models: ["llama*", "qwen2.5"], disabled: false }
//!   - { name: site-bot, key_sha256: <64 hex>, models: [llama3], workspaces: ["site*"], max_concurrent_jobs: 2 }
//!   - name: team-a                       # several keys, so one is rotated without downtime
//!     keys:
//!       - { sha256: <64 hex>, expires_at: "2027-01-31T00:00:00Z" }   # the old key, until then
//!       - { sha256: <64 hex> }                                        # the new key
//!     expires_at: "2027-06-30T00:00:00Z" # the principal's: every key stops then
//!     models: ["*"]
//!     requests_per_minute: 60            # per-key limits (`crate::ratelimit`), none unless set
//!     tokens_per_minute: 200000
//!     max_concurrent_requests: 4
//! ```
//!
//! A key is accepted until the earlier of its own `expires_at` and its
//! principal's (RFC 3339); from then on it answers `401 api_key_expired`.
//! A key refused later (disabled, removed or expired) also ends the jobs it
//! runs: `crate::job::standing` judges them again by [`Keys::caller_at`].
//! `iop-edge new-key --expires-in 30d` prints a key with its `expires_at`.
//!
//! `workspaces` (ref patterns, default none) decides which workspaces a key
//! may run jobs in (`iop-workspace`); any other ref is the same `404
//! workspace_not_found` as an unknown one. With `auth.mode: disabled` only
//! the refs the config lists in `auth.anonymous_workspaces` take jobs.
//!
//! A key arrives as `Authorization: Bearer KEY` (OpenAI), `x-api-key: KEY`
//! (Anthropic) or `api-key: KEY` (Azure-style clients). Its hash is compared
//! with every principal's in constant time. Keys and hashes are never logged;
//! errors name the principal or the field, never the key. Credential headers
//! never cross a tunnel (`iop_proto::wire::CREDENTIAL_HEADERS`).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use axum::http::{HeaderMap, header};
use iop_proto::config::{AuthConfig, AuthMode};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use time::OffsetDateTime;

/// Most principals one keys file may hold (each request scans them all).
pub const MAX_PRINCIPALS: usize = 10_000;

/// Longest API key accepted from a client; longer values are refused unhashed.
const MAX_KEY_LEN: usize = 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    principals: Vec<PrincipalEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalEntry {
    name: String,
    /// One key (the short form of `keys: [{ sha256 }]`).
    #[serde(default)]
    key_sha256: Option<String>,
    #[serde(default)]
    keys: Vec<KeyEntry>,
    /// RFC 3339; every key of the principal stops being accepted then.
    #[serde(default)]
    expires_at: Option<String>,
    models: Vec<String>,
    #[serde(default)]
    workspaces: Vec<String>,
    #[serde(default)]
    max_concurrent_jobs: Option<u32>,
    #[serde(default)]
    requests_per_minute: Option<u32>,
    #[serde(default)]
    tokens_per_minute: Option<u32>,
    #[serde(default)]
    max_concurrent_requests: Option<u32>,
    #[serde(default)]
    disabled: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    sha256: String,
    /// RFC 3339; this key stops being accepted then.
    #[serde(default)]
    expires_at: Option<String>,
}

/// Most keys one principal may hold (two at a time is what a rotation needs).
const MAX_KEYS_PER_PRINCIPAL: usize = 16;

/// A principal's request limits (none unless set), across the whole Edge:
/// each replica enforces its share (`crate::ratelimit`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrincipalLimits {
    /// Requests it may start per minute.
    pub requests_per_minute: Option<u32>,
    /// Tokens (input + output, from each finished answer's usage) per minute.
    pub tokens_per_minute: Option<u32>,
    /// Requests it may have in flight at once.
    pub max_concurrent_requests: Option<u32>,
}

/// One caller the keys file knows.
#[derive(Debug)]
pub struct Principal {
    /// Bounded by the keys file, so usable as a metric label.
    pub name: String,
    keys: Vec<PrincipalKey>,
    /// When every key of the principal stops being accepted.
    expires_at: Option<OffsetDateTime>,
    models: Vec<NamePattern>,
    /// Workspace refs it may run jobs in (none unless listed).
    workspaces: Vec<NamePattern>,
    /// Jobs it may run at once (`limits.max_jobs_per_principal` unless set).
    max_concurrent_jobs: Option<u32>,
    /// Requests per minute, tokens per minute, requests at once.
    pub limits: PrincipalLimits,
    disabled: bool,
}

/// One of a principal's keys, by hash.
#[derive(Debug)]
struct PrincipalKey {
    sha256: [u8; 32],
    expires_at: Option<OffsetDateTime>,
}

/// A name (public model, workspace ref), or a pattern where `*` stands for
/// any run of characters (`llama*`, `*-instruct`, `*`). Hand-written rather
/// than a glob crate: one wildcard, no character classes, no path
/// semantics. The one matcher for every grant in the keys file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NamePattern(String);

impl NamePattern {
    fn matches(&self, name: &str) -> bool {
        let mut parts = self.0.split('*');
        let first = parts.next().unwrap_or_default();
        let Some(mut rest) = name.strip_prefix(first) else { return false };
        let mut parts: Vec<&str> = parts.collect();
        let Some(last) = parts.pop() else { return rest.is_empty() };
        for middle in parts {
            match rest.find(middle) {
                Some(at) => rest = &rest[at + middle.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last)
    }
}

/// A presented API key, by its SHA-256: what a running job keeps so that
/// its caller is judged again on every reload (`crate::job::standing`).
/// Never printed, and compared only in constant time ([`Keys::caller_at`]).
#[derive(Clone, Copy)]
pub struct KeyDigest([u8; 32]);

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Who is calling: a principal (and the key it called with), or anyone
/// when `auth.mode` is `disabled`.
#[derive(Debug, Clone)]
pub enum Caller {
    Anonymous,
    Principal(Arc<Principal>, KeyDigest),
}

impl Caller {
    /// The key the caller presented (none for anonymous callers).
    pub fn credential(&self) -> Option<KeyDigest> {
        match self {
            Self::Anonymous => None,
            Self::Principal(_, key) => Some(*key),
        }
    }

    pub fn may_use(&self, model: &str) -> bool {
        match self {
            Self::Anonymous => true,
            Self::Principal(p, _) => p.models.iter().any(|m| m.matches(model)),
        }
    }

    /// Whether the caller may run jobs in the workspace `reference`: a
    /// principal when one of its `workspaces` patterns matches, anyone
    /// (auth disabled) only in the refs the config opens to anonymous
    /// callers (`auth.anonymous_workspaces`, exact).
    pub fn may_use_workspace(&self, reference: &str, anonymous_workspaces: &[String]) -> bool {
        match self {
            Self::Anonymous => anonymous_workspaces.iter().any(|r| r == reference),
            Self::Principal(p, _) => p.workspaces.iter().any(|w| w.matches(reference)),
        }
    }

    /// How many jobs the caller may run at once: the principal's
    /// `max_concurrent_jobs`, else `default` (anonymous callers share it
    /// as one principal).
    pub fn max_concurrent_jobs(&self, default: u32) -> u32 {
        match self {
            Self::Anonymous => default,
            Self::Principal(p, _) => p.max_concurrent_jobs.unwrap_or(default),
        }
    }

    /// The caller's request limits (anonymous callers have none).
    pub fn limits(&self) -> PrincipalLimits {
        match self {
            Self::Anonymous => PrincipalLimits::default(),
            Self::Principal(p, _) => p.limits,
        }
    }

    /// The principal's name (`anonymous` when authentication is disabled).
    pub fn name(&self) -> &str {
        match self {
            Self::Anonymous => "anonymous",
            Self::Principal(p, _) => &p.name,
        }
    }
}

/// Why a request was not authenticated (its label is the error code clients
/// see and the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No key in any of the accepted headers.
    Missing,
    /// A key that matches no principal.
    Unknown,
    /// A key of a principal marked `disabled`.
    Disabled,
    /// A key past its `expires_at` (or its principal's).
    Expired,
}

impl AuthFailure {
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing_api_key",
            Self::Unknown => "invalid_api_key",
            Self::Disabled => "api_key_disabled",
            Self::Expired => "api_key_expired",
        }
    }
}

/// The Edge's current keys: swapped with the config on reload.
#[derive(Debug, Default)]
pub enum Keys {
    /// `auth.mode: disabled`: every caller is `Anonymous`.
    #[default]
    Disabled,
    Required(Vec<Arc<Principal>>),
}

impl Keys {
    /// Reads and validates the keys file `auth` names (nothing when disabled).
    pub fn load(auth: &AuthConfig) -> Result<Self, String> {
        match (auth.mode, &auth.keys_file) {
            (AuthMode::Disabled, _) => Ok(Self::Disabled),
            (AuthMode::Required, None) => Err("auth.keys_file: required when auth.mode is `required`".into()),
            (AuthMode::Required, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read keys file {}: {e}", path.display()))?;
                Self::parse(&text).map_err(|e| format!("keys file {}: {e}", path.display()))
            }
        }
    }

    /// Parses and validates a keys document; the error names the field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: KeysFile = serde_saphyr::from_str(text).map_err(|e| format!("not a valid keys file: {e}"))?;
        if file.principals.len() > MAX_PRINCIPALS {
            return Err(format!("principals: at most {MAX_PRINCIPALS} entries"));
        }
        let (mut names, mut hashes) = (BTreeSet::new(), BTreeSet::new());
        let mut principals = Vec::with_capacity(file.principals.len());
        for (i, entry) in file.principals.into_iter().enumerate() {
            let at = |field: &str| format!("principals[{i}].{field}");
            if !iop_proto::config::is_config_name(&entry.name) {
                return Err(format!("{}: must be 1-63 of [A-Za-z0-9-_.]", at("name")));
            }
            if !names.insert(entry.name.clone()) {
                return Err(format!("{}: duplicate principal `{}`", at("name"), entry.name));
            }
            let short = entry.key_sha256.map(|sha256| (at("key_sha256"), KeyEntry { sha256, expires_at: None }));
            let listed = entry.keys.into_iter().enumerate().map(|(j, key)| (at(&format!("keys[{j}]")), key));
            let mut keys = Vec::new();
            for (field, key) in short.into_iter().chain(listed) {
                let sha256 = parse_sha256(&key.sha256)
                    .ok_or_else(|| format!("{field}: must be 64 hex digits (iop-edge hash-key prints it)"))?;
                if !hashes.insert(sha256) {
                    return Err(format!("{field}: the same key as another entry"));
                }
                let expires_at = parse_time(key.expires_at.as_deref(), &format!("{field}.expires_at"))?;
                keys.push(PrincipalKey { sha256, expires_at });
            }
            if keys.is_empty() {
                return Err(format!("{}: needs `key_sha256` or at least one entry in `keys`", at("keys")));
            }
            if keys.len() > MAX_KEYS_PER_PRINCIPAL {
                return Err(format!("{}: at most {MAX_KEYS_PER_PRINCIPAL} keys", at("keys")));
            }
            let expires_at = parse_time(entry.expires_at.as_deref(), &at("expires_at"))?;
            if entry.models.is_empty() {
                return Err(format!("{}: must list at least one model or pattern", at("models")));
            }
            let mut models = Vec::with_capacity(entry.models.len());
            for (j, model) in entry.models.into_iter().enumerate() {
                if model.is_empty() || model.len() > 256 || model.chars().any(char::is_whitespace) {
                    return Err(format!("principals[{i}].models[{j}]: must be 1-256 non-whitespace characters"));
                }
                models.push(NamePattern(model));
            }
            let mut workspaces = Vec::with_capacity(entry.workspaces.len());
            for (j, pattern) in entry.workspaces.into_iter().enumerate() {
                if !is_ref_pattern(&pattern) {
                    return Err(format!(
                        "principals[{i}].workspaces[{j}]: must be a workspace ref or pattern (1-63 of [A-Za-z0-9-_.*])"
                    ));
                }
                workspaces.push(NamePattern(pattern));
            }
            if entry.max_concurrent_jobs.is_some_and(|n| !(1..=1000).contains(&n)) {
                return Err(format!("{}: must be between 1 and 1000", at("max_concurrent_jobs")));
            }
            let limits = PrincipalLimits {
                requests_per_minute: entry.requests_per_minute,
                tokens_per_minute: entry.tokens_per_minute,
                max_concurrent_requests: entry.max_concurrent_requests,
            };
            for (field, value, max) in [
                ("requests_per_minute", limits.requests_per_minute, 1_000_000),
                ("tokens_per_minute", limits.tokens_per_minute, 1_000_000_000),
                ("max_concurrent_requests", limits.max_concurrent_requests, 100_000),
            ] {
                if value.is_some_and(|n| !(1..=max).contains(&n)) {
                    return Err(format!("{}: must be between 1 and {max}", at(field)));
                }
            }
            principals.push(Arc::new(Principal {
                name: entry.name,
                keys,
                expires_at,
                models,
                workspaces,
                max_concurrent_jobs: entry.max_concurrent_jobs,
                limits,
                disabled: entry.disabled,
            }));
        }
        Ok(Self::Required(principals))
    }

    pub fn mode(&self) -> AuthMode {
        match self {
            Self::Disabled => AuthMode::Disabled,
            Self::Required(_) => AuthMode::Required,
        }
    }

    /// The caller a request's headers name, now.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, AuthFailure> {
        self.authenticate_at(headers, OffsetDateTime::now_utc())
    }

    /// The caller a request's headers name at `now` (expiry is decided
    /// against it).
    pub fn authenticate_at(&self, headers: &HeaderMap, now: OffsetDateTime) -> Result<Caller, AuthFailure> {
        if matches!(self, Self::Disabled) {
            return Ok(Caller::Anonymous);
        }
        let key = presented_key(headers).ok_or(AuthFailure::Missing)?;
        if key.len() > MAX_KEY_LEN {
            return Err(AuthFailure::Unknown);
        }
        self.caller_at(Some(KeyDigest(sha256(key.as_bytes()))), now)
    }

    /// The one rule for a key: the caller `key` names at `now`, or why it
    /// is refused (no key: anyone when authentication is disabled, else
    /// `missing_api_key`). Judged at the door and again, for a running job,
    /// on every reload and at the key's expiry (`crate::job::standing`).
    pub fn caller_at(&self, key: Option<KeyDigest>, now: OffsetDateTime) -> Result<Caller, AuthFailure> {
        let Self::Required(_) = self else { return Ok(Caller::Anonymous) };
        let digest = key.ok_or(AuthFailure::Missing)?;
        let expired = |at: Option<OffsetDateTime>| at.is_some_and(|at| now >= at);
        match self.find(&digest) {
            None => Err(AuthFailure::Unknown),
            Some((p, _)) if p.disabled => Err(AuthFailure::Disabled),
            Some((p, key)) if expired(p.expires_at) || expired(key.expires_at) => Err(AuthFailure::Expired),
            Some((p, _)) => Ok(Caller::Principal(p.clone(), digest)),
        }
    }

    /// When `key` stops being accepted (the earlier of its own `expires_at`
    /// and its principal's), if it is known and ever does: when a running
    /// job's caller must be judged again without a reload.
    pub fn expires_at(&self, key: Option<KeyDigest>) -> Option<OffsetDateTime> {
        let (p, key) = self.find(&key?)?;
        [p.expires_at, key.expires_at].into_iter().flatten().min()
    }

    /// The principal holding the key `digest`, and that key. Every key is
    /// compared, so the time taken does not depend on where (or whether)
    /// the key matched. Hashes are unique, so at most one does.
    fn find(&self, digest: &KeyDigest) -> Option<(&Arc<Principal>, &PrincipalKey)> {
        let Self::Required(principals) = self else { return None };
        let mut found = None;
        for principal in principals {
            for key in &principal.keys {
                if bool::from(key.sha256.ct_eq(&digest.0)) {
                    found = Some((principal, key));
                }
            }
        }
        found
    }

    /// The principals whose key (or who) expire within `within` of `now`
    /// and have not yet: named in a warning at load so a rotation is not
    /// missed.
    pub fn expiring_soon(&self, now: OffsetDateTime, within: time::Duration) -> Vec<&str> {
        let Self::Required(principals) = self else { return Vec::new() };
        let soon = |at: Option<OffsetDateTime>| at.is_some_and(|at| at > now && at - now <= within);
        principals
            .iter()
            .filter(|p| !p.disabled && (soon(p.expires_at) || p.keys.iter().any(|k| soon(k.expires_at))))
            .map(|p| p.name.as_str())
            .collect()
    }
}

/// A workspace ref, or a pattern of one (`site*`): what a principal's
/// `workspaces` may list.
fn is_ref_pattern(pattern: &str) -> bool {
    iop_proto::config::is_config_name(&pattern.replace('*', "x"))
}

/// Says at start (and when a reload changes it) how clients are
/// authenticated; loudly when they are not, and louder when anonymous
/// callers may run jobs in workspaces.
pub fn log_mode(auth: &AuthConfig) {
    match auth.mode {
        AuthMode::Required => tracing::info!("client API keys required (auth.mode: required)"),
        AuthMode::Disabled => tracing::warn!(
            "CLIENT AUTHENTICATION IS DISABLED (auth.mode: disabled): anyone who reaches the HTTP listener may use every model"
        ),
    }
    let open = auth.anonymous_workspaces.len();
    if open > 0 {
        tracing::warn!(
            workspaces = open,
            "{open} WORKSPACE(S) OPEN TO ANONYMOUS CALLERS (auth.anonymous_workspaces): anyone who reaches the HTTP listener may write files and run commands there"
        );
    }
}

/// Names, in one warning per load, the principals with a key that expires
/// within a week, so a rotation is not missed.
pub fn warn_expiring(keys: &Keys) {
    let soon = keys.expiring_soon(OffsetDateTime::now_utc(), time::Duration::days(7));
    if !soon.is_empty() {
        tracing::warn!(principals = %soon.join(","), "API keys expire within 7 days (keys file `expires_at`)");
    }
}

/// The API key of a request: `Authorization: Bearer`, else `x-api-key`, else
/// `api-key`. Blank values count as absent.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| {
        let (scheme, token) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
    });
    let plain = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    [bearer, plain("x-api-key"), plain("api-key")].into_iter().flatten().find(|k| !k.is_empty())
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// Lowercase hex of a hash, as the keys file holds it.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `iop-edge new-key --expires-in`: a whole number and a unit, `s`, `m`,
/// `h`, `d` or `w` (`90d`, `12h`), at least a minute and at most ten years.
pub fn parse_expires_in(text: &str) -> Result<time::Duration, String> {
    let usage = || format!("`{text}`: give a number and a unit (s, m, h, d, w), e.g. 90d or 12h");
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(usage)?;
    let (number, unit) = text.split_at(split);
    let n: i64 = number.parse().map_err(|_| usage())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(usage()),
    };
    let d = time::Duration::seconds(n.saturating_mul(seconds));
    if d < time::Duration::minutes(1) || d > time::Duration::days(3653) {
        return Err(format!("`{text}`: must be between 1m and 10 years"));
    }
    Ok(d)
}

/// An RFC 3339 time of the keys file (`expires_at`); the error names `field`.
fn parse_time(text: Option<&str>, field: &str) -> Result<Option<OffsetDateTime>, String> {
    text.map(|t| {
        OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .map_err(|_| format!("{field}: must be an RFC 3339 time such as 2027-01-31T00:00:00Z"))
    })
    .transpose()
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// Resolves a relative `keys_file` against the config file's directory.
pub fn resolve_keys_file(auth: &mut AuthConfig, base: &Path) {
    if let Some(file) = auth.keys_file.as_mut()
        && file.is_relative()
    {
        *file = base.join(&*file);
    }
}

#[cfg(test)]
mod tests;

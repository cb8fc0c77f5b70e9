//! Status mirroring (pure): from the admin API snapshots of every Edge
//! replica (`GET /admin/v1/providers`, `GET /admin/v1/nodes`) to the fields
//! of `Provider.status` and `NodeCatalog.status` the mirror owns (field
//! manager `iop-operator/status`), and which objects need a write. The
//! snapshots are [`iop_proto::admin`]'s types, the Edge's own definition;
//! how they read an Edge newer or older than this operator (what is read
//! closed, what tolerantly) is in that module's docs.
//!
//! # One replica's view of a provider
//!
//! Each replica's `health` is its effective health of the provider: config,
//! its session with the node (readiness) and its runtime overlay combined,
//! the one definition the Edge's admission uses too. [`classify`] takes it
//! as it is, and is the only mapping from the Edge's view to a `Health`:
//!
//! | Edge `health`  | health        | classification       |
//! |----------------|---------------|----------------------|
//! | `available`    | `Available`   | (none)               |
//! | `unavailable`  | `Unavailable` | `provider_unhealthy` |
//! | `unknown`      | `Unknown`     | `health_unknown`     |
//!
//! (`unknown`: the node is not connected or not ready, or its probe could
//! not tell.) The classifications are the node's fail-closed pairs;
//! `request_stalled` (available/request_stalled) is never written: a stall
//! whose provider is fine leaves the provider `available`, and the Edge's
//! snapshot cannot tell that apart from a provider that never stalled, so a
//! healthy provider shows no classification.
//!
//! # Several replicas: the merge rule ([`merge_health`])
//!
//! Every node keeps one session with every Edge replica, and each replica
//! judges the provider on its own session. Only the replicas that **answered
//! this poll and hold a ready session with the provider's node** (their
//! `/admin/v1/nodes` says `connected`, phase `ready`) have a say; a replica
//! that did not answer, answered without a session to the node, or whose
//! session has not reached `ready` yet, is not counted as seeing anything
//! (neither up nor down). The last keeps a replica that just (re)started
//! from showing `degraded` in the moment between the node's registration,
//! when it has heard nothing of the providers yet (`unknown`), and its
//! readiness report. Of the replicas that have a say:
//!
//! | what they see (after [`classify`])             | health        | classification                          |
//! |------------------------------------------------|---------------|-----------------------------------------|
//! | none has a say                                 | `Unknown`     | `health_unknown`                        |
//! | all the same                                   | that one      | its classification                      |
//! | some `Available`, some not                     | `Degraded`    | `provider_unhealthy` if one sees it `Unavailable`, else `health_unknown` |
//! | none `Available`, some `Unavailable`, some `Unknown` | `Unavailable` | `provider_unhealthy`              |
//!
//! So `available` means every replica with a say may route to it, `degraded`
//! that only some may (a request on one that may not is served as with the
//! provider down there), `unavailable` that none may and at least one has
//! evidence it is down. With one replica the rule is the first table.
//!
//! `generation` and `lastObservationSequence` are those of the newest
//! evidence among the replicas that have a say (all replicas listing the
//! provider when none has): the overlay with the largest (generation,
//! sequence) when any has one, otherwise the largest node connection
//! generation and no sequence. `lastTransitionTime` moves only when
//! `health` changes: to that overlay's `since_ms` when the overlay holds the
//! new health since after the last transition, otherwise to `now` (always
//! `now` for `degraded`, which no single overlay holds).
//!
//! # Writes only when what a user sees changes
//!
//! The node probes a provider that is not available again and again (with
//! backoff, at most every 30 s), and every probe moves the overlay's
//! sequence. A change of `lastObservationSequence` alone is therefore not
//! written ([`visible_change`]): the sequence is updated together with a
//! change of anything else (health, classification, generation, transition
//! time). Each write costs the API server a write and every watcher an event.
//!
//! # Managed credential ([`merge_credential`])
//!
//! Each replica lists, for a provider with a managed credential, its
//! profile and state (`credential: {profile, state}`): `ok`, `disabled` (the
//! profile is disabled in the config), `invalid` (that replica could not
//! load the value), `rejected` (the provider answered 401/403 to it; it
//! stays so until the credential's revision changes) or `refused_by_node`
//! (the provider's node refused to open its leases, `node_refusal` saying
//! why: a revision older than one it has seen, say). Every answering
//! replica that lists the provider has a say (a credential is the Edge's,
//! not a node session's), and the worst state wins: `invalid`, then
//! `refused_by_node`, then `rejected`, then `disabled`, then `ok`. It becomes
//! the condition [`CREDENTIAL_ACCEPTED`]: `True`/`Accepted`, or `False` with
//! `CredentialInvalid`, `CredentialRefusedByNode`, `CredentialRejected` or
//! `CredentialDisabled`. A provider not available while its node refuses its
//! credential's leases is classified `credential_refused_by_node`. The
//! field is read tolerantly (`iop_proto::admin`): absent, or a state this
//! operator does not know, is no information; with no information from any
//! replica (no managed credential) the condition is left out (and so
//! removed).
//!
//! # Outlier ejection
//!
//! Each replica lists `ejected_until` (RFC 3339, `null` when selectable):
//! the time until which it leaves the provider out of selection after
//! generation failures in a row, whatever its `health` (a provider can
//! answer its metadata probe and fail every generation). Every answering
//! replica that lists the provider has a say (ejection is the replica's
//! own judgement, not a node session's); `ejectedUntil` is the latest of
//! theirs, in whole seconds, and absent when none has it ejected (the
//! `EJECTED` column). Read tolerantly like `credential` (a time that does not
//! parse is none).
//!
//! # Model residency
//!
//! Each replica lists the node's last report of whether the provider's
//! model is in its server's memory (`residency`: `loaded`, `not_loaded`,
//! `unknown`; the Edge says `unknown` without a report or a ready node) and
//! the node's last measured load (`last_load_seconds`, `last_load_at`,
//! `null` before any). Every answering replica that lists the provider has
//! a say ([`merge_residency`]): a replica that knows (`loaded` or
//! `not_loaded`) beats one that does not, and `loaded` beats `not_loaded`
//! (the node sends each report to every replica, so they differ only for
//! the moment between two reports; `loaded` is the newer news after a
//! load). The load shown is the latest (`last_load_at`) of the replicas',
//! with its duration. `status.residency` (the `LOADED` column),
//! `status.lastLoadSeconds` and `status.lastLoadTime` (whole seconds); read
//! tolerantly like `credential` (absent or unknown values: no information;
//! with none from any replica, `residency` is left out).
//!
//! # Node connection
//!
//! `replicas` is the number of Edge replicas (the pods the config lists,
//! answering or not); `connectedReplicas` the number of answering replicas
//! with a session to the node (`replicasSummary`: `connected/replicas`, the
//! REPLICAS column). `connected` is true while at least one is. `generation`
//! is the newest session's (the largest: generations grow with time), and
//! never goes back to an older one: it is kept while that session's replica
//! is away (restarting) and while the node is away; `since` moves when
//! `connected` flips or a newer session appears (a larger generation): to
//! that session's `connected_at_ms` when connected, to `now` when the node
//! went away. `version` is the newest current session's.
//!
//! Providers and nodes no answering replica lists (not in its config yet, or
//! left out as not ready) get these fields cleared: the Edge has no live
//! state for them. Objects that do not exist are not written; while no
//! replica answers, nothing is written.
//!
//! # A node's workspaces ([`workspaces_ready`])
//!
//! The condition [`WORKSPACES_READY`] of a NodeCatalog the build renders
//! ([`NodeFacts::workspaces`], from [`crate::reconcile::desired::node_workspaces`],
//! the build's own judgement of the same objects) says whether its
//! workspaces can take jobs. Each replica's ready session reports the
//! node's verdict on every workspace that replica's config assigns it
//! (`workspaces`: `accepted` or the closed reason; nothing before
//! readiness). Of the workspaces the config assigns the node:
//!
//! | what the build and the sessions say                               | status    | reason                   |
//! |-------------------------------------------------------------------|-----------|--------------------------|
//! | a workspace left out (template missing or not ready, Edge rules)  | `False`   | that problem's           |
//! | else one refused in any ready session                             | `False`   | `WorkspaceRefused`       |
//! | else no workspaces at all                                         | `True`    | `Accepted`               |
//! | else no ready session                                             | `Unknown` | `NotConnected`           |
//! | else each accepted in some ready session                          | `True`    | `Accepted`               |
//! | else (one no session reports: config not reloaded, older Edge)    | `Unknown` | `NotReported`            |
//!
//! The messages name each refused workspace and the node's reason. A node
//! the build leaves out (not `Ready`) has no such condition; one no
//! answering replica lists keeps it, judged without a session.
//!
//! # A node's bundle ([`bundle_current`])
//!
//! The condition [`BUNDLE_CURRENT`] compares the serial of the certificate
//! each replica's session presented (`certificate_serial`) with the one the
//! operator issued last (`status.certificate.serial`, the certificate
//! writer's): `True` when every session presents it; `False`,
//! `OlderBundle`, when any presents another (the Mac runs an older bundle;
//! the message names the serial and says to make a new bundle and restart
//! `iop-node`); `Unknown`, `NotConnected`, without a session, or when a
//! session's serial is not reported (an Edge older than this operator).
//! Written only once a certificate is issued, and, like the connection
//! fields, only while an answering replica lists the node.
//!
//! # One writer ([`leftovers`], [`removal`])
//!
//! The mirror applies its fields with server-side apply, which removes a
//! field the apply leaves out only when no other field manager owns it.
//! A field of the mirror's that someone else set (`kubectl patch
//! --subresource=status` has a field manager of its own) would stay: a
//! `classification` beside `health: available`. So after each apply the
//! object it returns is checked for the mirror's fields the apply did not
//! set, and those are removed with a JSON merge patch. In the steady state
//! the status holds exactly what the mirror applied: no second write.

use std::collections::BTreeMap;

use iop_proto::admin::{
    self, CredentialState, EdgeCredential, EdgeHealth, EdgeNode, EdgeProvider, NodesSnapshot, ProvidersSnapshot,
    SessionPhase,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::crd::provider::{Classification, Health, Residency};
use crate::crd::{NodeCatalogStatus, ProviderStatus};
use crate::reconcile::conditions::{BUNDLE_CURRENT, Status, WORKSPACES_READY, next};
use crate::reconcile::desired::NodeWorkspaces;

/// Condition type the status mirror writes on a Provider with a managed
/// credential (field manager `iop-operator/status`).
pub const CREDENTIAL_ACCEPTED: &str = "CredentialAccepted";

/// The residency a replica reports, as the status shows it.
impl From<admin::Residency> for Residency {
    fn from(residency: admin::Residency) -> Self {
        match residency {
            admin::Residency::Loaded => Self::Loaded,
            admin::Residency::NotLoaded => Self::NotLoaded,
            admin::Residency::Unknown => Self::Unknown,
        }
    }
}

/// An RFC 3339 time of the snapshot (`ejected_until`, `last_load_at`);
/// `None` when it does not parse (as absent).
fn parse_time(text: &str) -> Option<Time> {
    text.parse::<Timestamp>().ok().map(Time)
}

/// `last_load_seconds` in whole milliseconds; `None` when absent or out of
/// range (negative, not finite, absurdly large).
fn last_load_ms(p: &EdgeProvider) -> Option<u64> {
    let seconds = p.last_load_seconds.filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e12);
    // In range above: the cast neither saturates nor wraps.
    seconds.map(|s| (s * 1000.0).round() as u64)
}

/// The `Provider.status` fields the mirror owns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderMirror {
    pub health: Option<Health>,
    pub classification: Option<Classification>,
    pub last_observation_sequence: Option<u64>,
    pub generation: Option<u64>,
    pub last_transition_time: Option<Time>,
    /// The [`CREDENTIAL_ACCEPTED`] condition (none without information).
    pub credential: Option<Condition>,
    /// `status.ejectedUntil`: the latest replica's outlier ejection.
    pub ejected_until: Option<Time>,
    /// `status.residency` ([`merge_residency`]).
    pub residency: Option<Residency>,
    /// `status.lastLoadSeconds`: the latest load's duration (ms precision).
    pub last_load_seconds: Option<f64>,
    /// `status.lastLoadTime`: when the latest load ended (whole seconds).
    pub last_load_time: Option<Time>,
}

impl ProviderMirror {
    pub fn of(status: Option<&ProviderStatus>) -> Self {
        let Some(s) = status else { return Self::default() };
        Self {
            health: s.health,
            classification: s.classification,
            last_observation_sequence: s.last_observation_sequence,
            generation: s.generation,
            last_transition_time: s.last_transition_time.clone(),
            credential: s.conditions.iter().find(|c| c.type_ == CREDENTIAL_ACCEPTED).cloned(),
            ejected_until: s.ejected_until.clone(),
            residency: s.residency,
            last_load_seconds: s.last_load_seconds,
            last_load_time: s.last_load_time.clone(),
        }
    }

    /// A status holding only the mirror's fields (the apply body).
    pub fn to_status(&self) -> ProviderStatus {
        ProviderStatus {
            health: self.health,
            classification: self.classification,
            last_observation_sequence: self.last_observation_sequence,
            generation: self.generation,
            last_transition_time: self.last_transition_time.clone(),
            ejected_until: self.ejected_until.clone(),
            residency: self.residency,
            last_load_seconds: self.last_load_seconds,
            last_load_time: self.last_load_time.clone(),
            conditions: self.credential.iter().cloned().collect(),
            ..Default::default()
        }
    }
}

/// The `NodeCatalog.status` fields the mirror owns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeMirror {
    pub connected: Option<bool>,
    pub connected_replicas: Option<u32>,
    pub replicas: Option<u32>,
    pub replicas_summary: Option<String>,
    pub generation: Option<u64>,
    pub since: Option<Time>,
    pub version: Option<String>,
    /// The [`WORKSPACES_READY`] condition ([`workspaces_ready`]; none while
    /// the node is not rendered).
    pub workspaces_ready: Option<Condition>,
    /// The [`BUNDLE_CURRENT`] condition ([`bundle_current`]; none while no
    /// answering replica lists the node or no certificate is issued).
    pub bundle_current: Option<Condition>,
}

impl NodeMirror {
    pub fn of(status: Option<&NodeCatalogStatus>) -> Self {
        let Some(s) = status else { return Self::default() };
        let condition = |type_: &str| s.conditions.iter().find(|c| c.type_ == type_).cloned();
        Self {
            connected: s.connected,
            connected_replicas: s.connected_replicas,
            replicas: s.replicas,
            replicas_summary: s.replicas_summary.clone(),
            generation: s.generation,
            since: s.since.clone(),
            version: s.version.clone(),
            workspaces_ready: condition(WORKSPACES_READY),
            bundle_current: condition(BUNDLE_CURRENT),
        }
    }

    pub fn to_status(&self) -> NodeCatalogStatus {
        let Self {
            connected,
            connected_replicas,
            replicas,
            replicas_summary,
            generation,
            since,
            version,
            workspaces_ready,
            bundle_current,
        } = self;
        NodeCatalogStatus {
            connected: *connected,
            connected_replicas: *connected_replicas,
            replicas: *replicas,
            replicas_summary: replicas_summary.clone(),
            generation: *generation,
            since: since.clone(),
            version: version.clone(),
            conditions: workspaces_ready.iter().chain(bundle_current).cloned().collect(),
            ..Default::default()
        }
    }
}

/// The mirror's part of a kind's status: read from a status, written as
/// one (the apply body holds exactly these fields).
pub trait Mirrored: Clone + Default + PartialEq {
    type Status: Serialize;
    fn of(status: Option<&Self::Status>) -> Self;
    fn to_status(&self) -> Self::Status;
}

impl Mirrored for ProviderMirror {
    type Status = ProviderStatus;
    // The inherent functions (inherent items win over the trait's).
    fn of(status: Option<&ProviderStatus>) -> Self {
        Self::of(status)
    }
    fn to_status(&self) -> ProviderStatus {
        Self::to_status(self)
    }
}

impl Mirrored for NodeMirror {
    type Status = NodeCatalogStatus;
    fn of(status: Option<&NodeCatalogStatus>) -> Self {
        Self::of(status)
    }
    fn to_status(&self) -> NodeCatalogStatus {
        Self::to_status(self)
    }
}

/// What a NodeCatalog's mirrored conditions need besides the Edge's view.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    /// `status.certificate.serial`: the certificate the operator issued last.
    pub issued_serial: Option<String>,
    /// Its workspaces as the build renders them; `None` when the build
    /// leaves the node out (no [`WORKSPACES_READY`] then).
    pub workspaces: Option<NodeWorkspaces>,
}

/// Whole seconds: Kubernetes `Time` has no finer precision, and a value that
/// would not round-trip would look changed on every comparison.
fn seconds(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

fn from_ms(ms: u64) -> Option<Time> {
    i64::try_from(ms / 1000).ok().and_then(|s| Timestamp::from_second(s).ok()).map(Time)
}

/// The only mapping from an Edge replica's view of a provider to `Health`
/// and `Classification` (see the module docs).
pub fn classify(health: EdgeHealth) -> (Health, Option<Classification>) {
    match health {
        EdgeHealth::Available => (Health::Available, None),
        EdgeHealth::Unavailable => (Health::Unavailable, Some(Classification::ProviderUnhealthy)),
        EdgeHealth::Unknown => (Health::Unknown, Some(Classification::HealthUnknown)),
    }
}

/// The merge rule: the views of the replicas that have a say (answered,
/// a ready session with the provider's node), each as [`classify`] reads it. See
/// the module docs for the table.
pub fn merge_health(seen: &[EdgeHealth]) -> (Health, Option<Classification>) {
    let Some(&first) = seen.first() else { return classify(EdgeHealth::Unknown) };
    if seen.iter().all(|&h| h == first) {
        return classify(first);
    }
    let down = seen.contains(&EdgeHealth::Unavailable);
    if seen.contains(&EdgeHealth::Available) {
        // Some may route to it, some may not: the worse of the others' classifications.
        let worst = if down { EdgeHealth::Unavailable } else { EdgeHealth::Unknown };
        (Health::Degraded, classify(worst).1)
    } else {
        // Unavailable and unknown: nobody may route to it, and there is evidence it is down.
        classify(EdgeHealth::Unavailable)
    }
}

/// `status.residency` from what the replicas that list the provider say
/// (see the module docs): `loaded` over `not_loaded` over `unknown`;
/// `None` when no replica says anything (an Edge older than the field).
pub fn merge_residency(seen: &[Option<Residency>]) -> Option<Residency> {
    let rank = |r: Residency| match r {
        Residency::Loaded => 2,
        Residency::NotLoaded => 1,
        Residency::Unknown => 0,
    };
    seen.iter().flatten().copied().max_by_key(|r| rank(*r))
}

/// The latest load among the replicas' (`last_load_at`), as
/// `(lastLoadSeconds, lastLoadTime)`.
pub fn latest_load(seen: &[&EdgeProvider]) -> (Option<f64>, Option<Time>) {
    let latest = seen
        .iter()
        .filter_map(|p| Some((parse_time(p.last_load_at.as_deref()?)?, last_load_ms(p)?)))
        .max_by(|(a, _), (b, _)| a.0.cmp(&b.0));
    match latest {
        Some((at, ms)) => (Some(ms as f64 / 1000.0), Some(seconds(at.0))),
        None => (None, None),
    }
}

/// The [`CREDENTIAL_ACCEPTED`] condition from what the replicas that list
/// the provider say of its credential (see the module docs): `None` when
/// none says anything. `previous` is the condition written before (its
/// transition time stays while its status does).
pub fn merge_credential(
    seen: &[&EdgeCredential],
    replicas: usize,
    previous: Option<&Condition>,
    now: Timestamp,
) -> Option<Condition> {
    use crate::reconcile::conditions::{Status, next};
    // Best first: the worst state wins.
    let rank = |state: CredentialState| match state {
        CredentialState::Ok => 0,
        CredentialState::Disabled => 1,
        CredentialState::Rejected => 2,
        CredentialState::RefusedByNode => 3,
        CredentialState::Invalid => 4,
    };
    let worst = seen.iter().map(|c| c.state).max_by_key(|s| rank(*s))?;
    let example = seen.iter().find(|c| c.state == worst);
    let profile = example.map_or("", |c| c.profile.as_str());
    let of = seen.iter().filter(|c| c.state == worst).count();
    let on = if replicas > 1 { format!(" (on {of} of {replicas} Edge replicas)") } else { String::new() };
    let (status, reason, message) = match worst {
        CredentialState::Ok => (Status::True, "Accepted", format!("credential profile `{profile}` is loaded{on}")),
        CredentialState::Disabled => (
            Status::False,
            "CredentialDisabled",
            format!("credential profile `{profile}` is disabled in the Edge config{on}; runs are refused"),
        ),
        CredentialState::Rejected => (
            Status::False,
            "CredentialRejected",
            format!(
                "the provider answered 401/403 to credential profile `{profile}`{on}: its key is wrong or \
                 revoked; put a working key in the Secret (a new revision clears this)"
            ),
        ),
        CredentialState::RefusedByNode => (
            Status::False,
            "CredentialRefusedByNode",
            format!(
                "the provider's node refused the leases of credential profile `{profile}` ({}){on}; runs fail \
                 until the node accepts one or the Edge config's revision of the credential changes",
                example.and_then(|c| c.node_refusal.as_deref()).unwrap_or("no reason given")
            ),
        ),
        CredentialState::Invalid => (
            Status::False,
            "CredentialInvalid",
            format!("the Edge could not load credential profile `{profile}`{on}; runs are refused"),
        ),
    };
    let current: Vec<Condition> = previous.cloned().into_iter().collect();
    Some(seconds_condition(next(&current, CREDENTIAL_ACCEPTED, status, reason, message, None, now)))
}

/// A condition whose transition time is in whole seconds (see [`seconds`]).
fn seconds_condition(mut c: Condition) -> Condition {
    c.last_transition_time = seconds(c.last_transition_time.0);
    c
}

/// One replica's view of a provider: the provider as it lists it, and its
/// session with the provider's node (absent when it does not list the node).
pub type ProviderView<'a> = (&'a EdgeProvider, Option<&'a EdgeNode>);

/// The mirrored fields of one provider as one replica sees it.
pub fn provider(
    p: &EdgeProvider,
    node: Option<&EdgeNode>,
    previous: &ProviderMirror,
    now: Timestamp,
) -> ProviderMirror {
    merged_provider(&[(p, node)], previous, now)
}

/// The mirrored fields of one provider from the views of every answering
/// replica that lists it (see the module docs).
pub fn merged_provider(views: &[ProviderView<'_>], previous: &ProviderMirror, now: Timestamp) -> ProviderMirror {
    let ready =
        |(_, node): &&ProviderView<'_>| node.is_some_and(|n| n.connected && n.phase == Some(SessionPhase::Ready));
    let with_say: Vec<&ProviderView<'_>> = views.iter().filter(ready).collect();
    let seen: Vec<EdgeHealth> = with_say.iter().map(|(p, _)| p.health).collect();
    let (health, classification) = merge_health(&seen);

    // The newest evidence: of the replicas with a say, or of all when none has one.
    let evidence: Vec<&ProviderView<'_>> = if with_say.is_empty() { views.iter().collect() } else { with_say };
    let overlay = evidence.iter().filter_map(|(p, _)| p.overlay.as_ref()).max_by_key(|o| (o.generation, o.sequence));
    let (generation, last_observation_sequence) = match overlay {
        Some(o) => (Some(o.generation), Some(o.sequence)),
        None => (evidence.iter().filter_map(|(_, n)| n.and_then(|n| n.generation)).max(), None),
    };
    let last_transition_time = match &previous.last_transition_time {
        Some(t) if previous.health == Some(health) => Some(t.clone()),
        since => {
            // The overlay's own transition, when it is this one (never one
            // older than the transition already recorded).
            let overlay_since = overlay
                .filter(|o| classify(o.state).0 == health)
                .and_then(|o| from_ms(o.since_ms))
                .filter(|t| since.as_ref().is_none_or(|s| t.0 > s.0));
            overlay_since.or_else(|| Some(seconds(now)))
        }
    };
    let credentials: Vec<&EdgeCredential> = views.iter().filter_map(|(p, _)| p.credential.as_ref()).collect();
    let credential = merge_credential(&credentials, views.len(), previous.credential.as_ref(), now);
    // A provider unavailable because its node refuses its credential says so.
    let refused = credentials.iter().any(|c| c.state == CredentialState::RefusedByNode);
    let classification = if refused && health != Health::Available {
        Some(Classification::CredentialRefusedByNode)
    } else {
        classification
    };
    let ejected_until =
        views.iter().filter_map(|(p, _)| parse_time(p.ejected_until.as_deref()?)).map(|t| seconds(t.0)).max();
    let residency = merge_residency(&views.iter().map(|(p, _)| p.residency.map(Into::into)).collect::<Vec<_>>());
    let (last_load_seconds, last_load_time) = latest_load(&views.iter().map(|(p, _)| *p).collect::<Vec<_>>());
    ProviderMirror {
        health: Some(health),
        classification,
        last_observation_sequence,
        generation,
        last_transition_time,
        credential,
        ejected_until,
        residency,
        last_load_seconds,
        last_load_time,
    }
}

/// Whether `next` differs from `previous` in anything but
/// `lastObservationSequence` (see the module docs: a new sequence alone is
/// not worth a write).
pub fn visible_change(previous: &ProviderMirror, next: &ProviderMirror) -> bool {
    let ProviderMirror {
        health,
        classification,
        last_observation_sequence,
        generation,
        last_transition_time,
        credential,
        ejected_until,
        residency,
        last_load_seconds,
        last_load_time,
    } = next;
    // A sequence present where none should be (or the reverse) is not the
    // newest evidence, it is a field to clear (or to set).
    last_observation_sequence.is_some() != previous.last_observation_sequence.is_some()
        || (health, classification, generation, last_transition_time, credential, ejected_until)
            != (
                &previous.health,
                &previous.classification,
                &previous.generation,
                &previous.last_transition_time,
                &previous.credential,
                &previous.ejected_until,
            )
        || (residency, last_load_seconds, last_load_time)
            != (&previous.residency, &previous.last_load_seconds, &previous.last_load_time)
}

/// The mirrored fields of one node as one replica (of one) sees it.
pub fn node(n: &EdgeNode, previous: &NodeMirror, now: Timestamp) -> NodeMirror {
    merged_node(&[n], 1, previous, &NodeFacts::default(), now)
}

/// The mirrored fields of one node from the views of every answering
/// replica that lists it, of `replicas` replicas in all (see the module docs).
pub fn merged_node(
    seen: &[&EdgeNode],
    replicas: usize,
    previous: &NodeMirror,
    facts: &NodeFacts,
    now: Timestamp,
) -> NodeMirror {
    let connected_replicas = seen.iter().filter(|n| n.connected).count();
    let connected = connected_replicas > 0;
    // The newest session (the largest generation), of the connected replicas when any is.
    let newest =
        seen.iter().filter(|n| n.connected || !connected).max_by_key(|n| (n.generation, n.connected_at_ms)).copied();
    // Never back to an older session's while a newer one is away (generations grow with time).
    let generation = newest.and_then(|n| n.generation).max(previous.generation);
    let moved = previous.connected != Some(connected) || (connected && generation != previous.generation);
    let since = match &previous.since {
        Some(t) if !moved => Some(t.clone()),
        _ if connected => newest.and_then(|n| n.connected_at_ms).and_then(from_ms).or_else(|| Some(seconds(now))),
        _ => Some(seconds(now)),
    };
    // The version of the last connection stays while the node is away.
    let version = newest.and_then(|n| n.version.clone()).or_else(|| previous.version.clone());
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let workspaces_ready =
        facts.workspaces.as_ref().map(|w| workspaces_ready(w, seen, previous.workspaces_ready.as_ref(), now));
    let name = seen.first().map_or("", |n| n.name.as_str());
    let bundle_current = facts
        .issued_serial
        .as_deref()
        .map(|issued| bundle_current(name, issued, seen, previous.bundle_current.as_ref(), now));
    NodeMirror {
        connected: Some(connected),
        connected_replicas: Some(count(connected_replicas)),
        replicas: Some(count(replicas)),
        replicas_summary: Some(format!("{connected_replicas}/{replicas}")),
        generation,
        since,
        version,
        workspaces_ready,
        bundle_current,
    }
}

/// A node's verdict on a workspace it accepted (anything else is the
/// closed reason it refused it for: `outside_allowed_roots`, `not_found`,
/// ..., or the Edge's `not_reported` / `unknown_status`).
pub const WORKSPACE_ACCEPTED: &str = "accepted";

/// The [`WORKSPACES_READY`] condition of a rendered node from its
/// workspaces as the build renders them and the replicas' sessions with it
/// (see the module docs). `previous` is the condition written before (its
/// transition time stays while its status does).
pub fn workspaces_ready(
    workspaces: &NodeWorkspaces,
    seen: &[&EdgeNode],
    previous: Option<&Condition>,
    now: Timestamp,
) -> Condition {
    // The verdicts come with readiness: only ready sessions have them.
    let ready: Vec<&EdgeNode> =
        seen.iter().filter(|n| n.connected && n.phase == Some(SessionPhase::Ready)).copied().collect();
    let verdicts = |reference: &str| -> Vec<&str> {
        ready.iter().filter_map(|n| n.workspaces.get(reference).map(String::as_str)).collect()
    };
    let refused: Vec<String> = workspaces
        .assigned
        .iter()
        .filter_map(|r| {
            let mut why: Vec<&str> = verdicts(r).into_iter().filter(|v| *v != WORKSPACE_ACCEPTED).collect();
            why.sort_unstable();
            why.dedup();
            (!why.is_empty()).then(|| format!("workspace `{r}`: the node refused it ({})", why.join(", ")))
        })
        .collect();
    let unreported: Vec<&str> =
        workspaces.assigned.iter().filter(|r| verdicts(r).is_empty()).map(String::as_str).collect();
    let problems = workspaces.problems.iter().map(|p| p.message.clone());
    let (status, reason, message) = if let Some(first) = workspaces.problems.first() {
        (Status::False, first.reason.as_str(), problems.chain(refused).collect::<Vec<_>>().join("; "))
    } else if !refused.is_empty() {
        let message = format!(
            "{}; no job runs there until the node accepts it (it checks again when it reconnects)",
            refused.join("; ")
        );
        (Status::False, "WorkspaceRefused", message)
    } else if workspaces.assigned.is_empty() {
        (Status::True, "Accepted", "no workspaces".to_string())
    } else if ready.is_empty() {
        let message = "rendered into the Edge config; no Edge replica holds a ready session with the node, so \
                       whether the node accepts its workspaces is not known";
        (Status::Unknown, "NotConnected", message.to_string())
    } else if unreported.is_empty() {
        (
            Status::True,
            "Accepted",
            "every workspace is rendered into the Edge config and accepted by the node".to_string(),
        )
    } else {
        let message = format!(
            "no Edge replica reports the node's verdict on workspace `{}` yet (its config does not assign it yet, \
             or the Edge is older than this operator)",
            unreported.join("`, `")
        );
        (Status::Unknown, "NotReported", message)
    };
    let current: Vec<Condition> = previous.cloned().into_iter().collect();
    seconds_condition(next(&current, WORKSPACES_READY, status, reason, message, workspaces.generation, now))
}

/// Certificate serials as one: lowercase hex, without separators or
/// leading zeros (DER may pad a serial with a zero byte).
fn same_serial(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        let hex: String = s.chars().filter(char::is_ascii_hexdigit).map(|c| c.to_ascii_lowercase()).collect();
        hex.trim_start_matches('0').to_string()
    };
    norm(a) == norm(b)
}

/// The [`BUNDLE_CURRENT`] condition of node `name` from the serial the
/// operator issued last and the serials the replicas' sessions presented
/// (see the module docs). `previous` is the condition written before.
pub fn bundle_current(
    name: &str,
    issued: &str,
    seen: &[&EdgeNode],
    previous: Option<&Condition>,
    now: Timestamp,
) -> Condition {
    let sessions: Vec<&EdgeNode> = seen.iter().filter(|n| n.connected).copied().collect();
    // An empty serial is none reported.
    let presented: Vec<&str> =
        sessions.iter().filter_map(|n| n.certificate_serial.as_deref().filter(|s| !s.is_empty())).collect();
    let older: Vec<&str> = presented.iter().copied().filter(|s| !same_serial(s, issued)).collect();
    let (status, reason, message) = if sessions.is_empty() {
        (Status::Unknown, "NotConnected", "no Edge replica holds a session with the node".to_string())
    } else if !older.is_empty() {
        let mut serials = older.clone();
        serials.sort_unstable();
        serials.dedup();
        let message = format!(
            "the node's session presents certificate serial {} (on {} of {} Edge replicas with a session), not \
             {issued}, the one issued last: make a new bundle (iop-operator node-bundle {name}) and restart \
             iop-node",
            serials.join(", "),
            older.len(),
            sessions.len()
        );
        (Status::False, "OlderBundle", message)
    } else if presented.len() < sessions.len() {
        let message = "the Edge does not report which certificate the node's session presented (an Edge older \
                       than this operator)";
        (Status::Unknown, "NotConnected", message.to_string())
    } else {
        let message = format!("every session of the node presents certificate serial {issued}, the one issued last");
        (Status::True, "Current", message)
    };
    let current: Vec<Condition> = previous.cloned().into_iter().collect();
    seconds_condition(next(&current, BUNDLE_CURRENT, status, reason, message, None, now))
}

/// What to write after one poll.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Writes {
    pub providers: Vec<(String, ProviderMirror)>,
    pub nodes: Vec<(String, NodeMirror)>,
}

/// Both admin snapshots of one replica.
pub type AdminSnapshots = (ProvidersSnapshot, NodesSnapshot);

/// What one poll learned from every Edge replica: by replica id, its
/// snapshots, or `None` when it did not answer (or has no address yet).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeView {
    pub replicas: BTreeMap<String, Option<AdminSnapshots>>,
}

impl EdgeView {
    /// One replica that answered (an Edge without `replicas`).
    pub fn one(id: &str, providers: ProvidersSnapshot, nodes: NodesSnapshot) -> Self {
        Self { replicas: BTreeMap::from([(id.to_string(), Some((providers, nodes)))]) }
    }

    /// The snapshots of the replicas that answered.
    pub fn answered(&self) -> impl Iterator<Item = &AdminSnapshots> {
        self.replicas.values().flatten()
    }
}

/// Compares what the replicas say with the current mirrored fields of every
/// existing object (by name) and returns only the ones that differ in what
/// a user sees ([`visible_change`]). An object no answering replica lists
/// gets its mirrored fields cleared (a rendered node keeps its
/// [`WORKSPACES_READY`], judged without a session). `facts` are the nodes'
/// [`NodeFacts`] by name (a node without an entry has none). Nothing at all
/// while no replica answered.
pub fn plan(
    edge: &EdgeView,
    current_providers: &BTreeMap<String, ProviderMirror>,
    current_nodes: &BTreeMap<String, NodeMirror>,
    facts: &BTreeMap<String, NodeFacts>,
    now: Timestamp,
) -> Writes {
    let answered: Vec<&AdminSnapshots> = edge.answered().collect();
    if answered.is_empty() {
        return Writes::default();
    }
    let providers = current_providers
        .iter()
        .filter_map(|(name, previous)| {
            let views: Vec<ProviderView<'_>> = answered
                .iter()
                .filter_map(|(providers, nodes)| {
                    let p = providers.providers.iter().find(|p| &p.id == name)?;
                    Some((p, nodes.nodes.iter().find(|n| n.name == p.node)))
                })
                .collect();
            let next =
                if views.is_empty() { ProviderMirror::default() } else { merged_provider(&views, previous, now) };
            visible_change(previous, &next).then(|| (name.clone(), next))
        })
        .collect();
    let no_facts = NodeFacts::default();
    let nodes = current_nodes
        .iter()
        .filter_map(|(name, previous)| {
            let facts = facts.get(name).unwrap_or(&no_facts);
            let seen: Vec<&EdgeNode> =
                answered.iter().filter_map(|(_, nodes)| nodes.nodes.iter().find(|n| &n.name == name)).collect();
            let next = if seen.is_empty() {
                let workspaces_ready = facts
                    .workspaces
                    .as_ref()
                    .map(|w| workspaces_ready(w, &[], previous.workspaces_ready.as_ref(), now));
                NodeMirror { workspaces_ready, ..NodeMirror::default() }
            } else {
                merged_node(&seen, edge.replicas.len(), previous, facts, now)
            };
            (&next != previous).then(|| (name.clone(), next))
        })
        .collect();
    Writes { providers, nodes }
}

/// What an object's status holds of the mirror's fields beyond what the
/// mirror's apply set: top-level fields (JSON names) and condition types.
/// Server-side apply removes a field the applier leaves out only when no
/// other field manager owns it, so a value someone else wrote (`kubectl
/// patch --subresource=status`, a field manager of its own) survives every
/// apply; the mirror removes these with a second write ([`removal`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    pub fields: Vec<String>,
    pub conditions: Vec<String>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.conditions.is_empty()
    }
}

/// The [`Leftovers`] of `held` (the status after the mirror's apply) given
/// `applied` (what the mirror applied). Only the mirror's own fields count
/// ([`Mirrored::of`] reads nothing else): other writers' fields and
/// conditions are theirs.
pub fn leftovers<M: Mirrored>(held: Option<&M::Status>, applied: &M) -> Leftovers {
    let object = |m: &M| match serde_json::to_value(m.to_status()) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let (held, applied) = (object(&M::of(held)), object(applied));
    let types = |map: &Map<String, Value>| -> Vec<String> {
        let list = map.get("conditions").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        list.iter().filter_map(|c| c["type"].as_str().map(str::to_string)).collect()
    };
    let fields = held.keys().filter(|k| *k != "conditions" && !applied.contains_key(*k)).cloned().collect();
    let applied_types = types(&applied);
    let conditions = types(&held).into_iter().filter(|t| !applied_types.contains(t)).collect();
    Leftovers { fields, conditions }
}

/// The JSON merge patch (on the status subresource) that removes
/// `leftovers` from `object`, the object as the API server returned it:
/// each field set to `null`. A merge patch replaces a list whole, so when
/// a condition goes the patch carries the object's conditions without it
/// and the object's `resourceVersion`: a write in between fails the patch
/// (409) instead of being undone, and the next poll tries again.
pub fn removal(object: &Value, leftovers: &Leftovers) -> Value {
    let mut status: Map<String, Value> = leftovers.fields.iter().map(|f| (f.clone(), Value::Null)).collect();
    if leftovers.conditions.is_empty() {
        return json!({ "status": status });
    }
    let kept: Vec<Value> = object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| !c["type"].as_str().is_some_and(|t| leftovers.conditions.iter().any(|l| l == t)))
        .cloned()
        .collect();
    status.insert("conditions".to_string(), Value::Array(kept));
    json!({ "metadata": { "resourceVersion": object["metadata"]["resourceVersion"] }, "status": status })
}

#[cfg(test)]
mod tests;

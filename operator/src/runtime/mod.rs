//! The operator's I/O: everything that talks to the Kubernetes API or the
//! Edge admin API. The decisions it acts on are pure and live elsewhere
//! ([`crate::reconcile`], [`crate::certs`], [`crate::mirror`]).
//!
//! `iop-operator run`: wait until the CRDs are established ([`crds`]), elect
//! a leader through a Lease ([`leader`]); the leader watches the namespace's
//! Providers, NodeCatalogs and WorkspaceTemplates and reconciles the whole
//! namespace on any change ([`controller`] -> [`namespace`] -> [`pki`]),
//! renders the Edge pods as the config's replicas, and mirrors every Edge
//! replica's health and sessions into status ([`mirror`]). Only the leader
//! writes anything: the watches, the reconcile loop and the mirror run
//! inside its term and stop when it ends.
//! Every replica serves `/metrics`, `/healthz` and `/readyz` ([`listener`],
//! [`metrics`]) from the start.

pub mod admin;
pub mod controller;
pub mod crds;
pub mod leader;
pub mod listener;
pub mod metrics;
pub mod mirror;
pub mod namespace;
pub mod ownership;
pub mod pki;

use std::net::SocketAddr;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::certs::CertError;
use crate::certs::secrets::CaSecretError;
use crate::env::RunConfig;
use crate::reconcile::{BuildError, Settings};
use listener::{Endpoints, Readiness};
use metrics::Metrics;

/// Wall-clock time, injected so tests use fixed timestamps.
pub trait Clock: Send + Sync {
    fn now(&self) -> OffsetDateTime;
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

/// The system clock moved by a fixed offset (`IOP_TEST_CLOCK_OFFSET_S`,
/// tests only).
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock(pub time::Duration);

impl Clock for OffsetClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc() + self.0
    }
}

/// `now` for the reconcile stages and conditions (whole seconds, as
/// Kubernetes stores them).
pub fn timestamp(now: OffsetDateTime) -> Timestamp {
    Timestamp::from_second(now.unix_timestamp()).expect("the wall clock is within jiff's range")
}

/// The `User-Agent` of every request to the Kubernetes API (audit logs and
/// `managedFields` otherwise show the client as unknown).
pub const USER_AGENT: &str = concat!("iop-operator/", env!("CARGO_PKG_VERSION"));

/// Sets [`USER_AGENT`] on a client configuration.
pub fn identify(config: &mut kube::Config) {
    config.headers.retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
}

/// The API client of `iop-operator` (in-cluster config or KUBECONFIG),
/// identified by [`USER_AGENT`].
pub async fn client() -> Result<Client, kube::Error> {
    let mut config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
    identify(&mut config);
    Client::try_from(config)
}

/// What every write site needs.
pub struct Context {
    pub client: Client,
    pub namespace: String,
    pub settings: Settings,
    pub edge_server_names: Vec<String>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
}

impl Context {
    pub fn new(client: Client, config: &RunConfig, clock: Arc<dyn Clock>, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            namespace: config.namespace.clone(),
            settings: config.settings(),
            edge_server_names: config.edge_server_names.clone(),
            clock,
            metrics,
        }
    }
}

/// Errors of the I/O side. [`Error::label`] names are stable (logs, metrics).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    CaSecret(#[from] CaSecretError),
    #[error("certificate: {0}")]
    Cert(#[from] CertError),
    #[error(
        "Secret `iop-ca` is missing while `iop-edge-tls` exists: the operator makes a CA at the first install only. \
         Restore `iop-ca` or create it with your CA (every node then needs a new bundle; `iop-operator ca rotate` \
         replaces a CA without cutting nodes off), or delete `iop-edge-tls` too to let the operator make a new CA"
    )]
    CaMissing,
    #[error(
        "the IOP CustomResourceDefinitions are not established after {waited:?}: {missing}. \
         If they are not installed: kubectl apply -f crds/ (or `iop-operator crds | kubectl apply -f -`)"
    )]
    CrdsNotEstablished { waited: Duration, missing: String },
    #[error("a leader task ended unexpectedly: {0}")]
    TaskEnded(&'static str),
    #[error("cannot serve metrics and probes on {addr} (IOP_METRICS_ADDR): {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

impl Error {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Timeout(_) => "timeout",
            Self::Build(_) => "build",
            Self::CaSecret(_) => "ca_secret",
            Self::Cert(_) => "certificate",
            Self::CaMissing => "ca_missing",
            Self::CrdsNotEstablished { .. } => "crds_not_established",
            Self::TaskEnded(_) => "task_ended",
            Self::Listen { .. } => "listen",
        }
    }
}

/// An API error with this HTTP status.
pub(crate) fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// How long open `/metrics` requests may take to finish at shutdown.
const HTTP_DRAIN: Duration = Duration::from_secs(2);

/// Runs the operator until `shutdown` is cancelled. The metrics and probe
/// listener is bound first and serves until everything else has stopped.
pub async fn run(config: RunConfig, client: Client, shutdown: CancellationToken) -> Result<(), Error> {
    let metrics = Metrics::new();
    let readiness = Arc::new(Readiness::default());
    let addr = config.metrics_addr;
    let socket = listener::bind(addr).await.map_err(|source| Error::Listen { addr, source })?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    let stop_http = CancellationToken::new();
    let endpoints = Endpoints { metrics: metrics.clone(), readiness: readiness.clone() };
    let mut server = tokio::spawn(listener::serve(socket, endpoints, stop_http.clone()));

    let operating = operate(config, client, metrics, &readiness, shutdown.clone());
    tokio::pin!(operating);
    let result = tokio::select! {
        result = &mut operating => result,
        served = &mut server => {
            // The listener failed: stop the rest in order, then report it.
            shutdown.cancel();
            let _ = operating.await;
            Err(Error::Listen {
                addr,
                source: match served {
                    Ok(Err(e)) => e,
                    _ => std::io::Error::other("the listener stopped"),
                },
            })
        }
    };
    stop_http.cancel();
    if tokio::time::timeout(HTTP_DRAIN, &mut server).await.is_err() {
        server.abort();
    }
    result
}

async fn operate(
    config: RunConfig,
    client: Client,
    metrics: Arc<Metrics>,
    readiness: &Readiness,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        established = crds::wait_established(&client, crds::WaitConfig::default()) => established?,
    }
    tracing::info!(namespace = %config.namespace, "CRDs established");
    readiness.set_ready();

    let clock: Arc<dyn Clock> = match config.clock_offset_s {
        0 => Arc::new(SystemClock),
        offset => {
            tracing::warn!(offset_s = offset, "IOP_TEST_CLOCK_OFFSET_S: the clock is moved (tests only)");
            Arc::new(OffsetClock(time::Duration::seconds(offset)))
        }
    };
    let ctx = Arc::new(Context::new(client.clone(), &config, clock.clone(), metrics));
    let elector = leader::Elector::new(
        kube::Api::namespaced(client.clone(), &config.namespace),
        leader::LeaderConfig::new(&config.pod_name),
        clock,
    );
    let (leading_tx, mut leading) = watch::channel(false);
    let elector = tokio::spawn(leader::run(elector, leading_tx, shutdown.clone()));
    let mut led = false;
    let admin = admin::AdminClient::new();

    let mut result = Ok(());
    while !shutdown.is_cancelled() {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = leading.wait_for(|leading| *leading) => if changed.is_err() { break },
        }
        tracing::info!(identity = %config.pod_name, "leading: reconciling and mirroring status");
        led = true;
        ctx.metrics.set_leader(true);
        let term = shutdown.child_token();
        if let Some(name) = &config.cluster_rbac_name
            && let Err(e) = ownership::own_cluster_rbac(&client, &config.namespace, name).await
        {
            tracing::warn!(error = %e, name, "cannot make the namespace the owner of the operator's ClusterRole and ClusterRoleBinding; deleting the namespace will leave them");
        }
        let (stores, signals) = controller::watch(&client, &config.namespace, &config.edge_pod_selector);
        let reconcile_ctx = ctx.clone();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(controller::run(
            config.namespace.clone(),
            stores.clone(),
            signals,
            move |read| {
                let ctx = reconcile_ctx.clone();
                async move { namespace::reconcile_with_timeout(&ctx, read).await }
            },
            term.clone(),
        ));
        tasks.spawn(mirror::run(ctx.clone(), stores, admin.clone(), mirror::MirrorConfig::default(), term.clone()));
        match term_end(&shutdown, &mut leading, &mut tasks).await {
            TermEnd::Shutdown => release_if_terminating(&ctx).await,
            TermEnd::LostLeadership => tracing::warn!("lost leadership: stopping the leader tasks"),
            TermEnd::TaskEnded => {
                result = Err(Error::TaskEnded("controller or mirror"));
                shutdown.cancel();
            }
        }
        term.cancel();
        while tasks.join_next().await.is_some() {}
        ctx.metrics.set_leader(false);
    }
    // The leader tasks have stopped: release the Lease so a standby takes over at once.
    if let Ok(mut elector) = elector.await
        && led
    {
        match tokio::time::timeout(std::time::Duration::from_secs(2), elector.release()).await {
            Ok(Ok(())) => tracing::info!("released the leader Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the leader Lease failed"),
            Err(_) => tracing::warn!("releasing the leader Lease timed out"),
        }
    }
    result
}

/// How long a stopping leader spends releasing finalizers (the pod's grace
/// period is 30 s).
const RELEASE_AT_SHUTDOWN: Duration = Duration::from_secs(5);

/// At shutdown, as leader: when the namespace is being deleted (the
/// operator's pod goes first, before its NodeCatalogs), release every
/// NodeCatalog's finalizer now: no operator will be left to do it
/// ([`namespace::release_every_finalizer`]).
pub async fn release_if_terminating(ctx: &Context) {
    let release = async {
        if !ownership::terminating(&ctx.client, &ctx.namespace).await? {
            return Ok(());
        }
        // Read now (metadata only: an object that does not decode too).
        let api = kube::Api::namespaced(ctx.client.clone(), &ctx.namespace);
        let nodes = api.list_metadata(&Default::default()).await?;
        namespace::release_every_finalizer(&api, nodes.items.iter().map(|n| &n.metadata)).await
    };
    match tokio::time::timeout(RELEASE_AT_SHUTDOWN, release).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "releasing the finalizers of a terminating namespace failed"),
        Err(_) => tracing::warn!("releasing the finalizers of a terminating namespace timed out"),
    }
}

/// Why a leadership term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEnd {
    /// Shutdown was requested (SIGTERM): a clean stop.
    Shutdown,
    /// The elector stepped down.
    LostLeadership,
    /// The controller or the mirror returned on its own: a bug, the process fails.
    TaskEnded,
}

/// Waits for the end of a leadership term. A shutdown cancels the leader
/// tasks' token and the elector steps down, so at a shutdown all three
/// branches become ready together: shutdown is checked first (`biased`), and
/// a task end or lost leadership seen once shutdown was requested is part of
/// the clean stop, never "a leader task ended unexpectedly".
pub async fn term_end(
    shutdown: &CancellationToken,
    leading: &mut watch::Receiver<bool>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> TermEnd {
    let end = tokio::select! {
        biased;
        _ = shutdown.cancelled() => TermEnd::Shutdown,
        _ = tasks.join_next() => TermEnd::TaskEnded,
        _ = leading.wait_for(|leading| !*leading) => TermEnd::LostLeadership,
    };
    if shutdown.is_cancelled() { TermEnd::Shutdown } else { end }
}

#[cfg(test)]
mod tests;

//! Waiting for the IOP CRDs to be established before anything watches them.
//! Each definition is read by name (`GET .../customresourcedefinitions/NAME`):
//! the chart's ClusterRole grants `get` on exactly these three names, never a
//! list of every CRD in the cluster.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};
use tokio::time::Instant;

use super::{Error, is_status};
use crate::crd;

#[derive(Debug, Clone, Copy)]
pub struct WaitConfig {
    /// Between two reads of a definition that is not established yet.
    pub poll: Duration,
    /// Give up (with an install hint) after this long.
    pub deadline: Duration,
}

impl Default for WaitConfig {
    fn default() -> Self {
        Self { poll: Duration::from_secs(2), deadline: Duration::from_secs(120) }
    }
}

/// The definitions' names (`<plural>.<group>`), in a stable order.
pub fn names() -> Vec<String> {
    crd::all().into_iter().filter_map(|c| c.metadata.name).collect()
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
}

/// Returns once every IOP CRD is established; fails after `config.deadline`
/// naming the ones that are missing or not established. A forbidden read
/// fails at once (the RBAC is wrong; waiting will not fix it).
pub async fn wait_established(client: &Client, config: WaitConfig) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let started = Instant::now();
    let mut pending = names();
    loop {
        let mut still = Vec::new();
        for name in pending {
            match api.get_opt(&name).await {
                Ok(Some(crd)) if established(&crd) => {}
                Ok(Some(_)) => still.push((name, "not established".to_string())),
                Ok(None) => still.push((name, "not installed".to_string())),
                Err(e) if is_status(&e, 403) => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(crd = %name, error = %e, "reading the CRD failed; retrying");
                    still.push((name, format!("unreadable: {e}")));
                }
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        let missing = still.iter().map(|(name, why)| format!("{name} ({why})")).collect::<Vec<_>>().join(", ");
        let waited = started.elapsed();
        if waited >= config.deadline {
            return Err(Error::CrdsNotEstablished { waited, missing });
        }
        tracing::info!(%missing, "waiting for the IOP CRDs");
        tokio::time::sleep(config.poll).await;
        pending = still.into_iter().map(|(name, _)| name).collect();
    }
}

#[cfg(test)]
mod tests;

//! A namespace's bridge network: made once, recognised by its labels, never adopted
//! from someone else. A create can outlive the agent that sent it (SIGKILLed
//! mid-command, its request still in the engine), and the engine lets a second
//! network take the same name (dockerd's name check is best effort, and skipped
//! unless asked before API 1.44), so the next agent's `ensure_namespace` may find
//! two of its own under one name — which makes every later use of the name
//! ambiguous (400). Two of ours are made one again: the first by id is kept, the
//! others removed (nothing can be attached to them yet: a container is attached by
//! the name, which was ambiguous).

use crate::naming::{self, NAMESPACE};
use crate::{backend, gone_is_done, status, DockerDriver};
use bollard::models::{Network, NetworkCreateRequest};
use bollard::query_parameters::ListNetworksOptionsBuilder;
use capstan_common::ErrorCode;
use capstan_driver::DriverError;
use std::collections::HashMap;

impl DockerDriver {
    /// `ensure_namespace`: the namespace's network exists, is ours, and is one.
    pub(crate) async fn ensure_network(&self, namespace: &str) -> Result<(), DriverError> {
        let op = "ensure_namespace";
        let name = naming::network_name(namespace);
        let mut found = self.networks_named(op, namespace, &name).await?;
        if found.is_empty() {
            let request = NetworkCreateRequest {
                name: name.clone(),
                driver: Some("bridge".into()),
                labels: Some(naming::network_labels(&self.host, namespace)),
                ..Default::default()
            };
            match self.docker.create_network(request).await {
                Ok(_) => tracing::info!(network = %name, "network created"),
                // Made meanwhile (an engine that checks names): read below.
                Err(e) if status(&e) == Some(409) => {}
                Err(e) => return Err(backend(op, namespace)(e)),
            }
            found = self.networks_named(op, namespace, &name).await?;
        }
        // Read ownership back: a network of that name made by someone else (or by
        // another host's agent) is never adopted.
        if found.is_empty() || found.iter().any(|n| !owned(n, &self.host, namespace)) {
            return Err(DriverError::refused(
                op,
                namespace,
                ErrorCode::NotOwned,
                format!("network {name} exists and is not this host's capstan network"),
            ));
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        for extra in &found[1..] {
            let id = extra.id.as_deref().unwrap_or_default();
            tracing::warn!(network = %name, %id, "removing a second network of ours under the same name (a create that outlived its agent)");
            gone_is_done(op, namespace, self.docker.remove_network(id).await)?;
        }
        Ok(())
    }

    /// `delete_namespace`'s network: every network of ours under its name removed
    /// (one of someone else's there is refused, and nothing is removed).
    pub(crate) async fn delete_network(&self, namespace: &str) -> Result<(), DriverError> {
        let op = "delete_namespace";
        let name = naming::network_name(namespace);
        let found = self.networks_named(op, namespace, &name).await?;
        if found
            .iter()
            .any(|n| !naming::is_ours(n.labels.as_ref(), &self.host))
        {
            return Err(DriverError::refused(
                op,
                namespace,
                ErrorCode::NotOwned,
                format!("network {name} is not this host's capstan network"),
            ));
        }
        for network in &found {
            let id = network.id.as_deref().unwrap_or_default();
            gone_is_done(op, namespace, self.docker.remove_network(id).await)?;
        }
        Ok(())
    }

    /// Every network named exactly `name` (the engine's `name` filter also matches
    /// longer names).
    async fn networks_named(
        &self,
        op: &'static str,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Network>, DriverError> {
        let filters = HashMap::from([("name".to_string(), vec![name.to_string()])]);
        let options = ListNetworksOptionsBuilder::new().filters(&filters).build();
        let listed = self
            .docker
            .list_networks(Some(options))
            .await
            .map_err(backend(op, namespace))?;
        Ok(listed
            .into_iter()
            .filter(|n| n.name.as_deref() == Some(name))
            .collect())
    }
}

/// Whether `network` is this host's network for `namespace`.
fn owned(network: &Network, host: &str, namespace: &str) -> bool {
    let labels = network.labels.as_ref();
    naming::is_ours(labels, host)
        && labels.and_then(|l| l.get(NAMESPACE)).map(String::as_str) == Some(namespace)
}

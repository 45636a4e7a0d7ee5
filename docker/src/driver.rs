//! The [`DockerDriver`]: the [`Driver`] over the Docker Engine API.

use crate::engine::Engine;
use crate::naming::{self, NAMESPACE, REVISION, WORKLOAD};
use crate::{check_spec, DockerConfig};
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{EventsOptionsBuilder, ListNetworksOptionsBuilder};
use bollard::Docker;
use capstan_common::{DriverKind, ErrorCode, Spec};
use capstan_driver::{
    merged_env, BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed,
    RevisionRef,
};
use futures::StreamExt;

pub struct DockerDriver {
    pub(crate) docker: Docker,
    /// The reads bollard's typed models are too strict for (see [`engine`]).
    pub(crate) engine: Engine,
    pub(crate) host: String,
    pub(crate) config: DockerConfig,
    /// Where the exit feed (re)starts, in unix nanoseconds: first the moment the
    /// driver connected, then just after the last event seen. The engine replays
    /// events since then, so an exit during startup reconciliation or between two
    /// subscriptions is not lost (within the engine's event buffer).
    pub(crate) exits_since: std::sync::Mutex<i64>,
}

/// The HTTP status of an engine answer, if it was one.
pub(crate) fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

pub(crate) fn backend<E: std::error::Error + Send + Sync + 'static>(
    op: &'static str,
    target: impl ToString,
) -> impl FnOnce(E) -> DriverError {
    move |e| DriverError::Backend {
        op,
        target: target.to_string(),
        source: Box::new(e),
    }
}

/// The result of a stop or removal, where "no such object" means it is done.
pub(crate) fn gone_is_done(
    op: &'static str,
    target: impl ToString,
    result: Result<(), DockerError>,
) -> Result<(), DriverError> {
    match result {
        Err(e) if status(&e) != Some(404) => Err(backend(op, target)(e)),
        _ => Ok(()),
    }
}

impl DockerDriver {
    /// Connects to the engine at `config.socket` and negotiates the API version.
    pub async fn connect(host: &str, config: DockerConfig) -> Result<DockerDriver, DriverError> {
        let op = "connect";
        let Some(path) = config.socket.strip_prefix("unix://") else {
            return Err(DriverError::refused(
                op,
                &config.socket,
                ErrorCode::DriverFailed,
                "`docker.socket` must be unix:///path",
            ));
        };
        let docker = Docker::connect_with_unix(path, 120, bollard::API_DEFAULT_VERSION)
            .map_err(backend(op, &config.socket))?
            .negotiate_version()
            .await
            .map_err(backend(op, &config.socket))?;
        let engine = Engine::new(path, &docker.client_version());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        Ok(DockerDriver {
            docker,
            engine,
            host: host.to_string(),
            config,
            exits_since: std::sync::Mutex::new(now),
        })
    }
}

#[async_trait::async_trait]
impl Driver for DockerDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::DOCKER
    }

    fn check_spec(&self, spec: &Spec) -> Result<(), capstan_common::Rejection> {
        check_spec(spec)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: true,
            reports_exits: true,
            restarts_exits: true,
            reaps_orphans: self.config.reap_orphans,
            probes: true,
        }
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        self.ensure_network(namespace).await
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let op = "delete_namespace";
        let left = self
            .containers(op, namespace, &[(NAMESPACE, namespace)])
            .await?;
        if !left.is_empty() {
            return Err(DriverError::refused(
                op,
                namespace,
                ErrorCode::NamespaceNotEmpty,
                format!("{} container(s) of ours are still in it", left.len()),
            ));
        }
        self.delete_network(namespace).await
    }

    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        let op = "prepare";
        if spec.image.is_none() {
            return Err(DriverError::refused(
                op,
                rev,
                ErrorCode::InvalidSpec,
                "the docker driver needs `image`",
            ));
        }
        if let Some(existing) = self.find(op, rev).await? {
            if existing.label(naming::SPEC_HASH) == Some(naming::spec_hash(spec).as_str()) {
                return Ok(());
            }
            // A leftover from an earlier life of this host with another spec: the
            // log is the truth, so replace it.
            tracing::warn!(revision = %rev, "replacing a container made from another spec");
            self.remove(op, rev, &existing.id).await?;
        }
        self.create(op, rev, spec, &merged_env(spec, &LaunchEnv::new()))
            .await?;
        Ok(())
    }

    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        _previous: Option<&str>,
    ) -> Result<(), DriverError> {
        let op = "activate";
        // One list of the workload's containers: this revision's, and every other
        // one, to stop — not only `previous`: after a crash mid-activation more than
        // one may run. Taken before the start; the states it shows do not matter.
        let (mine, others): (Vec<_>, Vec<_>) = self
            .containers(
                op,
                &rev.to_string(),
                &[(NAMESPACE, rev.namespace), (WORKLOAD, rev.workload)],
            )
            .await?
            .into_iter()
            .partition(|c| c.label(REVISION) == Some(rev.revision));
        self.start_rev(op, rev, spec, launch_env, mine.into_iter().next())
            .await?;
        // Every one, whatever the list says its state is (stopping a stopped
        // container is a no-op answer, 304), all at once.
        futures::future::try_join_all(others.iter().map(|c| async move {
            self.stop_id(op, &rev.to_string(), &c.id).await?;
            tracing::info!(
                revision = c.label(REVISION).unwrap_or("?"),
                "other revision stopped"
            );
            Ok::<_, DriverError>(())
        }))
        .await?;
        Ok(())
    }

    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let existing = self.find("start", rev).await?;
        self.start_rev("start", rev, spec, launch_env, existing)
            .await
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = "start";
        let existing = self
            .find(op, rev)
            .await?
            .ok_or_else(|| DriverError::Missing {
                op,
                target: rev.to_string(),
            })?;
        // The container keeps the env it was created with: never recreated here.
        self.start_id(op, rev, &existing.id).await
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = "stop";
        match self.find(op, rev).await? {
            Some(c) => self.stop_id(op, &rev.to_string(), &c.id).await,
            None => Ok(()),
        }
    }

    async fn state(&self, rev: RevisionRef<'_>) -> Result<Option<BackendState>, DriverError> {
        match self.find("state", rev).await? {
            Some(c) => self.inspect_state("state", &c.id).await,
            None => Ok(None),
        }
    }

    async fn probe(
        &self,
        rev: RevisionRef<'_>,
        check: &capstan_common::Check,
        timeout: std::time::Duration,
    ) -> Result<capstan_driver::Probe, DriverError> {
        self.probe_container(rev, check, timeout).await
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let op = "retire";
        match self.find(op, rev).await? {
            Some(c) => {
                self.remove(op, rev, &c.id).await?;
                tracing::info!(revision = %rev, "container removed");
                Ok(())
            }
            None => Ok(()),
        }
    }

    async fn observe(&self) -> Result<Observed, DriverError> {
        let op = "observe";
        let mut observed = Observed::default();
        let options = ListNetworksOptionsBuilder::new()
            .filters(&naming::label_filter(&self.host, &[]))
            .build();
        for n in self
            .docker
            .list_networks(Some(options))
            .await
            .map_err(backend(op, &self.host))?
        {
            // Checked again, as for containers (see `containers`).
            if !naming::is_ours(n.labels.as_ref(), &self.host) {
                continue;
            }
            if let Some(ns) = n.labels.as_ref().and_then(|l| l.get(NAMESPACE)) {
                observed.namespaces.insert(ns.clone());
            }
        }
        // The list gives labels; each state is read with inspect, because the list's
        // view of state can lag behind the engine (seen: "running" for several
        // hundred ms after the `die` event under load).
        let states: Vec<_> = futures::stream::iter(self.containers(op, &self.host, &[]).await?)
            .map(|c| async move {
                let state = self.inspect_state(op, &c.id).await;
                (c, state)
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for (c, state) in states {
            let (Some(ns), Some(wl), Some(r)) =
                (c.label(NAMESPACE), c.label(WORKLOAD), c.label(REVISION))
            else {
                continue;
            };
            let Some(state) = state? else {
                continue; // removed since the list
            };
            observed
                .workloads
                .entry(capstan_common::workload_key(ns, wl))
                .or_default()
                .insert(r.to_string(), state);
        }
        Ok(observed)
    }

    async fn watch_exits(&self, exits: tokio::sync::mpsc::Sender<Exit>) -> Result<(), DriverError> {
        // No `event` filter: podman 4.3 matches `event=die` to nothing (its own word is
        // `died`, though it reports the event as `die`). And podman reads several
        // `label` filters as "any of": the action and the host are checked below.
        let mut filters = naming::label_filter(&self.host, &[]);
        filters.insert("type".into(), vec!["container".into()]);
        let since = *self.exits_since.lock().expect("exits_since");
        let since = format!(
            "{}.{:09}",
            since.div_euclid(1_000_000_000),
            since.rem_euclid(1_000_000_000)
        );
        let options = EventsOptionsBuilder::new()
            .since(&since)
            .filters(&filters)
            .build();
        let mut events = self.docker.events(Some(options));
        while let Some(event) = events.next().await {
            let event = event.map_err(backend("watch_exits", &self.host))?;
            if let Some(t) = event.time_nano {
                let mut since = self.exits_since.lock().expect("exits_since");
                if t < *since {
                    continue; // already reported before a resubscription
                }
                *since = t + 1;
            }
            if event.action.as_deref() != Some("die") {
                continue;
            }
            let attrs = event.actor.and_then(|a| a.attributes).unwrap_or_default();
            if !naming::is_ours(Some(&attrs), &self.host) {
                continue; // another host's container (see the filter above)
            }
            let (Some(ns), Some(wl), Some(r)) = (
                attrs.get(NAMESPACE),
                attrs.get(WORKLOAD),
                attrs.get(REVISION),
            ) else {
                continue;
            };
            let exit = Exit {
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: r.clone(),
                exit_code: attrs.get("exitCode").and_then(|c| c.parse().ok()),
            };
            if exits.send(exit).await.is_err() {
                return Ok(());
            }
        }
        Err(DriverError::refused(
            "watch_exits",
            &self.host,
            ErrorCode::DriverFailed,
            "the engine closed the event stream",
        ))
    }
}

//! The docker driver: workloads as containers, through the Docker Engine API
//! (bollard). A namespace is a bridge network `capstan-<ns>`; a revision is one
//! container, created by `prepare` and started by `activate`/`start`. Everything is
//! found again by its labels (see [`naming`]), never by name alone, and only objects
//! labelled with this agent's host are ever changed. What engines answer differently
//! (podman's Docker-compatible API) is read raw, in [`engine`].

pub mod engine;
pub mod naming;
mod network;
mod probe;

use bollard::errors::Error as DockerError;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, EventsOptionsBuilder,
    ListNetworksOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use capstan_common::{DriverKind, ErrorCode, Spec};
use capstan_driver::{
    merged_env, BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed,
    RevisionRef,
};
use engine::{Engine, Listed};
use futures::StreamExt;
use naming::{NAMESPACE, REVISION, WORKLOAD};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The standard docker socket.
pub const DEFAULT_SOCKET: &str = "unix:///var/run/docker.sock";

/// Docker driver settings (`[docker]` in the agent config).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerConfig {
    /// The engine's socket, `unix:///path`.
    #[serde(default = "default_socket")]
    pub socket: String,
    #[serde(default)]
    pub pull_policy: PullPolicy,
    /// Remove containers labelled as this host's that intent does not know (drift).
    /// Off by default: drift is only reported.
    #[serde(default)]
    pub reap_orphans: bool,
    /// Seconds a container gets between SIGTERM and SIGKILL when stopped.
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_secs: u32,
}

fn default_socket() -> String {
    DEFAULT_SOCKET.into()
}

fn default_stop_timeout() -> u32 {
    10
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            socket: default_socket(),
            pull_policy: PullPolicy::default(),
            reap_orphans: false,
            stop_timeout_secs: default_stop_timeout(),
        }
    }
}

/// Whether `prepare_revision` may pull a missing image.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullPolicy {
    /// The image must already be on the host (`image_not_found` otherwise).
    Never,
    /// Pull it when it is not on the host.
    #[default]
    IfNotPresent,
}

/// The docker driver.
pub struct DockerDriver {
    docker: Docker,
    /// The reads bollard's typed models are too strict for (see [`engine`]).
    engine: Engine,
    host: String,
    config: DockerConfig,
    /// Where the exit feed (re)starts, in unix nanoseconds: first the moment the
    /// driver connected, then just after the last event seen. The engine replays
    /// events since then, so an exit during startup reconciliation or between two
    /// subscriptions is not lost (within the engine's event buffer).
    exits_since: std::sync::Mutex<i64>,
}

/// The HTTP status of an engine answer, if it was one.
fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn backend<E: std::error::Error + Send + Sync + 'static>(
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
fn gone_is_done(
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

    /// This host's containers carrying every extra label given (stopped ones too).
    async fn containers(
        &self,
        op: &'static str,
        target: &str,
        extra: &[(&str, &str)],
    ) -> Result<Vec<Listed>, DriverError> {
        let filter = naming::label_filter(&self.host, extra);
        let listed = self
            .engine
            .containers(&filter)
            .await
            .map_err(backend(op, target))?;
        // The engine filtered; checked again here, so that an engine reading several
        // label filters as "any of" (podman 4.3 does for events; its lists combine
        // them, but nothing says they must) cannot hand us another host's or another
        // revision's container.
        Ok(listed
            .into_iter()
            .filter(|c| naming::matches(c.labels.as_ref(), &self.host, extra))
            .collect())
    }

    /// The container of exactly this revision, if there is one.
    async fn find(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<Option<Listed>, DriverError> {
        let found = self
            .containers(
                op,
                &rev.to_string(),
                &[
                    (NAMESPACE, rev.namespace),
                    (WORKLOAD, rev.workload),
                    (REVISION, rev.revision),
                ],
            )
            .await?;
        Ok(found.into_iter().next())
    }

    /// Makes sure `image` is on the host, pulling it if the policy allows.
    async fn ensure_image(&self, op: &'static str, image: &str) -> Result<(), DriverError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(backend(op, image)(e)),
        }
        if self.config.pull_policy == PullPolicy::Never {
            return Err(DriverError::refused(
                op,
                image,
                ErrorCode::ImageNotFound,
                "the image is not on the host and pull_policy is never",
            ));
        }
        tracing::info!(image, "pulling image");
        let options = CreateImageOptionsBuilder::new().from_image(image).build();
        let mut pull = self.docker.create_image(Some(options), None, None);
        while let Some(progress) = pull.next().await {
            if let Err(e) = progress {
                tracing::warn!(image, error = %e, "image pull failed");
                return Err(DriverError::refused(
                    op,
                    image,
                    ErrorCode::ImageNotFound,
                    "the image is not on the host and could not be pulled",
                ));
            }
        }
        Ok(())
    }

    /// Creates the revision's container (not started) with `env`, under its readable
    /// name, or its hashed name when another triple holds the readable one.
    async fn create(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        env: &BTreeMap<String, String>,
    ) -> Result<String, DriverError> {
        if let Some(name) = naming::bad_env(env) {
            let shown: String = name.chars().take(64).collect();
            return Err(DriverError::refused(
                op,
                rev,
                ErrorCode::InvalidEnv,
                format!("env entry {shown:?} cannot be written into a container"),
            ));
        }
        let body = naming::container_body(&self.host, rev, spec, env);
        let mut last = None;
        let mut image_checked = false;
        for name in [naming::container_name(rev), naming::hashed_name(rev)] {
            let options = CreateContainerOptionsBuilder::new().name(&name).build();
            let mut created = self
                .docker
                .create_container(Some(options.clone()), body.clone())
                .await;
            // The image is looked at only when the engine cannot find something (404:
            // the image, or the network): as `docker run` does, not once per create.
            if matches!(&created, Err(e) if status(e) == Some(404)) && !image_checked {
                image_checked = true;
                if let Some(image) = spec.image.as_deref() {
                    self.ensure_image(op, image).await?;
                }
                created = self
                    .docker
                    .create_container(Some(options), body.clone())
                    .await;
            }
            match created {
                Ok(created) => {
                    tracing::info!(container = %name, revision = %rev, "container created");
                    return Ok(created.id);
                }
                // A name in use is 409 from dockerd and 500 from podman 4.3: rather
                // than trusting either code, the name is looked up.
                Err(e) if status(&e) == Some(409) || self.name_taken(&name).await => {
                    last = Some(e);
                }
                Err(e) => return Err(backend(op, rev)(e)),
            }
        }
        Err(backend(op, rev)(last.expect("a name was tried")))
    }

    /// Whether a container named `name` exists (a failed lookup says no: the error
    /// that asked is then reported as it is).
    async fn name_taken(&self, name: &str) -> bool {
        matches!(self.engine.state(name).await, Ok(Some(_)))
    }

    /// The id of the revision's container, created with `spec` and `launch_env`. An
    /// existing container made with a different environment is replaced: container
    /// env cannot change after creation, and the launch environment must be the one
    /// projected at this start.
    /// `existing` is the revision's container as listed (`None`: there is none).
    async fn ready_container(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        existing: Option<Listed>,
    ) -> Result<String, DriverError> {
        let existing = existing.ok_or_else(|| DriverError::Missing {
            op,
            target: rev.to_string(),
        })?;
        let id = existing.id.clone();
        let env = merged_env(spec, launch_env);
        if existing.label(naming::ENV_HASH) == Some(naming::env_hash(&env).as_str()) {
            return Ok(id);
        }
        tracing::info!(revision = %rev, "environment changed: recreating the container");
        self.remove(op, rev, &id).await?;
        self.create(op, rev, spec, &env).await
    }

    /// Starts container `id` (a running one: a no-op answer, 304). Podman refuses to
    /// start a container while a stop is under way (state `stopping`: e.g. the stop
    /// of an agent killed mid-activation, which the engine carries on with): that
    /// stop is waited for (a second stop returns when the container has stopped),
    /// then the container is started.
    async fn start_id(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        id: &str,
    ) -> Result<(), DriverError> {
        let start = || {
            self.docker
                .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
        };
        let missing = || DriverError::Missing {
            op,
            target: rev.to_string(),
        };
        match start().await {
            Ok(()) => return Ok(()),
            Err(e) if status(&e) == Some(404) => return Err(missing()),
            Err(e) => match self.engine.state(id).await {
                Ok(Some(state)) if engine::is_stopping(&state) => {
                    tracing::info!(revision = %rev, "waiting for a stop under way before starting");
                }
                _ => return Err(backend(op, rev)(e)),
            },
        }
        self.stop_id(op, &rev.to_string(), id).await?;
        match start().await {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(404) => Err(missing()),
            Err(e) => Err(backend(op, rev)(e)),
        }
    }

    async fn stop_id(&self, op: &'static str, target: &str, id: &str) -> Result<(), DriverError> {
        let t = i32::try_from(self.config.stop_timeout_secs).unwrap_or(i32::MAX);
        let options = StopContainerOptionsBuilder::new().t(t).build();
        gone_is_done(
            op,
            target,
            self.docker.stop_container(id, Some(options)).await,
        )
    }

    async fn remove(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        id: &str,
    ) -> Result<(), DriverError> {
        let options = RemoveContainerOptionsBuilder::new().force(true).build();
        gone_is_done(
            op,
            rev,
            self.docker.remove_container(id, Some(options)).await,
        )
    }

    /// A container's state as the engine holds it now (`None`: it is gone).
    async fn inspect_state(
        &self,
        op: &'static str,
        id: &str,
    ) -> Result<Option<BackendState>, DriverError> {
        let state = self.engine.state(id).await.map_err(backend(op, id))?;
        Ok(state.as_ref().map(engine::backend_state))
    }

    /// Starts `rev` (recreating it if its env changed). Starting a running container
    /// is a no-op answer from the engine (304), so no state is read first: the list
    /// view of container state can lag behind the engine by a moment.
    async fn start_rev(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        existing: Option<Listed>,
    ) -> Result<(), DriverError> {
        let id = self
            .ready_container(op, rev, spec, launch_env, existing)
            .await?;
        self.start_id(op, rev, &id).await?;
        tracing::info!(revision = %rev, container = %id, "container started (or already running)");
        Ok(())
    }
}

#[async_trait::async_trait]
impl Driver for DockerDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Docker
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: true,
            reports_exits: true,
            restarts_exits: true,
            reaps_orphans: self.config.reap_orphans,
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

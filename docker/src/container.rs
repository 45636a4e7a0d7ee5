//! A revision's container on the engine: found by its labels, created (pulling its
//! image if the policy allows), recreated when its environment changed, started,
//! stopped, removed and inspected.

use crate::engine::{self, Listed};
use crate::naming::{self, NAMESPACE, REVISION, WORKLOAD};
use crate::{backend, gone_is_done, status, DockerDriver, PullPolicy};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use capstan_common::{ErrorCode, Spec};
use capstan_driver::{merged_env, BackendState, DriverError, LaunchEnv, RevisionRef};
use futures::StreamExt;
use std::collections::BTreeMap;

impl DockerDriver {
    /// This host's containers carrying every extra label given (stopped ones too).
    pub(crate) async fn containers(
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
    pub(crate) async fn find(
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
    pub(crate) async fn create(
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
    pub(crate) async fn start_id(
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

    pub(crate) async fn stop_id(
        &self,
        op: &'static str,
        target: &str,
        id: &str,
    ) -> Result<(), DriverError> {
        let t = i32::try_from(self.config.stop_timeout_secs).unwrap_or(i32::MAX);
        let options = StopContainerOptionsBuilder::new().t(t).build();
        gone_is_done(
            op,
            target,
            self.docker.stop_container(id, Some(options)).await,
        )
    }

    pub(crate) async fn remove(
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
    pub(crate) async fn inspect_state(
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
    pub(crate) async fn start_rev(
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

//! [`Measured`]: the configured driver behind the same [`Driver`] trait, timing every
//! operation into [`Metrics`]: its op, its result (`ok` or the error's code) and how
//! long it took. The executor does not know it is there.

use super::{DriverOp, Metrics};
use capstan_common::{DriverKind, Spec};
use capstan_driver::{
    BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed, RevisionRef,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

/// A driver whose operations are timed.
pub struct Measured {
    inner: Arc<dyn Driver>,
    metrics: Arc<Metrics>,
}

impl Measured {
    pub fn wrap(inner: Arc<dyn Driver>, metrics: Arc<Metrics>) -> Arc<dyn Driver> {
        Arc::new(Measured { inner, metrics })
    }

    /// Runs `op`, recording it whether it succeeds or fails. A call dropped before it
    /// ends (cancellation) is not recorded: it has no result.
    async fn timed<T>(
        &self,
        op: DriverOp,
        call: impl Future<Output = Result<T, DriverError>>,
    ) -> Result<T, DriverError> {
        let began = Instant::now();
        let result = call.await;
        let code = result.as_ref().err().map(DriverError::code);
        self.metrics.driver_op(op, code, began.elapsed());
        result
    }
}

#[async_trait::async_trait]
impl Driver for Measured {
    fn kind(&self) -> DriverKind {
        self.inner.kind()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let call = self.inner.ensure_namespace(namespace);
        self.timed(DriverOp::EnsureNamespace, call).await
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let call = self.inner.delete_namespace(namespace);
        self.timed(DriverOp::DeleteNamespace, call).await
    }

    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        let call = self.inner.prepare(rev, spec);
        self.timed(DriverOp::Prepare, call).await
    }

    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        previous: Option<&str>,
    ) -> Result<(), DriverError> {
        let call = self.inner.activate(rev, spec, launch_env, previous);
        self.timed(DriverOp::Activate, call).await
    }

    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let call = self.inner.start(rev, spec, launch_env);
        self.timed(DriverOp::Start, call).await
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.timed(DriverOp::Resume, self.inner.resume(rev)).await
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.timed(DriverOp::Stop, self.inner.stop(rev)).await
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.timed(DriverOp::Retire, self.inner.retire(rev)).await
    }

    async fn observe(&self) -> Result<Observed, DriverError> {
        self.timed(DriverOp::Observe, self.inner.observe()).await
    }

    async fn state(&self, rev: RevisionRef<'_>) -> Result<Option<BackendState>, DriverError> {
        self.timed(DriverOp::State, self.inner.state(rev)).await
    }

    /// Not timed: it runs for the agent's life.
    async fn watch_exits(&self, exits: tokio::sync::mpsc::Sender<Exit>) -> Result<(), DriverError> {
        self.inner.watch_exits(exits).await
    }
}

//! Decorators: a driver wrapped so that something happens around each of its
//! operations (timing it, holding it), behind the same [`Driver`] trait. A decorator
//! implements [`Around`] once; [`Wrapped`] does the forwarding of every operation.

use crate::{
    BackendState, Capabilities, Driver, DriverError, Exit, Failure, LaunchEnv, Observed, Probe,
    RevisionRef,
};
use capstan_common::{Check, DriverKind, Spec};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// One of a driver's operations (all but the exit feed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    EnsureNamespace,
    DeleteNamespace,
    Prepare,
    Activate,
    Start,
    Resume,
    Settle,
    Stop,
    Retire,
    Observe,
    State,
    Probe,
}

impl Operation {
    /// Its name, as the trait method's (`ensure_namespace`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::EnsureNamespace => "ensure_namespace",
            Operation::DeleteNamespace => "delete_namespace",
            Operation::Prepare => "prepare",
            Operation::Activate => "activate",
            Operation::Start => "start",
            Operation::Resume => "resume",
            Operation::Settle => "settle",
            Operation::Stop => "stop",
            Operation::Retire => "retire",
            Operation::Observe => "observe",
            Operation::State => "state",
            Operation::Probe => "probe",
        }
    }
}

/// A driver operation's future, not yet started.
pub type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, DriverError>> + Send + 'a>>;

/// What a decorator does around the operations of the driver it wraps.
pub trait Around: Send + Sync {
    /// Runs `call`, the wrapped driver's `op`.
    fn around<'a, T: Send + 'a>(&'a self, op: Operation, call: Call<'a, T>) -> Call<'a, T>;

    /// The exit feed: by default the wrapped driver's own, untouched.
    fn watch_exits<'a>(
        &'a self,
        inner: &'a dyn Driver,
        exits: tokio::sync::mpsc::Sender<Exit>,
    ) -> Call<'a, ()> {
        inner.watch_exits(exits)
    }

    /// The failure feed: by default the wrapped driver's own, untouched.
    fn watch_failures<'a>(
        &'a self,
        inner: &'a dyn Driver,
        failures: tokio::sync::mpsc::Sender<Failure>,
    ) -> Call<'a, ()> {
        inner.watch_failures(failures)
    }
}

/// `inner` with `around` around each of its operations; its kind and capabilities are
/// `inner`'s.
pub struct Wrapped<A> {
    inner: Arc<dyn Driver>,
    around: A,
}

impl<A: Around> Wrapped<A> {
    pub fn new(inner: Arc<dyn Driver>, around: A) -> Wrapped<A> {
        Wrapped { inner, around }
    }
}

#[async_trait::async_trait]
impl<A: Around> Driver for Wrapped<A> {
    fn kind(&self) -> DriverKind {
        self.inner.kind()
    }

    fn check_spec(&self, spec: &Spec) -> Result<(), capstan_common::Rejection> {
        self.inner.check_spec(spec)
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let call = self.inner.ensure_namespace(namespace);
        self.around.around(Operation::EnsureNamespace, call).await
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        let call = self.inner.delete_namespace(namespace);
        self.around.around(Operation::DeleteNamespace, call).await
    }

    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        let call = self.inner.prepare(rev, spec);
        self.around.around(Operation::Prepare, call).await
    }

    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        previous: Option<&str>,
    ) -> Result<(), DriverError> {
        let call = self.inner.activate(rev, spec, launch_env, previous);
        self.around.around(Operation::Activate, call).await
    }

    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let call = self.inner.start(rev, spec, launch_env);
        self.around.around(Operation::Start, call).await
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.around
            .around(Operation::Resume, self.inner.resume(rev))
            .await
    }

    async fn settle(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.around
            .around(Operation::Settle, self.inner.settle(rev))
            .await
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.around
            .around(Operation::Stop, self.inner.stop(rev))
            .await
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.around
            .around(Operation::Retire, self.inner.retire(rev))
            .await
    }

    async fn observe(&self) -> Result<Observed, DriverError> {
        self.around
            .around(Operation::Observe, self.inner.observe())
            .await
    }

    async fn state(&self, rev: RevisionRef<'_>) -> Result<Option<BackendState>, DriverError> {
        self.around
            .around(Operation::State, self.inner.state(rev))
            .await
    }

    async fn probe(
        &self,
        rev: RevisionRef<'_>,
        check: &Check,
        timeout: Duration,
    ) -> Result<Probe, DriverError> {
        let call = self.inner.probe(rev, check, timeout);
        self.around.around(Operation::Probe, call).await
    }

    async fn watch_exits(&self, exits: tokio::sync::mpsc::Sender<Exit>) -> Result<(), DriverError> {
        self.around.watch_exits(self.inner.as_ref(), exits).await
    }

    async fn watch_failures(
        &self,
        failures: tokio::sync::mpsc::Sender<Failure>,
    ) -> Result<(), DriverError> {
        self.around
            .watch_failures(self.inner.as_ref(), failures)
            .await
    }
}

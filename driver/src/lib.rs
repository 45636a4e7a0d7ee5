//! Drivers carry decisions out on the host. One narrow trait; each driver is one file
//! or one small folder behind it, and the [`sim`] driver sits beside the real ones as
//! their equal. Every operation is idempotent: the executor may repeat any of them
//! after a crash, and a repeat must converge, never duplicate.

pub mod decorate;
pub mod probe;
pub mod sim;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use probe::Probe;

use capstan_common::{Check, DriverKind, ErrorCode, Rejection, Spec};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The launch environment accepted from the `before_workload_start` hooks: a detached,
/// validated copy of opaque placeholders, projected into the workload's environment.
pub type LaunchEnv = BTreeMap<String, String>;

/// A workload's environment: its spec env overlaid with the launch env (the launch
/// env wins on a shared name).
pub fn merged_env(spec: &Spec, launch_env: &LaunchEnv) -> BTreeMap<String, String> {
    let mut env = spec.env.clone();
    env.extend(launch_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// The first 12 hex digits of the SHA-256 of `bytes`: the short hashes drivers put
/// into names and labels.
pub fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    capstan_common::signing::to_hex(&sha2::Sha256::digest(bytes)[..6])
}

/// The hash of a revision's spec (of its canonical JSON) that drivers record on what
/// they create, to tell a reused object from a leftover.
pub fn spec_hash(spec: &Spec) -> String {
    short_hash(
        serde_json::to_string(spec)
            .expect("a Spec always serialises")
            .as_bytes(),
    )
}

/// The address of one revision on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevisionRef<'a> {
    pub namespace: &'a str,
    pub workload: &'a str,
    pub revision: &'a str,
}

impl std::fmt::Display for RevisionRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.namespace, self.workload, self.revision)
    }
}

/// What a driver declares about itself. Behaviour follows these flags, never the
/// driver's name. Published in the host registry (`capabilities`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    /// The agent owns its workloads' lifecycle: it stops them on a graceful shutdown
    /// and starts them again on startup. False when something else (systemd, the
    /// cluster) keeps them running without the agent.
    pub manages_lifecycle: bool,
    /// The driver reports exits through [`Driver::watch_exits`]; each is recorded as
    /// `workload_exited`.
    pub reports_exits: bool,
    /// The agent restarts a running-intent workload that exited (capped backoff).
    /// False when the backend restarts its own (systemd's `Restart=`, a Deployment):
    /// the agent then only records what happened.
    pub restarts_exits: bool,
    /// Drift found at startup (objects labelled ours that intent does not know) is
    /// removed, not only reported.
    pub reaps_orphans: bool,
    /// The driver carries out a spec's readiness check ([`Driver::probe`]); without
    /// it a spec with `readiness` is refused at `prepare_revision` (`invalid_spec`).
    pub probes: bool,
}

/// The runtime state of one revision as the backend reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendState {
    /// Exists but is not running (created, stopped or exited).
    Stopped,
    Running,
    /// The backend has given up on it and will not start it again by itself
    /// (systemd's `failed` with `start-limit-hit`, a pod in a crash loop): the agent
    /// reports it instead of starting it. `reason` is the backend's own word for it.
    Failed {
        reason: String,
    },
}

impl BackendState {
    pub fn is_running(&self) -> bool {
        matches!(self, BackendState::Running)
    }
}

/// What the driver sees on the host: only what it labelled as capstan's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub namespaces: BTreeSet<String>,
    /// `namespace/workload` → revision → state.
    pub workloads: BTreeMap<String, BTreeMap<String, BackendState>>,
    /// Revisions of ours changed outside capstan (a Deployment scaled by hand):
    /// `namespace/workload` → revision → what changed. Reported as drift, never
    /// undone. Not carried by the external driver protocol.
    pub changed: BTreeMap<String, BTreeMap<String, String>>,
}

impl Observed {
    pub fn revision(
        &self,
        namespace: &str,
        workload: &str,
        revision: &str,
    ) -> Option<&BackendState> {
        self.workloads
            .get(&capstan_common::workload_key(namespace, workload))?
            .get(revision)
    }
}

/// A workload's process ended (on its own, or because it was stopped), as the
/// backend reported it. The supervisor decides what, if anything, to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub namespace: String,
    pub workload: String,
    pub revision: String,
    /// The exit status, when the backend knows it.
    pub exit_code: Option<i64>,
}

impl Exit {
    /// The revision that exited.
    pub fn rev(&self) -> RevisionRef<'_> {
        RevisionRef {
            namespace: &self.namespace,
            workload: &self.workload,
            revision: &self.revision,
        }
    }
}

/// A revision the backend reports failed while nothing exited: a rollout the cluster
/// gave up on (`ProgressDeadlineExceeded`), a pod whose image cannot be pulled or that
/// crash-loops. The supervisor records it (`workload_failed` with `code`) when intent
/// wants exactly this revision running; the backend, not the agent, retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub namespace: String,
    pub workload: String,
    pub revision: String,
    /// A stable code: `backend_failed`, `image_not_found`.
    pub code: ErrorCode,
    /// The backend's own words (the object and its reason).
    pub reason: String,
}

impl Failure {
    /// The revision that failed.
    pub fn rev(&self) -> RevisionRef<'_> {
        RevisionRef {
            namespace: &self.namespace,
            workload: &self.workload,
            revision: &self.revision,
        }
    }
}

/// A driver operation that did not happen. The message names the operation and the
/// object; the cause, if any, is the `source`.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The revision's runtime (container, unit, pod) does not exist.
    #[error("{op} {target}: the backend is missing")]
    Missing { op: &'static str, target: String },
    /// A failure scripted into the sim driver.
    #[error("{op} {target}: scripted failure")]
    Scripted { op: &'static str, target: String },
    /// The driver refused: what was asked cannot be done as things are (an image
    /// that is not there, a namespace still in use, an object that is not ours).
    #[error("{op} {target}: {reason}")]
    Refused {
        op: &'static str,
        target: String,
        code: ErrorCode,
        reason: String,
    },
    /// The driver could not be reached, or went away while the operation was in
    /// flight (an external driver's process): retryable, the caller reconnects.
    #[error("{op} {target}: the driver is unavailable")]
    Unavailable {
        op: &'static str,
        target: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The backend refused or failed.
    #[error("{op} {target} failed")]
    Backend {
        op: &'static str,
        target: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl DriverError {
    /// [`DriverError::Refused`], for drivers' refusals.
    pub fn refused(
        op: &'static str,
        target: impl ToString,
        code: ErrorCode,
        reason: impl Into<String>,
    ) -> DriverError {
        DriverError::Refused {
            op,
            target: target.to_string(),
            code,
            reason: reason.into(),
        }
    }

    /// The stable code reported for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            DriverError::Missing { .. } => ErrorCode::BackendMissing,
            DriverError::Refused { code, .. } => *code,
            DriverError::Unavailable { .. } => ErrorCode::DriverUnavailable,
            DriverError::Scripted { .. } | DriverError::Backend { .. } => ErrorCode::DriverFailed,
        }
    }

    /// The message with its causes, for reports.
    pub fn report(&self) -> String {
        capstan_common::report(self)
    }
}

/// One way of running workloads on a host.
#[async_trait::async_trait]
pub trait Driver: Send + Sync {
    /// Which driver this is (`sim`, `docker`, `systemd`, `kube`): what a spec's
    /// `driver` must name for this agent to run it.
    fn kind(&self) -> DriverKind;
    fn capabilities(&self) -> Capabilities;

    /// This driver's own rules for a spec of its kind (what it needs, its section),
    /// beyond what `capstan_common::validate::spec` checks for every driver. The agent
    /// asks when it takes a `prepare_revision` in: a spec refused here is rejected
    /// (`invalid_spec`) and recorded as such, never carried out. Default: no rules.
    fn check_spec(&self, _spec: &Spec) -> Result<(), Rejection> {
        Ok(())
    }

    /// Prepares tenant infrastructure (network, slice, Namespace object).
    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError>;
    /// Removes tenant infrastructure; the executor has checked it is empty.
    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError>;
    /// Stages a revision without starting it.
    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError>;
    /// Starts `rev` with `launch_env` projected in, then stops `previous` if given.
    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        previous: Option<&str>,
    ) -> Result<(), DriverError>;
    /// Starts an existing revision (explicit start, startup reconciliation).
    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError>;
    /// Starts an existing revision exactly as it was last configured, launch
    /// environment included. For infrastructure restarts (startup reconciliation, the
    /// supervisor), which run no hooks and so must neither drop nor re-grant what the
    /// hooks projected at the last command-driven start.
    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError>;
    /// Waits until `rev`, which this driver had already applied when the agent
    /// stopped mid-command (an activation or start found running after a restart), is
    /// as far along as [`Driver::activate`] and [`Driver::start`] wait for before they
    /// return: one meaning of "started" whether the command ran through or was
    /// recovered. An error is a start that did not take (the executor rolls back, as
    /// for a failed start). The default waits for nothing: for a driver whose start
    /// returns once the runtime runs (sim, docker, systemd), running is started; kube
    /// waits for the Deployment's rollout.
    async fn settle(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        let _ = rev;
        Ok(())
    }
    /// Stops a revision, keeping its runtime.
    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError>;
    /// Stops and removes exactly this revision's runtime; never touches another.
    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError>;
    /// Everything on the host that carries capstan's labels.
    async fn observe(&self) -> Result<Observed, DriverError>;
    /// The current state of one revision (`None`: no backend). Drivers whose bulk
    /// view can lag behind override this with an authoritative read.
    async fn state(&self, rev: RevisionRef<'_>) -> Result<Option<BackendState>, DriverError> {
        Ok(self
            .observe()
            .await?
            .revision(rev.namespace, rev.workload, rev.revision)
            .cloned())
    }
    /// Probes `rev`'s readiness once with `check` (its spec's `readiness`), within
    /// `timeout`. Asked only of a revision this driver has just started. The default
    /// carries out no check; a driver that keeps it must refuse such specs at prepare.
    async fn probe(
        &self,
        rev: RevisionRef<'_>,
        check: &Check,
        timeout: Duration,
    ) -> Result<Probe, DriverError> {
        let _ = (check, timeout);
        Err(DriverError::refused(
            "probe",
            rev,
            ErrorCode::InvalidSpec,
            "this driver carries out no readiness checks",
        ))
    }
    /// Sends every exit of this host's workloads to `exits` until the receiver is
    /// dropped (`Ok`) or the backend's feed breaks (`Err`; the caller reconnects).
    /// The supervisor's hook: a driver without an exit feed keeps this default,
    /// which reports nothing and returns at once.
    async fn watch_exits(&self, exits: tokio::sync::mpsc::Sender<Exit>) -> Result<(), DriverError> {
        drop(exits);
        Ok(())
    }
    /// Sends every [`Failure`] of this host's workloads the backend reports without an
    /// exit to `failures`, as [`Driver::watch_exits`] does exits (`Ok` when the
    /// receiver is dropped, `Err` when the feed breaks). Only drivers that declare
    /// `reports_exits` are asked. The default reports nothing and returns at once.
    async fn watch_failures(
        &self,
        failures: tokio::sync::mpsc::Sender<Failure>,
    ) -> Result<(), DriverError> {
        drop(failures);
        Ok(())
    }
}

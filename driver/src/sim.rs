//! The simulated driver: a "host" kept in a JSON file under the data dir, so its
//! workloads outlive the agent process (to test adoption and crashes), with failures
//! scripted from config. It implements the same trait as the real drivers and keeps
//! the same promises: idempotent operations, exact-revision retire.

use crate::{
    merged_env, BackendState, Capabilities, Driver, DriverError, LaunchEnv, Observed, RevisionRef,
};
use capstan_common::{DriverKind, Spec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file the simulated host lives in, under the agent's data dir.
pub const HOST_FILE: &str = "sim-host.json";

/// Sim driver settings (`[sim]` in the agent config).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Declare that the agent manages workload lifecycle (like docker). Default true.
    #[serde(default = "yes")]
    pub manages_lifecycle: bool,
    /// Failures to inject, checked in order.
    #[serde(default)]
    pub failures: Vec<ScriptedFailure>,
}

fn yes() -> bool {
    true
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            manages_lifecycle: true,
            failures: Vec::new(),
        }
    }
}

/// Fail operation `op` (`ensure_namespace`, `activate`, `start`, …) on matching objects,
/// `times` times (for ever when absent).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedFailure {
    pub op: String,
    pub namespace: Option<String>,
    pub workload: Option<String>,
    pub revision: Option<String>,
    pub times: Option<u32>,
}

/// One simulated runtime object (a "container").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimRevision {
    pub namespace: String,
    pub workload: String,
    pub revision: String,
    pub state: BackendState,
    /// How many times it was started: the exactly-once witness for tests.
    pub starts: u64,
    /// The environment it was last started with (spec env + launch env).
    pub env: BTreeMap<String, String>,
}

/// The simulated host's whole state, as stored in [`HOST_FILE`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimHost {
    pub namespaces: BTreeSet<String>,
    /// Keyed `namespace/workload@revision`.
    pub revisions: BTreeMap<String, SimRevision>,
    /// How often each scripted failure has fired, by index.
    #[serde(default)]
    pub fired: Vec<u32>,
}

impl SimHost {
    /// Reads the host file in `dir` (an empty host when there is none).
    pub fn load(dir: &Path) -> std::io::Result<SimHost> {
        match std::fs::read(dir.join(HOST_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SimHost::default()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the host file atomically (write, then rename).
    pub fn store(&self, dir: &Path) -> std::io::Result<()> {
        let tmp = dir.join(format!("{HOST_FILE}.tmp"));
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, dir.join(HOST_FILE))
    }

    fn key(rev: RevisionRef<'_>) -> String {
        format!("{}/{}@{}", rev.namespace, rev.workload, rev.revision)
    }
}

/// The sim driver.
pub struct SimDriver {
    dir: PathBuf,
    config: SimConfig,
    host: Mutex<SimHost>,
}

impl SimDriver {
    /// Opens the simulated host in `dir`, creating it empty if absent.
    pub fn open(dir: &Path, config: SimConfig) -> std::io::Result<SimDriver> {
        std::fs::create_dir_all(dir)?;
        let host = SimHost::load(dir)?;
        Ok(SimDriver {
            dir: dir.to_path_buf(),
            config,
            host: Mutex::new(host),
        })
    }

    /// Runs `change` on the host under the lock, after checking scripted failures, and
    /// stores the result.
    fn with_host<T>(
        &self,
        op: &'static str,
        target: Target<'_>,
        change: impl FnOnce(&mut SimHost) -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        let mut host = self.host.lock().expect("sim host lock");
        let mut next = host.clone();
        if let Some(i) = self.scripted(op, &target, &next) {
            if next.fired.len() <= i {
                next.fired.resize(i + 1, 0);
            }
            next.fired[i] += 1;
            self.persist(op, &target, &next)?;
            *host = next;
            return Err(DriverError::Scripted {
                op,
                target: target.to_string(),
            });
        }
        let out = change(&mut next)?;
        if next != *host {
            self.persist(op, &target, &next)?;
            *host = next;
        }
        Ok(out)
    }

    fn persist(
        &self,
        op: &'static str,
        target: &Target<'_>,
        host: &SimHost,
    ) -> Result<(), DriverError> {
        host.store(&self.dir).map_err(|e| DriverError::Backend {
            op,
            target: target.to_string(),
            source: Box::new(e),
        })
    }

    fn scripted(&self, op: &str, target: &Target<'_>, host: &SimHost) -> Option<usize> {
        self.config.failures.iter().enumerate().position(|(i, f)| {
            let matches = |want: &Option<String>, have: Option<&str>| {
                want.as_deref().is_none_or(|w| Some(w) == have)
            };
            let fired = host.fired.get(i).copied().unwrap_or(0);
            f.op == op
                && matches(&f.namespace, Some(target.namespace))
                && matches(&f.workload, target.workload)
                && matches(&f.revision, target.revision)
                && f.times.is_none_or(|t| fired < t)
        })
    }
}

/// What an operation addresses, for failure matching and messages.
struct Target<'a> {
    namespace: &'a str,
    workload: Option<&'a str>,
    revision: Option<&'a str>,
}

impl<'a> From<RevisionRef<'a>> for Target<'a> {
    fn from(r: RevisionRef<'a>) -> Self {
        Target {
            namespace: r.namespace,
            workload: Some(r.workload),
            revision: Some(r.revision),
        }
    }
}

impl std::fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.namespace)?;
        if let Some(w) = self.workload {
            write!(f, "/{w}")?;
        }
        if let Some(r) = self.revision {
            write!(f, "@{r}")?;
        }
        Ok(())
    }
}

fn ns_target(namespace: &str) -> Target<'_> {
    Target {
        namespace,
        workload: None,
        revision: None,
    }
}

fn start_in(
    host: &mut SimHost,
    op: &'static str,
    rev: RevisionRef<'_>,
    env: BTreeMap<String, String>,
) -> Result<(), DriverError> {
    let r = host
        .revisions
        .get_mut(&SimHost::key(rev))
        .ok_or_else(|| DriverError::Missing {
            op,
            target: rev.to_string(),
        })?;
    if r.state != BackendState::Running {
        r.state = BackendState::Running;
        r.starts += 1;
        r.env = env;
    }
    Ok(())
}

#[async_trait::async_trait]
impl Driver for SimDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Sim
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: self.config.manages_lifecycle,
            reports_exits: false,
            restarts_exits: false,
            reaps_orphans: false,
        }
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        self.with_host("ensure_namespace", ns_target(namespace), |h| {
            h.namespaces.insert(namespace.to_string());
            Ok(())
        })
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        self.with_host("delete_namespace", ns_target(namespace), |h| {
            h.namespaces.remove(namespace);
            Ok(())
        })
    }

    async fn prepare(&self, rev: RevisionRef<'_>, _spec: &Spec) -> Result<(), DriverError> {
        self.with_host("prepare", rev.into(), |h| {
            h.revisions
                .entry(SimHost::key(rev))
                .or_insert_with(|| SimRevision {
                    namespace: rev.namespace.into(),
                    workload: rev.workload.into(),
                    revision: rev.revision.into(),
                    state: BackendState::Stopped,
                    starts: 0,
                    env: BTreeMap::new(),
                });
            Ok(())
        })
    }

    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        previous: Option<&str>,
    ) -> Result<(), DriverError> {
        self.with_host("activate", rev.into(), |h| {
            start_in(h, "activate", rev, merged_env(spec, launch_env))?;
            if let Some(prev) = previous.filter(|p| *p != rev.revision) {
                let prev = RevisionRef {
                    revision: prev,
                    ..rev
                };
                if let Some(p) = h.revisions.get_mut(&SimHost::key(prev)) {
                    p.state = BackendState::Stopped;
                }
            }
            Ok(())
        })
    }

    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        self.with_host("start", rev.into(), |h| {
            start_in(h, "start", rev, merged_env(spec, launch_env))
        })
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.with_host("start", rev.into(), |h| {
            let env = h
                .revisions
                .get(&SimHost::key(rev))
                .map(|r| r.env.clone())
                .unwrap_or_default();
            start_in(h, "start", rev, env)
        })
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.with_host("stop", rev.into(), |h| {
            if let Some(r) = h.revisions.get_mut(&SimHost::key(rev)) {
                r.state = BackendState::Stopped;
            }
            Ok(())
        })
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.with_host("retire", rev.into(), |h| {
            h.revisions.remove(&SimHost::key(rev));
            Ok(())
        })
    }

    async fn observe(&self) -> Result<Observed, DriverError> {
        let host = self.host.lock().expect("sim host lock");
        let mut observed = Observed {
            namespaces: host.namespaces.clone(),
            ..Observed::default()
        };
        for r in host.revisions.values() {
            observed
                .workloads
                .entry(capstan_common::workload_key(&r.namespace, &r.workload))
                .or_default()
                .insert(r.revision.clone(), r.state);
        }
        Ok(observed)
    }
}

#[cfg(test)]
mod tests;

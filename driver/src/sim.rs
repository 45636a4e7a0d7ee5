//! The simulated driver: a "host" kept in a JSON file under the data dir, so its
//! workloads outlive the agent process (to test adoption and crashes), with failures
//! scripted from config. It implements the same trait as the real drivers and keeps
//! the same promises: idempotent operations, exact-revision retire.
//!
//! It declares whatever [`Capabilities`] its config says (`[sim]`), so the agent's
//! behaviour under any driver's capability set can be tested against it: with
//! `reports_exits` it reports every running revision that stops (a stop, a
//! replacement, a retire, or [`SimDriver::exit`]) through [`Driver::watch_exits`], as
//! docker reports `die` events. A scripted failure may also leave the revision
//! `failed` (`gives_up`), the way systemd gives up on a unit after `start-limit-hit`.

use crate::{
    merged_env, BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed,
    RevisionRef,
};
use capstan_common::{DriverKind, Spec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tokio::sync::{mpsc, watch};

/// The file the simulated host lives in, under the agent's data dir.
pub const HOST_FILE: &str = "sim-host.json";

/// Sim driver settings (`[sim]` in the agent config). The capability keys are what
/// the sim declares ([`Capabilities`]); the defaults are the sim's historical set:
/// the agent manages lifecycle, no exits are reported, nothing is restarted or reaped.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Declare that the agent manages workload lifecycle (like docker). Default true.
    #[serde(default = "yes")]
    pub manages_lifecycle: bool,
    /// Report exits through [`Driver::watch_exits`]. Default false.
    #[serde(default)]
    pub reports_exits: bool,
    /// Declare that the agent restarts what exits (docker); false: the backend would
    /// restart its own (systemd, kube). Default false.
    #[serde(default)]
    pub restarts_exits: bool,
    /// Declare that startup drift is removed, not only reported. Default false.
    #[serde(default)]
    pub reaps_orphans: bool,
    /// Failures to inject, checked in order.
    #[serde(default)]
    pub failures: Vec<ScriptedFailure>,
}

fn yes() -> bool {
    true
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig::declaring(Capabilities {
            manages_lifecycle: true,
            reports_exits: false,
            restarts_exits: false,
            reaps_orphans: false,
        })
    }
}

impl SimConfig {
    /// A sim that declares `capabilities` (to stand in for another driver), with no
    /// scripted failures.
    pub fn declaring(capabilities: Capabilities) -> SimConfig {
        let Capabilities {
            manages_lifecycle,
            reports_exits,
            restarts_exits,
            reaps_orphans,
        } = capabilities;
        SimConfig {
            manages_lifecycle,
            reports_exits,
            restarts_exits,
            reaps_orphans,
            failures: Vec::new(),
        }
    }
}

/// Fail operation `op` (`ensure_namespace`, `activate`, `start`, …) on matching objects,
/// `times` times (for ever when absent).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedFailure {
    pub op: String,
    pub namespace: Option<String>,
    pub workload: Option<String>,
    pub revision: Option<String>,
    pub times: Option<u32>,
    /// When it fires on an existing revision, the backend also gives up on that
    /// revision: it is left `failed` with this reason (e.g. `start-limit-hit`) until a
    /// command starts it again.
    pub gives_up: Option<String>,
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
    /// The status it last exited with on its own ([`SimDriver::exit`]); a stop
    /// clears it.
    #[serde(default)]
    pub exit_code: Option<i64>,
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
    /// One queue per open exit feed (unbounded: reporting never blocks the host).
    feeds: Mutex<Vec<mpsc::UnboundedSender<Exit>>>,
    /// How many exit feeds are open.
    watchers: watch::Sender<usize>,
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
            feeds: Mutex::new(Vec::new()),
            watchers: watch::Sender::new(0),
        })
    }

    /// The host as it is now.
    pub fn host(&self) -> SimHost {
        self.host.lock().expect("sim host lock").clone()
    }

    /// The running revision `rev` ends on its own with status `code` (a crash, a clean
    /// exit): it is left stopped and, when the sim reports exits, the exit is sent to
    /// every open feed. A revision that is not running is left alone.
    pub fn exit(&self, rev: RevisionRef<'_>, code: i64) -> Result<(), DriverError> {
        self.with_host("exit", rev.into(), |h| {
            let r = revision_in(h, "exit", rev)?;
            if r.state.is_running() {
                r.state = BackendState::Stopped;
                r.exit_code = Some(code);
            }
            Ok(())
        })
    }

    /// The backend gives up on `rev` (as systemd does after `start-limit-hit`): it is
    /// left `failed` with `reason` until a command starts it again.
    pub fn give_up(&self, rev: RevisionRef<'_>, reason: &str) -> Result<(), DriverError> {
        self.with_host("give_up", rev.into(), |h| {
            revision_in(h, "give_up", rev)?.state = BackendState::Failed {
                reason: reason.to_string(),
            };
            Ok(())
        })
    }

    /// Waits until at least one exit feed is open: an exit before that reaches no one,
    /// as with a real backend.
    pub async fn watched(&self) {
        let mut open = self.watchers.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = open.wait_for(|n| *n > 0).await;
    }

    /// Sends an exit for every revision that ran in `before` and does not in `after`.
    fn report_exits(&self, before: &SimHost, after: &SimHost) {
        if !self.config.reports_exits {
            return;
        }
        let exits: Vec<Exit> = before
            .revisions
            .iter()
            .filter(|(_, r)| r.state.is_running())
            .filter_map(|(key, r)| {
                let now = after.revisions.get(key);
                (!now.is_some_and(|n| n.state.is_running())).then(|| Exit {
                    namespace: r.namespace.clone(),
                    workload: r.workload.clone(),
                    revision: r.revision.clone(),
                    exit_code: now.and_then(|n| n.exit_code),
                })
            })
            .collect();
        if exits.is_empty() {
            return;
        }
        let mut feeds = self.feeds.lock().expect("sim feeds lock");
        feeds.retain(|feed| exits.iter().all(|e| feed.send(e.clone()).is_ok()));
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
            if let (Some(reason), Some(workload), Some(revision)) = (
                &self.config.failures[i].gives_up,
                target.workload,
                target.revision,
            ) {
                let key = SimHost::key(RevisionRef {
                    namespace: target.namespace,
                    workload,
                    revision,
                });
                if let Some(r) = next.revisions.get_mut(&key) {
                    r.state = BackendState::Failed {
                        reason: reason.clone(),
                    };
                }
            }
            self.persist(op, &target, &next)?;
            self.report_exits(&host, &next);
            *host = next;
            return Err(DriverError::Scripted {
                op,
                target: target.to_string(),
            });
        }
        let out = change(&mut next)?;
        if next != *host {
            self.persist(op, &target, &next)?;
            self.report_exits(&host, &next);
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

fn revision_in<'h>(
    host: &'h mut SimHost,
    op: &'static str,
    rev: RevisionRef<'_>,
) -> Result<&'h mut SimRevision, DriverError> {
    host.revisions
        .get_mut(&SimHost::key(rev))
        .ok_or_else(|| DriverError::Missing {
            op,
            target: rev.to_string(),
        })
}

/// Starts `rev` unless it runs; a start also clears a `failed` state (a command's
/// start is the operator's reset, as `systemctl reset-failed` + `start`).
fn start_in(
    host: &mut SimHost,
    op: &'static str,
    rev: RevisionRef<'_>,
    env: BTreeMap<String, String>,
) -> Result<(), DriverError> {
    let r = revision_in(host, op, rev)?;
    if !r.state.is_running() {
        r.state = BackendState::Running;
        r.starts += 1;
        r.env = env;
        r.exit_code = None;
    }
    Ok(())
}

/// Stops `r` if it runs (a stop is not an exit of its own: no status).
fn stop_in(r: &mut SimRevision) {
    if r.state.is_running() {
        r.state = BackendState::Stopped;
        r.exit_code = None;
    }
}

/// Closes one exit feed's count when the feed ends (returned or dropped).
struct Watching<'a>(&'a watch::Sender<usize>);

impl<'a> Watching<'a> {
    fn open(count: &'a watch::Sender<usize>) -> Watching<'a> {
        count.send_modify(|n| *n += 1);
        Watching(count)
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

#[async_trait::async_trait]
impl Driver for SimDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Sim
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: self.config.manages_lifecycle,
            reports_exits: self.config.reports_exits,
            restarts_exits: self.config.restarts_exits,
            reaps_orphans: self.config.reaps_orphans,
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
                    exit_code: None,
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
                    stop_in(p);
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
                stop_in(r);
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
                .insert(r.revision.clone(), r.state.clone());
        }
        Ok(observed)
    }

    /// With `reports_exits`: every running revision that stops, until `exits` is
    /// dropped. Without: returns at once, like a driver that has no exit feed.
    async fn watch_exits(&self, exits: mpsc::Sender<Exit>) -> Result<(), DriverError> {
        if !self.config.reports_exits {
            return Ok(());
        }
        let (feed, mut queue) = mpsc::unbounded_channel();
        self.feeds.lock().expect("sim feeds lock").push(feed);
        let _open = Watching::open(&self.watchers);
        loop {
            tokio::select! {
                exit = queue.recv() => match exit {
                    Some(exit) => {
                        if exits.send(exit).await.is_err() {
                            return Ok(());
                        }
                    }
                    None => return Ok(()),
                },
                () = exits.closed() => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests;

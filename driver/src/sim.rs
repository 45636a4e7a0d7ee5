//! The simulated driver: a "host" kept under the data dir (a snapshot and a journal
//! of changes, [`journal`]), so its workloads outlive the agent process (to test
//! adoption and crashes), with failures scripted from config. An operation costs one
//! journal line, whatever the number of workloads. It implements the same trait as the real drivers and keeps
//! the same promises: idempotent operations, exact-revision retire.
//!
//! It declares whatever [`Capabilities`] its config says (`[sim]`), so the agent's
//! behaviour under any driver's capability set can be tested against it: with
//! `reports_exits` it reports every running revision that stops (a stop, a
//! replacement, a retire, or [`SimDriver::exit`]) through [`Driver::watch_exits`], as
//! docker reports `die` events. A scripted failure may also leave the revision
//! `failed` (`gives_up`), the way systemd gives up on a unit after `start-limit-hit`,
//! and [`SimDriver::break_exit_feeds`] breaks the open exit feeds, as a backend's
//! event stream that ends under the agent.

use crate::{
    merged_env, BackendState, Capabilities, Driver, DriverError, Exit, LaunchEnv, Observed, Probe,
    RevisionRef,
};
use capstan_common::{Check, DriverKind, ErrorCode, Spec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

pub mod journal;

use journal::{Change, Journal};
pub use journal::{HOST_FILE, JOURNAL_FILE};

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
            // The sim is always probed by the executor: it never gates readiness.
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

/// Fail operation `op` (`ensure_namespace`, `activate`, `start`, …; `probe`: not ready)
/// on matching objects, `times` times (for ever when absent).
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

/// The simulated host's whole state: [`HOST_FILE`] with [`JOURNAL_FILE`] replayed.
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
    /// Reads the host in `dir`: the snapshot with the journal replayed (an empty host
    /// when there is none). Safe while a driver has it open in another process.
    pub fn load(dir: &Path) -> std::io::Result<SimHost> {
        journal::load(dir).map(|l| l.host)
    }

    fn key(rev: RevisionRef<'_>) -> String {
        format!("{}/{}@{}", rev.namespace, rev.workload, rev.revision)
    }
}

/// The host and where its changes go, under one lock.
struct State {
    host: SimHost,
    journal: Journal,
}

/// The sim driver.
pub struct SimDriver {
    config: SimConfig,
    state: Mutex<State>,
    /// The open exit feeds.
    feeds: Mutex<Feeds>,
    /// How many exit feeds are open (listed in `feeds`).
    watchers: watch::Sender<usize>,
}

/// The open exit feeds: one queue each (unbounded: reporting never blocks the host),
/// by id. A feed leaves the list when its `watch_exits` call ends, or when it is
/// broken ([`SimDriver::break_exit_feeds`]).
#[derive(Default)]
struct Feeds {
    next: u64,
    open: Vec<(u64, mpsc::UnboundedSender<Exit>)>,
}

impl SimDriver {
    /// Opens the simulated host in `dir`, creating it empty if absent.
    pub fn open(dir: &Path, config: SimConfig) -> std::io::Result<SimDriver> {
        std::fs::create_dir_all(dir)?;
        let (journal, host) = Journal::open(dir)?;
        Ok(SimDriver {
            config,
            state: Mutex::new(State { host, journal }),
            feeds: Mutex::new(Feeds::default()),
            watchers: watch::Sender::new(0),
        })
    }

    /// The host as it is now.
    pub fn host(&self) -> SimHost {
        self.locked().host.clone()
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("sim host lock")
    }

    /// The running revision `rev` ends on its own with status `code` (a crash, a clean
    /// exit): it is left stopped and, when the sim reports exits, the exit is sent to
    /// every open feed. A revision that is not running is left alone.
    pub fn exit(&self, rev: RevisionRef<'_>, code: i64) -> Result<(), DriverError> {
        self.with_host("exit", rev.into(), |t| {
            let r = revision_in(t, "exit", rev)?;
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
        self.with_host("give_up", rev.into(), |t| {
            revision_in(t, "give_up", rev)?.state = BackendState::Failed {
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

    /// Breaks every open exit feed, as a backend's event stream that ends under the
    /// agent (docker's engine restarting): each open `watch_exits` call returns `Err`,
    /// as a real driver's does when its feed breaks, and the exits from then on reach
    /// only feeds opened after ([`SimDriver::watched`] waits for one).
    pub fn break_exit_feeds(&self) {
        let mut feeds = self.feeds.lock().expect("sim feeds lock");
        feeds.open.clear();
        self.watchers.send_replace(0);
    }

    /// Sends `exits` to every open feed (when the sim reports exits).
    fn report_exits(&self, exits: Vec<Exit>) {
        if !self.config.reports_exits || exits.is_empty() {
            return;
        }
        let mut feeds = self.feeds.lock().expect("sim feeds lock");
        feeds
            .open
            .retain(|(_, feed)| exits.iter().all(|e| feed.send(e.clone()).is_ok()));
    }

    /// Runs `change` on the host under the lock, after checking scripted failures, and
    /// journals what it changed (one line): O(1) in the size of the host. A change
    /// that fails, or cannot be journaled, is undone.
    fn with_host<T>(
        &self,
        op: &'static str,
        target: Target<'_>,
        change: impl FnOnce(&mut Txn<'_>) -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        let mut state = self.locked();
        let State { host, journal } = &mut *state;
        let scripted = self.scripted(op, &target, host);
        let mut txn = Txn::new(host);
        let result = match scripted {
            Some(i) => {
                txn.fire(i);
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
                    if let Some(r) = txn.revision_mut(&key) {
                        r.state = BackendState::Failed {
                            reason: reason.clone(),
                        };
                    }
                }
                Err(DriverError::Scripted {
                    op,
                    target: target.to_string(),
                })
            }
            None => match change(&mut txn) {
                Ok(out) => Ok(out),
                Err(e) => {
                    txn.rollback();
                    return Err(e);
                }
            },
        };
        if let Err(e) = journal.append(&txn.changes(), txn.host) {
            txn.rollback();
            return Err(DriverError::Backend {
                op,
                target: target.to_string(),
                source: Box::new(e),
            });
        }
        self.report_exits(txn.exits());
        result
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

fn revision_in<'t>(
    txn: &'t mut Txn<'_>,
    op: &'static str,
    rev: RevisionRef<'_>,
) -> Result<&'t mut SimRevision, DriverError> {
    txn.revision_mut(&SimHost::key(rev))
        .ok_or_else(|| DriverError::Missing {
            op,
            target: rev.to_string(),
        })
}

/// Starts `rev` unless it runs; a start also clears a `failed` state (a command's
/// start is the operator's reset, as `systemctl reset-failed` + `start`).
fn start_in(
    txn: &mut Txn<'_>,
    op: &'static str,
    rev: RevisionRef<'_>,
    env: BTreeMap<String, String>,
) -> Result<(), DriverError> {
    let r = revision_in(txn, op, rev)?;
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

/// One operation's changes to the host, made in place: it remembers the first value
/// of everything it touches, so it can say what changed (the journal line, the exits)
/// or undo it, in O(what it touched).
struct Txn<'h> {
    host: &'h mut SimHost,
    namespaces: Vec<(String, bool)>,
    revisions: Vec<(String, Option<SimRevision>)>,
    fired: Vec<(usize, u32)>,
}

impl<'h> Txn<'h> {
    fn new(host: &'h mut SimHost) -> Txn<'h> {
        Txn {
            host,
            namespaces: Vec::new(),
            revisions: Vec::new(),
            fired: Vec::new(),
        }
    }

    fn get(&self, key: &str) -> Option<&SimRevision> {
        self.host.revisions.get(key)
    }

    fn touch(&mut self, key: &str) {
        if !self.revisions.iter().any(|(k, _)| k == key) {
            let was = self.host.revisions.get(key).cloned();
            self.revisions.push((key.to_string(), was));
        }
    }

    fn revision_mut(&mut self, key: &str) -> Option<&mut SimRevision> {
        self.touch(key);
        self.host.revisions.get_mut(key)
    }

    fn insert_if_absent(&mut self, key: String, make: impl FnOnce() -> SimRevision) {
        self.touch(&key);
        self.host.revisions.entry(key).or_insert_with(make);
    }

    fn remove(&mut self, key: &str) {
        self.touch(key);
        self.host.revisions.remove(key);
    }

    fn namespace(&mut self, name: &str, present: bool) {
        if !self.namespaces.iter().any(|(n, _)| n == name) {
            let was = self.host.namespaces.contains(name);
            self.namespaces.push((name.to_string(), was));
        }
        if present {
            self.host.namespaces.insert(name.to_string());
        } else {
            self.host.namespaces.remove(name);
        }
    }

    /// Scripted failure `i` fires once more.
    fn fire(&mut self, i: usize) {
        if self.host.fired.len() <= i {
            self.host.fired.resize(i + 1, 0);
        }
        if !self.fired.iter().any(|(f, _)| *f == i) {
            self.fired.push((i, self.host.fired[i]));
        }
        self.host.fired[i] += 1;
    }

    /// What differs from the values first seen.
    fn changes(&self) -> Vec<Change> {
        let namespaces = self
            .namespaces
            .iter()
            .filter(|(n, was)| self.host.namespaces.contains(n) != *was)
            .map(|(n, was)| Change::Namespace {
                name: n.clone(),
                present: !was,
            });
        let revisions = self
            .revisions
            .iter()
            .filter(|(k, was)| self.host.revisions.get(k) != was.as_ref())
            .map(|(k, _)| Change::Revision {
                key: k.clone(),
                revision: self.host.revisions.get(k).cloned(),
            });
        let fired = self
            .fired
            .iter()
            .filter(|(i, was)| self.host.fired[*i] != *was)
            .map(|(i, _)| Change::Fired {
                index: *i,
                count: self.host.fired[*i],
            });
        namespaces.chain(revisions).chain(fired).collect()
    }

    /// Every touched revision that ran before and does not now.
    fn exits(&self) -> Vec<Exit> {
        self.revisions
            .iter()
            .filter_map(|(key, was)| {
                let was = was.as_ref().filter(|r| r.state.is_running())?;
                let now = self.host.revisions.get(key);
                (!now.is_some_and(|n| n.state.is_running())).then(|| Exit {
                    namespace: was.namespace.clone(),
                    workload: was.workload.clone(),
                    revision: was.revision.clone(),
                    exit_code: now.and_then(|n| n.exit_code),
                })
            })
            .collect()
    }

    /// Puts back everything touched as it was first seen.
    fn rollback(self) {
        for (name, was) in self.namespaces {
            if was {
                self.host.namespaces.insert(name);
            } else {
                self.host.namespaces.remove(&name);
            }
        }
        for (key, was) in self.revisions {
            match was {
                Some(r) => {
                    self.host.revisions.insert(key, r);
                }
                None => {
                    self.host.revisions.remove(&key);
                }
            }
        }
        for (i, was) in self.fired {
            self.host.fired[i] = was;
        }
    }
}

/// Lists one exit feed (and counts it open) until its `watch_exits` call ends
/// (returned or dropped).
struct Watching<'a> {
    sim: &'a SimDriver,
    id: u64,
}

impl<'a> Watching<'a> {
    fn open(sim: &'a SimDriver, feed: mpsc::UnboundedSender<Exit>) -> Watching<'a> {
        let mut feeds = sim.feeds.lock().expect("sim feeds lock");
        let id = feeds.next;
        feeds.next += 1;
        feeds.open.push((id, feed));
        sim.watchers.send_replace(feeds.open.len());
        Watching { sim, id }
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        let mut feeds = self.sim.feeds.lock().expect("sim feeds lock");
        feeds.open.retain(|(id, _)| *id != self.id);
        self.sim.watchers.send_replace(feeds.open.len());
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
        self.with_host("ensure_namespace", ns_target(namespace), |t| {
            t.namespace(namespace, true);
            Ok(())
        })
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        self.with_host("delete_namespace", ns_target(namespace), |t| {
            t.namespace(namespace, false);
            Ok(())
        })
    }

    async fn prepare(&self, rev: RevisionRef<'_>, _spec: &Spec) -> Result<(), DriverError> {
        self.with_host("prepare", rev.into(), |t| {
            t.insert_if_absent(SimHost::key(rev), || SimRevision {
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
        self.with_host("activate", rev.into(), |t| {
            start_in(t, "activate", rev, merged_env(spec, launch_env))?;
            if let Some(prev) = previous.filter(|p| *p != rev.revision) {
                let prev = RevisionRef {
                    revision: prev,
                    ..rev
                };
                if let Some(p) = t.revision_mut(&SimHost::key(prev)) {
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
        self.with_host("start", rev.into(), |t| {
            start_in(t, "start", rev, merged_env(spec, launch_env))
        })
    }

    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.with_host("start", rev.into(), |t| {
            let env = t
                .get(&SimHost::key(rev))
                .map(|r| r.env.clone())
                .unwrap_or_default();
            start_in(t, "start", rev, env)
        })
    }

    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.with_host("stop", rev.into(), |t| {
            if let Some(r) = t.revision_mut(&SimHost::key(rev)) {
                stop_in(r);
            }
            Ok(())
        })
    }

    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.with_host("retire", rev.into(), |t| {
            t.remove(&SimHost::key(rev));
            Ok(())
        })
    }

    /// Ready when the revision runs, unless a scripted `probe` failure fires (`times`
    /// failed probes, then ready; for ever when absent). No check is carried out.
    async fn probe(
        &self,
        rev: RevisionRef<'_>,
        _check: &Check,
        _timeout: Duration,
    ) -> Result<Probe, DriverError> {
        let probed = self.with_host("probe", rev.into(), |t| {
            let r = revision_in(t, "probe", rev)?;
            Ok(match r.state.is_running() {
                true => Probe::Ready,
                false => Probe::NotReady(format!("{rev} does not run")),
            })
        });
        match probed {
            Err(DriverError::Scripted { .. }) => Ok(Probe::NotReady("scripted".into())),
            probed => probed,
        }
    }

    async fn observe(&self) -> Result<Observed, DriverError> {
        let state = self.locked();
        let host = &state.host;
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
    /// dropped (`Ok`) or the feed is broken (`Err`, [`SimDriver::break_exit_feeds`]).
    /// Without: returns at once, like a driver that has no exit feed.
    async fn watch_exits(&self, exits: mpsc::Sender<Exit>) -> Result<(), DriverError> {
        if !self.config.reports_exits {
            return Ok(());
        }
        let (feed, mut queue) = mpsc::unbounded_channel();
        let _open = Watching::open(self, feed);
        loop {
            tokio::select! {
                exit = queue.recv() => match exit {
                    Some(exit) => {
                        if exits.send(exit).await.is_err() {
                            return Ok(());
                        }
                    }
                    // Only `break_exit_feeds` lets go of a listed feed.
                    None => {
                        return Err(DriverError::refused(
                            "watch_exits",
                            "host",
                            ErrorCode::DriverFailed,
                            "the exit feed broke",
                        ))
                    }
                },
                () = exits.closed() => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests;

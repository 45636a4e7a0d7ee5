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
use capstan_common::{Check, DriverKind, ErrorCode, Rejection, Spec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

mod config;
mod feeds;
pub mod journal;
mod txn;

pub use config::{ScriptedFailure, SimConfig};
use feeds::{Feeds, Watching};
use journal::Journal;
pub use journal::{HOST_FILE, JOURNAL_FILE};
use txn::{revision_in, start_in, stop_in, Txn};

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
    /// The kind it answers to: `sim`, or another (a standalone sim standing in for a
    /// driver of a new kind).
    kind: DriverKind,
    state: Mutex<State>,
    /// The open exit feeds.
    feeds: Mutex<Feeds>,
    /// How many exit feeds are open (listed in `feeds`).
    watchers: watch::Sender<usize>,
}

/// The sim's own rule for a spec: it has no settings of its own, so a spec carrying
/// its section with any is refused, as a real driver refuses settings it cannot apply.
pub fn check_spec(spec: &Spec) -> Result<(), Rejection> {
    capstan_common::validate::no_settings(spec)
}

impl SimDriver {
    /// Opens the simulated host in `dir`, creating it empty if absent (`0700`, its
    /// files `0600`, whatever the umask: the specs it holds may carry secrets in their
    /// env).
    pub fn open(dir: &Path, config: SimConfig) -> std::io::Result<SimDriver> {
        use capstan_common::files;
        files::create_dir_all(dir, files::PRIVATE_DIR)?;
        let (journal, host) = Journal::open(dir)?;
        Ok(SimDriver {
            config,
            kind: DriverKind::SIM,
            state: Mutex::new(State { host, journal }),
            feeds: Mutex::new(Feeds::default()),
            watchers: watch::Sender::new(0),
        })
    }

    /// The same simulated host, answering to `kind`: it runs the specs that name it.
    pub fn answering_to(mut self, kind: DriverKind) -> SimDriver {
        self.kind = kind;
        self
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
#[async_trait::async_trait]
impl Driver for SimDriver {
    fn kind(&self) -> DriverKind {
        self.kind
    }

    fn check_spec(&self, spec: &Spec) -> Result<(), Rejection> {
        check_spec(spec)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            manages_lifecycle: self.config.manages_lifecycle,
            reports_exits: self.config.reports_exits,
            restarts_exits: self.config.restarts_exits,
            reaps_orphans: self.config.reaps_orphans,
            probes: self.config.probes,
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

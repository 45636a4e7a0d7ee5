//! One operation's changes to the simulated host (`Txn`), which say what to journal
//! and which revisions exited, or are undone; and the changes operations make to one
//! revision through it.

use super::journal::Change;
use super::{SimHost, SimRevision};
use crate::{BackendState, DriverError, Exit, RevisionRef};
use std::collections::BTreeMap;

pub(super) fn revision_in<'t>(
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
pub(super) fn start_in(
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
pub(super) fn stop_in(r: &mut SimRevision) {
    if r.state.is_running() {
        r.state = BackendState::Stopped;
        r.exit_code = None;
    }
}

/// One operation's changes to the host, made in place: it remembers the first value
/// of everything it touches, so it can say what changed (the journal line, the exits)
/// or undo it, in O(what it touched).
pub(super) struct Txn<'h> {
    pub(super) host: &'h mut SimHost,
    namespaces: Vec<(String, bool)>,
    revisions: Vec<(String, Option<SimRevision>)>,
    fired: Vec<(usize, u32)>,
}

impl<'h> Txn<'h> {
    pub(super) fn new(host: &'h mut SimHost) -> Txn<'h> {
        Txn {
            host,
            namespaces: Vec::new(),
            revisions: Vec::new(),
            fired: Vec::new(),
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&SimRevision> {
        self.host.revisions.get(key)
    }

    fn touch(&mut self, key: &str) {
        if !self.revisions.iter().any(|(k, _)| k == key) {
            let was = self.host.revisions.get(key).cloned();
            self.revisions.push((key.to_string(), was));
        }
    }

    pub(super) fn revision_mut(&mut self, key: &str) -> Option<&mut SimRevision> {
        self.touch(key);
        self.host.revisions.get_mut(key)
    }

    pub(super) fn insert_if_absent(&mut self, key: String, make: impl FnOnce() -> SimRevision) {
        self.touch(&key);
        self.host.revisions.entry(key).or_insert_with(make);
    }

    pub(super) fn remove(&mut self, key: &str) {
        self.touch(key);
        self.host.revisions.remove(key);
    }

    pub(super) fn namespace(&mut self, name: &str, present: bool) {
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
    pub(super) fn fire(&mut self, i: usize) {
        if self.host.fired.len() <= i {
            self.host.fired.resize(i + 1, 0);
        }
        if !self.fired.iter().any(|(f, _)| *f == i) {
            self.fired.push((i, self.host.fired[i]));
        }
        self.host.fired[i] += 1;
    }

    /// What differs from the values first seen.
    pub(super) fn changes(&self) -> Vec<Change> {
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
    pub(super) fn exits(&self) -> Vec<Exit> {
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
    pub(super) fn rollback(self) {
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

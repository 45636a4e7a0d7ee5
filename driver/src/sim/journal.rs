//! How the simulated host is stored: a snapshot ([`HOST_FILE`]) and a journal of the
//! changes made since ([`JOURNAL_FILE`]), so an operation costs one appended line, not
//! a rewrite of the whole host.
//!
//! - **Journal.** One JSON line per operation, holding every change it made (a
//!   namespace present or not, a revision's whole new value or its removal, a
//!   failure's fired count), written with one `write(2)` before the operation
//!   returns. A line is only complete with its newline: a torn last line (a crash
//!   during the write) is an operation that never returned, and is dropped.
//! - **Snapshot.** The whole host as JSON, replaced atomically (write, rename).
//! - **Compaction.** Once the journal has as many lines as the host has objects (and
//!   at least [`MIN_COMPACTION`]), the host is written as a new snapshot and the
//!   journal starts again: O(host) work every O(host) operations, so O(1) amortised.
//!   Each snapshot has a generation, and the journal's first line names the generation
//!   it follows. A crash between the two renames leaves an older journal beside a
//!   newer snapshot: replaying it is harmless, since every change is an absolute
//!   value (the last value of a key is the snapshot's). A reader that finds a journal
//!   *newer* than the snapshot it read (a compaction in between) reads again.
//!
//! Durability is what it was with one file rewritten per change: written before the
//! operation returns (a `kill -9` loses nothing), not fsync'ed (a simulated host need
//! not survive the machine).

use super::{SimHost, SimRevision};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

/// The snapshot of the simulated host, under the agent's data dir.
pub const HOST_FILE: &str = "sim-host.json";
/// The changes made since the snapshot, one JSON line per operation.
pub const JOURNAL_FILE: &str = "sim-host.journal";
/// The fewest journal lines that make a compaction due.
pub const MIN_COMPACTION: usize = 1024;

/// One change an operation made to the host. Each is an absolute value, so a replay
/// of the same change twice converges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Namespace {
        name: String,
        present: bool,
    },
    /// The revision under `key` is now `revision`; `None`: removed.
    Revision {
        key: String,
        revision: Option<SimRevision>,
    },
    /// Scripted failure `index` has fired `count` times.
    Fired {
        index: usize,
        count: u32,
    },
}

/// A journal line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    /// The first line: the snapshot generation this journal follows.
    Follows { generation: u64 },
    /// One operation's changes.
    Changed(Vec<Change>),
}

/// The snapshot file: the host, and its generation (0 for a file written before
/// there was a journal).
#[derive(Deserialize)]
struct Snapshot {
    #[serde(default)]
    generation: u64,
    #[serde(flatten)]
    host: SimHost,
}

/// Applies `change` to `host`.
pub fn apply(host: &mut SimHost, change: Change) {
    match change {
        Change::Namespace { name, present } => {
            if present {
                host.namespaces.insert(name);
            } else {
                host.namespaces.remove(&name);
            }
        }
        Change::Revision { key, revision } => match revision {
            Some(r) => {
                host.revisions.insert(key, r);
            }
            None => {
                host.revisions.remove(&key);
            }
        },
        Change::Fired { index, count } => {
            if host.fired.len() <= index {
                host.fired.resize(index + 1, 0);
            }
            host.fired[index] = count;
        }
    }
}

/// What was read from a data dir.
pub struct Loaded {
    pub host: SimHost,
    pub generation: u64,
    /// Complete journal lines replayed.
    pub lines: usize,
}

/// Reads the snapshot and replays the journal over it (an empty host when neither
/// exists). A torn last line is dropped; a bad complete line is an error.
pub fn load(dir: &Path) -> std::io::Result<Loaded> {
    // A compaction between reading the snapshot and the journal shows as a journal
    // newer than the snapshot: read both again (compactions are far apart).
    for _ in 0..16 {
        if let Some(loaded) = try_load(dir)? {
            return Ok(loaded);
        }
    }
    Err(std::io::Error::other(
        "the sim host kept changing under a reader",
    ))
}

fn try_load(dir: &Path) -> std::io::Result<Option<Loaded>> {
    let Snapshot {
        generation,
        mut host,
    } = match std::fs::read(dir.join(HOST_FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(std::io::Error::other)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Snapshot {
            generation: 0,
            host: SimHost::default(),
        },
        Err(e) => return Err(e),
    };
    let bytes = match std::fs::read(dir.join(JOURNAL_FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    // Only newline-terminated lines are complete.
    let complete = bytes
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(&bytes[..0], |end| &bytes[..=end]);
    let mut lines = 0;
    for (i, text) in complete.split(|b| *b == b'\n').enumerate() {
        if text.is_empty() {
            continue;
        }
        let line: Line = serde_json::from_slice(text).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{JOURNAL_FILE} line {}: {e}", i + 1),
            )
        })?;
        match line {
            Line::Follows { generation: g } if g > generation => return Ok(None),
            Line::Follows { .. } => {}
            Line::Changed(changes) => {
                for change in changes {
                    apply(&mut host, change);
                }
                lines += 1;
            }
        }
    }
    Ok(Some(Loaded {
        host,
        generation,
        lines,
    }))
}

/// The open journal of a host, appended to by the driver (which holds it under its
/// lock).
pub struct Journal {
    dir: std::path::PathBuf,
    file: File,
    generation: u64,
    /// Lines since the last compaction.
    lines: usize,
    /// A write failed: the file may end in part of a line.
    torn: bool,
}

impl Journal {
    /// Loads the host in `dir` and starts a fresh journal after a compaction, so a
    /// torn tail is gone before anything is appended.
    pub fn open(dir: &Path) -> std::io::Result<(Journal, SimHost)> {
        let loaded = load(dir)?;
        let generation = loaded.generation + 1;
        let file = start(dir, generation, &loaded.host)?;
        let journal = Journal {
            dir: dir.to_path_buf(),
            file,
            generation,
            lines: 0,
            torn: false,
        };
        Ok((journal, loaded.host))
    }

    /// Appends one operation's changes (one write), then compacts if due. `host` is
    /// the host with those changes made.
    pub fn append(&mut self, changes: &[Change], host: &SimHost) -> std::io::Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        if self.torn {
            // A failed write may have left part of a line: start again from `host`.
            return self.compact(host);
        }
        let mut line =
            serde_json::to_vec(&Line::Changed(changes.to_vec())).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if let Err(e) = self.file.write_all(&line) {
            self.torn = true;
            return Err(e);
        }
        self.lines += 1;
        if self.lines >= MIN_COMPACTION.max(host.namespaces.len() + host.revisions.len()) {
            self.compact(host)?;
        }
        Ok(())
    }

    /// Lines in the journal since the last compaction.
    pub fn lines(&self) -> usize {
        self.lines
    }

    /// The generation of the snapshot the journal follows.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Writes `host` as the next generation's snapshot, then an empty journal that
    /// follows it.
    pub fn compact(&mut self, host: &SimHost) -> std::io::Result<()> {
        let generation = self.generation + 1;
        self.file = start(&self.dir, generation, host)?;
        self.generation = generation;
        self.lines = 0;
        self.torn = false;
        Ok(())
    }
}

/// Writes `host` as snapshot `generation`, then an empty journal following it, open
/// for appending.
fn start(dir: &Path, generation: u64, host: &SimHost) -> std::io::Result<File> {
    #[derive(Serialize)]
    struct SnapshotRef<'a> {
        generation: u64,
        #[serde(flatten)]
        host: &'a SimHost,
    }
    let snapshot = SnapshotRef { generation, host };
    replace(
        dir,
        HOST_FILE,
        &serde_json::to_vec(&snapshot).map_err(std::io::Error::other)?,
    )?;
    let mut header =
        serde_json::to_vec(&Line::Follows { generation }).map_err(std::io::Error::other)?;
    header.push(b'\n');
    replace(dir, JOURNAL_FILE, &header)?;
    OpenOptions::new().append(true).open(dir.join(JOURNAL_FILE))
}

/// Replaces `dir/name` with `bytes` atomically (write, then rename).
fn replace(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use capstan_common::files;
    let tmp = dir.join(format!("{name}.tmp"));
    std::io::Write::write_all(&mut files::create(&tmp, files::PRIVATE_FILE)?, bytes)?;
    std::fs::rename(tmp, dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::tests::spec;
    use crate::sim::{SimConfig, SimDriver};
    use crate::{BackendState, Driver, LaunchEnv, RevisionRef};

    fn rev(workload: &str) -> RevisionRef<'_> {
        RevisionRef {
            namespace: "ns",
            workload,
            revision: "r1",
        }
    }

    /// `n` workloads prepared and activated, on a sim in `dir`.
    async fn with_workloads(dir: &Path, n: usize) -> SimDriver {
        let sim = SimDriver::open(dir, SimConfig::default()).unwrap();
        sim.ensure_namespace("ns").await.unwrap();
        for i in 0..n {
            let w = format!("w{i}");
            sim.prepare(rev(&w), &spec()).await.unwrap();
            sim.activate(rev(&w), &spec(), &LaunchEnv::new(), None)
                .await
                .unwrap();
        }
        sim
    }

    fn journal_text(dir: &Path) -> String {
        std::fs::read_to_string(dir.join(JOURNAL_FILE)).unwrap()
    }

    #[tokio::test]
    async fn every_returned_operation_is_in_the_journal_before_the_driver_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let sim = with_workloads(dir.path(), 3).await;
        sim.stop(rev("w1")).await.unwrap();
        sim.retire(rev("w2")).await.unwrap();
        // Another process reads it while the driver still has it open (as a test
        // harness does after a kill -9: nothing was flushed or closed on the way out).
        let read = SimHost::load(dir.path()).unwrap();
        assert_eq!(read, sim.host());
        assert_eq!(read.revisions["ns/w0@r1"].state, BackendState::Running);
        assert_eq!(read.revisions["ns/w1@r1"].state, BackendState::Stopped);
        assert!(!read.revisions.contains_key("ns/w2@r1"));
        // One line an operation (plus the header), none for an operation that
        // changed nothing.
        let lines = journal_text(dir.path()).lines().count();
        sim.ensure_namespace("ns").await.unwrap();
        sim.stop(rev("w1")).await.unwrap();
        assert_eq!(journal_text(dir.path()).lines().count(), lines);
        assert_eq!(lines, 1 + 1 + 3 * 2 + 2);
        drop(sim);
        // Reopening replays the journal and starts a fresh one after a snapshot.
        let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
        assert_eq!(sim.host(), read);
        assert_eq!(journal_text(dir.path()).lines().count(), 1);
    }

    #[tokio::test]
    async fn a_torn_last_line_is_an_operation_that_never_returned() {
        let dir = tempfile::tempdir().unwrap();
        let sim = with_workloads(dir.path(), 2).await;
        let before = sim.host();
        drop(sim);
        // A crash in the middle of writing the next line.
        let line = serde_json::to_string(&Line::Changed(vec![Change::Namespace {
            name: "torn".into(),
            present: true,
        }]))
        .unwrap();
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.path().join(JOURNAL_FILE))
            .unwrap();
        file.write_all(&line.as_bytes()[..line.len() / 2]).unwrap();
        drop(file);
        assert_eq!(SimHost::load(dir.path()).unwrap(), before);
        // The driver opens it, and what it appends after is read back whole.
        let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
        assert_eq!(sim.host(), before);
        sim.ensure_namespace("after").await.unwrap();
        drop(sim);
        let host = SimHost::load(dir.path()).unwrap();
        assert!(host.namespaces.contains("after") && !host.namespaces.contains("torn"));
        assert_eq!(host.revisions, before.revisions);
    }

    #[tokio::test]
    async fn a_complete_line_that_does_not_decode_is_an_error_not_a_loss() {
        let dir = tempfile::tempdir().unwrap();
        drop(with_workloads(dir.path(), 1).await);
        let text = journal_text(dir.path());
        let mut lines: Vec<&str> = text.lines().collect();
        lines[1] = "{\"changed\":[{\"nonsense\":1}]}";
        std::fs::write(dir.path().join(JOURNAL_FILE), lines.join("\n") + "\n").unwrap();
        let err = SimHost::load(dir.path()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("line 2"), "{err}");
        let err = SimDriver::open(dir.path(), SimConfig::default())
            .map(|_| ())
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[tokio::test]
    async fn the_journal_is_compacted_into_the_snapshot_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
        let first = sim.locked().journal.generation();
        sim.ensure_namespace("ns").await.unwrap();
        // Stop/start one revision: the host stays small, the journal grows.
        sim.prepare(rev("w"), &spec()).await.unwrap();
        let mut compactions = 0;
        let mut longest = 0;
        for i in 0..3 * MIN_COMPACTION {
            if i % 2 == 0 {
                sim.activate(rev("w"), &spec(), &LaunchEnv::new(), None)
                    .await
                    .unwrap();
            } else {
                sim.stop(rev("w")).await.unwrap();
            }
            let state = sim.locked();
            longest = longest.max(state.journal.lines());
            compactions = state.journal.generation() - first;
        }
        assert_eq!(
            compactions, 3,
            "one compaction every {MIN_COMPACTION} lines"
        );
        assert!(longest < MIN_COMPACTION, "{longest}");
        // The snapshot holds everything; the journal only what came after it.
        let lines = journal_text(dir.path()).lines().count();
        assert_eq!(lines, 1 + 2, "header + the operations since");
        assert_eq!(SimHost::load(dir.path()).unwrap(), sim.host());
        assert_eq!(
            sim.host().revisions["ns/w@r1"].starts,
            3 * MIN_COMPACTION as u64 / 2
        );
    }

    #[tokio::test]
    async fn a_big_host_compacts_no_more_often_than_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let sim = with_workloads(dir.path(), 1500).await;
        let state = sim.locked();
        // 3001 operations (the namespace, then prepare + activate each), each growing
        // the host by at most one object: compacted at the 1024th line (the minimum,
        // a host of 513 objects), then when the journal caught up with the host (at
        // the 2049th operation: 1025 lines, 1025 objects), and not since.
        assert_eq!(state.journal.generation(), 1 + 2);
        assert_eq!(state.journal.lines(), 3001 - 2049);
    }

    #[tokio::test]
    async fn an_operation_that_cannot_be_journaled_fails_and_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let sim = with_workloads(dir.path(), 1).await;
        let before = sim.host();
        // The journal's handle can no longer write (read-only).
        sim.locked().journal.file = File::open(dir.path().join(JOURNAL_FILE)).unwrap();
        let err = sim.stop(rev("w0")).await.unwrap_err();
        assert!(
            matches!(err, crate::DriverError::Backend { op: "stop", .. }),
            "{err}"
        );
        assert_eq!(sim.host(), before, "undone in memory");
        assert_eq!(SimHost::load(dir.path()).unwrap(), before, "and on disk");
        // The next operation starts the journal again from the host (the failed write
        // may have left part of a line), and what follows is read back whole.
        sim.stop(rev("w0")).await.unwrap();
        sim.ensure_namespace("later").await.unwrap();
        assert_eq!(
            sim.host().revisions["ns/w0@r1"].state,
            BackendState::Stopped
        );
        assert_eq!(SimHost::load(dir.path()).unwrap(), sim.host());
    }

    #[tokio::test]
    async fn an_older_journal_beside_a_newer_snapshot_replays_to_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let sim = with_workloads(dir.path(), 2).await;
        sim.stop(rev("w0")).await.unwrap();
        let old_journal = std::fs::read(dir.path().join(JOURNAL_FILE)).unwrap();
        let host = sim.host();
        // A compaction that crashed between writing the snapshot and the journal.
        sim.locked().journal.compact(&host).unwrap();
        drop(sim);
        std::fs::write(dir.path().join(JOURNAL_FILE), old_journal).unwrap();
        assert_eq!(SimHost::load(dir.path()).unwrap(), host);
        let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
        assert_eq!(sim.host(), host);
    }

    #[test]
    fn a_journal_newer_than_the_snapshot_read_is_never_replayed_over_it() {
        // What a reader sees when a compaction ran between its two reads: the old
        // snapshot and the next generation's journal. It reads again; here (nothing
        // changes any more) it gives up rather than return an old host.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(HOST_FILE),
            r#"{"generation":4,"namespaces":["old"],"revisions":{},"fired":[]}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join(JOURNAL_FILE),
            "{\"follows\":{\"generation\":5}}\n",
        )
        .unwrap();
        assert!(try_load(dir.path()).unwrap().is_none());
        let err = SimHost::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("kept changing"), "{err}");
    }

    #[test]
    fn a_snapshot_written_before_the_journal_existed_loads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(HOST_FILE),
            r#"{"namespaces":["a"],"revisions":{},"fired":[2]}"#,
        )
        .unwrap();
        let host = SimHost::load(dir.path()).unwrap();
        assert!(host.namespaces.contains("a"));
        assert_eq!(host.fired, [2]);
    }
}

use super::super::anchor::{self, Anchor};
use super::super::query::tests::{between, started, stepped_back};
use super::super::{db_lock, LogError};
use crate::testkit::{Log, LogReader};

use capstan_common::answers::LogRequest;
use std::path::Path;

fn seqs(reader: &LogReader, request: LogRequest) -> Vec<u64> {
    reader
        .query(&request)
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect()
}

fn web() -> LogRequest {
    LogRequest {
        namespace: Some("ns".into()),
        workload: Some("web".into()),
        ..LogRequest::default()
    }
}

/// Edits the closed log in `dir` with raw sled.
fn raw(dir: &Path, edit: impl FnOnce(&sled::Db)) {
    {
        let db = sled::Config::new().path(dir).open().unwrap();
        edit(&db);
        db.flush().unwrap();
    }
    db_lock::wait_until_released(&dir.join("db"));
}

fn tree_names(dir: &Path) -> Vec<sled::IVec> {
    let mut names = Vec::new();
    raw(dir, |db| names = db.tree_names());
    names
}

#[test]
fn a_reader_answers_as_the_open_log_does() {
    // Given a log (its clock stepped back), closed
    let dir = tempfile::tempdir().unwrap();
    let log = stepped_back(dir.path());
    let requests = [
        web(),
        LogRequest {
            command: Some("c1".into()),
            ..LogRequest::default()
        },
        between(1500, 3500),
        LogRequest {
            since: 2,
            limit: Some(1),
            ..between(1500, 3500)
        },
        LogRequest {
            since: 1,
            ..LogRequest::default()
        },
    ];
    let expected: Vec<_> = requests.iter().map(|r| log.query(r).unwrap()).collect();
    drop(log);
    // When it is read without being opened for writing
    let reader = LogReader::open(dir.path()).unwrap().unwrap();
    // Then every query has the open log's answer
    for (request, expected) in requests.iter().zip(&expected) {
        assert_eq!(&reader.query(request).unwrap(), expected, "{request:?}");
    }
    assert_eq!(reader.read_since(3).count(), 2);
    // and while it reads, the log cannot be opened for writing (nor the reverse)
    assert!(matches!(
        Log::open(dir.path(), Default::default()),
        Err(LogError::Open { .. })
    ));
    drop(reader);
    let log = Log::open(dir.path(), Default::default()).unwrap();
    assert!(matches!(
        LogReader::open(dir.path()),
        Err(LogError::Open { .. })
    ));
    drop(log);
}

#[test]
fn a_reader_refuses_a_log_in_an_earlier_layout_and_writes_nothing() {
    // Given a log in layout 1 (as builds before 2026-12 wrote it)
    let dir = tempfile::tempdir().unwrap();
    let log = stepped_back(dir.path());
    let expected = log.query(&web()).unwrap();
    drop(log);
    raw(dir.path(), super::super::layout::tests::to_layout_1);
    let names = tree_names(dir.path());
    // When read, then the reader says to start the agent once, and changes nothing
    let err = LogReader::open(dir.path()).err().expect("refused");
    assert!(matches!(err, LogError::OldLayout { .. }), "{err}");
    assert!(err.to_string().contains("start the agent"), "{err}");
    assert_eq!(tree_names(dir.path()), names);
    // and once the log has been opened for writing, it answers as before
    drop(Log::open(dir.path(), Default::default()).unwrap());
    let reader = LogReader::open(dir.path()).unwrap().unwrap();
    assert_eq!(reader.query(&web()).unwrap(), expected);
}

#[test]
fn a_reader_refuses_a_log_whose_conversion_is_not_in_place_yet() {
    // Given a conversion interrupted between its renames: no log, its copy beside
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    drop(stepped_back(&super::super::layout::sibling(
        &dir,
        "converting",
    )));
    // When read, then the reader says to start the agent, and creates no log
    let err = LogReader::open(&dir).err().expect("refused");
    assert!(matches!(err, LogError::OldLayout { .. }), "{err}");
    assert!(!dir.exists());
}

#[test]
fn a_reader_of_no_log_creates_none() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("log");
    assert!(LogReader::open(&missing).unwrap().is_none());
    assert!(!missing.exists());
    // nor in an empty database: no trees are created
    raw(dir.path(), |_| {});
    assert!(LogReader::open(dir.path()).unwrap().is_none());
    assert!(!tree_names(dir.path())
        .iter()
        .any(|n| n.as_ref() == super::super::records::TREE.as_bytes()));
}

#[test]
fn a_reader_shows_nothing_at_or_below_the_anchor() {
    // Given a log whose prune wrote its anchor (seq 2) and crashed before removing
    // records 1 and 2
    let dir = tempfile::tempdir().unwrap();
    let log = stepped_back(dir.path());
    log.append_at(&[started("web", "c5")], 5000).unwrap();
    drop(log);
    raw(dir.path(), |db| {
        let anchor = Anchor {
            seq: 2,
            hash: [0; 32],
            pruned: 2,
            file: "pruned.jsonl".into(),
            intent: crate::testkit::Intent::default(),
        };
        anchor::write(&db.open_tree(anchor::TREE).unwrap(), &anchor).unwrap();
    });
    // When read, then records 1 and 2 are not shown, by any path
    let reader = LogReader::open(dir.path()).unwrap().unwrap();
    assert_eq!(seqs(&reader, web()), [3, 4, 6]);
    assert_eq!(seqs(&reader, between(0, 6000)), [3, 4, 5, 6]);
    let first = reader.read_since(0).next().unwrap().unwrap();
    assert_eq!(first.seq, 3);
}

use super::super::query::tests::{at, started};
use super::super::records::Records;
use super::super::{db_lock, seq_key, LogOptions};
use super::{found, sibling, Found, KEY, OLD_TREES, TREES};
use crate::testkit::Log;
use capstan_common::answers::LogRequest;
use std::path::{Path, PathBuf};

/// Rewrites the closed layout-2 log in `db` as layout 1 wrote it: a key per record
/// in `records`, the old index trees (their contents are never read), no marker.
pub(crate) fn to_layout_1(db: &sled::Db) {
    let old = db.open_tree(OLD_TREES[0]).unwrap();
    let records = Records::new(db.open_tree(TREES[0]).unwrap());
    for item in records.range(0) {
        let (seq, sealed) = item.unwrap();
        old.insert(seq_key(seq), sealed).unwrap();
    }
    for name in &OLD_TREES[1..] {
        db.open_tree(name).unwrap().insert(b"stale", b"").unwrap();
    }
    for name in TREES {
        db.drop_tree(name).unwrap();
    }
    db.remove(KEY).unwrap();
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

/// 300 records: workloads `w0`..`w2`, commands `c0`..`c49`, 7 s apart (so the time
/// index spans many minutes and the lists many blocks).
fn written(dir: &Path) -> Log {
    let log = Log::open(dir, LogOptions::snapshot_every(64)).unwrap();
    for i in 0..300i64 {
        let event = started(&format!("w{}", i % 3), &format!("c{}", i % 50));
        log.append_at(&[event], 1_000_000 + i * 7_000).unwrap();
    }
    log
}

fn requests() -> Vec<LogRequest> {
    let workload = |wl: &str| LogRequest {
        namespace: Some("ns".into()),
        workload: Some(wl.into()),
        ..LogRequest::default()
    };
    let command = |id: &str| LogRequest {
        command: Some(id.into()),
        ..LogRequest::default()
    };
    let times = |from: i64, until: i64| LogRequest {
        since_time: at(from),
        until_time: at(until),
        ..LogRequest::default()
    };
    vec![
        workload("w0"),
        workload("w2"),
        LogRequest {
            since: 150,
            ..workload("w1")
        },
        command("c0"),
        command("c49"),
        command("none"),
        times(1_100_000, 1_500_000),
        times(0, i64::MAX / 2),
        LogRequest {
            since: 7,
            limit: Some(20),
            ..LogRequest::default()
        },
    ]
}

fn answers(log: &Log) -> Vec<Vec<u64>> {
    requests()
        .iter()
        .map(|r| log.query(r).unwrap().iter().map(|r| r.seq).collect())
        .collect()
}

fn tree_names(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    raw(dir, |db| {
        names = db
            .tree_names()
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect()
    });
    names
}

fn layout(dir: &Path) -> Found {
    let mut layout = Found::Empty;
    raw(dir, |db| layout = found(db).unwrap());
    layout
}

/// The raw contents of `tree` in the closed log at `dir`.
fn contents(dir: &Path, tree: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    raw(dir, |db| {
        out = db
            .open_tree(tree)
            .unwrap()
            .iter()
            .map(|e| e.unwrap())
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect()
    });
    out
}

/// A layout-1 log of [`written`]'s history at `dir`; its answers and intent.
fn layout_1(dir: &Path) -> (Vec<Vec<u64>>, crate::testkit::Intent) {
    let log = written(dir);
    let (expected, intent) = (answers(&log), log.intent());
    drop(log);
    raw(dir, to_layout_1);
    assert_eq!(layout(dir), Found::Old);
    (expected, intent)
}

fn leftovers(dir: &Path) -> Vec<PathBuf> {
    ["converting", "layout1"]
        .map(|what| sibling(dir, what))
        .into_iter()
        .filter(|p| p.exists())
        .collect()
}

#[test]
fn a_layout_1_log_is_converted_on_open_and_answers_as_before() {
    // Given a log in layout 1
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (expected, intent) = layout_1(&dir);
    assert!(expected[..5].iter().all(|a| !a.is_empty()) && expected[5].is_empty());
    let snapshots = contents(&dir, "snapshots");
    assert!(!snapshots.is_empty());
    // When it is opened
    let log = Log::open(&dir, LogOptions::snapshot_every(64)).unwrap();
    // Then it answers every query as before, verifies, and keeps its intent
    assert_eq!(log.degraded(), None);
    assert_eq!(answers(&log), expected);
    assert_eq!(log.intent(), intent);
    assert_eq!(log.verify().unwrap(), 300);
    // and new records are stored and indexed in the new layout
    log.append_at(&[started("w0", "c0")], 5_000_000).unwrap();
    let c0 = LogRequest {
        command: Some("c0".into()),
        ..LogRequest::default()
    };
    assert_eq!(log.query(&c0).unwrap().last().unwrap().seq, 301);
    drop(log);
    // and the log is a new database: layout 2, none of layout 1's trees, the
    // snapshots as they were, nothing left beside it
    assert_eq!(layout(&dir), Found::Current);
    let names = tree_names(&dir);
    for old in OLD_TREES {
        assert!(!names.iter().any(|n| n == old), "{old} in {names:?}");
    }
    assert_eq!(contents(&dir, "snapshots"), snapshots);
    assert_eq!(leftovers(&dir), Vec::<PathBuf>::new());
}

#[test]
fn an_unfinished_copy_is_removed_and_the_conversion_done_again() {
    // Given a layout-1 log and, beside it, the copy of a conversion cut short:
    // partial and wrong contents, no marker
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (expected, _) = layout_1(&dir);
    let converting = sibling(&dir, "converting");
    raw(&converting, |db| {
        let chunks = db.open_tree(TREES[0]).unwrap();
        chunks
            .insert(0u64.to_be_bytes(), b"garbage".to_vec())
            .unwrap();
        let commands = db.open_tree(TREES[1]).unwrap();
        commands
            .insert(b"c0\0", 0u32.to_be_bytes().to_vec())
            .unwrap();
    });
    // When opened, then the conversion starts over and every answer is as before
    let log = Log::open(&dir, LogOptions::snapshot_every(64)).unwrap();
    assert_eq!(log.degraded(), None);
    assert_eq!(answers(&log), expected);
    assert_eq!(log.verify().unwrap(), 300);
    drop(log);
    assert_eq!(leftovers(&dir), Vec::<PathBuf>::new());
}

#[test]
fn a_conversion_stopped_between_its_renames_is_put_in_place() {
    // Given the old log moved aside and the finished copy not yet renamed
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (expected, intent) = layout_1(&sibling(&dir, "layout1"));
    drop(written(&sibling(&dir, "converting")));
    assert!(!dir.exists());
    // When opened, then the copy is the log, and the old one is gone
    let log = Log::open(&dir, LogOptions::snapshot_every(64)).unwrap();
    assert_eq!(answers(&log), expected);
    assert_eq!(log.intent(), intent);
    assert_eq!(log.verify().unwrap(), 300);
    drop(log);
    assert_eq!(layout(&dir), Found::Current);
    assert_eq!(leftovers(&dir), Vec::<PathBuf>::new());
}

#[test]
fn a_conversion_stopped_after_its_swap_only_removes_the_old_copy() {
    // Given a converted log and the old one still beside it
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    layout_1(&sibling(&dir, "layout1"));
    let log = written(&dir);
    let expected = answers(&log);
    drop(log);
    let names = tree_names(&dir);
    // When opened, then the old copy goes, and nothing else changes
    let log = Log::open(&dir, LogOptions::snapshot_every(64)).unwrap();
    assert_eq!(answers(&log), expected);
    drop(log);
    assert_eq!(tree_names(&dir), names);
    assert_eq!(leftovers(&dir), Vec::<PathBuf>::new());
}

/// Writes at `dir` what a later build's storage layout `layout` might leave: its
/// marker, the build that wrote it, and a tree of records this build has no name for.
fn newer_layout(dir: &Path, layout: &str) {
    raw(dir, |db| {
        db.insert(b"layout", layout.as_bytes()).unwrap();
        db.insert(b"written_by", &b"9.1.0"[..]).unwrap();
        let records = db.open_tree(format!("records_v{layout}")).unwrap();
        records
            .insert(1u64.to_be_bytes(), &b"a record"[..])
            .unwrap();
    });
}

/// The errors opening `dir` gives, for the agent and for a reader.
fn refusals(dir: &Path) -> [String; 2] {
    let err = |e: super::super::LogError| {
        let mut text = e.to_string();
        if let Some(source) = std::error::Error::source(&e) {
            text = format!("{text}: {source}");
        }
        text
    };
    let log = Log::open(dir, LogOptions::default()).err().map(err);
    let reader = crate::testkit::LogReader::open(dir).err().map(err);
    [
        log.expect("the agent refuses the log"),
        reader.expect("a reader refuses the log"),
    ]
}

#[test]
fn a_log_in_a_newer_layout_is_refused_naming_it_and_its_build_and_left_as_it_is() {
    // Given a log a later build wrote in layout 3
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    newer_layout(&dir, "3");
    let before = tree_names(&dir);
    // When the agent or a reader opens it, then it is refused, saying what it is
    for text in refusals(&dir) {
        assert!(
            text.contains(&format!(
                "the log at {} is in storage layout 3",
                dir.display()
            )) && text.contains("last opened for writing by capstan-agent 9.1.0")
                && text.contains(&format!(
                    "this build (capstan-agent {}) reads storage layouts 1, 2",
                    env!("CARGO_PKG_VERSION")
                )),
            "{text}"
        );
    }
    // and nothing was written to it: no layout 2 beside its records
    assert_eq!(tree_names(&dir), before);
    let mut marker = None;
    raw(&dir, |db| marker = db.get(b"layout").unwrap());
    assert_eq!(marker.as_deref(), Some(&b"3"[..]));
    assert_eq!(leftovers(&dir), Vec::<PathBuf>::new());
}

#[test]
fn data_without_a_marker_this_build_knows_is_refused_not_taken_for_empty() {
    // Given a database with a tree of records under an unknown name and no marker
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    raw(&dir, |db| {
        let t = db.open_tree("chunks_v9").unwrap();
        t.insert(b"k", &b"v"[..]).unwrap();
    });
    // When opened, then it is refused, naming its trees
    for text in refusals(&dir) {
        assert!(
            text.contains(
                "in no storage layout this build knows (no layout marker; its trees: chunks_v9)"
            ),
            "{text}"
        );
    }
    // Given only keys in the default tree (no marker), the same
    let other = root.path().join("other");
    raw(&other, |db| {
        db.insert(b"tip", &7u64.to_be_bytes()[..]).unwrap();
    });
    for text in refusals(&other) {
        assert!(text.contains("no layout marker"), "{text}");
    }
}

#[test]
fn a_log_records_the_last_build_that_opened_it_for_writing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let written_by = |dir: &Path| {
        let mut v = None;
        raw(dir, |db| v = db.get(b"written_by").unwrap());
        v.map(|v| String::from_utf8(v.to_vec()).unwrap())
    };
    drop(Log::open(&dir, LogOptions::default()).unwrap());
    assert_eq!(written_by(&dir).as_deref(), Some(env!("CARGO_PKG_VERSION")));
    // An older build opened it last: this one says it is the last now; a reader
    // writes nothing.
    raw(&dir, |db| {
        db.insert(b"written_by", &b"0.0.9"[..]).unwrap();
    });
    drop(crate::testkit::LogReader::open(&dir).unwrap());
    assert_eq!(written_by(&dir).as_deref(), Some("0.0.9"));
    drop(Log::open(&dir, LogOptions::default()).unwrap());
    assert_eq!(written_by(&dir).as_deref(), Some(env!("CARGO_PKG_VERSION")));
    // A converted log says which build converted it.
    let old = root.path().join("old");
    layout_1(&old);
    drop(Log::open(&old, LogOptions::default()).unwrap());
    assert_eq!(written_by(&old).as_deref(), Some(env!("CARGO_PKG_VERSION")));
}

/// Makes the test below the child it starts: the log the child opens.
const OPEN_IN_CHILD: &str = "CAPSTAN_TEST_OPEN_LOG_IN_CHILD";

/// Opens the log at `dir` in a child process (this test binary, running only `test`)
/// whose writes stop `limit` bytes into any file, the way a full disk stops them
/// (`ulimit -f`, with SIGXFSZ ignored: a write past the limit fails with EFBIG).
/// Returns what the open said: `ok`, or the error and its causes. A child that has
/// not exited after a minute is killed, failing the test: the open hung.
fn open_in_child(test: &str, dir: &Path, limit: u64) -> String {
    let child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            r#"ulimit -f {} && trap '' XFSZ && exec "$0" "$@""#,
            limit / 512
        ))
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(OPEN_IN_CHILD, dir)
        .env(LIMIT_IN_CHILD, limit.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("opening the log hung (the child was killed after a minute)");
        }
    };
    assert!(out.status.success(), "the child failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.split_once("open: ").map(|(_, said)| said.to_string()))
        .unwrap_or_else(|| panic!("the child did not say how its open went: {out:?}"))
}

/// The file size limit the child runs under, to check `ulimit -f` set it.
const LIMIT_IN_CHILD: &str = "CAPSTAN_TEST_FILE_SIZE_LIMIT";

/// In the child: opens the log at `dir` and prints what happened.
fn open_here(dir: &str) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let fsize = limits.lines().find(|l| l.starts_with("Max file size"));
    let soft = fsize.and_then(|l| l.split_whitespace().nth(3));
    assert_eq!(
        soft,
        std::env::var(LIMIT_IN_CHILD).ok().as_deref(),
        "{fsize:?}"
    );
    let said = match Log::open(Path::new(dir), LogOptions::snapshot_every(64)) {
        Ok(_) => "ok".to_string(),
        Err(e) => capstan_common::report(&e),
    };
    println!("open: {said}");
}

#[test]
fn a_conversion_that_runs_out_of_space_fails_naming_why_and_loses_nothing() {
    if let Ok(dir) = std::env::var(OPEN_IN_CHILD) {
        return open_here(&dir);
    }
    // Given a layout-1 log with a record larger than the space the conversion will
    // find (sled writes it to a file of its own, from its start)
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = written(&dir);
    let mut spec = crate::testkit::spec();
    spec.env.insert("BIG".into(), "x".repeat(4 << 20));
    let big = crate::testkit::prepared("big", spec);
    log.append_at(&[big], 9_000_000).unwrap();
    let (expected, intent) = (answers(&log), log.intent());
    drop(log);
    raw(&dir, to_layout_1);
    let (records, snapshots) = (contents(&dir, OLD_TREES[0]), contents(&dir, "snapshots"));
    assert_eq!(records.len(), 301);
    // Room for what opening the old log writes (within its `db` file), not for the
    // big record's copy.
    let old_db = std::fs::metadata(dir.join("db")).unwrap().len();
    let limit = (old_db / (512 << 10) + 2) * (512 << 10);
    assert!(limit < 4 << 20);
    // When the agent opens it, and the copy runs out of space
    let said = open_in_child(
        "layout::tests::a_conversion_that_runs_out_of_space_fails_naming_why_and_loses_nothing",
        &dir,
        limit,
    );
    // Then the open fails, saying it could not convert the log and why
    let converting = sibling(&dir, "converting");
    assert_eq!(
        said,
        format!(
            "cannot convert the log to the current storage layout at {}: File too large (os error 27)",
            converting.display()
        )
    );
    // and the layout-1 log is as it was, still read as one; the copy is left unfinished
    assert_eq!(layout(&dir), Found::Old);
    assert_eq!(contents(&dir, OLD_TREES[0]), records);
    assert_eq!(contents(&dir, "snapshots"), snapshots);
    let reader = crate::testkit::LogReader::open(&dir)
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        reader,
        Some(format!("the log at {} is in an earlier storage layout: start the agent once (it converts the log when it opens it), then read it", dir.display()))
    );
    assert_eq!(leftovers(&dir), vec![converting.clone()]);
    assert_ne!(layout(&converting), Found::Current);
    // When opened with room, then the unfinished copy is not taken for the log: the
    // conversion is done again, and nothing is lost
    let log = Log::open(&dir, LogOptions::snapshot_every(64)).unwrap();
    assert_eq!(log.degraded(), None);
    assert_eq!(answers(&log), expected);
    assert_eq!(log.intent(), intent);
    assert_eq!(log.verify().unwrap(), 301);
    drop(log);
    assert_eq!(layout(&dir), Found::Current);
    assert_eq!(leftovers(&dir), Vec::<PathBuf>::new());
}

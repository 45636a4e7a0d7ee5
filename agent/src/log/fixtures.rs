//! Upgrade safety against real data: each `tests/fixtures/log-vN.tar.gz` holds a data
//! dir written by the build that stored format N, and that build's answers about it
//! (`expected/log.jsonl`, `intent.json`, `verify.txt`). This build must open it (not
//! degraded), verify it, show every record and the intent exactly as that build did,
//! and carry out new commands after it, in one chain of mixed format versions.
//!
//! Every later format adds its own fixture (made by a committed `make-log-vN.sh`); old
//! fixtures stay for ever. `log-v2-pruned.tar.gz` is log-v2 after retention pruned it:
//! its stored anchor (with the intent at the cut) and its export file. The fixtures of
//! builds before storage layout 2 are converted when opened (see [`super::layout`]);
//! `log-v2-layout2.tar.gz` is the same history written in layout 2, opened as it is.

use super::{stored, Log, LogOptions};
use crate::executor::Executor;
use crate::intent::Intent;
use capstan_common::{Command, Op, Outcome, Spec};
use capstan_driver::sim::{SimConfig, SimDriver};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An unpacked fixture.
struct Fixture {
    _dir: tempfile::TempDir,
    data: PathBuf,
    log_lines: Vec<String>,
    intent: String,
    verify: String,
}

impl Fixture {
    fn unpack(name: &str) -> Fixture {
        let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(name);
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("tar")
            .arg("-C")
            .arg(dir.path())
            .arg("-xzf")
            .arg(&archive)
            .status()
            .expect("run tar");
        assert!(status.success(), "cannot unpack {}", archive.display());
        let expected =
            |file: &str| std::fs::read_to_string(dir.path().join("expected").join(file)).unwrap();
        Fixture {
            data: dir.path().join("data"),
            log_lines: expected("log.jsonl").lines().map(String::from).collect(),
            intent: expected("intent.json").trim_end().to_string(),
            verify: expected("verify.txt").trim_end().to_string(),
            _dir: dir,
        }
    }

    fn open(&self) -> Log {
        let log = Log::open(&self.data.join("log"), LogOptions::default()).unwrap();
        assert_eq!(log.degraded(), None);
        log
    }
}

/// The format version byte of every stored record, in seq order.
fn versions(log: &Log) -> Vec<u8> {
    log.stored_records()
        .unwrap()
        .iter()
        .map(|(_, v)| v[0])
        .collect()
}

/// The seq and format version of every stored snapshot.
fn snapshots(log: &Log) -> Vec<(u64, u8)> {
    let stored = log.stored_snapshots();
    stored.iter().map(|(seq, v)| (*seq, v[0])).collect()
}

fn replay(log: &Log) -> Intent {
    let mut intent = Intent::default();
    for r in log.read_since(0) {
        let r = r.unwrap();
        intent.apply(r.seq, &r.event);
    }
    intent
}

/// Every query through an index answers what a scan of the records answers: each
/// command id's records, each workload's, and the records of each minute and of
/// a range cutting through minutes.
fn indexes_agree(log: &Log) {
    use capstan_common::answers::LogRequest;
    use std::collections::BTreeSet;
    let all: Vec<_> = log.read_since(0).map(|r| r.unwrap()).collect();
    let scan = |request: &LogRequest| -> Vec<u64> {
        all.iter()
            .filter(|r| r.matches(request))
            .map(|r| r.seq)
            .collect()
    };
    let indexed = |request: &LogRequest| -> Vec<u64> {
        assert!(super::uses_index(request));
        log.query(request).unwrap().iter().map(|r| r.seq).collect()
    };
    let mut requests = BTreeSet::new();
    for r in &all {
        if let Some(id) = r.event.command_id() {
            requests.insert((Some(id.to_string()), None, None));
        }
        if let (Some(ns), Some(wl)) = (r.event.namespace(), r.event.workload()) {
            requests.insert((None, Some(ns.to_string()), Some(wl.to_string())));
        }
    }
    assert!(requests.len() > 100, "a real history: {}", requests.len());
    for (command, namespace, workload) in requests {
        let request = LogRequest {
            command,
            namespace,
            workload,
            ..LogRequest::default()
        };
        let expected = scan(&request);
        assert!(!expected.is_empty());
        assert_eq!(indexed(&request), expected, "{request:?}");
    }
    let at = chrono::DateTime::from_timestamp_millis;
    let (first, last) = (all[0].at_ms, all[all.len() - 1].at_ms);
    for (from, until) in [
        (first, last + 1),
        (first + 1, first + 61_000),
        ((first + last) / 2, last),
    ] {
        let request = LogRequest {
            since_time: at(from),
            until_time: at(until),
            ..LogRequest::default()
        };
        assert_eq!(indexed(&request), scan(&request), "{from}..{until}");
    }
}

/// Opens the fixture and checks every answer its build gave; returns the open log.
fn reads_as_written(fx: &Fixture) -> Log {
    let log = fx.open();
    let count = fx.log_lines.len() as u64;
    assert_eq!(fx.verify, format!("ok {count} records"));
    assert_eq!(log.verify().unwrap(), count);
    assert_eq!(log.last_seq(), count);
    let mut shown = 0;
    for (record, line) in log.read_since(0).zip(&fx.log_lines) {
        let record = record.unwrap();
        assert_eq!(&record.to_json().to_string(), line, "record {}", record.seq);
        shown += 1;
    }
    assert_eq!(shown, fx.log_lines.len());
    assert_eq!(as_written(&log.intent()), fx.intent);
    assert_eq!(log.intent(), replay(&log));
    indexes_agree(&log);
    log
}

fn command(id: &str, op: Op) -> Command {
    Command {
        v: 1,
        id: id.into(),
        host: "fixture-host".into(),
        issued_at: chrono::Utc::now(),
        deadline: None,
        op,
    }
}

/// Carries out new commands after the fixture's last record; returns the intent after.
fn takes_new_commands(fx: &Fixture, log: Log) -> Intent {
    let before = log.last_seq();
    let log = Arc::new(log);
    let driver = Arc::new(SimDriver::open(&fx.data, SimConfig::default()).unwrap());
    let executor = Executor::new("fixture-host", Arc::clone(&log), driver);
    let spec: Spec = serde_json::from_str(
        r#"{"driver":"sim","image":"shop/web:r90","command":["serve"],"env":{"REV":"r90"},
            "working_dir":"/srv","mounts":[{"source":"/var/lib/shop","target":"/data"}],
            "ports":[{"container_port":80,"host_port":18090}]}"#,
    )
    .unwrap();
    let (ns, wl) = ("shop".to_string(), "web".to_string());
    let commands = [
        command(
            "upgrade-prep",
            Op::PrepareRevision {
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: "r90".into(),
                spec,
            },
        ),
        command(
            "upgrade-act",
            Op::ActivateRevision {
                namespace: ns.clone(),
                workload: wl.clone(),
                revision: "r90".into(),
            },
        ),
        command(
            "upgrade-retire",
            Op::RetireRevision {
                namespace: ns.clone(),
                workload: wl,
                revision: "r85".into(),
            },
        ),
        command(
            "upgrade-start",
            Op::StartWorkload {
                namespace: ns,
                workload: "worker".into(),
            },
        ),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for c in commands {
        let id = c.id.clone();
        let result = runtime.block_on(executor.execute(c));
        assert_eq!(
            result.outcome,
            Outcome::Succeeded,
            "{id}: {:?}",
            result.error
        );
    }
    let first = log.get(before + 1).unwrap().unwrap();
    assert_eq!(first.event.command_id(), Some("upgrade-prep"));
    assert!(log.last_seq() > before + 8);
    // A pruned log verifies (and stores) the records after its anchor.
    let anchored = log.anchor().unwrap().map_or(0, |a| a.seq);
    assert_eq!(
        log.verify().unwrap(),
        log.last_seq() - anchored,
        "one intact chain"
    );
    let versions = versions(&log);
    assert!(versions[(before - anchored) as usize..]
        .iter()
        .all(|v| *v == stored::CURRENT));
    log.intent()
}

#[test]
fn a_format_1_log_opens_reads_and_grows() {
    let fx = Fixture::unpack("log-v1.tar.gz");
    let log = reads_as_written(&fx);
    assert!(versions(&log).iter().all(|v| *v == 1));
    // The format-1 snapshots (2048, 3072) are ignored: the replay was long enough
    // (from seq 1) that open wrote a current snapshot where it ended.
    let kept = snapshots(&log);
    assert_eq!(kept.len(), 2);
    assert_eq!(kept[0].1, 1, "the newest format-1 snapshot, near 3072");
    assert_eq!(kept[1], (3339, capstan_log::SNAPSHOT_VERSION));
    drop(log);
    let log = fx.open();
    assert_eq!(log.since_snapshot(), 0, "opened from 3339");
    assert_eq!(as_written(&log.intent()), fx.intent);

    let after = takes_new_commands(&fx, log);
    // Reopened: the same intent, from a current snapshot or from the mixed chain.
    let log = fx.open();
    assert_eq!(log.intent(), after);
    assert_eq!(replay(&log), after, "a full replay of formats 1 and 2");
    for (record, line) in log.read_since(0).zip(&fx.log_lines) {
        assert_eq!(&record.unwrap().to_json().to_string(), line);
    }
}

#[test]
fn a_format_2_log_opens_reads_and_grows() {
    let fx = Fixture::unpack("log-v2.tar.gz");
    let log = reads_as_written(&fx);
    assert!(versions(&log).iter().all(|v| *v == 2));
    // Its own snapshots (format 2, before the grant ledger) are ignored: the replay
    // from seq 1 was long enough that open wrote a current snapshot where it ended.
    let newest = snapshots(&log).last().copied().unwrap();
    assert_eq!(newest, (log.last_seq(), capstan_log::SNAPSHOT_VERSION));
    assert_eq!(log.since_snapshot(), 0);
    let after = takes_new_commands(&fx, log);
    let log = fx.open();
    assert_eq!(log.intent(), after);
    assert_eq!(replay(&log), after);
}

#[test]
fn a_layout_2_log_opens_as_it_is_reads_and_grows() {
    // log-v2's history, written by the first build with storage layout 2
    // (make-log-v2-layout2.sh).
    let fx = Fixture::unpack("log-v2-layout2.tar.gz");
    let layout = super::layout_of(&fx.data.join("log")).unwrap();
    assert_eq!(layout.as_deref(), Some(super::current_layout()));
    let log = reads_as_written(&fx);
    assert!(versions(&log).iter().all(|v| *v == 2));
    let after = takes_new_commands(&fx, log);
    let log = fx.open();
    assert_eq!(log.intent(), after);
    assert_eq!(replay(&log), after);
    indexes_agree(&log);
}

#[test]
fn a_pruned_format_2_log_opens_from_its_anchor_reads_and_grows() {
    // log-v2 after the first build with retention pruned it (make-log-v2-pruned.sh).
    let fx = Fixture::unpack("log-v2-pruned.tar.gz");
    let log = fx.open();
    let anchor = log.anchor().unwrap().expect("the stored anchor");
    let seq_of = |line: &str| {
        serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"]
            .as_u64()
            .unwrap()
    };
    let kept = fx.log_lines.len() as u64;
    assert_eq!(seq_of(&fx.log_lines[0]), anchor.seq + 1);
    assert_eq!(anchor.pruned, anchor.seq, "everything up to it was pruned");
    assert!(
        fx.verify
            .starts_with(&format!("ok {kept} records from anchor seq {}", anchor.seq)),
        "{}",
        fx.verify
    );
    assert_eq!(log.verify().unwrap(), kept);
    assert_eq!(log.last_seq(), anchor.seq + kept);
    for (record, line) in log.read_since(0).zip(&fx.log_lines) {
        let record = record.unwrap();
        assert_eq!(&record.to_json().to_string(), line, "record {}", record.seq);
    }
    assert_eq!(log.read_since(0).count() as u64, kept);
    assert_eq!(as_written(&log.intent()), fx.intent);
    // The export file is the pruned records, one chain ending at the anchor.
    let export_dir = fx.data.with_file_name("export-files");
    let mut files: Vec<_> = std::fs::read_dir(&export_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let text: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let chain = super::export::Chain::verify::<crate::event::Event>(text.lines())
        .unwrap()
        .expect("exported records");
    assert_eq!((chain.first, chain.last), (1, anchor.seq));
    assert_eq!(chain.first_prev, [0; 32]);
    assert_eq!(chain.last_hash, anchor.hash);

    let after = takes_new_commands(&fx, log);
    let log = fx.open();
    assert_eq!(log.intent(), after);
    assert_eq!(log.verify().unwrap(), log.last_seq() - anchor.seq);
    drop(log);

    // Pruned again by this build (a snapshot at the end, so all may go): it keeps
    // what it pruned of the new commands, in trees the fixture's build did not have.
    // The commands that build pruned were not kept (it kept nothing of them).
    let log = Log::open(&fx.data.join("log"), LogOptions::snapshot_every(1)).unwrap();
    let policy = super::retention::Policy {
        max_records: Some(1),
        max_age: None,
        export_dir: fx.data.with_file_name("export-again"),
        interval: std::time::Duration::from_secs(1),
        pruned_ids_max_age: std::time::Duration::from_secs(30 * 86_400),
    };
    let now = chrono::Utc::now().timestamp_millis();
    while log.prune(&policy, log.last_seq(), now).unwrap().is_some() {}
    assert!(log.for_command("upgrade-act").unwrap().is_empty());
    let kept = log.pruned_command("upgrade-act").unwrap().expect("kept");
    assert_eq!(kept.outcome, Outcome::Succeeded);
    let old_id = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["kind"] == "command_received")
        .and_then(|l| l["command_id"].as_str().map(str::to_string))
        .expect("a command in the first export");
    assert_eq!(log.pruned_command(&old_id).unwrap(), None);
    assert_eq!(log.intent(), after);
}

/// The intent's JSON as the builds that wrote the fixtures showed it: before the grant
/// ledger (which these logs' hook records fold to; its own tests are in
/// `crate::grants`).
fn as_written(intent: &Intent) -> String {
    let mut json = serde_json::to_value(intent.answer()).expect("answers serialise");
    json.as_object_mut().unwrap().remove("grants");
    json.to_string()
}

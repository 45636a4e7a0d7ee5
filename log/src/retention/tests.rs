use super::*;
use crate::testkit::{Cause, Event, Log};
use crate::LogOptions;
use capstan_common::answers::LogRequest;

fn bounds() -> Bounds {
    Bounds {
        first: 1,
        last: 100,
        published: 100,
        snapshot: Some(90),
        aged: None,
        in_flight: None,
    }
}

#[test]
fn given_only_a_count_when_the_log_is_longer_then_the_excess_is_prunable() {
    assert_eq!(prunable(Some(30), &bounds()), Some(70));
}

#[test]
fn given_a_count_when_the_log_is_within_it_then_nothing_is_prunable() {
    assert_eq!(prunable(Some(100), &bounds()), None);
    assert_eq!(prunable(Some(500), &bounds()), None);
}

#[test]
fn given_records_not_yet_published_when_the_policy_asks_for_them_then_they_stay() {
    let b = Bounds {
        published: 40,
        ..bounds()
    };
    assert_eq!(prunable(Some(10), &b), Some(40));
    let b = Bounds {
        published: 0,
        ..bounds()
    };
    assert_eq!(prunable(Some(10), &b), None);
}

#[test]
fn given_a_snapshot_when_the_policy_asks_for_more_then_the_snapshot_and_all_after_it_stay() {
    assert_eq!(prunable(Some(1), &bounds()), Some(89));
    let b = Bounds {
        snapshot: None,
        ..bounds()
    };
    assert_eq!(
        prunable(Some(1), &b),
        None,
        "no snapshot: nothing rebuilds the intent"
    );
}

#[test]
fn given_an_age_when_records_are_older_then_they_are_prunable_even_under_the_count() {
    let b = Bounds {
        aged: Some(50),
        ..bounds()
    };
    assert_eq!(prunable(Some(1000), &b), Some(50));
    assert_eq!(prunable(None, &b), Some(50));
    assert_eq!(prunable(Some(80), &b), Some(50), "the larger of the two");
    assert_eq!(prunable(Some(20), &b), Some(80), "the larger of the two");
}

#[test]
fn given_an_anchor_when_everything_before_it_is_gone_then_only_later_records_are_prunable() {
    let b = Bounds {
        first: 71,
        ..bounds()
    };
    assert_eq!(prunable(Some(30), &b), None);
    assert_eq!(prunable(Some(20), &b), Some(80));
}

#[test]
fn given_a_huge_backlog_when_pruning_then_one_prune_takes_at_most_a_batch() {
    let b = Bounds {
        first: 1,
        last: 1_000_000,
        published: 1_000_000,
        snapshot: Some(999_000),
        aged: None,
        in_flight: None,
    };
    assert_eq!(prunable(Some(10), &b), Some(MAX_BATCH));
}

#[test]
fn given_a_command_in_flight_when_the_policy_asks_for_more_then_it_and_all_after_it_stay() {
    let b = Bounds {
        in_flight: Some(40),
        ..bounds()
    };
    assert_eq!(prunable(Some(1), &b), Some(39));
    assert_eq!(prunable(Some(80), &b), Some(20), "less asked for");
    let b = Bounds {
        in_flight: Some(1),
        ..bounds()
    };
    assert_eq!(
        prunable(Some(1), &b),
        None,
        "in flight from the first record"
    );
}

#[test]
fn the_config_is_off_by_default_and_checked() {
    assert_eq!(RetentionConfig::default().policy(3600).unwrap(), None);
    let dir = Some(PathBuf::from("/var/lib/capstan/export"));
    let ok = RetentionConfig {
        max_records: Some(5),
        export_dir: dir.clone(),
        ..RetentionConfig::default()
    };
    let policy = ok.policy(3600).unwrap().unwrap();
    assert_eq!(policy.interval, Duration::from_secs(60));
    assert_eq!(policy.pruned_ids_max_age, Duration::from_secs(30 * 86_400));
    let long_signing = ok.policy(40 * 86_400).unwrap().unwrap();
    assert_eq!(
        long_signing.pruned_ids_max_age,
        Duration::from_secs(47 * 86_400),
        "by default at least the floor"
    );
    for (bad, says) in [
        (
            RetentionConfig {
                max_records: Some(0),
                ..ok.clone()
            },
            "max_records",
        ),
        (
            RetentionConfig {
                max_age_secs: Some(0),
                ..ok.clone()
            },
            "max_age_secs",
        ),
        (
            RetentionConfig {
                export_dir: None,
                ..ok.clone()
            },
            "export_dir",
        ),
        (
            RetentionConfig {
                export_dir: Some("rel".into()),
                ..ok.clone()
            },
            "absolute",
        ),
        (
            RetentionConfig {
                interval_secs: Some(0),
                ..ok.clone()
            },
            "interval_secs",
        ),
        (
            RetentionConfig {
                pruned_ids_max_age_secs: Some(7 * 86_400),
                ..ok.clone()
            },
            "`pruned_ids_max_age_secs` must be at least 608400",
        ),
    ] {
        let err = bad.policy(3600).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    }
}

fn started(i: u64) -> Event {
    Event::WorkloadStarted {
        cause: Cause::Command(format!("c-{i}")),
        namespace: "ns".into(),
        workload: format!("w{}", i % 7),
        revision: format!("r{i}"),
        previous: None,
    }
}

/// Given a log of `n` records with a snapshot every 10, open in `dir`.
fn log_of(dir: &std::path::Path, n: u64) -> Log {
    let log = Log::open(dir, LogOptions::snapshot_every(10)).unwrap();
    for i in 1..=n {
        log.append(&[started(i)]).unwrap();
    }
    log.flush().unwrap();
    log
}

fn policy(dir: &std::path::Path, keep: u64) -> Policy {
    Policy {
        max_records: Some(keep),
        max_age: None,
        export_dir: dir.join("export"),
        interval: Duration::from_secs(1),
        pruned_ids_max_age: Duration::from_secs(30 * 86_400),
    }
}

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_prune_exports_first_then_anchors_and_the_log_reopens_to_the_same_intent() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("log");
    let (intent, pruned) = {
        let log = log_of(&db, 55);
        let pruned = log.prune(&policy(dir.path(), 20), 55, 0).unwrap().unwrap();
        // The newest snapshot is at 50: records 1..=35 asked for, all allowed.
        assert_eq!((pruned.first, pruned.last), (1, 35));
        assert_eq!(log.prune(&policy(dir.path(), 20), 55, 0).unwrap(), None);
        let anchor = log.anchor().unwrap().unwrap();
        assert_eq!((anchor.seq, anchor.pruned), (35, 35));
        assert_eq!(log.read_since(0).next().unwrap().unwrap().seq, 36);
        assert!(log.for_command("c-3").unwrap().is_empty());
        assert_eq!(log.for_command("c-40").unwrap().len(), 1);
        // No index finds a pruned record: by workload, by time.
        let seqs = |request: LogRequest| -> Vec<u64> {
            log.query(&request).unwrap().iter().map(|r| r.seq).collect()
        };
        let w3 = seqs(LogRequest {
            namespace: Some("ns".into()),
            workload: Some("w3".into()),
            ..LogRequest::default()
        });
        assert_eq!(w3, [38, 45, 52], "w3 is every 7th from 3, after 35");
        let all_time = seqs(LogRequest {
            since_time: Some(chrono::DateTime::UNIX_EPOCH),
            ..LogRequest::default()
        });
        assert_eq!(all_time, (36..=55).collect::<Vec<_>>());
        assert_eq!(log.verify().unwrap(), 20, "verified from the anchor on");
        (log.intent(), pruned)
    };
    let file = lines(&pruned.file);
    assert_eq!(file.len(), 35);
    let chain = export::Chain::verify::<Event>(file.iter().map(String::as_str))
        .unwrap()
        .unwrap();
    let log = Log::open(&db, LogOptions::snapshot_every(10)).unwrap();
    let anchor = log.anchor().unwrap().unwrap();
    assert_eq!(
        (chain.first, chain.last, chain.first_prev),
        (1, 35, [0; 32])
    );
    assert_eq!(chain.last_hash, anchor.hash);
    assert_eq!(log.intent(), intent);
    assert!(log.degraded().is_none());
    assert_eq!(log.verify().unwrap(), 20);
    log.append(&[started(56)]).unwrap();
    assert_eq!(log.verify().unwrap(), 21);
}

#[test]
fn the_outbox_and_the_snapshot_bound_a_prune() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_of(&dir.path().join("log"), 55);
    let p = policy(dir.path(), 1);
    assert_eq!(log.prune(&p, 0, 0).unwrap(), None, "nothing published");
    assert_eq!(log.prune(&p, 12, 0).unwrap().unwrap().last, 12);
    assert_eq!(
        log.prune(&p, 55, 0).unwrap().unwrap().last,
        49,
        "up to the snapshot at 50"
    );
    assert_eq!(log.anchor().unwrap().unwrap().pruned, 49);
}

#[test]
fn max_age_prunes_only_records_older_than_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_of(&dir.path().join("log"), 25);
    let p = Policy {
        max_records: None,
        max_age: Some(Duration::from_secs(3600)),
        ..policy(dir.path(), 1)
    };
    let now = chrono::Utc::now().timestamp_millis();
    assert_eq!(
        log.prune(&p, 25, now).unwrap(),
        None,
        "all younger than an hour"
    );
    let later = now + 2 * 3600 * 1000;
    assert_eq!(log.prune(&p, 25, later).unwrap().unwrap().last, 19);
}

#[test]
fn a_tampered_export_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_of(&dir.path().join("log"), 30);
    let pruned = log.prune(&policy(dir.path(), 5), 30, 0).unwrap().unwrap();
    let good = lines(&pruned.file);
    let check = |lines: &[String]| export::Chain::verify::<Event>(lines.iter().map(String::as_str));
    assert!(check(&good).is_ok());
    let mut edited = good.clone();
    edited[3] = edited[3].replace("\"r4\"", "\"r9\"");
    assert_ne!(edited, good);
    let err = check(&edited).unwrap_err().to_string();
    assert!(err.contains("line 4") && err.contains("edited"), "{err}");
    let mut dropped = good.clone();
    dropped.remove(5);
    assert!(check(&dropped).unwrap_err().to_string().contains("follows"));
    let mut restored = good.clone();
    let mut json: serde_json::Value = serde_json::from_str(&restored[2]).unwrap();
    json["stored"] = json["stored"].as_str().unwrap().replace("72", "73").into();
    restored[2] = json.to_string();
    let err = check(&restored).unwrap_err();
    assert!(
        matches!(&err, export::ExportError::Bad { line: 3, why } if why.contains("does not hash")),
        "{err}"
    );
}

#[test]
fn a_crash_between_export_and_prune_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("log");
    let p = policy(dir.path(), 5);
    // A crash after an export of 1..=7 whose anchor was never written: the file is
    // there, the records too.
    let leftover = export::file_name(&p.export_dir, 1, 7);
    std::fs::create_dir_all(&p.export_dir).unwrap();
    std::fs::write(&leftover, "partial").unwrap();
    let log = log_of(&db, 30);
    let third = log.records.get(3).unwrap().unwrap();
    let pruned = log.prune(&p, 30, 0).unwrap().unwrap();
    assert_eq!((pruned.first, pruned.last), (1, 25));
    assert!(!leftover.exists(), "the interrupted export is replaced");
    let names = std::fs::read_dir(&p.export_dir).unwrap().count();
    assert_eq!(names, 1);
    // A crash after the anchor, before the records went: they come back on disk.
    log.records.put_raw(3, &third).unwrap();
    log.by_command
        .transaction(|tx| {
            super::super::postings::push(tx, b"c-3", &3u64.to_be_bytes(), 8)?;
            Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
        })
        .unwrap();
    // What a reader racing the removal sees too: records at or below the anchor are
    // still stored, and no read shows them.
    assert!(log.records.get(3).unwrap().is_some());
    assert!(!super::super::postings::read(&log.by_command, b"c-3")
        .unwrap()
        .is_empty());
    assert!(log.for_command("c-3").unwrap().is_empty());
    assert_eq!(log.get(3).unwrap(), None);
    assert_eq!(log.read_since(0).next().unwrap().unwrap().seq, 26);
    let everything = capstan_common::answers::LogRequest::default();
    assert!(log.query(&everything).unwrap().iter().all(|r| r.seq > 25));
    let exported = log.export_lines(0, 30, 100).unwrap();
    assert_eq!(exported.len(), 5, "26..=30");
    let intent = log.intent();
    drop(log);
    let log = Log::open(&db, LogOptions::snapshot_every(10)).unwrap();
    assert!(log.degraded().is_none());
    assert_eq!(log.intent(), intent);
    assert!(log.records.get(3).unwrap().is_none(), "finished on open");
    assert!(log.for_command("c-3").unwrap().is_empty());
    assert_eq!(log.verify().unwrap(), 5);
}

#[test]
fn export_files_link_to_the_anchor_and_to_the_records_kept() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_of(&dir.path().join("log"), 30);
    let p = policy(dir.path(), 1);
    let a = log.prune(&p, 10, 0).unwrap().unwrap();
    let b = log.prune(&p, 20, 0).unwrap().unwrap();
    let chain = |path: &std::path::Path| {
        let lines = lines(path);
        export::Chain::verify::<Event>(lines.iter().map(String::as_str))
            .unwrap()
            .unwrap()
    };
    let anchor = log.anchor().unwrap().map(|a| (a.seq, a.hash));
    let in_log = |seq: u64| {
        let lines = log.export_lines(seq - 1, seq, 1).unwrap();
        let hash = lines.first()?["hash"].as_str().and_then(export::unhex)?;
        <[u8; 32]>::try_from(hash).ok()
    };
    let ok = export::link(&mut [chain(&b.file), chain(&a.file)], anchor, in_log).unwrap();
    assert!(ok.contains("records 1..=20"), "{ok}");
    let alone = export::link(&mut [chain(&a.file)], anchor, in_log).unwrap_err();
    assert!(alone.to_string().contains("later export files"), "{alone}");
    let gap = export::link(&mut [chain(&b.file)], anchor, in_log).unwrap();
    assert!(gap.contains("earlier records not given"), "{gap}");
    // An export of kept records links through the log's own record.
    let kept = log.export_lines(20, 25, 100).unwrap();
    let text: Vec<String> = kept.iter().map(|l| l.to_string()).collect();
    let mut c = [
        export::Chain::verify::<Event>(text.iter().map(String::as_str))
            .unwrap()
            .unwrap(),
    ];
    assert!(export::link(&mut c, anchor, in_log).is_ok());
    // A forged anchor (the log altered after the export) is found.
    let forged = anchor.map(|(s, _)| (s, [7; 32]));
    let err = export::link(&mut [chain(&b.file)], forged, in_log).unwrap_err();
    assert!(err.to_string().contains("altered"), "{err}");
}

#[test]
fn a_prune_during_a_verification_is_no_defect_the_verification_goes_on_from_the_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_of(&dir.path().join("log"), 55);
    let mut verifier = crate::verify::Verifier::new(&log).unwrap();
    assert!(!verifier.step(&log, 5).unwrap());
    log.prune(&policy(dir.path(), 20), 55, 0).unwrap().unwrap();
    while !verifier.step(&log, 5).unwrap() {}
    assert_eq!(verifier.finish().unwrap(), 5 + 20);
    // A record missing without a prune is still a defect.
    log.records.remove_raw(45).unwrap();
    let err = log.verify().unwrap_err();
    assert!(
        matches!(
            err,
            LogError::Corrupt(crate::Corruption {
                seq: 45,
                defect: crate::Defect::OutOfSequence
            })
        ),
        "{err:?}"
    );
}

//! What a prune keeps of the commands it removes: every one whose `command_received`
//! it removed, with its content and how it completed (also when it completed after
//! the cut), through a reopen; a prune never cuts through a command in flight; and
//! the set is bounded by its window.

use super::*;
use crate::retention::Policy;
use crate::testkit::{command, Event, Log};
use crate::LogOptions;
use std::time::Duration;

const DAY_MS: i64 = 86_400_000;
const DAY: Duration = Duration::from_secs(86_400);
/// The agent's clock in these tests.
const T0: i64 = 1_800_000_000_000;

fn ns(namespace: &str) -> capstan_common::Op {
    capstan_common::Op::EnsureNamespace {
        namespace: namespace.into(),
    }
}

fn received(id: &str) -> Event {
    let c = command(id, ns(id));
    Event::CommandReceived {
        command_id: id.into(),
        op: "ensure_namespace".into(),
        namespace: id.into(),
        workload: None,
        revision: None,
        command: c.to_json(),
    }
}

fn done(id: &str, code: Option<ErrorCode>) -> Event {
    Event::CommandCompleted {
        command_id: id.into(),
        outcome: code.map_or(Outcome::Succeeded, |_| Outcome::Failed),
        code,
        message: code.map(|_| "it failed".to_string()),
    }
}

fn filler(i: u64) -> Event {
    Event::NamespaceReady {
        command_id: format!("f{i}"),
        namespace: "ns".into(),
    }
}

fn policy(dir: &std::path::Path) -> Policy {
    Policy {
        max_records: Some(1),
        max_age: None,
        export_dir: dir.join("export"),
        interval: Duration::from_secs(1),
        pruned_ids_max_age: Duration::from_secs(30 * 86_400),
    }
}

/// Given a log in `dir` holding, in seq order: `a` received and completed (1, 2), `b`
/// received and failed (3, 4), `late` received (5), `c` received (6) and completed
/// (7), `late` completed (8), then fillers to 12 (a snapshot every 4).
fn given(dir: &std::path::Path) -> Log {
    let log = Log::open(&dir.join("log"), LogOptions::snapshot_every(4)).unwrap();
    let failed = Some(ErrorCode::RevisionNotFound);
    let events = [
        received("a"),
        done("a", None),
        received("b"),
        done("b", failed),
        received("late"),
        received("c"),
        done("c", None),
        done("late", None),
    ];
    for e in events.iter().cloned().chain((9..=12).map(filler)) {
        log.append(&[e]).unwrap();
    }
    log.flush().unwrap();
    log
}

fn outcome(log: &Log, id: &str) -> Option<(Outcome, Option<ErrorCode>, u64)> {
    let p = log.pruned_command(id).unwrap()?;
    Some((p.outcome, p.code, p.received_seq))
}

#[test]
fn a_prune_keeps_every_command_received_in_it_with_how_it_completed_through_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = given(dir.path());
    // Only 1..=6 published: the cut falls between `late`'s receipt and its completion.
    let pruned = log.prune(&policy(dir.path()), 6, T0).unwrap().unwrap();
    assert_eq!((pruned.first, pruned.last), (1, 6));

    let check = |log: &Log| {
        assert_eq!(outcome(log, "a"), Some((Outcome::Succeeded, None, 1)));
        let b = log.pruned_command("b").unwrap().unwrap();
        assert_eq!(
            (b.outcome, b.code, b.message.as_deref()),
            (
                Outcome::Failed,
                Some(ErrorCode::RevisionNotFound),
                Some("it failed")
            )
        );
        // Completed after the cut: its completion, from the log, is kept all the same.
        assert_eq!(outcome(log, "late"), Some((Outcome::Succeeded, None, 5)));
        assert_eq!(outcome(log, "c"), Some((Outcome::Succeeded, None, 6)));
        let late = log.for_command("late").unwrap();
        assert_eq!(late.iter().map(|r| r.seq).collect::<Vec<_>>(), [8]);
        // The content: the same command (another `issued_at`), not another one.
        let entry = log.pruned_command("a").unwrap().unwrap();
        assert_eq!(entry.same_content(&command("a", ns("a"))), Some(true));
        assert_eq!(entry.same_content(&command("a", ns("z"))), Some(false));
        assert_eq!(entry.pruned_at_ms, T0);
        assert!(log.knows_command("a") && log.knows_command("c"));
        assert!(!log.knows_command("never") && log.pruned_command("f9").unwrap().is_none());
        assert_eq!(log.pruned.len(), 4);
    };
    check(&log);
    drop(log);
    let log = Log::open(&dir.path().join("log"), LogOptions::snapshot_every(4)).unwrap();
    check(&log);
}

#[test]
fn a_prune_stops_before_the_oldest_command_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(&dir.path().join("log"), LogOptions::snapshot_every(4)).unwrap();
    let events = [received("a"), done("a", None), received("slow")];
    for e in events.into_iter().chain((4..=12).map(filler)) {
        log.append(&[e]).unwrap();
    }
    let p = policy(dir.path());
    let pruned = log.prune(&p, 12, T0).unwrap().unwrap();
    assert_eq!(pruned.last, 2, "`slow`, received at 3, is not done");
    assert_eq!(log.prune(&p, 12, T0).unwrap(), None);
    assert_eq!(
        log.for_command("slow").unwrap()[0].seq,
        3,
        "still in the log"
    );
    log.append(&[done("slow", None)]).unwrap();
    assert!(log.prune(&p, 13, T0).unwrap().unwrap().last > 3);
    assert_eq!(outcome(&log, "slow"), Some((Outcome::Succeeded, None, 3)));
}

#[test]
fn kept_commands_expire_after_the_window_at_a_later_prune() {
    let dir = tempfile::tempdir().unwrap();
    let log = given(dir.path());
    let p = policy(dir.path());
    log.prune(&p, 4, T0).unwrap().unwrap();
    assert!(log.knows_command("a") && log.knows_command("b"));
    // 29 days of the agent running on: still kept.
    log.advance_retention_clock(29 * DAY);
    log.prune(&p, 6, T0 + 29 * DAY_MS).unwrap().unwrap();
    assert!(log.knows_command("a"));
    assert_eq!(log.pruned.batches.len(), 2);
    // Past 30 days, the next prune (even one with nothing to prune) expires them.
    log.advance_retention_clock(DAY + Duration::from_millis(1));
    assert_eq!(log.prune(&p, 6, T0 + 30 * DAY_MS + 1).unwrap(), None);
    assert!(!log.knows_command("a") && !log.knows_command("b"));
    assert!(
        log.knows_command("late") && log.knows_command("c"),
        "pruned later"
    );
    assert_eq!((log.pruned.len(), log.pruned.batches.len()), (2, 1));
}

/// The wall clock set a year forward (a bad NTP server, a wrong RTC), a prune, the
/// clock put right: nothing kept was forgotten, so a re-post is still a duplicate.
#[test]
fn a_clock_jump_does_not_expire_kept_commands() {
    let dir = tempfile::tempdir().unwrap();
    let log = given(dir.path());
    let p = policy(dir.path());
    log.prune(&p, 4, T0).unwrap().unwrap();
    assert_eq!(log.prune(&p, 4, T0 + 365 * DAY_MS).unwrap(), None);
    assert!(log.knows_command("a") && log.knows_command("b"));
    assert_eq!(log.prune(&p, 4, T0 + DAY_MS).unwrap(), None);
    assert!(log.knows_command("a") && log.knows_command("b"));
    // The retention clock goes on through a reopen (stored at each prune), and
    // expires them once the agent has run the window.
    drop(log);
    let log = Log::open(&dir.path().join("log"), LogOptions::snapshot_every(4)).unwrap();
    log.advance_retention_clock(30 * DAY + Duration::from_millis(1));
    assert_eq!(log.prune(&p, 4, T0 + DAY_MS).unwrap(), None);
    assert!(!log.knows_command("a") && !log.knows_command("b"));
}

#[test]
fn the_retention_clock_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = given(dir.path());
    let p = policy(dir.path());
    log.prune(&p, 4, T0).unwrap().unwrap();
    log.advance_retention_clock(20 * DAY);
    log.prune(&p, 4, T0).unwrap();
    drop(log);
    let log = Log::open(&dir.path().join("log"), LogOptions::snapshot_every(4)).unwrap();
    assert!(log.pruned.clock.now() >= 20 * DAY);
    log.advance_retention_clock(10 * DAY + Duration::from_millis(1));
    log.prune(&p, 4, T0).unwrap();
    assert!(!log.knows_command("a"), "20 + 10 days of running");
}

/// Batches an earlier build kept by the wall clock (`pruned_batches`) are read: moved
/// to the retention clock at the first prune, a whole window from then.
#[test]
fn batches_an_earlier_build_kept_expire_a_window_after_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let log = given(dir.path());
    let p = policy(dir.path());
    log.prune(&p, 4, T0).unwrap().unwrap();
    // As a build before the retention clock left it: the batch under its wall time.
    let (key, batch) = log.pruned.batches.pop_min().unwrap().unwrap();
    let mut old_key = [0u8; 16];
    old_key[..8].copy_from_slice(&((T0 as u64) ^ (1 << 63)).to_be_bytes());
    old_key[8..].copy_from_slice(&key[8..]);
    log.pruned.old_batches.insert(old_key, batch).unwrap();
    log.advance_retention_clock(29 * DAY);
    assert_eq!(log.prune(&p, 4, T0 + 40 * DAY_MS).unwrap(), None);
    assert!(log.knows_command("a") && log.knows_command("b"));
    assert_eq!(
        (log.pruned.old_batches.len(), log.pruned.batches.len()),
        (0, 1)
    );
    log.advance_retention_clock(30 * DAY + Duration::from_millis(1));
    assert_eq!(log.prune(&p, 4, T0 + 40 * DAY_MS).unwrap(), None);
    assert!(!log.knows_command("a") && !log.knows_command("b"));
}

#[test]
fn a_prune_done_again_after_a_crash_keeps_its_commands_for_the_whole_window() {
    let dir = tempfile::tempdir().unwrap();
    let log = given(dir.path());
    // A prune of 1..=4 that wrote its entries and crashed before its anchor: the
    // records are all still in the log; the next prune, days later, does it again.
    let mut interrupted = Collector::default();
    for r in log.read_since(0).take(4) {
        interrupted.add(&r.unwrap());
    }
    let entries = interrupted.finish::<Event>(T0, |_| Ok(Vec::new())).unwrap();
    assert_eq!(entries.len(), 2);
    log.pruned
        .write(&entries, log.pruned.tick().unwrap(), 1, 4)
        .unwrap();
    assert_eq!(log.for_command("a").unwrap().len(), 2, "not pruned");
    log.advance_retention_clock(10 * DAY);
    let redo = T0 + 10 * DAY_MS;
    log.prune(&policy(dir.path()), 4, redo).unwrap().unwrap();
    assert_eq!(log.pruned.batches.len(), 1, "the redo took the batch over");
    // The interrupted prune's window is over; the redo's is not.
    log.advance_retention_clock(21 * DAY);
    assert_eq!(
        log.prune(&policy(dir.path()), 4, T0 + 31 * DAY_MS).unwrap(),
        None
    );
    assert_eq!(log.pruned_command("a").unwrap().unwrap().pruned_at_ms, redo);
    assert_eq!(log.pruned.batches.len(), 1);
    log.advance_retention_clock(10 * DAY);
    log.prune(&policy(dir.path()), 4, T0).unwrap();
    assert!(!log.knows_command("a"));
}

#[test]
fn an_entry_this_build_cannot_read_is_an_error_never_an_unknown_id() {
    let dir = tempfile::tempdir().unwrap();
    let log = given(dir.path());
    log.prune(&policy(dir.path()), 4, T0).unwrap().unwrap();
    let mut newer = log.pruned.ids.get(b"a").unwrap().unwrap().to_vec();
    newer[0] = 9;
    log.pruned.ids.insert(b"a", newer).unwrap();
    assert!(matches!(
        log.pruned_command("a"),
        Err(LogError::PrunedIds(_))
    ));
    assert!(log.knows_command("a"), "known, so never taken as new");
}

/// What a kept command costs: its entry's bytes (for a 36-character id, succeeded),
/// and the database's growth on disk for 50,000 of them, kept 2,000 a prune.
/// `cargo test -p capstan-agent --lib kept_commands_are_compact -- --nocapture`
/// prints the figures (docs/retention.md).
#[test]
fn kept_commands_are_compact() {
    let id = |i: u32| format!("{i:08x}-7d3c-4b5e-9a1f-0c2b3d4e5f60");
    let entry = PrunedCommand {
        received_seq: 123_456_789,
        pruned_at_ms: T0,
        content: Some([9; 32]),
        outcome: Outcome::Succeeded,
        code: None,
        message: None,
    };
    let value = stored::encode(&entry.to_stored()).unwrap().len();
    let stored_bytes = id(0).len() + value;
    let batch_bytes = id(0).len() + 1;
    println!(
        "one kept command: {value} bytes of entry + {} of key + {batch_bytes} in its batch",
        id(0).len()
    );
    assert!(
        stored_bytes + batch_bytes <= 140,
        "{stored_bytes} + {batch_bytes}"
    );

    let dir = tempfile::tempdir().unwrap();
    let db = sled::Config::new().path(dir.path()).open().unwrap();
    let kept = PrunedIds::open(&db).unwrap();
    db.flush().unwrap();
    let before = db.size_on_disk().unwrap();
    const N: u32 = 50_000;
    for prune in 0..N / 2_000 {
        let entries: Vec<_> = (prune * 2_000..(prune + 1) * 2_000)
            .map(|i| (id(i), entry.clone()))
            .collect();
        let last = u64::from(prune);
        kept.write(&entries, Duration::from_millis(last), last, last)
            .unwrap();
        db.flush().unwrap();
    }
    let grown = db.size_on_disk().unwrap() - before;
    println!(
        "{N} kept commands: the database grew {grown} bytes, {} a command",
        grown / u64::from(N)
    );
    assert_eq!(kept.len(), N as usize);
}

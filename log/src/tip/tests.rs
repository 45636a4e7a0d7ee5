use crate::testkit::Event;
use crate::testkit::{Log, LogReader};
use crate::LogOptions;
use capstan_common::answers::LogRequest;

fn received(id: &str, workload: &str) -> Event {
    Event::CommandReceived {
        command_id: id.into(),
        op: "stop".into(),
        namespace: "ns".into(),
        workload: Some(workload.into()),
        revision: None,
        command: "{}".into(),
    }
}

fn seqs(records: Vec<crate::Record<Event>>) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

fn by_command(id: &str) -> LogRequest {
    LogRequest {
        command: Some(id.into()),
        ..LogRequest::default()
    }
}

fn by_workload(workload: &str) -> LogRequest {
    LogRequest {
        namespace: Some("ns".into()),
        workload: Some(workload.into()),
        ..LogRequest::default()
    }
}

fn in_time(log: &Log) -> Vec<u64> {
    let request = LogRequest {
        since_time: chrono::DateTime::from_timestamp_millis(0),
        ..LogRequest::default()
    };
    seqs(log.query(&request).unwrap())
}

/// A log of three whole appends, then a fourth written in full but for its tip: what
/// a crash right before the tip's write leaves (sled recovers a prefix of its
/// writes). The fourth is 150 records of one command and workload, so that its index
/// entries fill the lists' heads into blocks (64 entries each).
fn cut_short(dir: &std::path::Path) -> u64 {
    let log = Log::open(dir, LogOptions::default()).unwrap();
    log.append(&[received("c-1", "w1")]).unwrap();
    log.append(&[received("c-2", "w2"), received("c-3", "w1")])
        .unwrap();
    let tip = log.append(&[received("c-4", "w2")]).unwrap();
    let long: Vec<Event> = (0..150).map(|_| received("c-5", "w1")).collect();
    assert_eq!(log.append(&long).unwrap(), tip + 150);
    super::write(&log.db, tip).unwrap();
    log.flush().unwrap();
    tip
}

#[test]
fn an_append_cut_short_by_a_crash_is_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let tip = cut_short(dir.path());
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert!(log.degraded().is_none());
    assert_eq!(log.last_seq(), tip);
    assert_eq!(log.verify().unwrap(), tip);
    assert_eq!(log.read_since(0).count() as u64, tip);
    assert!(log.for_command("c-5").unwrap().is_empty());
    assert_eq!(seqs(log.query(&by_workload("w1")).unwrap()), vec![1, 3]);
    assert_eq!(in_time(&log), vec![1, 2, 3, 4]);
    // The next append takes the seqs after the tip, and every list holds it once.
    let more: Vec<Event> = (0..70).map(|_| received("c-6", "w1")).collect();
    assert_eq!(log.append(&more).unwrap(), tip + 70);
    let new: Vec<u64> = (tip + 1..=tip + 70).collect();
    assert_eq!(seqs(log.for_command("c-6").unwrap()), new);
    let w1: Vec<u64> = [1, 3].into_iter().chain(new.iter().copied()).collect();
    assert_eq!(seqs(log.query(&by_workload("w1")).unwrap()), w1);
    let all: Vec<u64> = (1..=tip + 70).collect();
    assert_eq!(in_time(&log), all);
    drop(log);
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(log.verify().unwrap(), tip + 70);
    assert_eq!(in_time(&log), all);
}

#[test]
fn a_block_written_before_its_head_is_removed_with_the_append() {
    // The cut append filled a list's head into a block, and the crash kept the block
    // but not the head that counts it.
    let dir = tempfile::tempdir().unwrap();
    let tip = cut_short(dir.path());
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    log.by_workload
        .insert(
            super::super::postings::block_key(b"ns/w2", 0),
            (tip + 1).to_be_bytes().repeat(64),
        )
        .unwrap();
    super::write(&log.db, tip).unwrap();
    drop(log);
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(seqs(log.query(&by_workload("w2")).unwrap()), vec![2, 4]);
}

#[test]
fn the_reader_shows_nothing_after_the_tip() {
    let dir = tempfile::tempdir().unwrap();
    let tip = cut_short(dir.path());
    let reader = LogReader::open(dir.path()).unwrap().unwrap();
    assert_eq!(reader.read_since(0).count() as u64, tip);
    assert!(reader.query(&by_command("c-5")).unwrap().is_empty());
    assert_eq!(seqs(reader.query(&by_workload("w1")).unwrap()), vec![1, 3]);
}

#[test]
fn a_log_without_a_tip_is_whole() {
    // Written before the tip existed: every record stays.
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        log.append(&[received("c-1", "w1"), received("c-2", "w1")])
            .unwrap();
        log.db.remove(super::KEY).unwrap();
        log.flush().unwrap();
    }
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(log.last_seq(), 2);
    assert_eq!(seqs(log.query(&by_workload("w1")).unwrap()), vec![1, 2]);
}

use crate::testkit::Log;
use crate::testkit::{Cause, Event};
use crate::LogOptions;
use capstan_common::answers::LogRequest;
use chrono::{DateTime, Utc};
use std::path::Path;

pub(crate) fn started(workload: &str, command: &str) -> Event {
    Event::WorkloadStarted {
        cause: Cause::Command(command.into()),
        namespace: "ns".into(),
        workload: workload.into(),
        revision: "r1".into(),
        previous: None,
    }
}

pub(crate) fn at(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
}

fn seqs(log: &Log, request: LogRequest) -> Vec<u64> {
    log.query(&request).unwrap().iter().map(|r| r.seq).collect()
}

/// A log whose clock stepped back: seq 1 `web` at 1000, 2 `db` at 3000, 3 `web` at
/// 2000 (back by a second), 4 `web` at 4000, 5 `db` at 2500.
pub(crate) fn stepped_back(dir: &Path) -> Log {
    let log = Log::open(dir, LogOptions::default()).unwrap();
    for (ms, wl, cmd) in [
        (1000, "web", "c1"),
        (3000, "db", "c2"),
        (2000, "web", "c3"),
        (4000, "web", "c1"),
        (2500, "db", "c4"),
    ] {
        log.append_at(&[started(wl, cmd)], ms).unwrap();
    }
    log
}

pub(crate) fn between(from: i64, until: i64) -> LogRequest {
    LogRequest {
        since_time: at(from),
        until_time: at(until),
        ..LogRequest::default()
    }
}

#[test]
fn a_time_range_finds_every_record_in_it_when_the_clock_stepped_back() {
    // Given a log whose clock stepped back after seq 2
    let dir = tempfile::tempdir().unwrap();
    let log = stepped_back(dir.path());
    // When asked for [1500, 3500), then every record in it, in seq order, although
    // seq 2 (3000) is later than seq 3 (2000) and seq 5 (2500)
    assert_eq!(seqs(&log, between(1500, 3500)), [2, 3, 5]);
    // and the bounds are at-or-after / before
    assert_eq!(seqs(&log, between(2000, 3000)), [3, 5]);
    assert_eq!(seqs(&log, between(2001, 2500)), Vec::<u64>::new());
    // and either bound alone works
    let after = LogRequest {
        since_time: at(2500),
        ..LogRequest::default()
    };
    assert_eq!(seqs(&log, after), [2, 4, 5]);
    let before = LogRequest {
        until_time: at(2500),
        ..LogRequest::default()
    };
    assert_eq!(seqs(&log, before), [1, 3]);
}

#[test]
fn a_time_range_combines_with_a_workload_a_command_and_paging() {
    let dir = tempfile::tempdir().unwrap();
    let log = stepped_back(dir.path());
    // When the range is combined with a workload or a command, then only theirs
    let web = LogRequest {
        namespace: Some("ns".into()),
        workload: Some("web".into()),
        ..between(1500, 5000)
    };
    assert_eq!(seqs(&log, web.clone()), [3, 4]);
    let c1 = LogRequest {
        command: Some("c1".into()),
        ..between(0, 5000)
    };
    assert_eq!(seqs(&log, c1), [1, 4]);
    // When paged one record at a time from the last seq seen, then the same records
    let first = LogRequest {
        limit: Some(1),
        ..between(1500, 3500)
    };
    assert_eq!(seqs(&log, first.clone()), [2]);
    let next = LogRequest { since: 2, ..first };
    assert_eq!(seqs(&log, next), [3]);
    let web_after_3 = LogRequest { since: 3, ..web };
    assert_eq!(seqs(&log, web_after_3), [4]);
}

//! Given what the log holds of a command's id, when it arrives (again), then what
//! happens next: one test per state a crash, a redelivery, a cancel or a reused id
//! can leave it in.

use super::*;
use crate::testkit::{self, activate_op, by, command, image, prepare_op};
use capstan_common::{Op, Phase};
use chrono::Duration;

fn now() -> DateTime<Utc> {
    "2026-12-07T12:00:00Z".parse().unwrap()
}

/// The records `events` are, numbered from `first`.
fn records(first: u64, events: Vec<Event>) -> Vec<Record> {
    (first..)
        .zip(events)
        .map(|(seq, event)| Record {
            seq,
            at_ms: 0,
            prev_hash: [0; 32],
            event,
        })
        .collect()
}

fn activate(id: &str) -> Command {
    command(id, activate_op("r2"))
}

fn stop(id: &str) -> Command {
    let op = Op::StopWorkload {
        namespace: "ns".into(),
        workload: "web".into(),
    };
    command(id, op)
}

fn received(c: &Command) -> Event {
    Event::CommandReceived {
        command_id: c.id.clone(),
        op: c.op.name().into(),
        namespace: "ns".into(),
        workload: Some("web".into()),
        revision: c.op.revision().map(Into::into),
        command: c.to_json(),
    }
}

fn hook_started(id: &str, phase: Phase) -> Event {
    testkit::hook_started(id, phase, "vault", Some("r2"))
}

fn started(id: &str) -> Event {
    testkit::started(by(id), "r2", Some("r1"))
}

fn stopped(id: &str) -> Event {
    testkit::stopped(by(id), "r1")
}

fn completed(id: &str, outcome: Outcome, code: Option<ErrorCode>) -> Event {
    Event::CommandCompleted {
        command_id: id.into(),
        outcome,
        code,
        message: code.map(|_| "it failed".into()),
    }
}

fn cancel_requested(id: &str, by: &str) -> Event {
    Event::CancelRequested {
        command_id: id.into(),
        by: by.into(),
    }
}

fn rejected(id: &str) -> Event {
    Event::CommandRejected {
        command_id: Some(id.into()),
        code: ErrorCode::InvalidCommand,
        message: "no".into(),
    }
}

fn go(arrival: Arrival, cancelled_by: Option<&str>, next: Next) -> Resume {
    Resume::Go(Course {
        arrival,
        cancelled_by: cancelled_by.map(String::from),
        next,
    })
}

const CARRY: Next = Next::Carry { recover: false };

fn answered(id: &str, outcome: Outcome, code: Option<ErrorCode>) -> Resume {
    let error = code.map(|c| Rejection::new(c, "it failed"));
    Resume::Answered(CommandResult {
        id: Some(id.into()),
        outcome,
        duplicate: true,
        retryable: code.is_some_and(|c| c.is_retryable()),
        error,
    })
}

#[test]
fn a_command_the_log_never_saw_is_new_and_carried_out() {
    let c = activate("a1");
    assert_eq!(resume(&c, &[], None, now()), go(Arrival::New, None, CARRY));
}

#[test]
fn only_a_rejection_under_its_id_is_still_new() {
    let c = activate("a1");
    let log = records(4, vec![rejected("a1")]);
    assert_eq!(resume(&c, &log, None, now()), go(Arrival::New, None, CARRY));
}

#[test]
fn a_completed_command_is_answered_again_as_a_duplicate() {
    let c = activate("a1");
    let done = completed("a1", Outcome::Succeeded, None);
    let log = records(1, vec![received(&c), started("a1"), done]);
    let again = activate("a1"); // issued again later: the same content
    assert_eq!(
        resume(&again, &log, None, now()),
        answered("a1", Outcome::Succeeded, None)
    );
}

#[test]
fn a_failure_is_answered_again_with_its_code_and_whether_to_retry() {
    let c = activate("a1");
    for code in [ErrorCode::Interrupted, ErrorCode::InvalidSpec] {
        let done = completed("a1", Outcome::Failed, Some(code));
        let log = records(1, vec![received(&c), done]);
        assert_eq!(
            resume(&c, &log, None, now()),
            answered("a1", Outcome::Failed, Some(code))
        );
    }
}

#[test]
fn an_id_received_with_other_content_is_a_conflict_naming_its_seq() {
    let first = activate("a1");
    let log = records(7, vec![received(&first)]);
    let Resume::Conflict(r) = resume(&stop("a1"), &log, None, now()) else {
        panic!("not a conflict");
    };
    assert_eq!(r.code, ErrorCode::IdConflict);
    assert!(r.message.contains("received as seq 7)"), "{}", r.message);
}

#[test]
fn a_conflict_is_found_even_when_the_first_one_completed() {
    let first = activate("a1");
    let done = completed("a1", Outcome::Succeeded, None);
    let log = records(1, vec![received(&first), done]);
    assert!(matches!(
        resume(&stop("a1"), &log, None, now()),
        Resume::Conflict(_)
    ));
}

#[test]
fn a_stored_command_that_no_longer_parses_is_no_conflict() {
    let mut unreadable = received(&activate("a1"));
    if let Event::CommandReceived { command, .. } = &mut unreadable {
        *command = "{not json".into();
    }
    let log = records(3, vec![unreadable]);
    assert_eq!(
        resume(&stop("a1"), &log, None, now()),
        go(Arrival::Resumed { last: 3 }, None, CARRY)
    );
}

fn pruned(c: &Command, outcome: Outcome, code: Option<ErrorCode>) -> PrunedCommand {
    let message = code.map(|_| "it failed".to_string());
    PrunedCommand::new(9, 0, &c.to_json(), outcome, code, message)
}

#[test]
fn a_command_retention_pruned_is_answered_from_what_was_kept() {
    let c = activate("a1");
    let kept = pruned(&c, Outcome::Failed, Some(ErrorCode::HookFailed));
    assert_eq!(
        resume(&c, &[], Some(&kept), now()),
        answered("a1", Outcome::Failed, Some(ErrorCode::HookFailed))
    );
}

#[test]
fn a_pruned_id_sent_with_other_content_is_a_conflict_since_pruned() {
    let kept = pruned(&activate("a1"), Outcome::Succeeded, None);
    let Resume::Conflict(r) = resume(&stop("a1"), &[], Some(&kept), now()) else {
        panic!("not a conflict");
    };
    assert!(r.message.contains("seq 9, since pruned"), "{}", r.message);
}

#[test]
fn records_that_hold_its_arrival_outweigh_a_pruned_entry() {
    let c = activate("a1");
    let kept = pruned(&stop("a1"), Outcome::Succeeded, None);
    let log = records(20, vec![received(&c)]);
    assert_eq!(
        resume(&c, &log, Some(&kept), now()),
        go(Arrival::Resumed { last: 20 }, None, CARRY)
    );
}

#[test]
fn a_crash_after_its_arrival_resumes_it_from_the_last_of_its_own_records() {
    let c = activate("a1");
    let log = records(5, vec![received(&c), rejected("a1")]);
    assert_eq!(
        resume(&c, &log, None, now()),
        go(Arrival::Resumed { last: 5 }, None, CARRY)
    );
}

#[test]
fn a_crash_while_granting_recovers_before_carrying_it_out_even_past_its_deadline() {
    for deadline in [None, Some(now() - Duration::seconds(1))] {
        let mut c = activate("a1");
        c.deadline = deadline;
        let granting = hook_started("a1", Phase::BeforeWorkloadStart);
        let log = records(1, vec![received(&c), granting]);
        assert_eq!(
            resume(&c, &log, None, now()),
            go(
                Arrival::Resumed { last: 2 },
                None,
                Next::Carry { recover: true }
            ),
            "deadline {deadline:?}"
        );
    }
}

#[test]
fn a_crash_while_revoking_carries_it_out_again_without_recovery() {
    let c = stop("s1");
    let revoking = hook_started("s1", Phase::BeforeWorkloadStop);
    let log = records(1, vec![received(&c), revoking]);
    assert_eq!(
        resume(&c, &log, None, now()),
        go(Arrival::Resumed { last: 2 }, None, CARRY)
    );
}

#[test]
fn a_crash_after_a_starts_effect_was_logged_finishes_it_revoking_what_is_stale() {
    let c = activate("a1");
    let granting = hook_started("a1", Phase::BeforeWorkloadStart);
    let log = records(1, vec![received(&c), granting, started("a1")]);
    assert_eq!(
        resume(&c, &log, None, now()),
        go(
            Arrival::Resumed { last: 3 },
            None,
            Next::Finish { revoke_stale: true }
        )
    );
}

#[test]
fn a_crash_after_any_other_effect_was_logged_only_finishes_it() {
    let c = stop("s1");
    let log = records(1, vec![received(&c), stopped("s1")]);
    assert_eq!(
        resume(&c, &log, None, now()),
        go(
            Arrival::Resumed { last: 2 },
            None,
            Next::Finish {
                revoke_stale: false
            }
        )
    );
    let p = command("p1", prepare_op("r2", image("a")));
    let prepared = Event::RevisionPrepared {
        command_id: "p1".into(),
        namespace: "ns".into(),
        workload: "web".into(),
        revision: "r2".into(),
        spec: image("a"),
    };
    let log = records(1, vec![received(&p), prepared]);
    assert!(matches!(
        resume(&p, &log, None, now()),
        Resume::Go(Course {
            next: Next::Finish {
                revoke_stale: false
            },
            ..
        })
    ));
}

#[test]
fn a_cancel_recorded_before_it_arrived_cuts_it_before_it_begins() {
    let c = activate("a1");
    let log = records(2, vec![cancel_requested("a1", "c1")]);
    assert_eq!(
        resume(&c, &log, None, now()),
        go(
            Arrival::New,
            Some("c1"),
            Next::Cut(
                "cancelled at the controller's request (cancel_command c1) before it began; nothing was done"
                    .into()
            )
        )
    );
}

#[test]
fn a_cancel_after_its_effect_was_logged_changes_nothing_done() {
    let c = stop("s1");
    let cancel = cancel_requested("s1", "c1");
    let log = records(1, vec![received(&c), stopped("s1"), cancel]);
    let Resume::Go(course) = resume(&c, &log, None, now()) else {
        panic!("not going on");
    };
    assert_eq!(
        course.next,
        Next::Finish {
            revoke_stale: false
        }
    );
}

#[test]
fn a_deadline_reached_before_it_began_cuts_it_and_one_to_come_does_not() {
    let mut c = activate("a1");
    c.deadline = Some(now());
    let Resume::Go(course) = resume(&c, &[], None, now()) else {
        panic!("not going on");
    };
    assert_eq!(
        course.next,
        Next::Cut(
            "its deadline 2026-12-07T12:00:00.000Z passed before it began; nothing was done".into()
        )
    );
    c.deadline = Some(now() + Duration::milliseconds(1));
    assert_eq!(resume(&c, &[], None, now()), go(Arrival::New, None, CARRY));
}

#[test]
fn a_cancel_after_a_hook_began_cancels_it_where_it_is_but_does_not_cut_it() {
    let cases = [
        (activate("a1"), Phase::BeforeWorkloadStart, true),
        (stop("a1"), Phase::BeforeWorkloadStop, false),
    ];
    for (c, phase, recover) in cases {
        let began = hook_started("a1", phase);
        let log = records(1, vec![received(&c), began, cancel_requested("a1", "c1")]);
        assert_eq!(
            resume(&c, &log, None, now()),
            go(
                Arrival::Resumed { last: 2 },
                Some("c1"),
                Next::Carry { recover }
            ),
            "{phase:?}"
        );
    }
}

//! Given hook records, when folded, then who holds what.

use super::*;
use crate::testkit::{
    activated_with, by, completed, given, hook_failed, hook_started, hook_succeeded, ns_ready,
    prepared, received, retired, spec, started,
};
use capstan_common::Outcome;
use Phase::{
    AfterNamespacePrepared, BeforeNamespaceDelete, BeforeWorkloadStart, BeforeWorkloadStop,
};

/// `ns` ready, `web`'s r1 and r2 prepared.
fn prepared_r1_r2() -> Vec<Event> {
    vec![ns_ready(), prepared("r1", spec()), prepared("r2", spec())]
}

fn holders(pairs: &[(&str, Hold)]) -> Holders {
    pairs.iter().map(|(o, h)| (o.to_string(), *h)).collect()
}

fn of(events: &[Event], rev: &str) -> Option<Holders> {
    given(events).grants.of_revision("ns", "web", rev).cloned()
}

#[test]
fn a_revision_nobody_was_called_for_is_untracked() {
    assert_eq!(of(&prepared_r1_r2(), "r1"), None);
}

#[test]
fn a_succeeded_start_call_grants_in_order_for_the_commands_revision() {
    let mut events = prepared_r1_r2();
    events.extend(activated_with("a1", "r1", None, &["vault", "mesh"]));
    let granted = holders(&[("vault", Hold::Granted), ("mesh", Hold::Granted)]);
    assert_eq!(of(&events, "r1"), Some(granted));
    assert_eq!(of(&events, "r2"), None);
}

#[test]
fn a_call_cut_short_or_answered_invalidly_may_have_granted() {
    for cut in [
        None,
        Some(ErrorCode::HookTimeout),
        Some(ErrorCode::HookInvalidReply),
    ] {
        let mut events = prepared_r1_r2();
        events.push(received("a1", "activate_revision", Some("r1")));
        events.push(hook_started("a1", BeforeWorkloadStart, "vault", Some("r1")));
        if let Some(code) = cut {
            events.push(hook_failed("a1", BeforeWorkloadStart, "vault", code));
        }
        assert_eq!(
            of(&events, "r1"),
            Some(holders(&[("vault", Hold::Pending)])),
            "{cut:?}"
        );
    }
}

#[test]
fn an_owner_that_reports_failure_cleaned_up_after_itself() {
    let mut events = prepared_r1_r2();
    events.push(received("a1", "activate_revision", Some("r1")));
    events.push(hook_started("a1", BeforeWorkloadStart, "vault", Some("r1")));
    events.push(hook_failed(
        "a1",
        BeforeWorkloadStart,
        "vault",
        ErrorCode::HookFailed,
    ));
    assert_eq!(of(&events, "r1"), Some(Holders::new()));
}

#[test]
fn a_failed_regrant_leaves_a_grant_already_held() {
    let mut events = prepared_r1_r2();
    events.extend(activated_with("a1", "r1", None, &["vault"]));
    events.push(received("s1", "start_workload", None));
    events.push(hook_started("s1", BeforeWorkloadStart, "vault", Some("r1")));
    events.push(hook_failed(
        "s1",
        BeforeWorkloadStart,
        "vault",
        ErrorCode::HookFailed,
    ));
    assert_eq!(
        of(&events, "r1"),
        Some(holders(&[("vault", Hold::Granted)]))
    );
}

#[test]
fn a_succeeded_stop_call_revokes_and_a_failed_one_does_not() {
    let mut events = prepared_r1_r2();
    events.extend(activated_with("a1", "r1", None, &["vault", "mesh"]));
    events.push(received("x1", "stop_workload", None));
    events.push(hook_started("x1", BeforeWorkloadStop, "mesh", Some("r1")));
    events.push(hook_succeeded("x1", BeforeWorkloadStop, "mesh"));
    events.push(hook_started("x1", BeforeWorkloadStop, "vault", Some("r1")));
    events.push(hook_failed(
        "x1",
        BeforeWorkloadStop,
        "vault",
        ErrorCode::HookFailed,
    ));
    assert_eq!(
        of(&events, "r1"),
        Some(holders(&[("vault", Hold::Granted)]))
    );
}

#[test]
fn a_start_or_stop_is_about_the_revision_active_when_it_arrived() {
    let mut events = prepared_r1_r2();
    events.extend(activated_with("a1", "r1", None, &["vault"]));
    // A record written before hook_started named its revision.
    events.push(received("x1", "stop_workload", None));
    events.push(hook_started("x1", BeforeWorkloadStop, "vault", None));
    events.push(hook_succeeded("x1", BeforeWorkloadStop, "vault"));
    assert_eq!(of(&events, "r1"), Some(Holders::new()));
}

#[test]
fn the_revision_a_call_names_is_the_one_it_changes() {
    // Activating r2 revokes what r1 holds: the calls name r1, the command r2.
    let mut events = prepared_r1_r2();
    events.extend(activated_with("a1", "r1", None, &["vault"]));
    events.push(received("a2", "activate_revision", Some("r2")));
    events.push(hook_started("a2", BeforeWorkloadStart, "vault", Some("r2")));
    events.push(hook_succeeded("a2", BeforeWorkloadStart, "vault"));
    events.push(started(by("a2"), "r2", Some("r1")));
    events.push(hook_started("a2", BeforeWorkloadStop, "vault", Some("r1")));
    events.push(hook_succeeded("a2", BeforeWorkloadStop, "vault"));
    events.push(completed("a2", Outcome::Succeeded));
    let intent = given(&events);
    assert_eq!(
        intent.grants.held_revisions("ns", "web"),
        vec!["r2".to_string()]
    );
    assert_eq!(of(&events, "r1"), Some(Holders::new()));
}

#[test]
fn calls_after_the_command_completed_change_nothing() {
    let mut events = prepared_r1_r2();
    events.extend(activated_with("a1", "r1", None, &["vault"]));
    events.push(hook_started("a1", BeforeWorkloadStop, "vault", Some("r1")));
    events.push(hook_succeeded("a1", BeforeWorkloadStop, "vault"));
    assert_eq!(
        of(&events, "r1"),
        Some(holders(&[("vault", Hold::Granted)]))
    );
    assert!(given(&events).grants.targets.is_empty());
}

#[test]
fn namespace_phases_hold_for_the_namespace() {
    let ns = |id: &str| Event::CommandReceived {
        command_id: id.into(),
        op: "ensure_namespace".into(),
        namespace: "ns".into(),
        workload: None,
        revision: None,
        command: String::new(),
    };
    let mut events = vec![ns("n1")];
    events.push(hook_started("n1", AfterNamespacePrepared, "net", None));
    events.push(hook_succeeded("n1", AfterNamespacePrepared, "net"));
    events.push(ns_ready());
    events.push(completed("n1", Outcome::Succeeded));
    let intent = given(&events);
    assert_eq!(
        intent.grants.of_namespace("ns"),
        Some(&holders(&[("net", Hold::Granted)]))
    );
    assert!(intent.grants.revisions.is_empty());
    events.push(ns("d1"));
    events.push(hook_started("d1", BeforeNamespaceDelete, "net", None));
    events.push(hook_succeeded("d1", BeforeNamespaceDelete, "net"));
    assert_eq!(
        given(&events).grants.of_namespace("ns"),
        Some(&Holders::new())
    );
}

#[test]
fn a_retired_revision_and_a_deleted_namespace_are_forgotten() {
    let mut events = prepared_r1_r2();
    events.extend(activated_with("a1", "r1", None, &["vault"]));
    events.extend(activated_with("a2", "r2", Some("r1"), &["vault"]));
    events.push(retired("r1"));
    assert_eq!(of(&events, "r1"), None);
    assert!(of(&events, "r2").is_some());
    events.push(Event::NamespaceDeleted {
        command_id: "d1".into(),
        namespace: "ns".into(),
    });
    assert!(given(&events).grants.revisions.is_empty());
}

#[test]
fn the_ledger_survives_a_snapshot() {
    let mut events = prepared_r1_r2();
    events.extend(activated_with("a1", "r1", None, &["vault"]));
    events.push(received("a2", "activate_revision", Some("r2")));
    events.push(hook_started("a2", BeforeWorkloadStart, "vault", Some("r2")));
    let intent = given(&events);
    let json = serde_json::to_string(&intent).unwrap();
    let back: crate::intent::Intent = serde_json::from_str(&json).unwrap();
    assert_eq!(back.grants, intent.grants);
    // A snapshot written before the ledger existed folds to an empty one.
    let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
    old.as_object_mut().unwrap().remove("grants");
    let back: crate::intent::Intent = serde_json::from_value(old).unwrap();
    assert_eq!(back.grants, Grants::default());
}

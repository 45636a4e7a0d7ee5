//! Given a ledger and what the driver reports, when deciding about grants, then what
//! to grant, revoke, stop, resume or finish.

use super::*;
use crate::event::Event;
use crate::testkit::{
    activated_with, by, given, hook_started, ns_ready, prepared, received, spec, stopped,
};
use capstan_common::Phase::{AfterNamespacePrepared, BeforeWorkloadStart};
use BackendState::{Running, Stopped};
use Strategy::{StartFirst, StopFirst};

fn duties(workload: &[&str]) -> Duties {
    Duties {
        workload: workload.iter().map(|o| o.to_string()).collect(),
        namespace: vec![],
    }
}

/// `web` running r1, granted by `owners`; r2 prepared.
fn r1_granted_by(owners: &[&str]) -> Vec<Event> {
    let mut events = vec![ns_ready(), prepared("r1", spec()), prepared("r2", spec())];
    events.extend(activated_with("a1", "r1", None, owners));
    events
}

fn already_running(rev: &str) -> Step {
    Step::AlreadyRunning {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
    }
}

fn start(rev: &str) -> Step {
    Step::Start {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
        spec: spec(),
    }
}

fn activate(rev: &str, previous: Option<&str>) -> Step {
    Step::Activate {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
        spec: spec(),
        previous: previous.map(Into::into),
    }
}

fn seen(target: Option<BackendState>, intended: Option<BackendState>) -> Seen {
    Seen {
        target,
        intended,
        unready: None,
    }
}

#[test]
fn what_runs_with_every_grant_held_needs_nothing() {
    let intent = given(&r1_granted_by(&["vault"]));
    let step = with_grants(already_running("r1"), &intent, &duties(&["vault"]));
    assert_eq!(step, already_running("r1"));
}

#[test]
fn what_runs_with_a_grant_missing_is_started_again_to_grant_it() {
    // Granted by vault only; mesh was added to the config since.
    let intent = given(&r1_granted_by(&["vault"]));
    let step = with_grants(already_running("r1"), &intent, &duties(&["vault", "mesh"]));
    assert_eq!(step, start("r1"));
    // A grant that is only pending (its call was cut short) is missing too.
    let mut events = r1_granted_by(&[]);
    events.push(received("s1", "start_workload", None));
    events.push(hook_started("s1", BeforeWorkloadStart, "vault", Some("r1")));
    let intent = given(&events);
    assert_eq!(
        with_grants(already_running("r1"), &intent, &duties(&["vault"])),
        start("r1")
    );
}

#[test]
fn a_start_of_what_runs_or_an_ensure_of_a_ready_namespace_is_a_regrant_nothing_else_is() {
    let intent = given(&r1_granted_by(&["vault"]));
    assert_eq!(
        regrant(&intent, &start("r1")).as_deref(),
        Some("revision r1")
    );
    assert_eq!(
        regrant(&intent, &activate("r1", None)).as_deref(),
        Some("revision r1")
    );
    assert_eq!(regrant(&intent, &activate("r2", Some("r1"))), None);
    let ensure = |ns: &str| Step::EnsureNamespace {
        namespace: ns.into(),
    };
    assert_eq!(
        regrant(&intent, &ensure("ns")).as_deref(),
        Some("namespace ns")
    );
    assert_eq!(regrant(&intent, &ensure("other")), None);
    // A stopped workload's start is a first grant: it does not run.
    let mut events = r1_granted_by(&["vault"]);
    events.push(stopped(by("s1"), "r1"));
    assert_eq!(regrant(&given(&events), &start("r1")), None);
}

#[test]
fn what_runs_untracked_counts_as_granted() {
    // Started by a build before the ledger: no record says a grant is missing.
    let intent = given(&crate::testkit::running("r1", spec()));
    let step = with_grants(already_running("r1"), &intent, &duties(&["vault"]));
    assert_eq!(step, already_running("r1"));
    assert!(!surely_granted(
        &intent,
        &duties(&["vault"]),
        "ns",
        "web",
        "r1"
    ));
    assert!(surely_granted(&intent, &duties(&[]), "ns", "web", "r1"));
}

#[test]
fn a_ready_namespace_missing_a_grant_is_ensured_again() {
    let mut events = vec![Event::CommandReceived {
        command_id: "n1".into(),
        op: "ensure_namespace".into(),
        namespace: "ns".into(),
        workload: None,
        revision: None,
        command: String::new(),
    }];
    events.push(hook_started("n1", AfterNamespacePrepared, "net", None));
    let intent = given(&events);
    let d = Duties {
        workload: vec![],
        namespace: vec!["net".into()],
    };
    let ready = Step::AlreadyReady {
        namespace: "ns".into(),
    };
    let ensure = Step::EnsureNamespace {
        namespace: "ns".into(),
    };
    assert_eq!(with_grants(ready.clone(), &intent, &d), ensure);
    assert_eq!(
        with_grants(ready.clone(), &intent, &Duties::default()),
        ready
    );
}

#[test]
fn revisions_other_than_the_running_one_that_hold_grants_are_stale() {
    let mut events = r1_granted_by(&["vault"]);
    events.extend(activated_with("a2", "r2", Some("r1"), &["vault"]));
    let intent = given(&events);
    assert_eq!(stale(&intent, "ns", "web", "r2"), vec!["r1".to_string()]);
    assert_eq!(stale(&intent, "ns", "web", "r1"), vec!["r2".to_string()]);
}

/// r1 running (granted by vault), and activation a2 of r2 with vault's grant begun.
fn r2_being_granted() -> crate::intent::Intent {
    let mut events = r1_granted_by(&["vault"]);
    events.push(received("a2", "activate_revision", Some("r2")));
    events.push(hook_started("a2", BeforeWorkloadStart, "vault", Some("r2")));
    given(&events)
}

#[test]
fn a_failed_activation_resumes_the_old_revision_then_stops_and_revokes_the_new() {
    let intent = r2_being_granted();
    let both = seen(Some(Running), Some(Stopped));
    let fixes = roll_back(&intent, "ns", "web", "r2", StartFirst, &both);
    assert_eq!(
        fixes,
        vec![
            Fix::Resume("r1".into()),
            Fix::Stop("r2".into()),
            Fix::Revoke("r2".into()),
        ],
        "start-first: r1 back before r2 goes (on a cluster, r1's pods never all go)"
    );
    // Nothing of r2 ran and r1 still runs: only the grant is undone.
    let fixes = roll_back(
        &intent,
        "ns",
        "web",
        "r2",
        StartFirst,
        &seen(Some(Stopped), Some(Running)),
    );
    assert_eq!(fixes, vec![Fix::Revoke("r2".into())]);
}

#[test]
fn a_failed_stop_first_activation_stops_and_revokes_the_new_revision_before_resuming_the_old() {
    let intent = r2_being_granted();
    let both = seen(Some(Running), Some(Stopped));
    let fixes = roll_back(&intent, "ns", "web", "r2", StopFirst, &both);
    assert_eq!(
        fixes,
        vec![
            Fix::Stop("r2".into()),
            Fix::Revoke("r2".into()),
            Fix::Resume("r1".into()),
        ],
        "the two never run at once"
    );
}

#[test]
fn a_failed_start_of_a_stopped_workload_leaves_nothing_running_or_granted() {
    let mut events = r1_granted_by(&["vault"]);
    events.push(stopped(by("x1"), "r1"));
    events.push(received("s1", "start_workload", None));
    events.push(hook_started("s1", BeforeWorkloadStart, "vault", Some("r1")));
    let intent = given(&events);
    let fixes = roll_back(
        &intent,
        "ns",
        "web",
        "r1",
        StartFirst,
        &seen(Some(Running), None),
    );
    assert_eq!(
        fixes,
        vec![Fix::Stop("r1".into()), Fix::Revoke("r1".into())]
    );
}

#[test]
fn a_failed_regrant_of_what_intent_runs_keeps_it_running() {
    let intent = given(&r1_granted_by(&["vault"]));
    let fixes = roll_back(
        &intent,
        "ns",
        "web",
        "r1",
        StartFirst,
        &seen(Some(Running), Some(Running)),
    );
    assert_eq!(fixes, vec![]);
}

/// r1 running (granted by vault), and activation a2 of r2 begun: vault granted r2.
fn r2_granted_by_vault_when_interrupted() -> Vec<Event> {
    let mut events = r1_granted_by(&["vault"]);
    events.push(received("a2", "activate_revision", Some("r2")));
    events.push(hook_started("a2", BeforeWorkloadStart, "vault", Some("r2")));
    events.push(crate::testkit::hook_succeeded(
        "a2",
        BeforeWorkloadStart,
        "vault",
    ));
    events
}

#[test]
fn an_interrupted_activation_the_driver_applied_is_finished() {
    let intent = given(&r2_granted_by_vault_when_interrupted());
    let d = duties(&["vault"]);
    let step = activate("r2", Some("r1"));
    let r = recover(&intent, &d, &step, &seen(Some(Running), Some(Running)));
    assert_eq!(
        r,
        Some(Recovery::Finish {
            stop: Some("r1".into())
        })
    );
    let r = recover(&intent, &d, &step, &seen(Some(Running), Some(Stopped)));
    assert_eq!(r, Some(Recovery::Finish { stop: None }));
}

#[test]
fn an_interrupted_activation_that_runs_granted_but_fails_its_readiness_check_is_rolled_back() {
    let intent = given(&r2_granted_by_vault_when_interrupted());
    let unready = Seen {
        unready: Some("connect to 127.0.0.1:8080: refused".into()),
        ..seen(Some(Running), Some(Running))
    };
    let r = recover(
        &intent,
        &duties(&["vault"]),
        &activate("r2", Some("r1")),
        &unready,
    );
    assert_eq!(
        r,
        Some(Recovery::RollBack(vec![
            Fix::Stop("r2".into()),
            Fix::Revoke("r2".into()),
        ])),
        "r1 runs on with its grants"
    );
}

#[test]
fn an_interrupted_activation_not_applied_or_not_granted_is_rolled_back() {
    let mut events = r1_granted_by(&["vault", "mesh"]);
    events.push(received("a2", "activate_revision", Some("r2")));
    events.push(hook_started("a2", BeforeWorkloadStart, "vault", Some("r2")));
    events.push(crate::testkit::hook_succeeded(
        "a2",
        BeforeWorkloadStart,
        "vault",
    ));
    events.push(hook_started("a2", BeforeWorkloadStart, "mesh", Some("r2")));
    let intent = given(&events);
    let d = duties(&["vault", "mesh"]);
    let step = activate("r2", Some("r1"));
    // The crash came during mesh's call: the driver never started r2.
    let r = recover(&intent, &d, &step, &seen(None, Some(Running)));
    assert_eq!(r, Some(Recovery::RollBack(vec![Fix::Revoke("r2".into())])));
    // Even if r2 runs, mesh is not surely granted: it is rolled back, r1 first.
    let r = recover(&intent, &d, &step, &seen(Some(Running), Some(Stopped)));
    assert_eq!(
        r,
        Some(Recovery::RollBack(vec![
            Fix::Resume("r1".into()),
            Fix::Stop("r2".into()),
            Fix::Revoke("r2".into()),
        ]))
    );
}

#[test]
fn only_activations_and_starts_are_recovered() {
    let intent = given(&r1_granted_by(&["vault"]));
    let stop = Step::Stop {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: Some("r1".into()),
    };
    assert_eq!(
        recover(&intent, &duties(&["vault"]), &stop, &Seen::default()),
        None
    );
    assert!(duties(&[]).is_empty());
    assert_eq!(intended(&intent, "ns", "web"), Some("r1".into()));
}

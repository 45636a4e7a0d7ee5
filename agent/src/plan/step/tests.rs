//! What every kind of step is, checked against each other: the effect it records,
//! whether it is a start, the spec it runs.

use super::*;
use crate::plan::grants::starting;
use crate::testkit::image;

/// One step of each kind.
fn one_of_each() -> Vec<Step> {
    let (namespace, workload, revision) = ("ns".to_string(), "web".to_string(), "r2".to_string());
    let steps = vec![
        Step::EnsureNamespace {
            namespace: namespace.clone(),
        },
        Step::DeleteNamespace {
            namespace: namespace.clone(),
        },
        Step::Prepare {
            namespace: namespace.clone(),
            workload: workload.clone(),
            revision: revision.clone(),
            spec: image("a"),
        },
        Step::Activate {
            namespace: namespace.clone(),
            workload: workload.clone(),
            revision: revision.clone(),
            spec: image("a"),
            previous: Some("r1".into()),
        },
        Step::Start {
            namespace: namespace.clone(),
            workload: workload.clone(),
            revision: revision.clone(),
            spec: image("a"),
        },
        Step::Stop {
            namespace: namespace.clone(),
            workload: workload.clone(),
            revision: Some("r1".into()),
        },
        Step::Retire {
            namespace: namespace.clone(),
            workload: workload.clone(),
            revision: revision.clone(),
        },
        Step::AlreadyRunning {
            namespace: namespace.clone(),
            workload,
            revision,
        },
        Step::AlreadyReady { namespace },
    ];
    // A new kind of step fails to compile here: add it to the list above too.
    let kinds: std::collections::BTreeSet<u8> = steps
        .iter()
        .map(|s| match s {
            Step::EnsureNamespace { .. } => 0,
            Step::DeleteNamespace { .. } => 1,
            Step::Prepare { .. } => 2,
            Step::Activate { .. } => 3,
            Step::Start { .. } => 4,
            Step::Stop { .. } => 5,
            Step::Retire { .. } => 6,
            Step::AlreadyRunning { .. } => 7,
            Step::AlreadyReady { .. } => 8,
        })
        .collect();
    assert_eq!(kinds.len(), steps.len(), "one step of each kind");
    steps
}

#[test]
fn every_step_that_changes_the_host_records_an_effect_the_log_knows_as_one() {
    for step in one_of_each() {
        let nothing_to_do = matches!(
            step,
            Step::AlreadyRunning { .. } | Step::AlreadyReady { .. }
        );
        match step.clone().effect("c1") {
            Some(event) => assert!(event.is_effect(), "{step:?} records {event:?}"),
            None => assert!(nothing_to_do, "{step:?} records no effect"),
        }
    }
}

#[test]
fn a_step_is_recovered_as_a_start_exactly_when_it_grants_before_its_driver_call() {
    for step in one_of_each() {
        let grants_first =
            step.hooks() == HookSequence::GrantThenDriver(Phase::BeforeWorkloadStart);
        assert_eq!(starting(&step).is_some(), grants_first, "{step:?}");
        if grants_first {
            assert!(step.spec().is_some(), "{step:?} starts with no spec");
        }
    }
}

//! Property: for random valid command sequences, every command is answered once, as
//! its completion record says, succeeded or failed with one of the precondition codes
//! (never rejected, never a log or driver failure: the sim driver does not fail);
//! and the intent rebuilt on reopen (snapshot + tail) equals the intent before, and
//! equals a replay from scratch.

use crate::event::Event;
use crate::executor::Executor;
use crate::intent::Intent;
use crate::log::{Log, LogOptions};
use crate::testkit::{command, image, records};
use capstan_common::{CommandResult, ErrorCode, Op, Outcome};
use capstan_driver::sim::{SimConfig, SimDriver};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

fn op_strategy() -> impl Strategy<Value = Op> {
    let ns = prop::sample::select(vec!["a", "b"]).prop_map(String::from);
    let wl = prop::sample::select(vec!["web", "db"]).prop_map(String::from);
    let rev = prop::sample::select(vec!["r1", "r2", "r3"]).prop_map(String::from);
    let images = prop::sample::select(vec!["img:1", "img:2"]).prop_map(String::from);
    prop_oneof![
        ns.clone()
            .prop_map(|namespace| Op::EnsureNamespace { namespace }),
        ns.clone()
            .prop_map(|namespace| Op::DeleteNamespace { namespace }),
        (ns.clone(), wl.clone(), rev.clone(), images).prop_map(
            |(namespace, workload, revision, name)| {
                Op::PrepareRevision {
                    namespace,
                    workload,
                    revision,
                    spec: image(&name),
                }
            }
        ),
        (ns.clone(), wl.clone(), rev.clone()).prop_map(|(namespace, workload, revision)| {
            Op::ActivateRevision {
                namespace,
                workload,
                revision,
            }
        }),
        (ns.clone(), wl.clone()).prop_map(|(namespace, workload)| Op::StopWorkload {
            namespace,
            workload
        }),
        (ns.clone(), wl.clone()).prop_map(|(namespace, workload)| Op::StartWorkload {
            namespace,
            workload
        }),
        (ns, wl, rev).prop_map(|(namespace, workload, revision)| Op::RetireRevision {
            namespace,
            workload,
            revision
        }),
    ]
}

fn replay_from_scratch(log: &Log) -> Intent {
    let mut intent = Intent::default();
    for r in records(log) {
        intent.apply(r.seq, &r.event);
    }
    intent
}

/// The codes a valid command on a healthy host may fail with: what it asks does not
/// fit what the host holds (docs/protocol.md, the execution codes).
const PRECONDITIONS: [ErrorCode; 7] = [
    ErrorCode::NamespaceNotFound,
    ErrorCode::NamespaceNotEmpty,
    ErrorCode::WorkloadNotFound,
    ErrorCode::RevisionNotFound,
    ErrorCode::RevisionConflict,
    ErrorCode::RevisionRetired,
    ErrorCode::NoActiveRevision,
];

/// Each result against its command and the log: answered under its own id, not a
/// duplicate, succeeded or failed with a precondition code, and equal to the one
/// completion the log holds for it.
fn check_results(log: &Log, results: &[CommandResult]) -> Result<(), TestCaseError> {
    let mut completions: HashMap<String, Vec<(Outcome, Option<ErrorCode>)>> = HashMap::new();
    for r in records(log) {
        if let Event::CommandCompleted {
            command_id,
            outcome,
            code,
            ..
        } = r.event
        {
            completions
                .entry(command_id)
                .or_default()
                .push((outcome, code));
        }
    }
    prop_assert_eq!(completions.len(), results.len());
    for (i, result) in results.iter().enumerate() {
        let id = format!("c{i}");
        prop_assert_eq!(result.id.as_deref(), Some(id.as_str()));
        prop_assert!(!result.duplicate, "{:?}", result);
        let code = result.error.as_ref().map(|e| e.code);
        match result.outcome {
            Outcome::Succeeded => prop_assert!(code.is_none(), "{:?}", result),
            Outcome::Failed => prop_assert!(
                code.is_some_and(|c| PRECONDITIONS.contains(&c)),
                "{:?}",
                result
            ),
            Outcome::Rejected => prop_assert!(false, "a valid command rejected: {:?}", result),
        }
        prop_assert_eq!(
            completions.get(&id),
            Some(&vec![(result.outcome, code)]),
            "{}",
            id
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn reopen_rebuilds_the_same_intent(ops in prop::collection::vec(op_strategy(), 1..60), every in 1u64..9) {
        let dir = tempfile::tempdir().unwrap();
        let options = LogOptions::snapshot_every(every);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let before = runtime.block_on(async {
            let log = Arc::new(Log::open(&dir.path().join("log"), options).unwrap());
            let driver = Arc::new(SimDriver::open(dir.path(), SimConfig::default()).unwrap());
            let executor = Executor::new("h1", Arc::clone(&log), driver);
            let mut results = Vec::new();
            for (i, op) in ops.into_iter().enumerate() {
                results.push(executor.execute(command(&format!("c{i}"), op)).await);
            }
            log.flush().unwrap();
            check_results(&log, &results).map(|()| log.intent())
        })?;
        let log = Log::open(&dir.path().join("log"), options).unwrap();
        prop_assert!(log.degraded().is_none());
        prop_assert_eq!(&log.intent(), &before);
        prop_assert_eq!(&replay_from_scratch(&log), &before);
    }
}

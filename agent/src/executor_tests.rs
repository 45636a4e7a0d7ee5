//! Property: for random valid command sequences, the intent rebuilt on reopen
//! (snapshot + tail) equals the intent before, and equals a replay from scratch.

use crate::executor::Executor;
use crate::intent::Intent;
use crate::log::{Log, LogOptions};
use crate::testkit::{command, image, records};
use capstan_common::Op;
use capstan_driver::sim::{SimConfig, SimDriver};
use proptest::prelude::*;
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
            for (i, op) in ops.into_iter().enumerate() {
                executor.execute(command(&format!("c{i}"), op)).await;
            }
            log.flush().unwrap();
            log.intent()
        });
        let log = Log::open(&dir.path().join("log"), options).unwrap();
        prop_assert!(log.degraded().is_none());
        prop_assert_eq!(&log.intent(), &before);
        prop_assert_eq!(&replay_from_scratch(&log), &before);
    }
}

//! A failed log flush must show (status, heartbeat) and must not be acted on.

use crate::log::LogError;
use crate::testkit::{command, prepare_op, spec, Rig};
use crate::transport::rpc;
use capstan_common::{ErrorCode, Op, Outcome};
use capstan_driver::sim::SimConfig;

use crate::testkit::host_info as info;

#[tokio::test]
async fn a_command_whose_receipt_is_not_durable_is_never_acted_on() {
    let rig = Rig::new(SimConfig::default());
    let ns = Op::EnsureNamespace {
        namespace: "ns".into(),
    };
    rig.ok("ns", ns).await;
    rig.executor.log().inject_flush_failure("disk on fire");
    // The first delivery: `command_received` is written but cannot be made durable.
    // The redelivery (the consumer naks it) finds that record in the log: it must not
    // take it for recorded and carry the command out.
    for delivery in 1..=2 {
        let r = rig
            .executor
            .execute(command("p1", prepare_op("r1", spec())))
            .await;
        assert_eq!(r.outcome, Outcome::Failed, "delivery {delivery}: {r:?}");
        let error = r.error.unwrap();
        assert_eq!(error.code, ErrorCode::LogFailed, "delivery {delivery}");
        assert!(error.message.contains("disk on fire"), "{error:?}");
        assert!(
            rig.sim.host().revisions.is_empty(),
            "delivery {delivery}: the driver was called"
        );
    }
}

#[tokio::test]
async fn status_shows_a_failed_flush() {
    let rig = Rig::new(SimConfig::default());
    let status = rpc::answer("status", b"", &rig.executor, &info(), 0);
    assert_eq!(status["healthy"], true, "{status}");
    assert_eq!(status["log_failed"], serde_json::Value::Null);
    let log = rig.executor.log();
    log.inject_flush_failure("disk on fire");
    let seq = log.append(&[crate::testkit::ns_ready()]).unwrap();
    assert!(matches!(
        log.durable(seq).await,
        Err(LogError::Flush(ref why)) if why == "disk on fire"
    ));
    let status = rpc::answer("status", b"", &rig.executor, &info(), 0);
    assert_eq!(status["healthy"], false, "{status}");
    assert_eq!(status["log_failed"], "disk on fire");
    assert_eq!(status["degraded"], serde_json::Value::Null);
    // Nothing more is written once a flush has failed.
    assert!(matches!(
        log.append(&[crate::testkit::ns_ready()]),
        Err(LogError::Flush(ref why)) if why == "disk on fire"
    ));
    assert_eq!(log.last_seq(), seq);
}

#[tokio::test]
async fn the_heartbeat_shows_a_failed_flush() {
    let rig = Rig::new(SimConfig::default());
    let log = rig.executor.log();
    let beat = crate::transport::registry::beat(&info(), &rig.executor, 0, 0);
    assert!(beat.healthy && beat.log_failed.is_none(), "{beat:?}");
    log.inject_flush_failure("disk on fire");
    let seq = log.append(&[crate::testkit::ns_ready()]).unwrap();
    assert!(matches!(
        log.durable(seq).await,
        Err(LogError::Flush(ref why)) if why == "disk on fire"
    ));
    let beat = crate::transport::registry::beat(&info(), &rig.executor, seq, 0);
    assert!(!beat.healthy, "{beat:?}");
    assert_eq!(beat.log_failed.as_deref(), Some("disk on fire"));
    // What the coordinator reads back (and shows in `/v1/hosts`).
    let json = serde_json::to_value(&beat).unwrap();
    assert_eq!(json["log_failed"], "disk on fire");
    assert_eq!(json["healthy"], false);
}

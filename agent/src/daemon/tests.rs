//! Given a daemon with running workloads, when it stops, then the sweep, the exit
//! status and the stop order hold — with and without NATS.

use super::*;
use crate::testkit::{command, spec, Rig, HOST};
use crate::transport::auth::SigningConfig;
use capstan_common::{Op, Outcome};
use capstan_driver::sim::{ScriptedFailure, SimConfig, SimHost};
use capstan_driver::BackendState;
use std::path::Path;

fn settings(shutdown: ShutdownMode, nats: Option<NatsSettings>) -> Settings {
    Settings {
        nats,
        shutdown,
        shutdown_concurrency: 4,
        reconcile_interval: None,
        backoff: Backoff::default(),
        metrics: None,
        local: None,
        retention: None,
    }
}

/// Given: namespace `ns` with workloads `web` and `db` running on r1.
async fn given_two_running(sim: SimConfig) -> Rig {
    let rig = Rig::new(sim);
    rig.running_r1().await;
    let ops = [
        Op::PrepareRevision {
            namespace: "ns".into(),
            workload: "db".into(),
            revision: "r1".into(),
            spec: spec(),
        },
        Op::ActivateRevision {
            namespace: "ns".into(),
            workload: "db".into(),
            revision: "r1".into(),
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let r = rig.executor.execute(command(&format!("db-{i}"), op)).await;
        assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    }
    rig
}

fn assert_state(dir: &Path, wl: &str, expected: BackendState) {
    let host = SimHost::load(dir).unwrap();
    assert_eq!(
        host.revisions[&format!("ns/{wl}@r1")].state,
        expected,
        "{wl}"
    );
}

#[tokio::test]
async fn a_graceful_stop_sweeps_without_changing_intent_and_exits_0() {
    let rig = given_two_running(SimConfig::default()).await;
    let (dir, executor) = (&rig.dir, Arc::clone(&rig.executor));
    let intent = executor.log().intent().workloads;

    let daemon = Daemon::start(executor, settings(ShutdownMode::Stop, None))
        .await
        .unwrap();
    let executor = Arc::clone(daemon.executor());
    let report = daemon.stop(None).await.unwrap();

    assert_eq!(
        report.sweep,
        Some(SweepReport {
            stopped: 2,
            failed: 0
        })
    );
    assert_eq!(report.exit_code(), 0);
    assert_state(dir.path(), "web", BackendState::Stopped);
    assert_eq!(
        executor.log().intent().workloads,
        intent,
        "intent unchanged"
    );
    assert!(
        executor.shutdown_token().is_cancelled(),
        "hooks in flight were cancelled"
    );
}

#[tokio::test]
async fn the_exit_status_is_the_number_of_workloads_that_would_not_stop() {
    let sim = SimConfig {
        failures: vec![ScriptedFailure {
            op: "stop".into(),
            namespace: None,
            workload: Some("db".into()),
            revision: None,
            times: None,
            gives_up: None,
        }],
        ..SimConfig::default()
    };
    let rig = given_two_running(sim).await;
    let (dir, executor) = (&rig.dir, Arc::clone(&rig.executor));

    let daemon = Daemon::start(executor, settings(ShutdownMode::Stop, None))
        .await
        .unwrap();
    let report = daemon.stop(None).await.unwrap();

    assert_eq!(
        report.sweep,
        Some(SweepReport {
            stopped: 1,
            failed: 1
        })
    );
    assert_eq!(report.exit_code(), 1);
    assert_state(dir.path(), "db", BackendState::Running);
}

#[tokio::test]
async fn leave_running_from_the_operator_overrides_the_config() {
    let rig = given_two_running(SimConfig::default()).await;
    let (dir, executor) = (&rig.dir, Arc::clone(&rig.executor));

    let daemon = Daemon::start(executor, settings(ShutdownMode::Stop, None))
        .await
        .unwrap();
    let report = daemon.stop(Some(ShutdownMode::LeaveRunning)).await.unwrap();

    assert_eq!(report, StopReport { sweep: None });
    assert_eq!(report.exit_code(), 0);
    assert_state(dir.path(), "web", BackendState::Running);
}

#[tokio::test]
async fn a_driver_that_reports_no_exits_is_not_supervised() {
    let rig = Rig::new(SimConfig::default());
    let executor = Arc::clone(&rig.executor);
    assert!(!executor.driver().capabilities().reports_exits);
    let daemon = Daemon::start(executor, settings(ShutdownMode::Stop, None))
        .await
        .unwrap();
    assert!(!daemon.supervising());
    daemon.stop(None).await.unwrap();
}

/// The regression: with NATS, stopping awaited the command task twice and panicked
/// ("JoinHandle polled after completion"), skipping the outbox drain and the flush.
#[tokio::test]
async fn a_stop_with_nats_drains_the_outbox_and_returns() {
    let server = capstan_testsupport::NatsServer::start(&[]);
    let rig = given_two_running(SimConfig::default()).await;
    let executor = Arc::clone(&rig.executor);
    let nats = NatsSettings {
        config: capstan_common::nats::NatsConfig {
            url: server.url.clone(),
            ..Default::default()
        },
        policy: SigningConfig {
            allow_unsigned: true,
            ..Default::default()
        }
        .policy()
        .unwrap(),
        info: HostInfo {
            host: HOST.into(),
            version: "test".into(),
            drivers: vec!["sim".into()],
            capabilities: serde_json::Value::Null,
            outbox_alarm: Default::default(),
        },
        key: Arc::new(capstan_common::signing::Signer::generate().unwrap()),
        in_flight: 4,
    };

    let daemon = Daemon::start(executor, settings(ShutdownMode::Stop, Some(nats)))
        .await
        .unwrap();
    let executor = Arc::clone(daemon.executor());
    let report = daemon.stop(None).await.unwrap();

    assert_eq!(report.exit_code(), 0);
    // Every record reached the event stream before the stop returned.
    let client = async_nats::connect(&server.url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = capstan_common::nats::evt_stream(&js, 1, capstan_common::nats::Scope::Shared)
        .await
        .unwrap();
    let last = executor.log().last_seq();
    let published = stream.info().await.unwrap().state.messages;
    assert_eq!(published, last, "the outbox drained every record");
}

#[tokio::test]
async fn the_background_verification_degrades_a_log_with_a_forged_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    {
        // 11 records, snapshots at 4 and 8; the one at 8 resealed over an intent
        // without namespace `n0`: a valid hash, a valid anchor, a lie.
        let log = crate::log::Log::open(&log_dir, crate::log::LogOptions::snapshot_every(4));
        let log = log.unwrap();
        for i in 0..11 {
            let ready = crate::event::Event::NamespaceReady {
                command_id: format!("c-n{i}"),
                namespace: format!("n{i}"),
            };
            log.append(&[ready]).unwrap();
        }
        log.reseal_snapshot(8, |body| {
            let namespaces = body["intent"]["namespaces"].as_object_mut().unwrap();
            assert!(namespaces.remove("n0").is_some(), "{body}");
        });
        log.flush().unwrap();
    }
    let options = crate::log::LogOptions::snapshot_every(1000);
    let log = Arc::new(crate::log::Log::open(&log_dir, options).unwrap());
    assert!(log.degraded().is_none(), "opening trusts the snapshot");
    let sim =
        Arc::new(capstan_driver::sim::SimDriver::open(dir.path(), SimConfig::default()).unwrap());
    let executor = Arc::new(Executor::new(HOST, log, sim));
    let mut daemon = Daemon::start(
        Arc::clone(&executor),
        settings(ShutdownMode::LeaveRunning, None),
    )
    .await
    .unwrap();
    let verification = daemon.verification().await;
    assert!(
        matches!(verification, Some(Err(LogError::Corrupt(_)))),
        "{verification:?}"
    );
    assert_eq!(
        executor.log().degraded().map(|c| (c.seq, c.defect)),
        Some((8, crate::log::Defect::SnapshotForged))
    );
    let ns = Op::EnsureNamespace {
        namespace: "late".into(),
    };
    let r = executor.execute(command("late", ns)).await;
    assert_eq!(r.outcome, Outcome::Rejected, "{r:?}");
    assert_eq!(
        r.error.unwrap().code,
        capstan_common::ErrorCode::LogDegraded
    );
    daemon.stop(None).await.unwrap();
}

#[tokio::test]
async fn the_background_verification_passes_an_honest_log() {
    let rig = given_two_running(SimConfig::default()).await;
    let records = rig.executor.log().last_seq();
    let mut daemon = Daemon::start(
        Arc::clone(&rig.executor),
        settings(ShutdownMode::LeaveRunning, None),
    )
    .await
    .unwrap();
    let verified = daemon.verification().await.unwrap().unwrap().unwrap();
    assert!(verified >= records, "{verified} < {records}");
    assert!(rig.executor.log().degraded().is_none());
    daemon.stop(None).await.unwrap();
}

/// `GET /metrics` at `addr`: the whole HTTP/1.0 response.
async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn metrics_are_served_until_the_stop_which_a_stalled_connection_does_not_hold() {
    use tokio::io::AsyncWriteExt as _;
    let rig = given_two_running(SimConfig::default()).await;
    let listener = crate::metrics::serve::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    // A second listener on the same address is refused, naming it.
    let taken = crate::metrics::serve::bind(addr).await.unwrap_err();
    assert!(taken.to_string().contains(&addr.to_string()), "{taken}");
    let mut settings = settings(ShutdownMode::LeaveRunning, None);
    settings.metrics = Some(listener);
    let daemon = Daemon::start(Arc::clone(&rig.executor), settings)
        .await
        .unwrap();
    let response = scrape(addr).await;
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    let last = rig.executor.log().last_seq();
    assert!(
        response.contains(&format!("\ncapstan_agent_log_last_seq {last}\n")),
        "{response}"
    );
    assert!(response.contains("capstan_agent_workloads{state=\"running\"} 2\n"));
    // Half a request, never finished.
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    stalled.write_all(b"GET /metr").await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(30), daemon.stop(None)).await;
    assert!(stopped.expect("the stop was held").is_ok());
    assert!(
        matches!(
            tokio::net::TcpStream::connect(addr).await,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        ),
        "still listening"
    );
}

#[tokio::test]
async fn a_running_daemon_sees_a_backend_removed_by_hand_without_a_restart() {
    use capstan_driver::Driver as _;
    let rig = given_two_running(SimConfig::default()).await;
    let settings = Settings {
        reconcile_interval: Some(Duration::from_millis(20)),
        ..settings(ShutdownMode::LeaveRunning, None)
    };
    let daemon = Daemon::start(Arc::clone(&rig.executor), settings)
        .await
        .unwrap();
    let db = capstan_driver::RevisionRef {
        namespace: "ns",
        workload: "db",
        revision: "r1",
    };
    rig.sim.retire(db).await.unwrap();
    let recorded = || {
        rig.records().iter().any(|r| {
            matches!(
                &r.event,
                crate::event::Event::WorkloadFailed {
                    workload,
                    code: capstan_common::ErrorCode::BackendMissing,
                    ..
                } if workload == "db"
            )
        })
    };
    // Waits for the record the loop writes (not for a time): at most 30 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !recorded() {
        assert!(tokio::time::Instant::now() < deadline, "never recorded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = daemon.stop(None).await.unwrap();
    assert_eq!(report.exit_code(), 0);
    assert_state(rig.dir.path(), "web", BackendState::Running);
}

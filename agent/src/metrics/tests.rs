//! Given commands carried out through a measured driver and real hooks, then the
//! figures count them, the text renders them in the 0.0.4 format, and no label
//! carries a command id or a workload name.

use super::render::{render, Gauges};
use super::*;
use crate::hooks::{HookKind, HookOwner, Hooks, Runners};
use crate::testkit::{activate_op, command, line, prepare_op, spec, Rig, HOST};
use capstan_driver::sim::{ScriptedFailure, SimConfig};
use std::sync::Arc;

fn gauges(rig: &Rig) -> Gauges {
    let log = rig.executor.log();
    Gauges {
        last_seq: log.last_seq(),
        published_seq: Some(1),
        degraded: !log.healthy(),
        workloads: log.with_intent(workloads),
        version: "9.9.9",
        driver: capstan_common::DriverKind::SIM,
    }
}

fn owner(name: &str, argv: &str) -> HookOwner {
    HookOwner {
        name: name.into(),
        kind: HookKind::Exec {
            argv: vec![argv.into()],
        },
        timeout: Duration::from_secs(10),
        phases: vec![Phase::BeforeWorkloadStart],
    }
}

/// A sim whose first `activate` of `web2` fails, measured, with hook owners `iam`
/// (`/bin/true`) and, when `failing_hook`, `net` (`/bin/false`).
fn measured_rig(failing_hook: bool) -> Rig {
    let mut config = SimConfig::default();
    config.failures.push(ScriptedFailure {
        op: "activate".into(),
        namespace: None,
        workload: Some("web2".into()),
        revision: None,
        times: Some(1),
        gives_up: None,
    });
    let mut owners = vec![owner("iam", "/bin/true")];
    if failing_hook {
        owners.push(owner("net", "/bin/false"));
    }
    let rig = Rig::new(config);
    // Measured as `HostSetup::open` measures: one `Metrics` for driver, hooks, executor.
    let metrics = Arc::new(Metrics::new());
    let driver: Arc<dyn capstan_driver::Driver> = rig.sim.clone();
    let driver = driver::Measured::wrap(driver, Arc::clone(&metrics));
    let hooks = Hooks::new(owners, Arc::new(Runners::default())).with_metrics(Arc::clone(&metrics));
    let executor = crate::executor::Executor::new(HOST, Arc::clone(rig.executor.log()), driver)
        .with_hooks(hooks)
        .with_metrics(metrics);
    Rig {
        executor: Arc::new(executor),
        ..rig
    }
}

fn ns() -> Op {
    Op::EnsureNamespace {
        namespace: "ns".into(),
    }
}

fn web2(op: Op) -> Op {
    match op {
        Op::PrepareRevision {
            namespace,
            revision,
            spec,
            ..
        } => Op::PrepareRevision {
            namespace,
            workload: "web2".into(),
            revision,
            spec,
        },
        Op::ActivateRevision {
            namespace,
            revision,
            ..
        } => Op::ActivateRevision {
            namespace,
            workload: "web2".into(),
            revision,
        },
        other => other,
    }
}

/// The value of the one sample line starting with `series ` (`None`: no such line).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[tokio::test]
async fn commands_are_counted_by_op_and_outcome_and_duplicates_apart() {
    let rig = measured_rig(false);
    let e = &rig.executor;
    rig.ok("c-ns", ns()).await;
    rig.ok("c-p1", prepare_op("r1", spec())).await;
    rig.ok("c-a1", activate_op("r1")).await;
    // A duplicate, a failed command (the scripted activate), two rejections.
    assert!(
        e.execute(command("c-a1", activate_op("r1")))
            .await
            .duplicate
    );
    rig.ok("c-p2", web2(prepare_op("r1", spec()))).await;
    let failed = e.execute(command("c-a2", web2(activate_op("r1")))).await;
    assert_eq!(failed.outcome, Outcome::Failed, "{failed:?}");
    assert_eq!(e.submit("{not json").await.outcome, Outcome::Rejected);
    let elsewhere = line("c-x", "ensure_namespace", r#""namespace":"ns""#).replace(HOST, "h9");
    assert_eq!(e.submit(&elsewhere).await.outcome, Outcome::Rejected);

    let text = render(e.metrics(), &gauges(&rig));
    let count = |op: &str, outcome: &str, dup: bool| {
        value(
            &text,
            &format!(
                r#"capstan_agent_commands_total{{op="{op}",outcome="{outcome}",duplicate="{dup}"}}"#
            ),
        )
    };
    assert_eq!(
        count("ensure_namespace", "succeeded", false),
        Some(1.0),
        "{text}"
    );
    assert_eq!(count("activate_revision", "succeeded", false), Some(1.0));
    assert_eq!(count("activate_revision", "succeeded", true), Some(1.0));
    assert_eq!(count("activate_revision", "failed", false), Some(1.0));
    assert_eq!(count("prepare_revision", "succeeded", false), Some(2.0));
    assert_eq!(count("none", "rejected", false), Some(1.0));
    assert_eq!(count("ensure_namespace", "rejected", false), Some(1.0));
    assert_eq!(count("stop_workload", "succeeded", false), Some(0.0));
    assert_eq!(
        e.metrics().command_counts(),
        CommandCounts {
            succeeded: 4,
            failed: 1,
            rejected: 2,
            duplicate: 1
        }
    );
    // The heartbeat's figures: the same counts, the lag against the given seqs.
    let last = e.log().last_seq();
    let figures = e.metrics().figures(e.log(), last, last - 2);
    assert_eq!(figures.commands, e.metrics().command_counts());
    assert_eq!(figures.outbox_lag, 2);
    // One workload running; one whose activation failed: never started, so stopped
    // (a failed command changes no intent; `workload_failed` comes from reconciling).
    assert_eq!(
        figures.workloads,
        WorkloadCounts {
            running: 1,
            stopped: 1,
            failed: 0
        }
    );
    assert_eq!(
        value(&text, r#"capstan_agent_workloads{state="running"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "capstan_agent_log_last_seq"),
        Some(e.log().last_seq() as f64)
    );
    assert_eq!(
        value(&text, "capstan_agent_outbox_lag"),
        Some((e.log().last_seq() - 1) as f64)
    );
    assert_eq!(value(&text, "capstan_agent_degraded"), Some(0.0));
    // Bounded labels: no command id, workload or namespace name anywhere.
    for name in ["c-ns", "c-a1", "c-x", "web2", "\"ns\"", "h9"] {
        assert!(!text.contains(name), "{name} in {text}");
    }
}

#[tokio::test]
async fn the_measured_driver_counts_ok_and_errors_by_op_with_their_code() {
    let rig = measured_rig(false);
    rig.ok("c-ns", ns()).await;
    rig.ok("c-p2", web2(prepare_op("r1", spec()))).await;
    let failed = rig
        .executor
        .execute(command("c-a2", web2(activate_op("r1"))))
        .await;
    assert_eq!(failed.outcome, Outcome::Failed);
    rig.ok("c-a3", web2(activate_op("r1"))).await;
    rig.executor.driver().observe().await.unwrap();

    let ops: Vec<_> = rig
        .executor
        .metrics()
        .driver_ops()
        .into_iter()
        .map(|(op, code, h)| (op.as_str(), result_str(code), h.count()))
        .collect();
    assert_eq!(
        ops,
        [
            ("ensure_namespace", "ok", 1),
            ("prepare", "ok", 1),
            ("activate", "driver_failed", 1),
            ("activate", "ok", 1),
            ("observe", "ok", 1),
            // The failed activation's roll-back read what runs.
            ("state", "ok", 1),
        ]
    );
    let text = render(rig.executor.metrics(), &gauges(&rig));
    let series = r#"capstan_agent_driver_op_duration_seconds_bucket{op="activate",result="driver_failed",le="+Inf"}"#;
    assert_eq!(value(&text, series), Some(1.0), "{text}");
    let count = r#"capstan_agent_driver_op_duration_seconds_count{op="activate",result="ok"}"#;
    assert_eq!(value(&text, count), Some(1.0));
}

#[tokio::test]
async fn hook_calls_are_counted_by_owner_phase_and_result_and_timed() {
    let rig = measured_rig(true);
    rig.ok("c-ns", ns()).await;
    rig.ok("c-p1", prepare_op("r1", spec())).await;
    let failed = rig
        .executor
        .execute(command("c-a1", activate_op("r1")))
        .await;
    assert_eq!(failed.outcome, Outcome::Failed, "{failed:?}");
    let (calls, durations) = rig.executor.metrics().hooks();
    let start = Phase::BeforeWorkloadStart;
    assert_eq!(
        calls,
        [
            ("iam".to_string(), start, "ok", 1),
            ("net".to_string(), start, "hook_failed", 1),
        ]
    );
    let counts: Vec<_> = durations
        .iter()
        .map(|(o, p, h)| (o.as_str(), *p, h.count()))
        .collect();
    assert_eq!(counts, [("iam", start, 1), ("net", start, 1)]);
    assert!(durations.iter().all(|(_, _, h)| h.sum() > 0.0));
    let text = render(rig.executor.metrics(), &gauges(&rig));
    let series = r#"capstan_agent_hook_calls_total{owner="net",phase="before_workload_start",result="hook_failed"}"#;
    assert_eq!(value(&text, series), Some(1.0), "{text}");
}

#[test]
fn histograms_are_cumulative_with_sum_and_count() {
    let mut h = Histogram::default();
    for ms in [0, 3, 3, 700, 120_000] {
        h.observe(Duration::from_millis(ms));
    }
    let c: Vec<(f64, u64)> = h.cumulative().collect();
    assert_eq!(c[0], (0.001, 1));
    assert_eq!(c[1], (0.005, 3));
    assert_eq!(c[8], (1.0, 4));
    assert_eq!(
        c[BUCKETS.len() - 1],
        (60.0, 4),
        "two minutes is past the last bound"
    );
    assert_eq!(c[BUCKETS.len()], (f64::INFINITY, 5));
    assert_eq!(h.count(), 5);
    assert!((h.sum() - 120.706).abs() < 1e-9);
    assert!(BUCKETS.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn the_text_has_help_and_type_for_every_family_and_escapes_label_values() {
    let m = Metrics::new();
    m.hook_call(
        "a\"b\\c\nd",
        Phase::BeforeWorkloadStop,
        "ok",
        Duration::from_millis(2),
    );
    m.driver_op(DriverOp::Stop, None, Duration::from_millis(2));
    let g = Gauges {
        last_seq: 7,
        published_seq: None,
        degraded: true,
        workloads: WorkloadCounts::default(),
        version: "1.2.3",
        driver: capstan_common::DriverKind::DOCKER,
    };
    let text = render(&m, &g);
    assert!(text.contains(r#"owner="a\"b\\c\nd""#), "{text}");
    assert!(text.contains("capstan_agent_build_info{version=\"1.2.3\",driver=\"docker\"} 1\n"));
    assert_eq!(value(&text, "capstan_agent_degraded"), Some(1.0));
    assert!(
        !text.contains("outbox"),
        "no outbox figures without NATS: {text}"
    );
    // Every sample belongs to a family announced just before with HELP and TYPE.
    let mut family: Option<(String, String)> = None;
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            family = Some((name.to_string(), String::new()));
        } else if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let f = family.as_mut().expect("TYPE after HELP");
            assert_eq!(f.0, name);
            assert!(["gauge", "counter", "histogram"].contains(&kind), "{l}");
            f.1 = kind.to_string();
        } else {
            let (name, kind) = family.as_ref().expect("a sample after its family");
            let series = l.split(['{', ' ']).next().unwrap();
            let ok = match kind.as_str() {
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| series == format!("{name}{s}")),
                _ => series == name,
            };
            assert!(ok, "{series} under {name} ({kind})");
            assert!(l.rsplit(' ').next().unwrap().parse::<f64>().is_ok(), "{l}");
        }
    }
}

#[test]
fn workloads_are_failed_while_their_last_start_failed_else_by_intent() {
    use crate::event::{Cause, Event};
    use crate::testkit::{given, running, started, stopped};
    let failed = Event::WorkloadFailed {
        cause: Cause::AgentStartup,
        namespace: "ns".into(),
        workload: "web".into(),
        code: ErrorCode::BackendMissing,
        message: "gone".into(),
    };
    let mut events = running("r1", spec());
    let count = |events: &[Event]| workloads(&given(events));
    assert_eq!(count(&events).running, 1);
    events.push(failed);
    assert_eq!(count(&events).failed, 1);
    assert_eq!(count(&events).running, 0);
    // A start clears the failure; a stop by command changes the intent.
    events.push(started(Cause::Supervisor, "r1", None));
    assert_eq!(count(&events).running, 1);
    events.push(stopped(crate::testkit::by("s1"), "r1"));
    assert_eq!(
        count(&events),
        WorkloadCounts {
            running: 0,
            stopped: 1,
            failed: 0
        }
    );
}

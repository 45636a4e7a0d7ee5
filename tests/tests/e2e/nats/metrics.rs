//! An agent's `/metrics` and heartbeat figures end to end: commands over NATS (one
//! failing), a hook, then a scrape that counts them as the log and CAPSTAN_EVT show
//! them; and an address in use stops `run` with an error naming it.

use super::{shop, Fleet};
use capstan_tests::agent::{metrics_address, scrape, Agent};
use capstan_tests::hooks::Hook;
use capstan_tests::process::Exit;

/// The value of the sample `series` (name and labels exactly as rendered).
fn value(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{series}: {v}")))
}

fn commands(text: &str, op: &str, outcome: &str) -> Option<u64> {
    value(
        text,
        &format!(
            r#"capstan_agent_commands_total{{op="{op}",outcome="{outcome}",duplicate="false"}}"#
        ),
    )
}

#[test]
fn metrics_and_heartbeat_count_commands_hooks_and_driver_ops() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let h1 = fleet
        .agent("h1")
        .hook(Hook::plain(
            "iam",
            &["before_workload_start", "before_workload_stop"],
        ))
        .build();
    // Leaving the workload running, a stop appends nothing: the log read after it is
    // the log the scrape saw.
    let daemon = h1.run_with(&["--leave-running"], &[]);
    let addr = metrics_address(&daemon);
    assert!(addr.ip().is_loopback(), "{addr}");

    coordinator.run_all(&shop(&h1, true));
    let id = coordinator.submit(&h1.commands("shop").start("start-ghost", "ghost"));
    let failed = coordinator.cli_json(&["wait", &id], 1);
    assert_eq!(failed["error"]["code"], "workload_not_found", "{failed}");

    // Once the outbox has caught up (its lag 0), the figures are final.
    let text = capstan_tests::wait_until("the outbox to catch up", capstan_tests::READY, || {
        let (status, content_type, text) = scrape(addr);
        assert_eq!(status, 200, "{text}");
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
        (value(&text, "capstan_agent_outbox_lag") == Some(0)
            && commands(&text, "start_workload", "failed") == Some(1))
        .then_some(text)
    });
    assert_eq!(
        commands(&text, "ensure_namespace", "succeeded"),
        Some(1),
        "{text}"
    );
    assert_eq!(commands(&text, "prepare_revision", "succeeded"), Some(1));
    assert_eq!(commands(&text, "activate_revision", "succeeded"), Some(1));
    assert_eq!(commands(&text, "none", "rejected"), Some(0));
    let hook = r#"{owner="iam",phase="before_workload_start"#;
    assert_eq!(
        value(
            &text,
            &format!(r#"capstan_agent_hook_calls_total{hook}",result="ok"}}"#)
        ),
        Some(1),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            &format!("capstan_agent_hook_call_duration_seconds_count{hook}\"}}")
        ),
        Some(1)
    );
    for op in ["ensure_namespace", "prepare", "activate"] {
        let series =
            format!(r#"capstan_agent_driver_op_duration_seconds_count{{op="{op}",result="ok"}}"#);
        assert_eq!(value(&text, &series), Some(1), "{series} in {text}");
    }
    let observed = r#"capstan_agent_driver_op_duration_seconds_count{op="observe",result="ok"}"#;
    assert!(
        value(&text, observed) >= Some(1),
        "startup reconciliation observes"
    );
    assert_eq!(
        value(&text, r#"capstan_agent_workloads{state="running"}"#),
        Some(1)
    );
    assert_eq!(value(&text, "capstan_agent_degraded"), Some(0));
    assert!(
        text.contains(r#"capstan_agent_build_info{version=""#),
        "{text}"
    );
    assert!(text.contains(r#",driver="sim"} 1"#), "{text}");
    // The log's last seq, as CAPSTAN_EVT holds it (the outbox lag is 0).
    let events = coordinator.events("h1");
    let last = events
        .last()
        .and_then(|e| e["seq"].as_u64())
        .expect("events");
    assert_eq!(value(&text, "capstan_agent_log_last_seq"), Some(last));
    assert_eq!(
        value(&text, "capstan_agent_outbox_published_seq"),
        Some(last)
    );
    // No command id or workload name in any label.
    for name in ["start-ghost", "ghost", "web", "shop"] {
        assert!(!text.contains(name), "{name} in {text}");
    }

    // The heartbeat carries the same key figures; `/v1/hosts` passes them through.
    let hosts = coordinator.wait_for_hosts("h1's figures", |v| {
        let beat = &v["hosts"][0]["beat"];
        beat["last_seq"] == last && beat["figures"]["outbox_lag"] == 0
    });
    let figures = &hosts["hosts"][0]["beat"]["figures"];
    assert_eq!(figures["published_seq"], last, "{figures}");
    assert_eq!(
        figures["commands"],
        serde_json::json!({"succeeded": 3, "failed": 1, "rejected": 0, "duplicate": 0})
    );
    assert_eq!(
        figures["workloads"],
        serde_json::json!({"running": 1, "stopped": 0, "failed": 0})
    );
    assert!(figures["since"].is_string(), "{figures}");

    // A second agent on the same address does not start without its endpoint.
    let h2 = Agent::builder("h2")
        .metrics(Some(&addr.to_string()))
        .build();
    let refused = h2.start(&[], &[]).wait_expecting(Exit::Code(2));
    assert!(
        refused.contains(&format!("cannot listen for /metrics on {addr}")),
        "{refused}"
    );
    assert!(!h2.log_dir().exists(), "nothing was opened");

    daemon.stop();
    let log = h1.log();
    let seq = log.last().and_then(|r| r["seq"].as_u64());
    assert_eq!(
        seq,
        Some(last),
        "the log's last seq, read by `capstan-agent log`"
    );
    fleet.stop();
}

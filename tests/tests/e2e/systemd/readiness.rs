//! Readiness gates activation on a real systemd: the agent probes the unit's port on
//! loopback (units share the host's network) and stops the predecessor only once the
//! new revision answers; one that never does is stopped, the command failing
//! `not_ready` with the predecessor's unit still active. Stop-first hands a port over
//! from one revision to the next.

use super::spec_running;
use capstan_driver::RevisionRef;
use capstan_systemd::naming;
use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::free_port;
use capstan_tests::process::Exit;
use capstan_tests::systemd::SystemdHost;
use capstan_tests::unique;
use serde_json::json;

fn unit(revision: &str) -> String {
    naming::unit_name(RevisionRef {
        namespace: "ns",
        workload: "web",
        revision,
    })
}

/// `web@revision`: `program` with a tcp check on `port`, probed every 100 ms.
fn checked(program: Spec, port: u16, deadline_ms: u32) -> Spec {
    program.with(
        "readiness",
        json!({"check": {"tcp": {"port": port}}, "interval_ms": 100, "deadline_ms": deadline_ms}),
    )
}

/// `ns/web` running `r1`, and `r2` prepared.
fn r1_running_r2_prepared(a: &Agent, r1: Spec, r2: Spec) {
    let c = a.commands("ns");
    a.apply_ok(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "web", "r1", r1),
        c.activate("a1", "web", "r1"),
        c.prepare("p2", "web", "r2", r2),
    ]);
}

#[test]
fn a_unit_that_never_listens_fails_not_ready_and_the_predecessor_stays_active() {
    let host = SystemdHost::boot();
    let a = Agent::builder(&unique("sdready-never"))
        .systemd(&host)
        .build();
    let c = a.commands("ns");
    let port = free_port();
    let r2 = checked(spec_running(&host, "ns", "web").into(), port, 1_500);
    r1_running_r2_prepared(&a, spec_running(&host, "ns", "web").into(), r2);
    let pid = host.property(&unit("r1"), "MainPID");
    let applied = a.apply(&[c.activate("a2", "web", "r2")]);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    let r = applied.result("a2");
    assert_eq!(r["error"]["code"], "not_ready", "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert_eq!(host.property(&unit("r1"), "ActiveState"), "active");
    assert_eq!(
        host.property(&unit("r1"), "MainPID"),
        pid,
        "r1 never restarted"
    );
    let r2 = host.property(&unit("r2"), "ActiveState");
    assert!(matches!(r2.as_str(), "inactive" | "failed"), "{r2}");
    assert_eq!(a.intent()["workloads"]["ns/web"]["active_revision"], "r1");
}

#[test]
fn a_unit_listening_after_a_while_activates_and_stops_the_predecessor() {
    let host = SystemdHost::boot();
    let a = Agent::builder(&unique("sdready-late"))
        .systemd(&host)
        .build();
    let c = a.commands("ns");
    let port = free_port();
    // Refuses connections for a second, then listens.
    let late = format!("sleep 1; exec /bin/busybox httpd -f -p 127.0.0.1:{port} -h /");
    let mut program = spec_running(&host, "ns", "web");
    program.command = ["/bin/sh", "-c", &late].map(String::from).to_vec();
    let r2 = checked(program.into(), port, 60_000);
    r1_running_r2_prepared(&a, spec_running(&host, "ns", "web").into(), r2);
    a.apply_ok(&[c.activate("a2", "web", "r2")]);
    assert_eq!(host.property(&unit("r2"), "ActiveState"), "active");
    let r1 = host.property(&unit("r1"), "ActiveState");
    assert!(matches!(r1.as_str(), "inactive" | "failed"), "{r1}");
    let connected = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(connected.is_ok(), "r2 listens: {connected:?}");
}

#[test]
fn stop_first_hands_the_port_over_and_the_probe_reaches_the_new_unit() {
    let host = SystemdHost::boot();
    let a = Agent::builder(&unique("sdstopfirst"))
        .systemd(&host)
        .build();
    let c = a.commands("ns");
    let port = free_port();
    let serving = |rev: &str| {
        let mut program = spec_running(&host, "ns", "web");
        let httpd = format!("exec /bin/busybox httpd -f -p 127.0.0.1:{port} -h /");
        program.command = ["/bin/sh", "-c", &httpd].map(String::from).to_vec();
        program.env.insert("REV".into(), rev.into());
        Spec::from(program)
    };
    // Two revisions on one port: only one can listen, so the old one goes first.
    let r2 = checked(serving("r2"), port, 60_000).with("strategy", "stop-first");
    r1_running_r2_prepared(&a, serving("r1"), r2);
    a.apply_ok(&[c.activate("a2", "web", "r2")]);
    assert_eq!(host.property(&unit("r2"), "ActiveState"), "active");
    assert_eq!(host.property(&unit("r2"), "NRestarts"), "0");
    let r1 = host.property(&unit("r1"), "ActiveState");
    assert!(matches!(r1.as_str(), "inactive" | "failed"), "{r1}");
    let connected = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(connected.is_ok(), "r2 listens: {connected:?}");
}

//! Crash in the middle of an activation: SIGKILL `capstan-agent apply` while it
//! replaces r1 by r2 across several workloads (after r2 started, typically while r1
//! is still being stopped), then apply the same commands again. Every workload ends
//! with exactly one running container, r2, and every activation logged exactly one
//! `workload_started`.

use capstan_tests::docker::{docker, wait_until, DockerAgent};
use std::process::Stdio;

const WORKLOADS: usize = 4;

#[test]
fn sigkill_mid_activation_ends_with_one_running_container_per_workload() {
    let a = DockerAgent::new("crash");
    let mut setup = vec![a.ensure_ns("ns")];
    let mut swap = Vec::new();
    for w in 0..WORKLOADS {
        let wl = format!("w{w}");
        setup.push(a.prepare(&format!("{wl}.p1"), &wl, "r1"));
        setup.push(a.activate(&format!("{wl}.a1"), &wl, "r1"));
        setup.push(a.prepare(&format!("{wl}.p2"), &wl, "r2"));
        swap.push(a.activate(&format!("{wl}.a2"), &wl, "r2"));
    }
    a.apply_ok("setup.jsonl", &setup);

    let input = a.agent.write_input("swap.jsonl", &swap);
    let mut child = a
        .command()
        .arg("apply")
        .arg(&input)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn apply");
    // Kill as soon as the first r2 container runs: that activation has started its
    // new revision and has not (or only just) stopped the old one.
    let r2_running = "label=io.capstan.revision=r2";
    let host = format!("label=io.capstan.host={}", a.host());
    wait_until("an r2 container to run", || {
        !docker(&["ps", "-q", "--filter", &host, "--filter", r2_running])
            .trim()
            .is_empty()
            || matches!(child.try_wait(), Ok(Some(_)))
    });
    let both = a.containers().iter().filter(|c| c.running).count();
    child.kill().expect("SIGKILL apply");
    let status = child.wait().expect("wait");
    eprintln!("killed apply ({status}) with {both} containers running");

    a.apply_ok("swap.jsonl", &swap);

    for w in 0..WORKLOADS {
        let wl = format!("w{w}");
        let running: Vec<_> = a
            .containers()
            .into_iter()
            .filter(|c| c.workload == wl && c.running)
            .collect();
        assert_eq!(running.len(), 1, "{wl}: {running:?}");
        assert_eq!(running[0].revision, "r2", "{wl}: {running:?}");
        assert!(!a.container(&wl, "r1").running);
    }
    let started = a.events("workload_started");
    for w in 0..WORKLOADS {
        for id in [format!("w{w}.a1"), format!("w{w}.a2")] {
            let n = started.iter().filter(|e| e["command_id"] == id).count();
            assert_eq!(n, 1, "{id} started {n} times: {started:#?}");
        }
    }
    let intent = a.agent.intent();
    for w in 0..WORKLOADS {
        let wi = &intent["workloads"][format!("{}/w{w}", a.ns)];
        assert_eq!(wi["active_revision"], "r2");
        assert_eq!(wi["intent"], "running");
    }
    assert!(intent["in_flight"].as_object().unwrap().is_empty());
    let (ok, text) = a.agent.verify();
    assert!(ok, "{text}");
}

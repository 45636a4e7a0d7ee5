//! Crash in the middle of an activation: SIGKILL `capstan-agent apply` while it
//! replaces r1 by r2 across several workloads (after r2 started, typically while r1
//! is still being stopped), then apply the same commands again. Every workload ends
//! with exactly one running container, r2, and every activation logged exactly one
//! `workload_started`.

use capstan_tests::docker::{agent, docker, serve};
use capstan_tests::{wait_until, READY};
use std::io::{BufRead as _, BufReader};

const WORKLOADS: usize = 4;

#[test]
fn sigkill_mid_activation_ends_with_one_running_container_per_workload() {
    let a = agent("crash").build();
    let c = a.commands(&a.host);
    let mut setup = vec![c.ensure_namespace("ns")];
    let mut swap = Vec::new();
    for w in 0..WORKLOADS {
        let wl = format!("w{w}");
        setup.push(c.prepare(&format!("{wl}.p1"), &wl, "r1", serve("r1")));
        setup.push(c.activate(&format!("{wl}.a1"), &wl, "r1"));
        setup.push(c.prepare(&format!("{wl}.p2"), &wl, "r2", serve("r2")));
        swap.push(c.activate(&format!("{wl}.a2"), &wl, "r2"));
    }
    a.apply_ok(&setup);

    // Fed through a pipe that stays open until the kill: `apply` cannot reach the end
    // of its input and exit, so the kill hits a live process.
    let (mut apply, feed) = a.start_apply_fed(&swap);
    let answers = BufReader::new(apply.stdout());
    // Kill as soon as the first r2 container runs: that activation has started its
    // new revision and has not (or only just) stopped the old one.
    let r2_running = "label=io.capstan.revision=r2";
    let host = format!("label=io.capstan.host={}", a.host);
    wait_until("an r2 container to run", READY, || {
        if let Some(exit) = apply.exited() {
            panic!(
                "apply ended ({exit}) before an r2 container ran: {}",
                apply.stderr()
            );
        }
        !docker(&["ps", "-q", "--filter", &host, "--filter", r2_running])
            .trim()
            .is_empty()
    });
    let both = a.containers().iter().filter(|c| c.running).count();
    // Asserts it was still running and that SIGKILL ended it.
    apply.kill();
    feed.close();
    let answered = answers.lines().count();
    let mid_command = swap
        .get(answered)
        .is_some_and(|next| a.in_progress(next.id()));
    eprintln!(
        "SIGKILLed apply after {answered} answers with {both} containers running; \
         {} of 1 kills landed mid-command",
        u8::from(mid_command)
    );

    a.apply_ok(&swap);

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
    let intent = a.intent();
    for w in 0..WORKLOADS {
        let wi = &intent["workloads"][format!("{}/w{w}", c.ns)];
        assert_eq!(wi["active_revision"], "r2");
        assert_eq!(wi["intent"], "running");
    }
    assert!(intent["in_flight"].as_object().unwrap().is_empty());
    let (ok, text) = a.verify();
    assert!(ok, "{text}");
}

//! Crashes in the middle of activations, in a loop: SIGKILL `capstan-agent apply`
//! again and again while it replaces r1 by r2 across several workloads — each time as
//! soon as one more r2 runs, so typically while its r1 is still being stopped (podman
//! then reports r1 `stopping`, a state the Docker API does not list) — and start it
//! again on the same commands, which first finishes the activation it was killed in.
//! Every workload ends with exactly one running container, r2, and every activation
//! logged exactly one `workload_started`.

use capstan_tests::docker::{agent, slow_to_stop, Engine};
use capstan_tests::{wait_until, READY};

capstan_tests::each_engine!(sigkill_mid_activation_ends_with_one_running_container_per_workload);

const WORKLOADS: usize = 4;

fn sigkill_mid_activation_ends_with_one_running_container_per_workload(engine: Engine) {
    let a = agent(engine, "crash").build();
    let c = a.commands(&a.host);
    let mut setup = vec![c.ensure_namespace("ns")];
    let mut swap = Vec::new();
    for w in 0..WORKLOADS {
        let wl = format!("w{w}");
        setup.push(c.prepare(&format!("{wl}.p1"), &wl, "r1", slow_to_stop("r1", 2)));
        setup.push(c.activate(&format!("{wl}.a1"), &wl, "r1"));
        setup.push(c.prepare(&format!("{wl}.p2"), &wl, "r2", slow_to_stop("r2", 2)));
        swap.push(c.activate(&format!("{wl}.a2"), &wl, "r2"));
    }
    a.apply_ok(&setup);

    // Round w kills `apply` as soon as w's r2 runs: that activation has started its
    // new revision and has not (or only just) asked the engine to stop the old one.
    // The next round's `apply` recovers it first, then goes on to the next workload.
    let host = format!("label=io.capstan.host={}", a.host);
    let mut mid_command = 0;
    for w in 0..WORKLOADS {
        // Fed through a pipe that stays open until the kill: `apply` cannot reach the
        // end of its input and exit, so the kill hits a live process.
        let (mut apply, feed) = a.start_apply_fed(&swap);
        let answers = apply.stdout_lines();
        let workload = format!("label=io.capstan.workload=w{w}");
        wait_until(format_args!("w{w}@r2 to run"), READY, || {
            if let Some(exit) = apply.exited() {
                panic!(
                    "apply ended ({exit}) before w{w}@r2 ran: {}",
                    apply.stderr()
                );
            }
            !a.docker(&[
                "ps",
                "-q",
                "--filter",
                &host,
                "--filter",
                &workload,
                "--filter",
                "label=io.capstan.revision=r2",
            ])
            .trim()
            .is_empty()
        });
        // Asserts it was still running and that SIGKILL ended it.
        apply.kill();
        feed.close();
        let answered = answers.rest("the answers of the killed apply").len();
        if swap
            .get(answered)
            .is_some_and(|next| a.in_progress(next.id()))
        {
            mid_command += 1;
        }
    }
    eprintln!("{mid_command} of {WORKLOADS} kills landed mid-command");
    // Each kill comes as r2 runs while r1 takes 2 s to stop: a run whose kills all
    // missed the activations tested nothing.
    assert!(mid_command > 0, "no kill landed mid-command");

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
        // Stopped to the end, not still stopping (podman's `Running` is false then).
        assert_eq!(a.container(&wl, "r1").status, "exited");
    }
    let started = a.events("workload_started");
    for w in 0..WORKLOADS {
        for id in [format!("w{w}.a1"), format!("w{w}.a2")] {
            let n = started.iter().filter(|e| e["command_id"] == id).count();
            assert_eq!(n, 1, "{id} started {n} times: {started:#?}");
        }
    }
    // Nothing else started anything: no startup reconciliation found a revision to
    // start again.
    assert_eq!(started.len(), 2 * WORKLOADS, "{started:#?}");
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

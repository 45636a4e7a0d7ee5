//! A start that meets a stop under way. Podman shows that moment as `stopping` and
//! refuses to start the container until the stop is over ("container state
//! improper"); the driver waits for the stop, then starts it, so `start_workload`
//! succeeds and the workload runs. Only podman: dockerd shows the same moment as
//! `running` and answers the start with 304, after which the stop ends it (the
//! supervisor of `capstan-agent run` then starts it again, see docs/docker.md).
//!
//! The moment is made exact with an exec hook: `before_workload_start` of the start
//! waits until the test has had the container started and a stop begun behind the
//! agent's back.

use capstan_tests::docker::{agent, slow_to_stop, Engine};
use capstan_tests::hooks::Hook;
use capstan_tests::process::{Exit, Process};
use capstan_tests::{wait_until, READY};
use std::process::{Command, Stdio};

mod a_start_during_a_stop_under_way_waits_for_it_then_runs {
    #[test]
    fn podman() {
        super::a_start_during_a_stop_under_way_waits_for_it_then_runs(
            capstan_tests::docker::Engine::Podman,
        )
    }
}

/// Owner `gate`: once the file `armed` exists in the agent's dir, every
/// `before_workload_start` says so in `waiting` and waits for `go`.
fn gate() -> Hook {
    let body = r#"dir=$(dirname "$0")
if [ "$phase" = before_workload_start ] && [ -e "$dir/armed" ]; then
  touch "$dir/waiting"
  until [ -e "$dir/go" ]; do sleep 0.05; done
fi
exit 0"#;
    Hook::new(
        "gate",
        &["before_workload_start", "before_workload_stop"],
        body,
    )
    .timeout(60.0)
}

fn a_start_during_a_stop_under_way_waits_for_it_then_runs(engine: Engine) {
    let a = agent(engine, "stopping").hook(gate()).build();
    let c = a.commands(&a.host);
    a.apply_ok(&c.rollout(&["web"], "r1", |rev| slow_to_stop(rev, 5)));
    a.apply_ok(&[c.stop("s1", "web")]);
    let web = a.container("web", "r1");
    assert_eq!(web.status, "exited");

    std::fs::write(a.path("armed"), "").expect("arm the gate");
    let start = c.start("s2", "web");
    let (mut apply, feed) = a.start_apply_fed(std::slice::from_ref(&start));
    let answers = apply.stdout_lines();
    wait_until("the start's hook to wait", READY, || {
        a.path("waiting").exists()
    });
    // Behind the agent's back: the container runs, and a stop of it begins.
    a.docker(&["start", &web.id]);
    let mut stop = Command::new("docker");
    stop.args(["-H", &engine.socket(), "stop", "-t", "30", &web.id])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let stop = Process::spawn("docker stop", stop, &a.path("docker-stop.err"));
    wait_until("the container to be stopping", READY, || {
        a.container("web", "r1").status == "stopping"
    });
    std::fs::write(a.path("go"), "").expect("open the gate");

    let answer: serde_json::Value = serde_json::from_str(
        &answers
            .next_line("the start's answer")
            .expect("an answer before the end of stdout"),
    )
    .expect("a JSON answer");
    feed.close();
    apply.wait_expecting(Exit::Code(0));
    assert_eq!(answer["outcome"], "succeeded", "{answer}");
    // The driver waited for the stop, then started the same container.
    let after = a.container("web", "r1");
    assert_eq!(after.status, "running", "{after:?}");
    assert_eq!(after.id, web.id, "started again, not recreated");
    // The stop behind our back ended: stopped, or (when the driver's start came
    // first) refused by podman to clean up after it, leaving the container running.
    let exit = wait_until("docker stop to end", READY, || stop.exited());
    let said = stop.stderr();
    assert!(
        exit == Exit::Code(0) || (exit == Exit::Code(1) && said.contains("refusing to clean up")),
        "docker stop ended with {exit}: {said}"
    );
    drop(stop);
    let started: Vec<_> = a
        .events("workload_started")
        .into_iter()
        .filter(|e| e["command_id"] == "s2")
        .collect();
    assert_eq!(started.len(), 1, "{started:#?}");
}

//! Readiness gates activation on the real engines: the predecessor runs until the new
//! revision passes its check — inside the container (`exec`) or at its address on the
//! namespace's network (`tcp`, `http`) — and one that never passes is stopped, the
//! command failing `not_ready` with the predecessor still running.

use capstan_tests::command::Spec;
use capstan_tests::docker::{agent, serve, Engine, IMAGE};
use capstan_tests::process::Exit;
use serde_json::{json, Value};

capstan_tests::each_engine!(
    a_revision_that_never_listens_fails_not_ready_and_its_predecessor_runs_on,
    an_exec_check_passing_on_its_third_run_activates_and_stops_the_predecessor,
    an_http_check_reaches_the_container_at_its_address_and_passes_on_a_2xx_only,
);

fn checked(spec: Spec, check: Value, deadline_ms: u32) -> Spec {
    spec.with(
        "readiness",
        json!({"check": check, "interval_ms": 100, "timeout_ms": 500, "deadline_ms": deadline_ms}),
    )
}

fn a_revision_that_never_listens_fails_not_ready_and_its_predecessor_runs_on(engine: Engine) {
    let a = agent(engine, "rdy-never").build();
    let c = a.commands(&a.host);
    let mut setup = c.rollout(&["web"], "r1", serve);
    let never = checked(serve("r2"), json!({"tcp": {"port": 8080}}), 1_500);
    setup.push(c.prepare("p2", "web", "r2", never));
    a.apply_ok(&setup);
    let r1 = a.container("web", "r1");
    let applied = a.apply(&[c.activate("a2", "web", "r2")]);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    let error = &applied.results[0]["error"];
    assert_eq!(error["code"], "not_ready", "{applied}");
    assert_eq!(applied.results[0]["retryable"], true, "{applied}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("was not ready within 1500 ms"),
        "{message}"
    );
    assert!(
        message.contains(":8080"),
        "the last probe's words: {message}"
    );
    assert_eq!(a.container("web", "r1"), r1, "r1 untouched, same start");
    assert!(!a.container("web", "r2").running);
}

fn an_exec_check_passing_on_its_third_run_activates_and_stops_the_predecessor(engine: Engine) {
    let a = agent(engine, "rdy-exec").build();
    let c = a.commands(&a.host);
    let mut setup = c.rollout(&["web"], "r1", serve);
    // Counts its runs in the container; passes from the third.
    let count = "n=$(cat /tmp/probes 2>/dev/null || echo 0); n=$((n+1)); echo $n > /tmp/probes; [ $n -ge 3 ]";
    let check = json!({"exec": {"command": ["sh", "-c", count]}});
    setup.push(c.prepare("p2", "web", "r2", checked(serve("r2"), check, 60_000)));
    a.apply_ok(&setup);
    a.apply_ok(&[c.activate("a2", "web", "r2")]);
    let r2 = a.container("web", "r2");
    assert!(r2.running);
    assert!(!a.container("web", "r1").running);
    let probes = a.docker(&["exec", &r2.id, "cat", "/tmp/probes"]);
    assert_eq!(probes.trim(), "3", "probed until it passed, then no more");
}

fn an_http_check_reaches_the_container_at_its_address_and_passes_on_a_2xx_only(engine: Engine) {
    let a = agent(engine, "rdy-http").build();
    let c = a.commands(&a.host);
    let mut setup = c.rollout(&["web"], "r1", serve);
    // Serves /www: /ready.html only from a second after the start (404 before).
    let script = "mkdir -p /www; trap 'exit 0' TERM; httpd -f -p 8080 -h /www & \
                sleep 1; echo ok > /www/ready.html; wait";
    let site = |rev: &str, path: &str, deadline_ms| {
        let check = json!({"http": {"port": 8080, "path": path}});
        let spec = Spec::docker(IMAGE)
            .command(&["sh", "-c", script])
            .env("REV", rev);
        checked(spec, check, deadline_ms)
    };
    setup.push(c.prepare("p2", "web", "r2", site("r2", "/ready.html", 60_000)));
    setup.push(c.prepare("p3", "web", "r3", site("r3", "/missing.html", 2_000)));
    a.apply_ok(&setup);
    a.apply_ok(&[c.activate("a2", "web", "r2")]);
    assert!(a.container("web", "r2").running);
    assert!(!a.container("web", "r1").running);
    // A path that answers 404 for ever never makes its revision ready.
    let applied = a.apply(&[c.activate("a3", "web", "r3")]);
    assert_eq!(
        applied.results[0]["error"]["code"], "not_ready",
        "{applied}"
    );
    let message = applied.results[0]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("status 404"), "{message}");
    assert!(a.container("web", "r2").running);
    assert!(!a.container("web", "r3").running);
}

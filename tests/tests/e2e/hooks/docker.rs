//! Hook conformance #11 on the docker driver: the placeholder an exec hook contributes
//! reaches the container's environment (and never the log), and survives the
//! agent's graceful stop and restart and the supervisor's restart of a killed
//! container, which run no hooks and keep the grant (`docs/hooks.md`).

use super::iam;
use capstan_tests::docker::{agent, serve, Engine};
use capstan_tests::{wait_until, READY};

capstan_tests::each_engine!(
    the_placeholder_reaches_the_container_env_and_survives_an_agent_restart
);

fn the_placeholder_reaches_the_container_env_and_survives_an_agent_restart(engine: Engine) {
    let a = agent(engine, "hookenv").hook(iam()).build();
    a.apply_ok(&a.commands(&a.host).rollout(&["web"], "r1", serve));
    let before = a.container("web", "r1");
    assert!(before.running);
    assert!(
        before.has_env("DB_TOKEN=opaque-db.tok:42"),
        "{:?}",
        before.env
    );
    assert!(before.has_env("REV=r1"), "spec env kept: {:?}", before.env);

    // No value in the log.
    let log = serde_json::to_string(&a.log()).unwrap();
    assert!(!log.contains("opaque-db"), "a placeholder reached the log");

    // Graceful stop (the sweep stops it), then startup resumes the same container.
    a.run().stop();
    assert!(!a.container("web", "r1").running);
    let daemon = a.run();
    let after = a.container("web", "r1");
    assert!(after.running, "started again on startup");
    assert_eq!(after.id, before.id, "resumed, not recreated");
    assert!(
        after.has_env("DB_TOKEN=opaque-db.tok:42"),
        "{:?}",
        after.env
    );

    // The container dies: the supervisor starts it again, no hook either.
    a.docker(&["kill", &after.id]);
    wait_until("the supervisor to restart web", READY, || {
        let now = a.container("web", "r1");
        (now.running && now.started_at != after.started_at).then_some(())
    });
    daemon.stop();
    let restarted = a.container("web", "r1");
    assert!(
        restarted.has_env("DB_TOKEN=opaque-db.tok:42"),
        "{:?}",
        restarted.env
    );
    assert_eq!(
        a.calls("iam"),
        ["before_workload_start false"],
        "neither the sweep, the startup nor the supervisor ran a hook"
    );
    let intent = a.intent();
    let holds = &intent["grants"]["revisions"][format!("{}/web", a.host)]["r1"];
    assert!(holds.get("iam").is_some(), "the grant is kept: {intent}");
}

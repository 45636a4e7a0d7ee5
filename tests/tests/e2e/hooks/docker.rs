//! Hook conformance #11 on the docker driver: the placeholder an exec hook contributes
//! reaches the container's environment (and never the log), and survives the
//! agent's graceful stop and restart, which run no hooks.

use super::iam;
use capstan_tests::docker::{agent, serve, Engine};

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
    daemon.stop();
}

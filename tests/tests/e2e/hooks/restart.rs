//! An infrastructure restart keeps the hooks' placeholders: the graceful-stop sweep
//! and startup reconciliation run no hooks, so they must resume the workload exactly
//! as its last command-driven start configured it — never drop its launch env.

use super::{iam, rollout, web};
use capstan_tests::agent::Agent;

#[test]
fn a_sweep_and_a_startup_restart_keep_the_launch_env() {
    let agent = Agent::builder("h1").hook(iam()).build();
    let (_, lines) = rollout(&agent, &[("PLAIN", "value")]);
    agent.apply_ok(&lines);
    assert_eq!(web(&agent)["env"]["DB_TOKEN"], "opaque-db.tok:42");

    // Graceful stop: the sweep stops the workload, intent unchanged.
    agent.run().stop();
    assert_eq!(web(&agent)["state"], "stopped");

    // Startup: reconciliation starts it again, with the placeholder it had.
    let daemon = agent.run();
    let r = web(&agent);
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(
        r["env"]["DB_TOKEN"], "opaque-db.tok:42",
        "launch env kept: {r}"
    );
    assert_eq!(r["env"]["PLAIN"], "value");
    daemon.stop();
}

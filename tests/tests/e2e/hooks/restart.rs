//! Infrastructure stops and restarts keep grants (`docs/hooks.md`, *Infrastructure
//! stops keep grants*): the graceful-stop sweep, startup reconciliation and the
//! supervisor run no hooks, the grant ledger still holds what the last command-driven
//! start granted, and the workload resumes exactly as that start configured it —
//! never without its launch env. Only a command (stop, retire, delete) revokes.

use super::{iam, rollout, web};
use capstan_tests::agent::Agent;
use serde_json::Value;

/// The owners holding a grant for `ns/web@r1`, from `intent --json`.
fn holders(agent: &Agent) -> Vec<String> {
    let intent = agent.intent();
    match &intent["grants"]["revisions"]["ns/web"]["r1"] {
        Value::Object(holders) => holders.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

#[test]
fn a_sweep_and_a_startup_restart_keep_the_launch_env_and_the_grants() {
    let agent = Agent::builder("h1").hook(iam()).build();
    let (c, lines) = rollout(&agent, &[("PLAIN", "value")]);
    agent.apply_ok(&lines);
    assert_eq!(web(&agent)["env"]["DB_TOKEN"], "opaque-db.tok:42");
    assert_eq!(agent.calls("iam"), ["before_workload_start false"]);
    assert_eq!(holders(&agent), ["iam"]);

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

    // Neither told the owner anything, and the grant is still held…
    assert_eq!(
        agent.calls("iam"),
        ["before_workload_start false"],
        "no hook ran for the sweep or the restart"
    );
    assert_eq!(holders(&agent), ["iam"], "the grant is kept");
    // …until a command stops the workload: that revokes it.
    agent.apply_ok(&[c.stop("s1", "web")]);
    assert_eq!(
        agent.calls("iam"),
        ["before_workload_start false", "before_workload_stop false"]
    );
    assert!(holders(&agent).is_empty(), "revoked by the stop command");
}

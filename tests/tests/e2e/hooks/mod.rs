//! Lifecycle hooks with real exec hook scripts.

mod apply_stop;
mod crash;
mod docker;
mod exec;
mod frozen;
mod restart;

use capstan_tests::agent::Agent;
use capstan_tests::command::{Cmd, Commands, Spec};
use capstan_tests::hooks::Hook;

/// Namespace `ns` and revision `r1` of workload `web` on the sim driver (with `env`),
/// then its activation `a1`; and the commands for more.
fn rollout(agent: &Agent, env: &[(&str, &str)]) -> (Commands, Vec<Cmd>) {
    let c = agent.commands("ns");
    let spec = env
        .iter()
        .fold(Spec::sim(), |spec, (name, value)| spec.env(name, value));
    let lines = vec![
        c.ensure_namespace("ns"),
        c.prepare("p1", "web", "r1", spec),
        c.activate("a1", "web", "r1"),
    ];
    (c, lines)
}

/// The sim host's record of `web@r1`.
fn web(agent: &Agent) -> serde_json::Value {
    agent.sim_host()["revisions"]["ns/web@r1"].clone()
}

/// Owner `iam`: contributes the placeholder `DB_TOKEN=opaque-db.tok:42` to every start.
pub(crate) fn iam() -> Hook {
    let body = r#"[ "$phase" = before_workload_start ] && echo '{"env":{"DB_TOKEN":"opaque-db.tok:42"}}'
exit 0"#;
    Hook::new(
        "iam",
        &["before_workload_start", "before_workload_stop"],
        body,
    )
}

//! The docker driver against the real dockerd from `.ci/services.sh`.

mod bad_input;
mod crash;
mod names;
mod ownership;
mod restart;
mod retire;
mod supervise;

use capstan_tests::agent::Agent;
use capstan_tests::command::Commands;
use capstan_tests::docker::{agent, serve};

/// A docker agent named `name` (its namespace too) with workloads `a` and `b` at
/// `r1`: `a` running, `b` explicitly stopped. Nothing runs the agent yet.
fn a_running_b_stopped(name: &str) -> (Agent, Commands) {
    let a = agent(name).build();
    let c = a.commands(&a.host);
    let mut setup = c.rollout(&["a", "b"], "r1", serve);
    setup.push(c.stop("sb", "b"));
    a.apply_ok(&setup);
    (a, c)
}

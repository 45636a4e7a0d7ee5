//! The docker driver against the real engines from `.ci/services.sh`: every test runs
//! once on dockerd and once on podman (`<test>::dockerd`, `<test>::podman`), but
//! `stopping`, a state only podman shows, and `duplicate_network`, a name only dockerd
//! lets two networks share.

mod bad_input;
mod contract;
mod crash;
mod crash_loop;
mod duplicate_network;
mod grants;
mod names;
mod ownership;
mod readiness;
mod restart;
mod retire;
mod stopping;
mod strategy;
mod supervise;

use capstan_tests::agent::Agent;
use capstan_tests::command::Commands;
use capstan_tests::docker::{agent, serve, Engine};

/// A docker agent named `name` (its namespace too) with workloads `a` and `b` at
/// `r1`: `a` running, `b` explicitly stopped. Nothing runs the agent yet.
fn a_running_b_stopped(engine: Engine, name: &str) -> (Agent, Commands) {
    let a = agent(engine, name).build();
    let c = a.commands(&a.host);
    let mut setup = c.rollout(&["a", "b"], "r1", serve);
    setup.push(c.stop("sb", "b"));
    a.apply_ok(&setup);
    (a, c)
}

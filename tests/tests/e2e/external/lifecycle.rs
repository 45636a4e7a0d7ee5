//! A graceful stop (SIGTERM) of `capstan-agent run` sweeps what an external driver
//! runs only when the driver announced `manages_lifecycle`.

use capstan_driver::BackendState;
use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::external::SimDriver;

/// Rolls `web` out through an agent on `sim` (started with `args`), runs the agent
/// and stops it gracefully; returns web's state in the driver afterwards.
fn state_after_agent_stop(host: &str, args: &[&str]) -> BackendState {
    let sim = SimDriver::new();
    let agent = Agent::builder(host).external(&sim.socket()).build();
    let driver = sim.start(args);
    agent.apply_ok(
        &agent
            .commands("shop")
            .rollout(&["web"], "r1", |_| Spec::sim()),
    );
    let daemon = agent.run();
    daemon.stop();
    let state = sim.host().revisions["shop/web@r1"].state.clone();
    driver.kill();
    state
}

#[test]
fn a_driver_without_lifecycle_keeps_its_workloads_running_past_agent_stop() {
    let state = state_after_agent_stop("ext-keep", &["--manages-lifecycle", "false"]);
    assert_eq!(state, BackendState::Running);
}

#[test]
fn a_driver_with_lifecycle_gets_the_stop_sweep() {
    let state = state_after_agent_stop("ext-sweep", &[]);
    assert_eq!(state, BackendState::Stopped);
}

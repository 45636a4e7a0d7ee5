//! How `capstan-agent run` stops on the sim driver (which manages its workloads'
//! lifecycle): SIGTERM stops the running workloads; SIGUSR2 — what the package's
//! upgrade sends before `systemctl stop` — leaves them running, and the SIGTERM that
//! follows changes nothing.

use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::process::{send_signal, Exit};
use capstan_tests::unique;
use serde_json::Value;

fn web_state(a: &Agent) -> Value {
    a.sim_host()["revisions"]["ns/web@r1"]["state"].clone()
}

#[test]
fn sigusr2_leaves_workloads_running_even_when_sigterm_follows_and_sigterm_alone_stops_them() {
    let a = Agent::builder(&unique("usr2")).build();
    let c = a.commands("ns");
    a.apply_ok(&c.rollout(&["web"], "r1", |_| Spec::sim()));
    assert_eq!(web_state(&a), "running");

    // Back to back, as the upgrade does: whichever moment the SIGTERM lands (while
    // the agent stops, or pending beside the SIGUSR2), the SIGUSR2 decides.
    let daemon = a.run();
    send_signal(daemon.id(), libc::SIGUSR2);
    send_signal(daemon.id(), libc::SIGTERM);
    let stderr = daemon.wait_expecting(Exit::OK);
    assert!(stderr.contains("SIGUSR2: stopping"), "{stderr}");
    assert!(stderr.contains("leaving workloads running"), "{stderr}");
    assert_eq!(web_state(&a), "running", "SIGUSR2 stopped nothing");
    assert_eq!(a.events("workload_stopped"), Vec::<Value>::new());

    let daemon = a.run();
    daemon.stop();
    assert_eq!(web_state(&a), "stopped", "SIGTERM stopped it");
    let stopped = a.events("workload_stopped");
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(stopped[0]["cause"], "agent_shutdown");
}

//! A signal during startup: `run` installs its signal handlers before it opens the log
//! and reconciles the host, so a SIGTERM that arrives while it starts is neither fatal
//! nor lost — the agent finishes starting, then stops cleanly (exit 0), saying so. The
//! driver holds the startup reconciliation's `observe` so that the signal lands
//! inside startup, not before or after it.

use capstan_tests::agent::Agent;
use capstan_tests::external::SimDriver;
use capstan_tests::process::{send_signal, Exit};

#[test]
fn a_sigterm_during_startup_is_handled_once_the_agent_is_up() {
    let sim = SimDriver::new();
    let agent = Agent::builder("ext-startup")
        .external(&sim.socket())
        .build();
    let release = agent.path("release-observe");
    let release_arg = release.to_str().expect("a UTF-8 path");
    let driver = sim.start(&["--hold", "observe", "--release", release_arg]);
    let daemon = agent.start(&[], &[]);
    driver.wait_for_text("holding observe");
    assert!(daemon.exited().is_none(), "run waits on the held observe");
    assert!(
        !daemon.stderr().contains("capstan-agent ready"),
        "still starting: {}",
        daemon.stderr()
    );
    send_signal(daemon.id(), libc::SIGTERM);
    std::fs::write(&release, b"").expect("release the driver");
    // Not killed by the signal: a clean exit after a complete startup.
    let stderr = daemon.wait_expecting(Exit::OK);
    let at = |needle: &str| {
        stderr
            .find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{stderr}"))
    };
    assert!(
        at("capstan-agent ready") < at("SIGTERM: stopping"),
        "{stderr}"
    );
    assert!(
        at("SIGTERM: stopping") < at("capstan-agent stopped"),
        "{stderr}"
    );
    driver.kill();
}

//! Readiness through an external driver: a driver that announces `probes` is asked
//! `probe` over its socket (held here, so the activation waits on it) and the
//! activation succeeds once it answers ready; one that does not gets no spec with
//! `readiness` (`invalid_spec`, before it is received).

use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::external::SimDriver;
use capstan_tests::process::Exit;
use serde_json::json;

fn checked() -> Spec {
    Spec::sim().with(
        "readiness",
        json!({"check": {"tcp": {"port": 8080}}, "interval_ms": 50, "deadline_ms": 30000}),
    )
}

#[test]
fn a_driver_that_probes_is_asked_and_one_that_does_not_gets_no_readiness() {
    let sim = SimDriver::new();
    let agent = Agent::builder("ext-probe").external(&sim.socket()).build();
    let c = agent.commands("shop");
    let release = agent.path("release-probe");
    let driver = sim.start(&[
        "--probes",
        "--hold",
        "probe",
        "--release",
        release.to_str().expect("path"),
    ]);
    let input = agent.write_input(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "web", "r1", checked()),
        c.activate("a1", "web", "r1"),
    ]);
    let apply = agent.start_apply(Some(&input));
    driver.wait_for_text("holding probe");
    assert!(
        apply.exited().is_none(),
        "the activation waits on its probe"
    );
    std::fs::write(&release, b"").expect("release the probe");
    apply.wait_expecting(Exit::OK);
    let a1 = agent.log_of("a1");
    assert_eq!(a1.last().unwrap()["outcome"], "succeeded", "{a1:?}");
    driver.kill();

    // The same spec to a driver that did not announce `probes`.
    let driver = sim.start(&[]);
    let refused = agent.apply(&[c.prepare("p2", "web", "r2", checked())]);
    let r = &refused.results[0];
    assert_eq!(r["outcome"], "rejected", "{refused}");
    assert_eq!(r["error"]["code"], "invalid_spec", "{refused}");
    driver.kill();
}

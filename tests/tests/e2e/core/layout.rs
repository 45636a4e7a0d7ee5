//! Refuse, never empty: a log in a storage layout this build does not read (here one
//! a later build might write, layout 3) stops `run`, `apply`, `sim-fleet` and the
//! read commands with exit 2 and a message naming the layout and the build that wrote
//! it; nothing is written to it, and no fresh log is made beside it.

use capstan_tests::agent::Agent;
use capstan_tests::process::Exit;
use capstan_tests::unique;

const SAYS: &str =
    "is in storage layout 3, last opened for writing by capstan-agent 9.1.0; this build";

#[test]
fn a_log_in_a_newer_layout_stops_the_agent_with_exit_2_naming_it() {
    let a = Agent::builder(&unique("layout")).build();
    capstan_agent::log::write_future_layout(&a.log_dir(), "3", "9.1.0").expect("layout 3");

    let stderr = a.start(&[], &[]).wait_expecting(Exit::Code(2));
    assert!(stderr.contains(SAYS), "run: {stderr}");
    let applied = a.apply(&[a.commands("ns").ensure_namespace("ns")]);
    assert_eq!(applied.exit, Exit::Code(2), "{applied:?}");
    assert!(
        applied.results.is_empty() && applied.stderr.contains(SAYS),
        "{applied:?}"
    );
    for args in [&["log"][..], &["intent"], &["log", "verify"]] {
        let out = a.cli(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(SAYS), "{args:?}: {stderr}");
    }
    // A simulated fleet's host with such a log stops the fleet the same way.
    let fleet_host = a.data_dir().join("sim-0001").join("log");
    capstan_agent::log::write_future_layout(&fleet_host, "3", "9.1.0").expect("layout 3");
    let fleet = a.cli(&["sim-fleet", "--hosts", "1"]);
    let stderr = String::from_utf8_lossy(&fleet.stderr);
    assert_eq!(fleet.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(SAYS), "{stderr}");

    // The log is as it was: still layout 3, and nothing beside it.
    assert_eq!(
        String::from_utf8(a.cli_ok(&["log", "layout"])).unwrap(),
        "3\n"
    );
    let mut beside: Vec<_> = std::fs::read_dir(a.data_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    beside.sort();
    assert_eq!(beside, ["log", "sim-0001"]);
}

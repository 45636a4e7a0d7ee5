//! `capstan-bench --smoke`: every measurement of the benchmarks (bench/,
//! docs/benchmarks.md) once at tiny sizes, so that a change that breaks one fails CI
//! rather than the next person to measure. No figure is judged: the run must end with
//! exit 0 (every measurement ran to its end, or said why it was skipped) and every
//! measurement must have said something.

use capstan_tests::process::output;
use std::process::Command;
use std::time::Duration;

/// The smoke run's limit, just under the watchdog's: it took 206–214 s alone on the
/// 2-core development VM at a load of 12 (100 s of it building the packages for
/// `fleet-systemd`), 471 s beside a workspace clippy at a load of 17–21.
const LIMIT: Duration = Duration::from_secs(570);

/// Every measurement, in the order they run (`capstan-bench --only`'s names).
const MEASUREMENTS: [&str; 16] = [
    "group-commit",
    "open",
    "apply",
    "sim",
    "systemd",
    "fleet-systemd",
    "roundtrip",
    "throughput",
    "reads",
    "fanout",
    "log-append",
    "replay",
    "query",
    "docker",
    "footprint",
    "fleet",
];

#[test]
fn smoke_runs_every_measurement_once() {
    let mut c = Command::new(capstan_tests::binary("capstan-bench"));
    c.arg("--smoke");
    let out = output("capstan-bench --smoke", LIMIT, c);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "capstan-bench --smoke: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    // Each prints its figures (or why it was skipped) on lines of its own that start
    // with its name, or as JSON lines naming it.
    for m in MEASUREMENTS {
        let (line, json) = (format!("{m} "), format!("\"bench\":\"{m}\""));
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&line) || l.contains(&json)),
            "nothing from {m} in\n{stdout}\nstderr:\n{stderr}"
        );
    }
}

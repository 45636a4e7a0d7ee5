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

/// SIGTERM in the middle of a run: the processes the bench started are killed, and
/// the bench exits 143 at once. The run is held where it is by stopping its
/// nats-server (SIGSTOP), so that it cannot end by itself before the signal.
#[test]
fn a_signal_kills_what_the_bench_started() {
    use capstan_tests::process::{children_of, send_signal, Exit, Process};
    use capstan_tests::{wait_until, READY};
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(capstan_tests::binary("capstan-bench"));
    c.args(["--smoke", "--only", "roundtrip"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    let bench = Process::spawn("capstan-bench", c, &dir.path().join("stderr"));
    let pid = bench.id();
    let comm = |p: u32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    let server = wait_until("the bench's nats-server", READY, || {
        (children_of(pid).into_iter()).find(|&child| comm(child).trim() == "nats-server")
    });
    send_signal(server, libc::SIGSTOP);
    send_signal(pid, libc::SIGTERM);
    let stderr = bench.wait_expecting(Exit::Code(143));
    assert!(
        stderr.contains("capstan-bench: signal 15: killed the"),
        "{stderr}"
    );
    wait_until(
        format!("its nats-server (pid {server}) to be gone"),
        READY,
        || {
            let status =
                std::fs::read_to_string(format!("/proc/{server}/status")).unwrap_or_default();
            // Gone, or dead and not yet reaped by whoever inherited it.
            status.is_empty() || status.contains("State:\tZ")
        },
    );
}

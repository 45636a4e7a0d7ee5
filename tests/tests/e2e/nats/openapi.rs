//! The coordinator's API fuzzed from its own OpenAPI description
//! (`GET /v1/openapi.json`) by schemathesis (`.ci/schemathesis.sh`), against a live
//! coordinator with a live agent `h1` behind it: no answer outside what the
//! description documents (status codes, content types, headers, bodies), schema-invalid
//! input never accepted, and no 5xx but the documented 503/504s. The short run here;
//! `CAPSTAN_SCHEMATHESIS_EXAMPLES` raises the examples per operation (the full run,
//! docs/benchmarks.md).

use super::Fleet;
use capstan_tests::process::{Exit, Process};
use capstan_tests::wait_until;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// schemathesis's `st`: `$CAPSTAN_SCHEMATHESIS`, else what `.ci/schemathesis.sh` prints
/// (it installs it first on a machine without it).
fn st() -> PathBuf {
    if let Some(st) = std::env::var_os("CAPSTAN_SCHEMATHESIS") {
        return st.into();
    }
    capstan_tests::ci_script("schemathesis.sh")
}

#[test]
fn schemathesis_finds_every_answer_of_the_api_as_its_description_says() {
    let fleet = Fleet::start();
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();
    // What the description's examples name: a command to look up, a host that answers.
    fleet
        .coordinator
        .run_all(&[h1.commands("openapi").ensure_namespace("openapi-ns")]);

    let examples = std::env::var("CAPSTAN_SCHEMATHESIS_EXAMPLES").unwrap_or("25".into());
    // Every operation in every phase, but `waitCommand`: a wait on a command that stays
    // pending (fuzzed commands go to hosts that do not exist) rightly takes its whole
    // timeout, up to 5 minutes. It gets its examples and the boundary cases of its
    // parameters on their own (on a finished command, it answers at once).
    let runs: [&[&str]; 2] = [
        &["--exclude-operation-id", "waitCommand"],
        &[
            "--include-operation-id",
            "waitCommand",
            "--phases",
            "examples,coverage",
        ],
    ];
    let st = st();
    for (n, only) in runs.into_iter().enumerate() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut command = Command::new(&st);
        command
            .arg("run")
            .arg(format!("{}/v1/openapi.json", fleet.coordinator.url))
            .args(only)
            .args(["--checks", "all"])
            // A 5xx is checked against the description instead (status code
            // conformance): 503 and 504 are documented answers (NATS or the host not
            // there). Schema-valid commands that break a rule the description leaves to
            // the protocol (what each driver needs in a spec) are rightly 400.
            .args([
                "--exclude-checks",
                "not_a_server_error,positive_data_acceptance",
            ])
            .args(["--max-examples", &examples, "--seed", "1", "--workers", "1"])
            .args(["--request-timeout", "30", "--no-color"])
            .arg("--header")
            .arg(format!("Authorization: Bearer {}", fleet.coordinator.token))
            .arg("--report-dir")
            .arg(dir.path())
            .env("HOME", dir.path())
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("st.out")).expect("stdout file"));
        let run = Process::spawn(
            format!("schemathesis {n}"),
            command,
            &dir.path().join("err"),
        );
        // Bounded, and by more than READY: a run is many requests long.
        let exit = wait_until("schemathesis to finish", Duration::from_secs(540), || {
            run.exited()
        });
        let out = std::fs::read_to_string(dir.path().join("st.out")).unwrap_or_default();
        assert_eq!(
            exit,
            Exit::OK,
            "schemathesis {only:?}:\n{out}\n{}",
            run.stderr()
        );
        assert!(out.contains(" passed"), "{out}");
        // What it counted, e.g. "1008 generated, 1008 passed, 12 skipped".
        let counted = out
            .lines()
            .skip_while(|l| !l.starts_with("Test cases:"))
            .nth(1);
        eprintln!("schemathesis {only:?}: {}", counted.unwrap_or("?").trim());
    }
    daemon.stop();
    fleet.stop();
}

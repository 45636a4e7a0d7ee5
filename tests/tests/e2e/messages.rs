//! What an operator reads when something is off, from the real binaries: a
//! coordinator address without a scheme, JSON errors named by the input's own line
//! and column, a `--data-dir` that overrides the config's, a NATS server that does not
//! answer.

use capstan_tests::process::{output, Process};
use capstan_tests::{binary, free_port, wait_until, READY};
use std::process::Command;
use std::time::Duration;

const CLI: Duration = Duration::from_secs(60);

/// Given `--coordinator` without a scheme, then `capstan` says what to write instead
/// (exit 2), not the HTTP client's "relative URL without a base".
#[test]
fn a_coordinator_address_without_a_scheme_is_said_with_the_url_to_write() {
    let mut capstan = Command::new(binary("capstan"));
    capstan.args(["--coordinator", "127.0.0.1:7400", "hosts"]);
    let out = output("capstan hosts", CLI, capstan);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("\"127.0.0.1:7400\" is not a URL: say http://127.0.0.1:7400"),
        "{stderr}"
    );
    assert!(!stderr.contains("relative URL"), "{stderr}");
}

/// Given input whose third line (after a blank one) is not JSON, then `capstan-agent
/// apply` rejects it naming line 3 and its column, and `capstan submit` (a file of
/// commands over several lines) names the line and column in the file.
#[test]
fn a_json_error_names_the_line_and_column_of_the_input() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let input = dir.path().join("commands.jsonl");
    std::fs::write(
        &input,
        "{\"v\":1,\"id\":\"a1\",\"host\":\"h1\",\"issued_at\":\"2026-01-01T00:00:00Z\",\"op\":\"ensure_namespace\",\"namespace\":\"shop\"}\n\n  {\"v\":1, \"id\": oops}\n",
    )
    .expect("write the input");
    let mut apply = Command::new(binary("capstan-agent"));
    apply
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--host", "h1", "apply"])
        .arg(&input)
        .env("RUST_LOG", "error");
    let out = output("capstan-agent apply", CLI, apply);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let results = capstan_tests::parse_lines(&out.stdout);
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[1]["error"]["code"], "invalid_json");
    assert_eq!(
        results[1]["error"]["message"],
        "not JSON: expected value at line 3 column 17"
    );

    let file = dir.path().join("commands.json");
    std::fs::write(
        &file,
        "[\n  {\"host\": \"h1\", \"op\": \"ensure_namespace\",\n   \"namespace\": \"shop\",}\n]\n",
    )
    .expect("write the file");
    let mut submit = Command::new(binary("capstan"));
    submit
        .args(["--coordinator", "http://127.0.0.1:9", "submit"])
        .arg(&file);
    let out = output("capstan submit", CLI, submit);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is not JSON: trailing comma at line 3 column 24"),
        "{stderr}"
    );
}

/// Given a config that says `data_dir`, when `--data-dir` or `CAPSTAN_DATA_DIR` says
/// another, then that one is used and the agent says so, naming both and where the
/// winner came from; when they agree, it says nothing.
#[test]
fn a_data_dir_over_the_configs_is_said() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let configured = dir.path().join("configured");
    let given = dir.path().join("given");
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "host = \"h1\"\ndata_dir = {:?}\n",
            configured.display().to_string()
        ),
    )
    .expect("write the config");
    // `host-key` makes the key in the data dir it uses: where it is tells which won.
    let host_key = |flag: Option<&std::path::Path>, env: Option<&std::path::Path>| {
        let mut agent = Command::new(binary("capstan-agent"));
        agent.arg("--config").arg(&config);
        if let Some(dir) = flag {
            agent.arg("--data-dir").arg(dir);
        }
        agent.arg("host-key").env_remove("CAPSTAN_DATA_DIR");
        if let Some(dir) = env {
            agent.env("CAPSTAN_DATA_DIR", dir);
        }
        let out = output("capstan-agent host-key", CLI, agent);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let said = host_key(Some(&given), None);
    assert!(
        said.contains(&format!(
            "data dir {} (from --data-dir) overrides `data_dir = {:?}` in {}",
            given.display(),
            configured,
            config.display()
        )),
        "{said}"
    );
    assert!(given.join("host.key").exists() && !configured.exists());
    let said = host_key(None, Some(&given));
    assert!(said.contains("(from CAPSTAN_DATA_DIR) overrides"), "{said}");
    let said = host_key(Some(&configured), None);
    assert!(!said.contains("overrides"), "{said}");
    std::fs::remove_dir_all(&configured).expect("remove the configured dir");
    let said = host_key(None, None);
    assert!(!said.contains("overrides"), "{said}");
    assert!(configured.join("host.key").exists());
}

/// Given a coordinator whose NATS does not answer, when it tries again and again, then
/// it says so once at `warn`, naming the server's URL, and async-nats' own line per
/// attempt (`event: client error: nats: IO error`, no URL) is not there.
#[test]
fn a_nats_that_does_not_answer_is_said_once_naming_its_url() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let key = dir.path().join("signing.key");
    let mut keygen = Command::new(binary("capstan-coordinator"));
    keygen.args(["keygen", "--out"]).arg(&key);
    assert!(output("keygen", CLI, keygen).status.success());
    let url = format!("nats://127.0.0.1:{}", free_port());
    let config = dir.path().join("coordinator.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nsigning_key_file = {:?}\n[nats]\nurl = {url:?}\n",
            key.display().to_string()
        ),
    )
    .expect("write the config");
    let mut run = Command::new(binary("capstan-coordinator"));
    run.args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info,capstan_common::nats=debug");
    let coordinator = Process::spawn("coordinator", run, &dir.path().join("coordinator.log"));
    // Every failed attempt is logged at debug: wait for several.
    wait_until("three failed attempts to reach NATS", READY, || {
        coordinator
            .stderr()
            .matches("cannot connect to NATS (nats: IO error); retrying url=")
            .count()
            >= 3
    });
    let stderr = coordinator.stop();
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("cannot connect to NATS"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains(&format!("url=\"{url}\"")), "{stderr}");
    assert!(!stderr.contains("event: client error"), "{stderr}");
}

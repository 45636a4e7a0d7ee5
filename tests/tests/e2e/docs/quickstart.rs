//! The README's by-hand quickstart, run as written: the shell blocks between
//! `<!-- quickstart:begin -->` and `<!-- quickstart:end -->`, read from README.md when
//! the test runs, in one `bash -euo pipefail`, with the built binaries and a real
//! nats-server (`$CAPSTAN_NATS_SERVER`) first on `PATH` and its own temp dir. The
//! quickstart picks its own ports (each server says which) and stops what it starts;
//! whatever it left running when it failed is killed by the pid it wrote.

use capstan_common::audit_table;
use capstan_tests::docs;
use capstan_tests::process::output;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Longer than the quickstart takes on a loaded machine (seconds), short of the
/// watchdog's limit.
const QUICKSTART: Duration = Duration::from_secs(300);

#[test]
fn the_readmes_quickstart_runs_as_written() {
    let readme = docs::read("README.md");
    let section = docs::marked(&readme, "quickstart");
    let script: Vec<String> = docs::blocks(section)
        .into_iter()
        .filter(|b| b.lang == "sh")
        .map(|b| b.body)
        .collect();
    assert!(!script.is_empty(), "the quickstart section has no sh block");
    let script = script.join("\n");

    let dir = tempfile::tempdir().expect("a temp dir");
    // `nats-server` on PATH is the one the tests run ($CAPSTAN_NATS_SERVER).
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin dir");
    let server = nats_server();
    std::os::unix::fs::symlink(&server, bin.join("nats-server")).expect("link nats-server");
    // The quickstart's `mktemp -d` is made in here.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("tmp dir");
    let _leftovers = Leftovers(tmp.clone());

    let path = format!(
        "{}:{}:{}",
        bin.display(),
        capstan_tests::bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut bash = Command::new("bash");
    bash.args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("TMPDIR", &tmp)
        .env("HOME", dir.path());
    // Nothing from the test's own environment changes what the quickstart does.
    for name in [
        "RUST_LOG",
        "CAPSTAN_COORDINATOR",
        "CAPSTAN_TOKEN",
        "CAPSTAN_TOKEN_FILE",
        "CAPSTAN_CONFIG",
        "CAPSTAN_DATA_DIR",
        "CAPSTAN_HOST",
        "CAPSTAN_COORDINATOR_CONFIG",
    ] {
        bash.env_remove(name);
    }
    let out = output("the README's quickstart", QUICKSTART, bash);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the quickstart failed ({}); its stdout:\n{stdout}\nits stderr:\n{stderr}\n{}",
        out.status,
        logs(&tmp)
    );

    // The rollout reached both hosts, every command.
    assert!(
        stdout.contains("2/2 succeeded (all 3 commands)"),
        "{stdout}"
    );
    // h1's audit log, printed by `capstan log` from the central stream and by
    // `capstan-agent log` from the host's own log: one format, the same 9 records.
    let tables = tables(&stdout);
    assert_eq!(tables.len(), 2, "two audit-log tables: {stdout}");
    assert_eq!(
        tables[0], tables[1],
        "the two printers print the same table"
    );
    assert_eq!(tables[0].len(), 9, "{stdout}");
    assert!(
        tables[0][8].contains("command_completed")
            && tables[0][8].contains("web-r1-on.h1")
            && tables[0][8].contains("outcome=succeeded"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok: 9 records of h1 equal on the host and in CAPSTAN_EVT"),
        "{stdout}"
    );
    // It stopped everything it started: every pid it wrote has ended.
    for pid in pids(&tmp) {
        assert!(
            !running(pid),
            "the quickstart left pid {pid} running; its stderr:\n{stderr}"
        );
    }
}

/// The rows under each audit-log header of `stdout` (a table ends at the first line
/// that is not a row: one starting with a right-aligned seq).
fn tables(stdout: &str) -> Vec<Vec<String>> {
    let header = audit_table::header();
    let mut tables: Vec<Vec<String>> = vec![];
    let mut inside = false;
    for line in stdout.lines() {
        if line == header {
            tables.push(vec![]);
            inside = true;
        } else if inside
            && line
                .get(..6)
                .is_some_and(|seq| seq.trim_start().parse::<u64>().is_ok())
        {
            tables.last_mut().expect("a table").push(line.to_string());
        } else {
            inside = false;
        }
    }
    tables
}

/// The end of every log the quickstart wrote (`*.log` under its temp dir), to show why
/// it failed.
fn logs(dir: &Path) -> String {
    let mut out = String::new();
    for path in files(dir, "log") {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        out.push_str(&format!(
            "--- {} (its last 30 lines):\n{tail}\n",
            path.display()
        ));
    }
    out
}

/// The files under `dir` whose name ends in `.EXT`.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut found = vec![];
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The nats-server the tests run, as a path.
fn nats_server() -> PathBuf {
    let name = capstan_testsupport::nats_server_binary();
    if name.contains('/') {
        return PathBuf::from(name);
    }
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(&name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} is not on PATH (set CAPSTAN_NATS_SERVER)"))
}

/// The pids the quickstart wrote (`*.pid` under its temp dir).
fn pids(dir: &Path) -> Vec<u32> {
    files(dir, "pid")
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
        .collect()
}

/// Whether `pid` is one of the quickstart's programs and still runs (not a zombie).
fn running(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let ours = String::from_utf8_lossy(&cmdline);
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = state
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    !zombie && (ours.contains("capstan") || ours.contains("nats-server"))
}

/// On drop, SIGKILLs every program whose pid the quickstart wrote and that still
/// runs: a quickstart that failed half way leaves nothing behind.
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for pid in pids(&self.0) {
            if running(pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

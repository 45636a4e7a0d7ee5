//! One agent's data dir and its CLI.

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A `capstan-agent` with its own temporary data dir and host name.
pub struct Agent {
    dir: tempfile::TempDir,
    pub host: String,
}

impl Agent {
    pub fn new(host: &str) -> Agent {
        Agent {
            dir: tempfile::tempdir().expect("temp dir"),
            host: host.to_string(),
        }
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    /// `capstan-agent --data-dir … --host …` ready for a subcommand.
    pub fn command(&self) -> Command {
        let mut c = Command::new(crate::binary("capstan-agent"));
        c.arg("--data-dir")
            .arg(self.dir.path())
            .arg("--host")
            .arg(&self.host);
        c.env("RUST_LOG", "warn");
        c
    }

    /// Writes `lines` to a file in the data dir and returns its path.
    pub fn write_input(&self, name: &str, lines: &[String]) -> PathBuf {
        let path = self.dir.path().join(name);
        let mut f = std::fs::File::create(&path).expect("input file");
        for l in lines {
            writeln!(f, "{l}").expect("write input");
        }
        path
    }

    /// Runs `apply` on the file; returns the output and its parsed result lines.
    pub fn apply(&self, file: &Path) -> (Output, Vec<Value>) {
        let out = self
            .command()
            .arg("apply")
            .arg(file)
            .stdin(Stdio::null())
            .output()
            .expect("run apply");
        let results = parse_lines(&out.stdout);
        (out, results)
    }

    /// The whole log as JSON objects.
    pub fn log_json(&self) -> Vec<Value> {
        let out = self
            .command()
            .args(["log", "--json"])
            .output()
            .expect("run log");
        assert!(
            out.status.success(),
            "log --json failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_lines(&out.stdout)
    }

    /// `log verify`: (exit success, stdout).
    pub fn verify(&self) -> (bool, String) {
        let out = self
            .command()
            .args(["log", "verify"])
            .output()
            .expect("run log verify");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// `intent --json`.
    pub fn intent(&self) -> Value {
        let out = self
            .command()
            .args(["intent", "--json"])
            .output()
            .expect("run intent");
        assert!(
            out.status.success(),
            "intent failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("intent JSON")
    }
}

/// Parses JSON lines, panicking on any line that is not JSON.
pub fn parse_lines(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

/// A command line for `host` with id `id` and the given op fields (a JSON object's
/// inner text, e.g. `"op":"ensure_namespace","namespace":"a"`).
pub fn command(host: &str, id: &str, op_fields: &str) -> String {
    format!(
        r#"{{"v":1,"id":"{id}","host":"{host}","issued_at":"2026-11-29T10:00:00Z",{op_fields}}}"#
    )
}

//! The agent's CLI against its files: `apply` (its inputs, its results, started and
//! fed through stdin), `log`, `log verify`, `intent`.

use super::Agent;
use crate::process::{Exit, Process};
use serde_json::Value;
use std::fmt::Display;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// What an `apply` did.
#[derive(Debug)]
pub struct Applied {
    pub exit: Exit,
    /// Its result lines.
    pub results: Vec<Value>,
    pub stderr: String,
}

impl Agent {
    /// Writes `lines` to a new file in the temp dir and returns its path.
    pub fn write_input(&self, lines: &[impl Display]) -> PathBuf {
        self.inputs.set(self.inputs.get() + 1);
        let path = self.path(&format!("input-{}.jsonl", self.inputs.get()));
        let mut f = std::fs::File::create(&path).expect("input file");
        for l in lines {
            writeln!(f, "{l}").expect("write input");
        }
        path
    }

    /// Runs `apply` on `lines`.
    pub fn apply(&self, lines: &[impl Display]) -> Applied {
        let input = self.write_input(lines);
        let mut c = self.command();
        c.arg("apply").arg(&input);
        let out = crate::process::output(
            format_args!("capstan-agent apply {} ({})", input.display(), self.host),
            crate::READY,
            c,
        );
        Applied {
            exit: Exit::of(out.status),
            results: crate::parse_lines(&out.stdout),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `apply` with no commands: the agent opens its log and recovers (finishes what a
    /// crash interrupted), then exits.
    pub fn recover(&self) -> Applied {
        let nothing: &[&str] = &[];
        self.apply(nothing)
    }

    /// Runs `apply` and asserts every command succeeded.
    #[track_caller]
    pub fn apply_ok(&self, lines: &[impl Display]) -> Applied {
        let applied = self.apply(lines);
        for r in &applied.results {
            assert_eq!(r["outcome"], "succeeded", "{r}");
        }
        assert_eq!(applied.results.len(), lines.len(), "{applied}");
        assert_eq!(applied.exit, Exit::OK, "{applied}");
        applied
    }

    /// Runs `apply` on `lines`, of which some fail (exit 1), and asserts each one's
    /// `(outcome, error code)`, in order.
    #[track_caller]
    pub fn apply_expecting(&self, lines: &[impl Display], expected: &[(&str, &str)]) -> Applied {
        let applied = self.apply(lines);
        assert_eq!(applied.exit, Exit::Code(1), "{applied}");
        assert_eq!(applied.results.len(), expected.len(), "{applied}");
        for ((r, (outcome, code)), line) in applied.results.iter().zip(expected).zip(lines) {
            assert_eq!(r["outcome"], *outcome, "{line} -> {r}");
            assert_eq!(r["error"]["code"], *code, "{line} -> {r}");
        }
        applied
    }

    /// `apply` started on `input` (a file, or `None` for its stdin, piped), its stdout
    /// piped: for tests that crash it or talk to it.
    pub fn start_apply(&self, input: Option<&Path>) -> Process {
        let mut c = self.command();
        c.arg("apply");
        match input {
            Some(file) => c.arg(file).stdin(Stdio::null()),
            None => c.arg("-").stdin(Stdio::piped()),
        };
        c.stdout(Stdio::piped());
        let n = self.next_run();
        Process::spawn(
            format!("capstan-agent apply ({}, run {n})", self.host),
            c,
            &self.path(&format!("run-{n}.log")),
        )
    }

    /// `apply` on `lines` fed through its stdin, its stdout piped. The pipe stays open
    /// until [`Feed::close`]: `apply` cannot reach the end of its input and exit, so a
    /// kill before the close always hits a live process.
    pub fn start_apply_fed(&self, lines: &[impl Display]) -> (Process, Feed) {
        let mut apply = self.start_apply(None);
        let mut stdin = apply.stdin();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        // Writes what the pipe takes, then keeps it open; a write into a killed
        // process's pipe just fails.
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(text.as_bytes());
            stdin
        });
        (apply, Feed(feeder))
    }

    /// Whether command `id` is in progress in the log: received and not completed
    /// (e.g. where a kill cut it).
    pub fn in_progress(&self, id: &str) -> bool {
        let log = self.log_of(id);
        let has = |kind: &str| log.iter().any(|r| r["kind"] == kind);
        has("command_received") && !has("command_completed")
    }

    /// The whole log as JSON objects (asserting `log --json` succeeded).
    pub fn log(&self) -> Vec<Value> {
        self.log_args(&[])
    }

    /// The records of command `id`.
    pub fn log_of(&self, id: &str) -> Vec<Value> {
        self.log_args(&["--command", id])
    }

    fn log_args(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["log", "--json"];
        all.extend(args);
        crate::parse_lines(&self.cli_ok(&all))
    }

    /// Runs the CLI with `args`, asserting it succeeded; returns its stdout.
    #[track_caller]
    pub fn cli_ok(&self, args: &[&str]) -> Vec<u8> {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "capstan-agent {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Runs the CLI with `args` (stdin null) and returns how it ended, what it wrote;
    /// fails the test if it has not ended within [`crate::READY`].
    #[track_caller]
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut c = self.command();
        c.args(args);
        crate::process::output(
            format_args!("capstan-agent {args:?} ({})", self.host),
            crate::READY,
            c,
        )
    }

    /// The log's records of `kind` (from the files, or from the running agent over its
    /// local socket).
    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.log()
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }

    /// `log verify`: (exit success, stdout).
    pub fn verify(&self) -> (bool, String) {
        let out = self.cli(&["log", "verify"]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// `intent --json`.
    pub fn intent(&self) -> Value {
        serde_json::from_slice(&self.cli_ok(&["intent", "--json"])).expect("intent JSON")
    }
}

/// The writer of an [`Agent::start_apply_fed`] input, holding its pipe open.
pub struct Feed(std::thread::JoinHandle<std::process::ChildStdin>);

impl Feed {
    /// Closes the pipe (once `apply` is dead or has read everything: the writer
    /// must be done).
    #[track_caller]
    pub fn close(self) {
        crate::wait_until(
            "the input feeder to be done writing (apply dead or done reading)",
            crate::READY,
            || self.0.is_finished(),
        );
        drop(self.0.join().expect("input feeder thread"));
    }
}

impl Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "apply ended with {}", self.exit)?;
        for r in &self.results {
            writeln!(f, "{r}")?;
        }
        f.write_str(&self.stderr)
    }
}

impl Applied {
    /// The result line of the command `id` (panics if there is none).
    pub fn result(&self, id: &str) -> &Value {
        self.results
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no result for {id}: {self}"))
    }
}

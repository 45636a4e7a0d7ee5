//! Harness for the hook tests: an agent data dir with a config of exec hooks, hook
//! scripts written into the test's temp dir, and the agent CLI run against them.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The built `capstan-agent` binary (`cargo build --workspace --bins` first).
pub fn agent_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("capstan-agent");
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// One hook owner: its name, the phases it takes, and the shell body it runs after
/// recording the call (`$phase`, `$compensating`, `$req` are set; stdout is the reply).
pub struct Owner<'a> {
    pub name: &'a str,
    pub phases: &'a [&'a str],
    pub body: &'a str,
    pub timeout: Option<f64>,
}

impl<'a> Owner<'a> {
    /// An owner that succeeds with an empty reply in every phase it takes.
    pub fn plain(name: &'a str, phases: &'a [&'a str]) -> Owner<'a> {
        Owner {
            name,
            phases,
            body: "exit 0",
            timeout: None,
        }
    }
}

/// A test's agent: data dir, config, hook scripts.
pub struct HookAgent {
    pub dir: tempfile::TempDir,
}

impl HookAgent {
    /// Writes the scripts and a config naming them, in order.
    pub fn new(owners: &[Owner<'_>]) -> HookAgent {
        let agent = HookAgent {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        agent.configure(owners);
        agent
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn config(&self) -> PathBuf {
        self.path("agent.toml")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.path("data")
    }

    /// (Re)writes the config (and the owners' scripts).
    pub fn configure(&self, owners: &[Owner<'_>]) {
        let mut toml = String::from("host = \"h1\"\ndriver = \"sim\"\n");
        for o in owners {
            let script = self.path(&format!("hook-{}.sh", o.name));
            let calls = self.path(&format!("calls-{}", o.name));
            let text = format!(
                "#!/bin/sh\n\
                 req=$(cat)\n\
                 phase=$(printf '%s' \"$req\" | sed -n 's/.*\"phase\":\"\\([a-z_]*\\)\".*/\\1/p')\n\
                 compensating=false\n\
                 case \"$req\" in *'\"compensating\":true'*) compensating=true;; esac\n\
                 echo \"$phase $compensating\" >> {calls}\n\
                 {body}\n",
                calls = calls.display(),
                body = o.body
            );
            std::fs::write(&script, text).expect("write hook");
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
                .expect("chmod hook");
            let phases: Vec<String> = o.phases.iter().map(|p| format!("{p:?}")).collect();
            toml.push_str(&format!(
                "[[hooks]]\nname = {:?}\nkind = \"exec\"\nargv = [{:?}]\nphases = [{}]\n",
                o.name,
                script.display().to_string(),
                phases.join(", ")
            ));
            if let Some(t) = o.timeout {
                toml.push_str(&format!("timeout = {t}\n"));
            }
        }
        std::fs::write(self.config(), toml).expect("write config");
    }

    /// The calls owner `name` recorded: `"<phase> <compensating>"` lines.
    pub fn calls(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(&format!("calls-{name}")))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `capstan-agent` with this agent's config and data dir.
    pub fn command(&self) -> Command {
        let mut c = Command::new(agent_binary());
        c.arg("--config")
            .arg(self.config())
            .arg("--data-dir")
            .arg(self.data_dir());
        c
    }

    /// Runs `apply` on these command lines and returns the process output.
    pub fn apply(&self, lines: &[String]) -> Output {
        let mut child = self
            .command()
            .args(["apply", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn capstan-agent");
        let mut stdin = child.stdin.take().expect("stdin");
        for l in lines {
            writeln!(stdin, "{l}").expect("write command");
        }
        drop(stdin);
        child.wait_with_output().expect("capstan-agent output")
    }

    /// The result lines of an `apply`.
    pub fn results(output: &Output) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("result line is JSON"))
            .collect()
    }

    /// `capstan-agent log --json`, optionally for one command.
    pub fn log(&self, command: Option<&str>) -> Vec<serde_json::Value> {
        let mut c = self.command();
        c.args(["log", "--json"]);
        if let Some(id) = command {
            c.args(["--command", id]);
        }
        let out = c.output().expect("capstan-agent log");
        assert!(out.status.success(), "log: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("log line is JSON"))
            .collect()
    }

    /// The sim host's state file.
    pub fn sim_host(&self) -> serde_json::Value {
        let text =
            std::fs::read_to_string(self.data_dir().join("sim-host.json")).expect("sim-host.json");
        serde_json::from_str(&text).expect("sim host JSON")
    }
}

/// One command line for host `h1`.
pub fn command(id: &str, op: &str, fields: &str) -> String {
    format!(
        r#"{{"v":1,"id":"{id}","host":"h1","issued_at":"2026-01-01T00:00:00Z","op":"{op}",{fields}}}"#
    )
}

/// `namespace ns` and revision `r1` of workload `web`, prepared with `spec_env`.
pub fn staging(spec_env: &str) -> Vec<String> {
    vec![
        command("ns", "ensure_namespace", r#""namespace":"ns""#),
        command(
            "p1",
            "prepare_revision",
            &format!(
                r#""namespace":"ns","workload":"web","revision":"r1","spec":{{"driver":"sim","image":null,"command":[],"env":{{{spec_env}}}}}"#
            ),
        ),
    ]
}

/// `activate_revision` of `web@r1`.
pub fn activate(id: &str) -> String {
    command(
        id,
        "activate_revision",
        r#""namespace":"ns","workload":"web","revision":"r1""#,
    )
}

/// The `(kind, phase, owner)` of each hook record, in order.
pub fn hook_records(log: &[serde_json::Value]) -> Vec<(String, String, String)> {
    log.iter()
        .filter(|r| r["kind"].as_str().is_some_and(|k| k.starts_with("hook_")))
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("kind"), s("phase"), s("owner"))
        })
        .collect()
}

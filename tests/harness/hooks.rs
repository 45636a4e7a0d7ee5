//! Exec hook owners for an agent's config (`AgentBuilder::hook`): each a real shell
//! script in the agent's temp dir that records every call, then runs the test's body.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// One hook owner: its name, the phases it takes, and the shell body it runs after
/// recording the call (`$phase`, `$compensating`, `$req` are set; stdout is the
/// reply; `$(dirname "$0")` is the agent's temp dir, `Agent::path`).
#[derive(Debug, Clone)]
pub struct Hook {
    pub name: String,
    pub phases: Vec<String>,
    pub body: String,
    pub timeout: Option<f64>,
}

impl Hook {
    pub fn new(name: &str, phases: &[&str], body: &str) -> Hook {
        Hook {
            name: name.to_string(),
            phases: phases.iter().map(|p| p.to_string()).collect(),
            body: body.to_string(),
            timeout: None,
        }
    }

    /// An owner that succeeds with an empty reply in every phase it takes.
    pub fn plain(name: &str, phases: &[&str]) -> Hook {
        Hook::new(name, phases, "exit 0")
    }

    /// With a `timeout` (seconds).
    pub fn timeout(mut self, secs: f64) -> Hook {
        self.timeout = Some(secs);
        self
    }

    /// Writes its script into `dir` and returns its `[[hooks]]` config section.
    pub(crate) fn install(&self, dir: &Path) -> String {
        let script = dir.join(format!("hook-{}.sh", self.name));
        let text = format!(
            "#!/bin/sh\n\
             req=$(cat)\n\
             phase=$(printf '%s' \"$req\" | sed -n 's/.*\"phase\":\"\\([a-z_]*\\)\".*/\\1/p')\n\
             compensating=false\n\
             case \"$req\" in *'\"compensating\":true'*) compensating=true;; esac\n\
             echo \"$phase $compensating\" >> {calls}\n\
             {body}\n",
            calls = dir.join(calls_file(&self.name)).display(),
            body = self.body
        );
        std::fs::write(&script, text).expect("write hook");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("chmod hook");
        let mut toml = format!(
            "[[hooks]]\nname = {:?}\nkind = \"exec\"\nargv = [{:?}]\nphases = {:?}\n",
            self.name,
            script.display().to_string(),
            self.phases
        );
        if let Some(t) = self.timeout {
            writeln!(toml, "timeout = {t:?}").expect("write to a string");
        }
        toml
    }
}

/// The file in the agent's temp dir where owner `name` records its calls.
pub(crate) fn calls_file(name: &str) -> String {
    format!("calls-{name}")
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

/// Owner `rec`, in `before_workload_start` and `before_workload_stop`: appends
/// `grant <workload> <revision>` (or `revoke …`, compensating or not) to `grants` in
/// the agent's dir for each call, then runs `then` (a shell tail; `$wl`, `$rev` and
/// `$d`, the dir, are set). The witness that grants follow what runs ([`holding`]).
pub fn grant_recorder(then: &str) -> Hook {
    let body = format!(
        r#"field() {{ printf '%s' "$req" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }}
wl=$(field workload); rev=$(field revision); d=$(dirname "$0")
case "$phase" in
  before_workload_start) echo "grant $wl $rev" >> "$d/grants";;
  before_workload_stop) echo "revoke $wl $rev" >> "$d/grants";;
esac
{then}"#
    );
    Hook::new(
        "rec",
        &["before_workload_start", "before_workload_stop"],
        &body,
    )
}

/// `(workload, revision)` holding a grant as [`grant_recorder`] recorded them: each
/// grant not revoked since.
pub fn holding(agent: &crate::agent::Agent) -> std::collections::BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(agent.path("grants")).unwrap_or_default();
    let mut held = std::collections::BTreeSet::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let (wl, rev) = (words[1].to_string(), words[2].to_string());
        match words[0] {
            "grant" => held.insert((wl, rev)),
            _ => held.remove(&(wl, rev)),
        };
    }
    held
}

/// Asserts that the revisions holding grants ([`holding`]) are exactly `running`,
/// showing the whole record when not.
#[track_caller]
pub fn assert_grants_follow(
    agent: &crate::agent::Agent,
    running: &std::collections::BTreeSet<(String, String)>,
) {
    assert_eq!(
        &holding(agent),
        running,
        "grants follow what runs: {}",
        std::fs::read_to_string(agent.path("grants")).unwrap_or_default()
    );
}

//! `capstan rollout FILE --hosts …`: the commands of FILE to many hosts, in order on
//! each, with a progress bar (the rollout itself is `capstan_coordinator::rollout`).

use crate::commands::read_input;
use crate::output::{duration, print, typed};
use capstan_coordinator::answers::{HostResult, HostState, HostsAnswer, RolloutSummary};
use capstan_coordinator::client::Client;
use capstan_coordinator::rollout;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// How `rollout` goes about it (its flags).
pub(crate) struct RolloutHow {
    pub(crate) timeout: String,
    /// Requests in flight at once.
    pub(crate) concurrency: usize,
    /// A line for every host, not only those that did not succeed.
    pub(crate) each: bool,
}

/// Hosts listed in the human summary when `--each` is not given: those that did not
/// succeed, up to this many.
const ROLLOUT_LISTED: usize = 20;

/// `capstan rollout`: [`rollout::run`] with a progress bar on stderr and a summary.
pub(crate) async fn rollout(
    client: &Client,
    json: bool,
    file: &PathBuf,
    hosts: &str,
    how: &RolloutHow,
) -> anyhow::Result<ExitCode> {
    let commands = read_input(file)?;
    let hosts: Vec<String> = if hosts == "alive" {
        let answer: HostsAnswer = typed(&client.get("/v1/hosts").await?)?;
        answer
            .hosts
            .into_iter()
            .filter(|h| h.status == HostState::Alive)
            .map(|h| h.host)
            .collect()
    } else {
        hosts
            .split(',')
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect()
    };
    anyhow::ensure!(!hosts.is_empty(), "no hosts to roll out to");
    let plan = rollout::Plan {
        commands,
        hosts,
        timeout: duration("timeout", &how.timeout)?,
        concurrency: how.concurrency,
    };
    let summary = rollout::run(client, &plan, draw).await?;
    let _ = writeln!(std::io::stderr());
    let printed = serde_json::to_value(&summary)?;
    print(json, &printed, |_| human_rollout(&summary, how.each));
    Ok(if summary.succeeded == summary.total {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The rollout's summary: a line for each host that did not succeed (the first
/// [`ROLLOUT_LISTED`], or every host with `each`; with the step it stopped at when
/// the rollout has more than one command), the hosts the coordinator does not know,
/// then the count.
fn human_rollout(v: &RolloutSummary, each: bool) -> String {
    let steps = v.commands > 1;
    let listed: Vec<&HostResult> = v
        .results
        .iter()
        .filter(|r| each || r.status.status != "succeeded")
        .collect();
    let mut out = String::new();
    let step = |text: &str| match steps {
        true => format!("{text:<6} "),
        false => String::new(),
    };
    if !listed.is_empty() {
        out.push_str(&format!(
            "{:<20} {:<11} {}{:<32} ERROR\n",
            "HOST",
            "STATUS",
            step("STEP"),
            "COMMAND"
        ));
    }
    let shown = if each {
        listed.len()
    } else {
        listed.len().min(ROLLOUT_LISTED)
    };
    for r in &listed[..shown] {
        let s = &r.status;
        out.push_str(&format!(
            "{:<20} {:<11} {}{:<32} {}\n",
            s.host,
            s.status,
            step(&format!("{}/{}", r.step, v.commands)),
            s.id,
            code(r)
        ));
    }
    if shown < listed.len() {
        out.push_str(&format!(
            "… and {} more that did not succeed (--each or --json lists every host)\n",
            listed.len() - shown
        ));
    }
    let unknown: Vec<&str> = v
        .results
        .iter()
        .filter(|r| code(r) == "host_not_found")
        .map(|r| r.status.host.as_str())
        .collect();
    if !unknown.is_empty() {
        let named = unknown.len().min(ROLLOUT_LISTED);
        out.push_str(&format!(
            "{} unknown to the coordinator (no registered key: a misspelt name, or a host not installed yet): {}{}\n",
            match unknown.len() {
                1 => "1 host".to_string(),
                n => format!("{n} hosts"),
            },
            unknown[..named].join(", "),
            if named < unknown.len() { ", …" } else { "" }
        ));
    }
    out.push_str(&format!("{}/{} succeeded", v.succeeded, v.total));
    if steps {
        out.push_str(&format!(" (all {} commands)", v.commands));
    }
    out.push('\n');
    out
}

/// The code of a host's error, if any.
fn code(r: &HostResult) -> &str {
    r.status
        .error
        .as_ref()
        .and_then(|e| e.get("code")?.as_str())
        .unwrap_or("")
}

/// The rollout's one progress bar on stderr, redrawn in place: commands
/// `submitted` (out of hosts × commands), then hosts `done`.
fn draw(p: &rollout::Progress) {
    let filled = p.done * 20 / p.total.max(1);
    let line = format!(
        "rollout [{}{}] {}/{} submitted, {}/{} done, {} not succeeded",
        "#".repeat(filled),
        ".".repeat(20 - filled),
        p.submitted,
        p.total * p.commands,
        p.done,
        p.total,
        p.failed
    );
    let mut stderr = std::io::stderr();
    let _ = write!(stderr, "\r{line}");
    let _ = stderr.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_common::status::CommandStatus;
    use serde_json::json;

    fn result(host: &str, step: usize, status: &str, code: Option<&str>) -> HostResult {
        HostResult {
            step,
            status: CommandStatus {
                status: status.into(),
                error: code.map(|c| json!({"code": c})),
                ..CommandStatus::pending(&format!("ro.{host}"), host)
            },
        }
    }

    fn summary(hosts: usize, failed: usize) -> RolloutSummary {
        let results = (0..hosts)
            .map(|i| match i < failed {
                true => result(&format!("h{i:05}"), 1, "failed", Some("hook_failed")),
                false => result(&format!("h{i:05}"), 1, "succeeded", None),
            })
            .collect();
        RolloutSummary {
            total: hosts,
            succeeded: hosts - failed,
            commands: 1,
            results,
        }
    }

    /// Given a rollout of three commands where one host stopped at the second and two
    /// hosts are unknown, when it is summed up for a person, then each host that did
    /// not succeed shows the step it stopped at, and the unknown hosts are named.
    #[test]
    fn a_rollout_summary_says_where_each_host_stopped_and_which_hosts_are_unknown() {
        let v = RolloutSummary {
            total: 4,
            succeeded: 1,
            commands: 3,
            results: vec![
                result("a", 3, "succeeded", None),
                result("b", 2, "failed", Some("hook_failed")),
                result("ghost", 1, "unsubmitted", Some("host_not_found")),
                result("gost", 1, "unsubmitted", Some("host_not_found")),
            ],
        };
        let text = human_rollout(&v, false);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("STEP"), "{text}");
        assert!(
            lines[1].starts_with('b')
                && lines[1].contains(" 2/3 ")
                && lines[1].contains("hook_failed"),
            "{text}"
        );
        assert_eq!(
            lines[4],
            "2 hosts unknown to the coordinator (no registered key: a misspelt name, or a host not installed yet): ghost, gost",
            "{text}"
        );
        assert_eq!(lines[5], "1/4 succeeded (all 3 commands)", "{text}");
    }

    /// Given a rollout to thousands of hosts, when it is summed up for a person, then
    /// the summary lists only the hosts that did not succeed, at most 20 of them,
    /// unless every host is asked for.
    #[test]
    fn a_rollout_summary_lists_the_hosts_that_did_not_succeed_not_every_host() {
        let all_ok = human_rollout(&summary(5000, 0), false);
        assert_eq!(all_ok, "5000/5000 succeeded\n");
        let some = human_rollout(&summary(5000, 3), false);
        assert_eq!(some.lines().count(), 1 + 3 + 1, "{some}");
        assert!(
            some.contains("h00002") && !some.contains("h00003"),
            "{some}"
        );
        let many = human_rollout(&summary(5000, 25), false);
        assert_eq!(many.lines().count(), 1 + ROLLOUT_LISTED + 2, "{many}");
        assert!(many.contains("… and 5 more that did not succeed"), "{many}");
        assert!(many.ends_with("4975/5000 succeeded\n"), "{many}");
        let each = human_rollout(&summary(50, 25), true);
        assert_eq!(each.lines().count(), 1 + 50 + 1, "{each}");
    }
}

//! `capstan rollout FILE --hosts …`: one command to many hosts, with a progress bar
//! (the rollout itself is `capstan_coordinator::rollout`).

use crate::commands::read_input;
use crate::output::{duration, print, typed};
use anyhow::Context as _;
use capstan_common::status::CommandStatus;
use capstan_coordinator::answers::{HostState, HostsAnswer, RolloutSummary};
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
    let template = read_input(file)?
        .into_iter()
        .next()
        .context("the rollout file holds no command")?;
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
        template,
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
/// [`ROLLOUT_LISTED`], or every host with `each`), then the count.
fn human_rollout(v: &RolloutSummary, each: bool) -> String {
    let listed: Vec<&CommandStatus> = v
        .results
        .iter()
        .filter(|s| each || s.status != "succeeded")
        .collect();
    let mut out = String::new();
    if !listed.is_empty() {
        out.push_str(&format!(
            "{:<20} {:<10} {:<32} ERROR\n",
            "HOST", "STATUS", "COMMAND"
        ));
    }
    let shown = if each {
        listed.len()
    } else {
        listed.len().min(ROLLOUT_LISTED)
    };
    for s in &listed[..shown] {
        out.push_str(&format!(
            "{:<20} {:<10} {:<32} {}\n",
            s.host,
            s.status,
            s.id,
            s.error
                .as_ref()
                .and_then(|e| e.get("code")?.as_str())
                .unwrap_or("")
        ));
    }
    if shown < listed.len() {
        out.push_str(&format!(
            "… and {} more that did not succeed (--each or --json lists every host)\n",
            listed.len() - shown
        ));
    }
    out.push_str(&format!("{}/{} succeeded\n", v.succeeded, v.total));
    out
}

/// The rollout's one progress bar on stderr, redrawn in place: `submitted`, then
/// `done`.
fn draw(p: &rollout::Progress) {
    let filled = p.done * 20 / p.total.max(1);
    let line = format!(
        "rollout [{}{}] {}/{} submitted, {}/{} done, {} not succeeded",
        "#".repeat(filled),
        ".".repeat(20 - filled),
        p.submitted,
        p.total,
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
    use serde_json::json;

    fn summary(hosts: usize, failed: usize) -> RolloutSummary {
        let results = (0..hosts)
            .map(|i| {
                let (status, error) = if i < failed {
                    ("failed", Some(json!({"code": "hook_failed"})))
                } else {
                    ("succeeded", None)
                };
                let (id, host) = (format!("ro.h{i:05}"), format!("h{i:05}"));
                CommandStatus {
                    status: status.into(),
                    error,
                    ..CommandStatus::pending(&id, &host)
                }
            })
            .collect();
        RolloutSummary {
            total: hosts,
            succeeded: hosts - failed,
            results,
        }
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

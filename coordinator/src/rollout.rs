//! A rollout: one command (a template, without `host`) to many hosts through the
//! coordinator's HTTP API, and every result waited for. `capstan rollout` is this
//! with a progress bar and a summary.
//!
//! Each host's command has the id `<base>.<host>` (`base`: the template's `id`, else
//! `rollout-<UTC time>`). Submissions go first, `concurrency` at a time, then the
//! waits, as many at a time. A failover of the coordinator's NATS (a cluster that lost
//! a server) does not end it: a submission the coordinator answers 502, 503 or 504 to
//! is sent again (the same id: a submission is idempotent by id), and a wait that
//! fails so, or finds the coordinator unreachable, is asked again, with backoff, each
//! within the host's `timeout`. A host the API refuses a command for
//! (`host_not_found`, `invalid_name`, …) is a result of its own, `unsubmitted`; a
//! wait that never got an answer is `unknown`. Not reaching the coordinator to
//! submit, or a token it refuses, ends the rollout.

pub use crate::answers::RolloutSummary;
use crate::client::{Client, ClientError};
use capstan_common::status::CommandStatus;
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::time::Instant;

/// The first pause before asking again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// What to roll out, where, and how.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The command, without `host`; its `id`, if any, is the ids' base.
    pub template: Value,
    pub hosts: Vec<String>,
    /// How long each host's submission, and each host's wait, may take (retries
    /// included).
    pub timeout: Duration,
    /// Requests in flight at once, submissions and waits alike.
    pub concurrency: usize,
}

/// How far a rollout has got, given to the progress callback after every change.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub total: usize,
    pub submitted: usize,
    pub done: usize,
    /// Done and not `succeeded` (including `unsubmitted`).
    pub failed: usize,
}

/// Runs `plan`; the summary, the results sorted by host, one a host (a command
/// status, or an `unsubmitted` or `unknown` result: [`not_done`]).
pub async fn run(
    client: &Client,
    plan: &Plan,
    mut progress: impl FnMut(&Progress),
) -> Result<RolloutSummary, ClientError> {
    let base = plan
        .template
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("rollout-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%.3f")));
    let concurrency = plan.concurrency.max(1);
    let mut counts = Progress {
        total: plan.hosts.len(),
        ..Progress::default()
    };
    let submissions = futures::stream::iter(&plan.hosts)
        .map(|host| {
            let mut command = plan.template.clone();
            command["host"] = json!(host);
            let id = format!("{base}.{host}");
            command["id"] = json!(id);
            async move { (host, id, submit(client, &command, plan.timeout).await) }
        })
        .buffered(concurrency);
    tokio::pin!(submissions);
    let mut ids = Vec::with_capacity(plan.hosts.len());
    let mut results = Vec::with_capacity(plan.hosts.len());
    while let Some((host, id, accepted)) = submissions.next().await {
        match accepted {
            Ok(()) => ids.push((host, id)),
            Err(ClientError::Api { code, message, .. }) => {
                counts.failed += 1;
                counts.done += 1;
                results.push(not_done(&id, host, "unsubmitted", &code, message));
            }
            Err(e) => return Err(e),
        }
        counts.submitted += 1;
        progress(&counts);
    }
    let waits = futures::stream::iter(&ids)
        .map(|(host, id)| wait(client, host, id, plan.timeout))
        .buffer_unordered(concurrency);
    tokio::pin!(waits);
    while let Some(status) = waits.next().await {
        counts.done += 1;
        if status.status != "succeeded" {
            counts.failed += 1;
        }
        progress(&counts);
        results.push(status);
    }
    results.sort_by(|a, b| a.host.cmp(&b.host));
    let succeeded = results.iter().filter(|s| s.status == "succeeded").count();
    Ok(RolloutSummary {
        total: plan.hosts.len(),
        succeeded,
        results,
    })
}

/// The result of a host whose command was not submitted (`unsubmitted`) or whose wait
/// got no answer (`unknown`): not done, with the error that says why.
fn not_done(id: &str, host: &str, status: &str, code: &str, message: String) -> CommandStatus {
    CommandStatus {
        status: status.to_string(),
        error: Some(json!({"code": code, "message": message})),
        ..CommandStatus::pending(id, host)
    }
}

/// The coordinator is there but its NATS (or a stream's leader) is not, for now.
fn failing_over(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Api {
            status: 502..=504,
            ..
        }
    )
}

/// Submits `command`, again while the coordinator fails over, within `timeout`.
async fn submit(client: &Client, command: &Value, timeout: Duration) -> Result<(), ClientError> {
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    loop {
        match client.post("/v1/commands", command).await {
            Ok(_) => return Ok(()),
            Err(e) if failing_over(&e) && Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "submitting again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The command's status once done, or at `timeout`: asked again while the
/// coordinator fails over or cannot be reached, and past the server's longest wait.
async fn wait(client: &Client, host: &str, id: &str, timeout: Duration) -> CommandStatus {
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = client
            .get_as::<CommandStatus>(&format!(
                "/v1/commands/{id}/wait?timeout={}ms",
                left.as_millis()
            ))
            .await;
        match answer {
            Ok(status) if status.done || Instant::now() >= deadline => return status,
            Ok(_) => {}
            Err(e) if e.transient() && Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "waiting again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Err(e) => return not_done(id, host, "unknown", "client", e.to_string()),
        }
    }
}

//! A rollout: commands (templates, without `host`) to many hosts through the
//! coordinator's HTTP API, in order on each host, and every result waited for.
//! `capstan rollout` is this with a progress bar and a summary.
//!
//! Each host gets the first command; once that succeeded there, the second; and so
//! on: a host whose command did not succeed (or could not be submitted, or whose
//! wait got no answer) stops there and gets none of the later ones. Hosts do not
//! wait for each other. The command of step `n` for host `h` has the id
//! `<base>.<h>`, `base` being that command's own `id` if it has one, else
//! `rollout-<UTC time>` in a rollout of one command and `rollout-<UTC time>-<n>` in
//! one of more ([`bases`]); two commands of one rollout with the same `id` are
//! refused before anything is submitted. At most `concurrency` requests are in
//! flight at once, submissions and waits alike, each taken in the order asked for:
//! every host's first submission goes in before any wait holds a request, and a
//! host's next command queues behind what was asked before it. A failover of the
//! coordinator's NATS (a cluster that lost a server) does not end it: a submission
//! the coordinator answers 502, 503 or 504 to is sent again (the same id: a
//! submission is idempotent by id), and a wait that fails so, or finds the
//! coordinator unreachable, is asked again, with backoff, each within the host's
//! `timeout`. A host the API refuses a command for (`host_not_found`: a host nobody
//! registered; `invalid_name`, …) is a result of its own, `unsubmitted`; a wait
//! that never got an answer is `unknown`. Not reaching the coordinator to submit,
//! or a token it refuses, ends the rollout.

pub use crate::answers::{HostResult, RolloutSummary};
use crate::client::{Client, ClientError};
use capstan_common::status::CommandStatus;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use serde_json::{json, Value};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The first pause before asking again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Why a rollout did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("the rollout holds no command")]
    NoCommand,
    #[error("command {0} of the rollout is not a JSON object")]
    NotAnObject(usize),
    #[error("commands {first} and {second} of the rollout have the same id {id:?}: each host's ids would collide")]
    SameId {
        id: String,
        first: usize,
        second: usize,
    },
    /// The coordinator could not be reached, or refused the token.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// What to roll out, where, and how.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The commands, in the order each host runs them, without `host`; each one's
    /// `id`, if any, is its ids' base.
    pub commands: Vec<Value>,
    pub hosts: Vec<String>,
    /// How long each host's submission, and each host's wait, may take (retries
    /// included), for each command.
    pub timeout: Duration,
    /// Requests in flight at once, submissions and waits alike.
    pub concurrency: usize,
}

/// How far a rollout has got, given to the progress callback after every change.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Hosts.
    pub total: usize,
    /// Commands each host is to run.
    pub commands: usize,
    /// Submissions made (or refused), out of `total * commands`.
    pub submitted: usize,
    /// Hosts done: every command succeeded, or one did not and the host stopped.
    pub done: usize,
    /// Hosts done and not `succeeded` (including `unsubmitted`).
    pub failed: usize,
}

/// Each command's ids' base, in order: its `id`, else `rollout-<now>` (one command)
/// or `rollout-<now>-<n>` (step `n` of more than one).
pub fn bases(
    commands: &[Value],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<String>, RolloutError> {
    if commands.is_empty() {
        return Err(RolloutError::NoCommand);
    }
    let stamp = format!("rollout-{}", now.format("%Y%m%dT%H%M%S%.3f"));
    let mut out: Vec<String> = Vec::with_capacity(commands.len());
    for (i, command) in commands.iter().enumerate() {
        if !command.is_object() {
            return Err(RolloutError::NotAnObject(i + 1));
        }
        let base = match command.get("id").and_then(Value::as_str) {
            Some(id) => id.to_string(),
            None if commands.len() == 1 => stamp.clone(),
            None => format!("{stamp}-{}", i + 1),
        };
        if let Some(first) = out.iter().position(|b| *b == base) {
            return Err(RolloutError::SameId {
                id: base,
                first: first + 1,
                second: i + 1,
            });
        }
        out.push(base);
    }
    Ok(out)
}

/// What one request of a host's turn came to: its host (an index into the plan's),
/// the step (from 0), and the answer.
enum Outcome {
    Submitted(usize, usize, Result<(), ClientError>),
    Waited(usize, usize, CommandStatus),
}

type Request<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// The requests of a rollout, each taken under one of `permits`.
struct Requests<'a> {
    client: &'a Client,
    plan: &'a Plan,
    bases: Vec<String>,
    permits: &'a Semaphore,
}

impl<'a> Requests<'a> {
    /// The id of step `step`'s command for host `host`.
    fn id(&self, host: usize, step: usize) -> String {
        format!("{}.{}", self.bases[step], self.plan.hosts[host])
    }

    fn submission(&self, host: usize, step: usize) -> Request<'a> {
        let (client, plan, permits) = (self.client, self.plan, self.permits);
        let mut command = plan.commands[step].clone();
        command["host"] = json!(plan.hosts[host]);
        command["id"] = json!(self.id(host, step));
        async move {
            let _permit = permits.acquire().await.expect("the permits stay open");
            let accepted = submit(client, &command, plan.timeout).await;
            Outcome::Submitted(host, step, accepted)
        }
        .boxed()
    }

    fn wait(&self, host: usize, step: usize) -> Request<'a> {
        let (client, plan, permits) = (self.client, self.plan, self.permits);
        let id = self.id(host, step);
        async move {
            let _permit = permits.acquire().await.expect("the permits stay open");
            let status = wait(client, &plan.hosts[host], &id, plan.timeout).await;
            Outcome::Waited(host, step, status)
        }
        .boxed()
    }
}

/// Runs `plan`; the summary, the results sorted by host, one a host (the status of
/// the last command it got to, or an `unsubmitted` or `unknown` result:
/// [`not_done`]).
pub async fn run(
    client: &Client,
    plan: &Plan,
    mut progress: impl FnMut(&Progress),
) -> Result<RolloutSummary, RolloutError> {
    let permits = Semaphore::new(plan.concurrency.max(1));
    let make = Requests {
        client,
        plan,
        bases: bases(&plan.commands, chrono::Utc::now())?,
        permits: &permits,
    };
    let mut counts = Progress {
        total: plan.hosts.len(),
        commands: plan.commands.len(),
        ..Progress::default()
    };
    let mut requests: FuturesUnordered<Request<'_>> = (0..plan.hosts.len())
        .map(|h| make.submission(h, 0))
        .collect();
    let mut results = Vec::with_capacity(plan.hosts.len());
    while let Some(outcome) = requests.next().await {
        let ended = match outcome {
            Outcome::Submitted(host, step, Ok(())) => {
                counts.submitted += 1;
                requests.push(make.wait(host, step));
                None
            }
            Outcome::Submitted(host, step, Err(ClientError::Api { code, message, .. })) => {
                counts.submitted += 1;
                let (id, host) = (make.id(host, step), &plan.hosts[host]);
                Some((step, not_done(&id, host, "unsubmitted", &code, message)))
            }
            Outcome::Submitted(_, _, Err(e)) => return Err(e.into()),
            Outcome::Waited(host, step, status) => {
                if status.status == "succeeded" && step + 1 < plan.commands.len() {
                    requests.push(make.submission(host, step + 1));
                    None
                } else {
                    Some((step, status))
                }
            }
        };
        if let Some((step, status)) = ended {
            counts.done += 1;
            if status.status != "succeeded" {
                counts.failed += 1;
            }
            results.push(HostResult {
                step: step + 1,
                status,
            });
        }
        progress(&counts);
    }
    results.sort_by(|a, b| a.status.host.cmp(&b.status.host));
    let succeeded = results
        .iter()
        .filter(|r| r.status.status == "succeeded")
        .count();
    Ok(RolloutSummary {
        total: plan.hosts.len(),
        succeeded,
        commands: plan.commands.len(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::Json;
    use std::sync::{Arc, Mutex};

    /// What the fake coordinator was asked, in order: `submit ID` and `wait ID`.
    type Asked = Arc<Mutex<Vec<String>>>;

    /// A coordinator that knows every host but `ghost`, and on which command `two`
    /// fails on host `b`; every other command succeeds at once.
    async fn coordinator() -> (String, Asked) {
        async fn submit(
            State(asked): State<Asked>,
            Json(c): Json<Value>,
        ) -> (StatusCode, Json<Value>) {
            let (id, host) = (c["id"].as_str().unwrap(), c["host"].as_str().unwrap());
            asked.lock().unwrap().push(format!("submit {id}"));
            if host == "ghost" {
                let error = json!({"error": {"code": "host_not_found", "message": "host ghost is unknown"}});
                return (StatusCode::NOT_FOUND, Json(error));
            }
            (StatusCode::ACCEPTED, Json(json!({"id": id, "host": host})))
        }
        async fn wait(State(asked): State<Asked>, Path(id): Path<String>) -> Json<CommandStatus> {
            asked.lock().unwrap().push(format!("wait {id}"));
            let (_, host) = id.split_once('.').unwrap();
            let failed = id == "two.b";
            Json(CommandStatus {
                status: if failed { "failed" } else { "succeeded" }.into(),
                done: true,
                error: failed.then(|| json!({"code": "hook_failed", "message": "no"})),
                ..CommandStatus::pending(&id, host)
            })
        }
        let asked = Asked::default();
        let app = axum::Router::new()
            .route("/v1/commands", post(submit))
            .route("/v1/commands/{id}/wait", get(wait))
            .with_state(Arc::clone(&asked));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (base, asked)
    }

    /// Given a rollout of three commands to a host that succeeds at each, one on which
    /// the second fails and one the coordinator does not know, when it runs, then
    /// each host gets each command only once the one before succeeded there, stops
    /// at the first that did not, and the summary says where each host got to.
    #[tokio::test]
    async fn each_host_runs_the_commands_in_order_and_stops_at_the_first_that_did_not_succeed() {
        let (base, asked) = coordinator().await;
        let command = |id: &str| json!({"id": id, "op": "ensure_namespace", "namespace": "n"});
        let plan = Plan {
            commands: vec![command("one"), command("two"), command("three")],
            hosts: vec!["a".into(), "b".into(), "ghost".into()],
            timeout: Duration::from_secs(30),
            concurrency: 2,
        };
        let mut last = Progress::default();
        let summary = run(&Client::new(&base, None), &plan, |p| last = *p)
            .await
            .unwrap();
        let asked = asked.lock().unwrap().clone();
        let of = |host: &str| -> Vec<&str> {
            let tail = format!(".{host}");
            asked
                .iter()
                .map(String::as_str)
                .filter(|a| a.ends_with(&tail))
                .collect()
        };
        let a = [
            "submit one.a",
            "wait one.a",
            "submit two.a",
            "wait two.a",
            "submit three.a",
            "wait three.a",
        ];
        assert_eq!(of("a"), a);
        assert_eq!(
            of("b"),
            ["submit one.b", "wait one.b", "submit two.b", "wait two.b"]
        );
        assert_eq!(of("ghost"), ["submit one.ghost"]);
        let got: Vec<(&str, usize, &str, &str)> = summary
            .results
            .iter()
            .map(|r| {
                let code = r.status.error.as_ref().and_then(|e| e["code"].as_str());
                (
                    r.status.host.as_str(),
                    r.step,
                    r.status.status.as_str(),
                    code.unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", 3, "succeeded", ""),
                ("b", 2, "failed", "hook_failed"),
                ("ghost", 1, "unsubmitted", "host_not_found"),
            ]
        );
        assert_eq!(
            (summary.total, summary.succeeded, summary.commands),
            (3, 1, 3)
        );
        let expected = Progress {
            total: 3,
            commands: 3,
            submitted: 6,
            done: 3,
            failed: 2,
        };
        assert_eq!(last, expected);
    }

    /// Ids: a command's own id is its base; without one, a rollout of one command
    /// keeps `rollout-<time>` and one of more numbers each step; two commands with
    /// the same id are refused.
    #[test]
    fn each_command_of_a_rollout_gets_ids_of_its_own() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-07T01:02:03.456Z")
            .unwrap()
            .to_utc();
        let plain = json!({"op": "ensure_namespace", "namespace": "n"});
        assert_eq!(
            bases(std::slice::from_ref(&plain), now).unwrap(),
            ["rollout-20261207T010203.456"]
        );
        let named = json!({"id": "ns", "op": "ensure_namespace", "namespace": "n"});
        assert_eq!(
            bases(&[named.clone(), plain.clone()], now).unwrap(),
            ["ns", "rollout-20261207T010203.456-2"]
        );
        let same = bases(&[named.clone(), plain, named], now).unwrap_err();
        assert!(
            matches!(
                &same,
                RolloutError::SameId {
                    first: 1,
                    second: 3,
                    ..
                }
            ),
            "{same}"
        );
        assert!(matches!(bases(&[], now), Err(RolloutError::NoCommand)));
        assert!(matches!(
            bases(&[json!([1])], now),
            Err(RolloutError::NotAnObject(1))
        ));
    }
}

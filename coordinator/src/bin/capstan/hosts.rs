//! `capstan hosts`, `verify`, `intent`, `register`, `keys` and `unregister`: what the
//! coordinator knows of the hosts.

use crate::output::{print, typed};
use anyhow::Context as _;
use capstan_common::answers::{read_answer, AnswerError, IntentAnswer};
use capstan_coordinator::answers::HostsAnswer;
use capstan_coordinator::client::Client;
use capstan_coordinator::verify::{Finding, Verdict};
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;

/// How many registrations of `capstan register --file` are in flight at once.
const REGISTER_IN_FLIGHT: usize = 16;

/// `capstan hosts`: every host, with its heartbeat's status and age.
pub(crate) async fn list(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let answer = client.get("/v1/hosts").await?;
    let hosts: HostsAnswer = typed(&answer)?;
    print(json, &answer, |_| human_hosts(&hosts));
    Ok(ExitCode::SUCCESS)
}

fn human_hosts(answer: &HostsAnswer) -> String {
    let mut out = format!(
        "{:<20} {:<10} {:>6} {:<10} {:<10} {:>8}\n",
        "HOST", "STATUS", "AGE", "VERSION", "DRIVERS", "LAST_SEQ"
    );
    for h in &answer.hosts {
        let beat = h.beat.as_ref();
        out.push_str(&format!(
            "{:<20} {:<10} {:>6} {:<10} {:<10} {:>8}\n",
            h.host,
            h.status.as_str(),
            h.age_secs.map_or("-".into(), |a| format!("{a}s")),
            beat.map_or("-", |b| b.version.as_str()),
            beat.map_or("-".into(), |b| b.drivers.join(",")),
            beat.map_or("-".into(), |b| b.last_seq.to_string()),
        ));
    }
    out
}

/// `capstan verify HOST`: the host's log against its published copy.
pub(crate) async fn verify(client: &Client, json: bool, host: &str) -> anyhow::Result<ExitCode> {
    let value = client.get(&format!("/v1/hosts/{host}/verify")).await?;
    let verdict: Verdict =
        serde_json::from_value(value.clone()).context("the coordinator's verdict is unreadable")?;
    print(json, &value, |_| human_verdict(&verdict));
    Ok(match verdict.result {
        Finding::Ok => ExitCode::SUCCESS,
        Finding::Differs | Finding::Truncated => ExitCode::from(1),
    })
}

/// `capstan intent HOST`.
pub(crate) async fn intent(client: &Client, json: bool, host: &str) -> anyhow::Result<ExitCode> {
    let intent = client.get(&format!("/v1/hosts/{host}/intent")).await?;
    let intent = expect_intent(intent)?;
    print(json, &intent, |v| {
        serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
    });
    Ok(ExitCode::SUCCESS)
}

/// `capstan keys HOST`.
pub(crate) async fn keys(client: &Client, json: bool, host: &str) -> anyhow::Result<ExitCode> {
    let entry = client.get(&format!("/v1/hosts/{host}/keys")).await?;
    print(json, &entry, human_keys);
    Ok(ExitCode::SUCCESS)
}

/// `capstan unregister HOST KEY`.
pub(crate) async fn unregister(
    client: &Client,
    json: bool,
    host: &str,
    key: &str,
) -> anyhow::Result<ExitCode> {
    let entry = client
        .delete(&format!("/v1/hosts/{host}/keys/{key}"))
        .await?;
    print(json, &entry, human_keys);
    Ok(ExitCode::SUCCESS)
}

/// `capstan register HOST KEY` or `--file FILE`: each pair through
/// `PUT /v1/hosts/{host}/keys`; one line (or JSON object) per host.
pub(crate) async fn register(
    client: &Client,
    json: bool,
    host: Option<String>,
    key: Option<String>,
    file: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let pairs: Vec<(String, String)> = match (host, key, file) {
        (Some(h), Some(k), None) => vec![(h, k)],
        (None, None, Some(f)) => {
            let text = std::fs::read_to_string(&f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            let mut pairs = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                match line.split_whitespace().collect::<Vec<_>>()[..] {
                    [h, k] => pairs.push((h.to_string(), k.to_string())),
                    _ => anyhow::bail!("{}:{}: expected `HOST KEY`", f.display(), n + 1),
                }
            }
            pairs
        }
        _ => anyhow::bail!("give HOST and KEY, or --file FILE"),
    };
    // One key is one host's: a file giving a key to two hosts is refused before any
    // request (the coordinator checks against what is registered, not against
    // registrations in flight beside each other).
    let mut owners = std::collections::HashMap::new();
    for (host, key) in &pairs {
        if let Some(other) = owners.insert(key.trim().to_ascii_lowercase(), host) {
            if other != host {
                anyhow::bail!(
                    "the key {key} is given to hosts {other} and {host}: a key is one host's"
                );
            }
        }
    }
    // Up to REGISTER_IN_FLIGHT at once (on per-host accounts each registration also
    // makes the host's storage on the server): printed in the file's order, stopping
    // at the first refusal.
    let mut answers = futures::stream::iter(pairs)
        .map(|(host, key)| async move {
            client
                .put(
                    &format!("/v1/hosts/{host}/keys"),
                    &json!({"public_key": key}),
                )
                .await
        })
        .buffered(REGISTER_IN_FLIGHT);
    while let Some(entry) = answers.next().await {
        print(json, &entry?, human_keys);
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn human_keys(entry: &Value) -> String {
    let keys: Vec<&str> = entry["public_keys"]
        .as_array()
        .map(|k| k.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    format!(
        "{} {}\n",
        entry["host"].as_str().unwrap_or("?"),
        if keys.is_empty() {
            "(no keys)".to_string()
        } else {
            keys.join(" ")
        }
    )
}

pub(crate) fn human_verdict(v: &Verdict) -> String {
    let (host, published) = (v.host_seq, v.published_seq);
    match (&v.result, &v.first_difference) {
        (Finding::Ok, _) => format!(
            "ok: {} records of {} equal on the host and in CAPSTAN_EVT (host at seq {host}, published up to {published}{})\n",
            v.compared,
            v.host,
            v.anchor_seq
                .map(|a| format!("; compared after the host's anchor at seq {a}"))
                .unwrap_or_default()
        ),
        (Finding::Truncated, d) => format!(
            "TRUNCATED at seq {}: the log of {} ends at seq {host}, CAPSTAN_EVT holds records up to {published}\n",
            d.as_ref().map_or(0, |d| d.seq),
            v.host
        ),
        (Finding::Differs, d) => {
            let show = |r: Option<&Value>| r.map_or("-".into(), Value::to_string);
            let d = d.as_ref();
            format!(
                "DIFFERS at seq {}: the log of {} was rewritten or forked after publication\n  host:      {}\n  published: {}\n",
                d.map_or(0, |d| d.seq),
                v.host,
                show(d.and_then(|d| d.host.as_ref())),
                show(d.and_then(|d| d.published.as_ref()))
            )
        }
    }
}

/// The agent's intent, or an error when the answer is not one (an error reply, `{}`).
/// It is shown as it came (a newer agent's fields too).
pub(crate) fn expect_intent(intent: Value) -> anyhow::Result<Value> {
    match read_answer::<IntentAnswer>(&intent) {
        Ok(_) => Ok(intent),
        Err(AnswerError::Refused(error)) => {
            anyhow::bail!("the agent answered with an error: {error}")
        }
        Err(AnswerError::Malformed(e)) => {
            anyhow::bail!("the agent's answer is not an intent ({e}): {intent}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_is_not_an_intent_is_an_error() {
        let empty = expect_intent(json!({})).unwrap_err().to_string();
        assert!(empty.contains("is not an intent"), "{empty}");
        let error = json!({"error": {"code": "log_unreadable", "message": "m"}});
        let error = expect_intent(error).unwrap_err().to_string();
        assert!(
            error.contains("answered with an error") && error.contains("log_unreadable"),
            "{error}"
        );
        let intent = json!({"applied_seq": 9, "namespaces": {}, "workloads": {}});
        assert_eq!(expect_intent(intent.clone()).unwrap(), intent);
        let bad = json!({"applied_seq": 9, "namespaces": {}, "workloads": {"a/b": {}}});
        let bad = expect_intent(bad).unwrap_err().to_string();
        assert!(bad.contains("is not an intent"), "{bad}");
        let intent = json!({"applied_seq": 9, "namespaces": {}, "workloads": {}, "new": 1});
        assert_eq!(expect_intent(intent.clone()).unwrap(), intent);
    }
}

//! `capstan submit`, `wait`, `cancel` and `status`: commands through the coordinator,
//! and how a command's status reads.

use crate::log::event_line;
use crate::output::print;
use anyhow::Context as _;
use capstan_coordinator::client::Client;
use serde_json::Value;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// `capstan submit FILE [--wait]`: each command posted; with `--wait`, its status once done.
pub(crate) async fn submit(
    client: &Client,
    json: bool,
    file: &PathBuf,
    wait: bool,
) -> anyhow::Result<ExitCode> {
    let mut code = ExitCode::SUCCESS;
    for command in read_input(file)? {
        let accepted = client.post("/v1/commands", &command).await?;
        let id = accepted["id"].as_str().unwrap_or_default().to_string();
        if wait {
            let s = client
                .get(&format!("/v1/commands/{id}/wait?timeout=60s"))
                .await?;
            print(json, &s, human_status);
            if status_code(&s) != ExitCode::SUCCESS {
                code = status_code(&s);
            }
        } else {
            print(json, &accepted, |v| {
                format!("{}\n", v["id"].as_str().unwrap_or(""))
            });
        }
    }
    Ok(code)
}

/// `capstan wait ID`: the command's status once done, or when `timeout` ends.
pub(crate) async fn wait(
    client: &Client,
    json: bool,
    id: &str,
    timeout: &str,
) -> anyhow::Result<ExitCode> {
    let s = client
        .get(&format!("/v1/commands/{id}/wait?timeout={timeout}"))
        .await?;
    print(json, &s, human_status);
    Ok(status_code(&s))
}

/// `capstan cancel ID [--wait]`.
pub(crate) async fn cancel(
    client: &Client,
    json: bool,
    id: &str,
    wait: bool,
    timeout: &str,
) -> anyhow::Result<ExitCode> {
    let answer = client
        .post(&format!("/v1/commands/{id}/cancel"), &serde_json::json!({}))
        .await?;
    if !wait {
        print(json, &answer, human_cancel);
        return Ok(ExitCode::SUCCESS);
    }
    let s = client
        .get(&format!("/v1/commands/{id}/wait?timeout={timeout}"))
        .await?;
    print(json, &s, human_status);
    Ok(match s["done"].as_bool() {
        Some(true) => ExitCode::SUCCESS,
        _ => ExitCode::from(3),
    })
}

/// `capstan status ID`.
pub(crate) async fn status(client: &Client, json: bool, id: &str) -> anyhow::Result<ExitCode> {
    let s = client.get(&format!("/v1/commands/{id}")).await?;
    print(json, &s, human_status);
    Ok(match s["status"].as_str() {
        Some("failed" | "rejected") => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

pub(crate) fn read_input(file: &PathBuf) -> anyhow::Result<Vec<Value>> {
    let mut text = String::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text)?;
    } else {
        text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
    }
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        return Ok(match value {
            Value::Array(items) => items,
            other => vec![other],
        });
    }
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("line {} is not JSON", i + 1))
        })
        .collect()
}

pub(crate) fn status_code(status: &Value) -> ExitCode {
    match status["status"].as_str() {
        Some("succeeded") => ExitCode::SUCCESS,
        Some("failed" | "rejected") => ExitCode::from(1),
        _ => ExitCode::from(3),
    }
}

pub(crate) fn human_cancel(a: &Value) -> String {
    let command = &a["command"];
    let (id, status) = (
        command["id"].as_str().unwrap_or("-"),
        command["status"].as_str().unwrap_or("-"),
    );
    match a["cancel_id"].as_str() {
        Some(cancel) => format!("{id}  cancel={cancel} sent  (status was {status})\n"),
        None => format!("{id}  is done ({status}): nothing to cancel\n"),
    }
}

pub(crate) fn human_status(s: &Value) -> String {
    let mut out = format!(
        "{}  host={}  status={}",
        s["id"].as_str().unwrap_or("-"),
        s["host"].as_str().unwrap_or("-"),
        s["status"].as_str().unwrap_or("-")
    );
    if let Some(e) = s["error"].as_object() {
        out.push_str(&format!(
            "  error={}: {}",
            e["code"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        ));
    }
    out.push('\n');
    for e in s["events"].as_array().into_iter().flatten() {
        out.push_str(&event_line(e));
    }
    out
}

//! `capstan submit`, `wait`, `cancel` and `status`: commands through the coordinator,
//! and how a command's status reads.

use crate::output::{print, typed};
use anyhow::Context as _;
use capstan_common::audit_table;
use capstan_common::status::CommandStatus;
use capstan_coordinator::answers::{Accepted, CancelAnswer};
use capstan_coordinator::client::Client;
use serde_json::Value;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// `capstan submit FILE [--wait] [--queue-unknown-host]`: each command posted (for a
/// host the coordinator does not know only with `queue_unknown_host`); with
/// `--wait`, its status once done.
pub(crate) async fn submit(
    client: &Client,
    json: bool,
    file: &PathBuf,
    wait: bool,
    queue_unknown_host: bool,
) -> anyhow::Result<ExitCode> {
    let path = match queue_unknown_host {
        true => "/v1/commands?unknown_host=queue",
        false => "/v1/commands",
    };
    let mut code = ExitCode::SUCCESS;
    for command in read_input(file)? {
        let answer = client.post(path, &command).await?;
        let accepted: Accepted = typed(&answer)?;
        if wait {
            let s = client
                .get(&format!("/v1/commands/{}/wait?timeout=60s", accepted.id))
                .await?;
            let status = show_status(json, &s)?;
            if status_code(&status) != ExitCode::SUCCESS {
                code = status_code(&status);
            }
        } else {
            print(json, &answer, |_| format!("{}\n", accepted.id));
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
    Ok(status_code(&show_status(json, &s)?))
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
        let cancel: CancelAnswer = typed(&answer)?;
        print(json, &answer, |_| human_cancel(&cancel));
        return Ok(ExitCode::SUCCESS);
    }
    let s = client
        .get(&format!("/v1/commands/{id}/wait?timeout={timeout}"))
        .await?;
    Ok(match show_status(json, &s)?.done {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(3),
    })
}

/// `capstan status ID`.
pub(crate) async fn status(client: &Client, json: bool, id: &str) -> anyhow::Result<ExitCode> {
    let s = client.get(&format!("/v1/commands/{id}")).await?;
    Ok(match show_status(json, &s)?.status.as_str() {
        "failed" | "rejected" => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

/// A command's status, printed; what it says.
fn show_status(json: bool, answer: &Value) -> anyhow::Result<CommandStatus> {
    let status: CommandStatus = typed(answer)?;
    print(json, answer, |_| human_status(&status));
    Ok(status)
}

/// The commands of FILE (`-`: stdin): one JSON object, an array of them, or a stream
/// of them (JSON lines, or objects spread over lines). A JSON error names its line and
/// column in the file.
pub(crate) fn read_input(file: &PathBuf) -> anyhow::Result<Vec<Value>> {
    let mut text = String::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text)?;
    } else {
        text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
    }
    parse_input(&text).with_context(|| format!("{} is not JSON", file.display()))
}

/// [`read_input`]'s reading of the text.
fn parse_input(text: &str) -> Result<Vec<Value>, serde_json::Error> {
    let values = serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match <[Value; 1]>::try_from(values) {
        Ok([Value::Array(items)]) => items,
        Ok([one]) => vec![one],
        Err(many) => many,
    })
}

pub(crate) fn status_code(status: &CommandStatus) -> ExitCode {
    match status.status.as_str() {
        "succeeded" => ExitCode::SUCCESS,
        "failed" | "rejected" => ExitCode::from(1),
        _ => ExitCode::from(3),
    }
}

pub(crate) fn human_cancel(a: &CancelAnswer) -> String {
    let (id, status) = (&a.command.id, &a.command.status);
    match &a.cancel_id {
        Some(cancel) => format!("{id}  cancel={cancel} sent  (status was {status})\n"),
        None => format!("{id}  is done ({status}): nothing to cancel\n"),
    }
}

pub(crate) fn human_status(s: &CommandStatus) -> String {
    let mut out = format!("{}  host={}  status={}", s.id, s.host, s.status);
    if let Some(e) = s.error.as_ref().and_then(Value::as_object) {
        out.push_str(&format!(
            "  error={}: {}",
            e.get("code").and_then(Value::as_str).unwrap_or(""),
            e.get("message").and_then(Value::as_str).unwrap_or("")
        ));
    }
    out.push('\n');
    // The events as `capstan log` prints them, under the same header, indented.
    if !s.events.is_empty() {
        out.push_str(&format!("  {}\n", audit_table::header()));
    }
    for e in &s.events {
        out.push_str(&format!("  {}\n", audit_table::row(e)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::parse_input;
    use serde_json::json;

    /// Given one object, an array, JSON lines with blank lines, and an object spread
    /// over lines, then each reads as its commands.
    #[test]
    fn reads_an_object_an_array_and_json_lines() {
        assert_eq!(parse_input(r#"{"a":1}"#).unwrap(), [json!({"a": 1})]);
        assert_eq!(
            parse_input(r#"[{"a":1},{"a":2}]"#).unwrap(),
            [json!({"a": 1}), json!({"a": 2})]
        );
        assert_eq!(
            parse_input("{\"a\":1}\n\n{\"a\":2}\n").unwrap(),
            [json!({"a": 1}), json!({"a": 2})]
        );
        assert_eq!(
            parse_input("{\n  \"a\": 1\n}\n{\"a\":2}").unwrap(),
            [json!({"a": 1}), json!({"a": 2})]
        );
    }

    /// Given a JSON error after blank lines, in an array over many lines, or on a
    /// later JSON line, then the error names the file's line and column of it.
    #[test]
    fn an_error_names_the_files_line_and_column() {
        let at = |text: &str| {
            let e = parse_input(text).unwrap_err();
            (e.line(), e.column())
        };
        assert_eq!(at("{\"a\":1}\n\n   {\"a\":x}\n"), (3, 9));
        assert_eq!(at("[\n{\"op\":\"x\",\n \"b\": 1,}\n]\n"), (3, 9));
        assert_eq!(at("\n\n\n{\"a\":"), (4, 5));
    }
}

//! `capstan-agent intent`: what the agent means to run, as folded from its log.

use crate::context::{open_log, Context};
use capstan_agent::local_socket;
use std::io::Write;
use std::process::ExitCode;

/// `capstan-agent intent`: from the running agent when one runs, else rebuilt from
/// the log files.
pub(crate) fn show_intent(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    let intent = match local_socket::running(&ctx.data_dir) {
        Some(path) => local_socket::ask(&path, "intent", serde_json::Value::Null)?,
        None => open_log(ctx)?.intent().to_json(),
    };
    if intent.get("error").is_some() || !intent["applied_seq"].is_u64() {
        anyhow::bail!("the running agent's answer is not an intent: {intent}");
    }
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{intent}")?;
        return Ok(ExitCode::SUCCESS);
    }
    let keys = |v: &serde_json::Value| {
        v.as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    writeln!(out, "applied_seq {}", intent["applied_seq"])?;
    for ns in keys(&intent["namespaces"]) {
        writeln!(out, "namespace {ns}")?;
    }
    for (key, w) in intent["workloads"].as_object().into_iter().flatten() {
        let text = |k: &str| w[k].as_str().map(str::to_string);
        writeln!(
            out,
            "workload {key:<32} intent={:<8} active={}{}",
            text("intent").unwrap_or_default(),
            text("active_revision").as_deref().unwrap_or("-"),
            text("failed")
                .map(|c| format!(" failed={c}"))
                .unwrap_or_default()
        )?;
    }
    let in_flight = keys(&intent["in_flight"]);
    if !in_flight.is_empty() {
        writeln!(out, "in flight: {}", in_flight.join(", "))?;
    }
    Ok(ExitCode::SUCCESS)
}

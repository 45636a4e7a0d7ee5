//! `capstan-agent intent`: what the agent means to run, as folded from its log.

use crate::context::{open_log, Context};
use capstan_agent::local_socket;
use capstan_common::answers::{IntentAnswer, Verb};
use std::io::Write;
use std::process::ExitCode;

/// `capstan-agent intent`: from the running agent when one runs, else rebuilt from
/// the log files.
pub(crate) fn show_intent(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    let intent: IntentAnswer = match local_socket::running(&ctx.data_dir) {
        Some(path) => local_socket::ask_as(&path, Verb::Intent, &())?,
        None => open_log(ctx)?.intent().answer(),
    };
    let mut out = std::io::stdout().lock();
    if json {
        // As a JSON value, whose object keys are sorted: the order every earlier
        // build printed.
        writeln!(out, "{}", serde_json::to_value(&intent)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "applied_seq {}", intent.applied_seq)?;
    for ns in intent.namespaces.keys() {
        writeln!(out, "namespace {ns}")?;
    }
    for (key, w) in &intent.workloads {
        writeln!(
            out,
            "workload {key:<32} intent={:<8} active={}{}",
            w.intent.as_str(),
            w.active_revision.as_deref().unwrap_or("-"),
            w.failed
                .map(|c| format!(" failed={}", c.as_str()))
                .unwrap_or_default()
        )?;
    }
    if !intent.in_flight.is_empty() {
        let ids: Vec<&str> = intent.in_flight.keys().map(String::as_str).collect();
        writeln!(out, "in flight: {}", ids.join(", "))?;
    }
    Ok(ExitCode::SUCCESS)
}

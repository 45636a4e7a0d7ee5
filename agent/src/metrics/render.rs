//! The Prometheus text exposition format 0.0.4 of one agent's figures: every family
//! with `# HELP` and `# TYPE`, names prefixed `capstan_agent_`.

use super::{outcome_str, result_str, Metrics};
use capstan_common::answers::WorkloadCounts;
use std::fmt::Write as _;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What is read when scraped, besides the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauges {
    pub last_seq: u64,
    /// The last seq `CAPSTAN_EVT` acknowledged; `None` without `[nats]`.
    pub published_seq: Option<u64>,
    /// The log takes no writes (degraded, or a flush failed).
    pub degraded: bool,
    pub workloads: WorkloadCounts,
    pub version: &'static str,
    /// The driver's kind (`sim`, `docker`, …).
    pub driver: capstan_common::DriverKind,
}

/// A label value, escaped as the format asks (`\\`, `\"`, `\n`).
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, pairs: &[(&str, &str)], value: impl std::fmt::Display) {
    let _ = writeln!(out, "{name}{} {value}", labels(pairs));
}

fn bound(b: f64) -> String {
    if b.is_infinite() {
        "+Inf".into()
    } else {
        b.to_string()
    }
}

fn histogram(out: &mut String, name: &str, pairs: &[(&str, &str)], h: &super::Histogram) {
    for (b, n) in h.cumulative() {
        let le = bound(b);
        let mut with_le = pairs.to_vec();
        with_le.push(("le", &le));
        sample(out, &format!("{name}_bucket"), &with_le, n);
    }
    sample(out, &format!("{name}_sum"), pairs, h.sum());
    sample(out, &format!("{name}_count"), pairs, h.count());
}

/// The whole exposition.
pub fn render(metrics: &Metrics, gauges: &Gauges) -> String {
    let mut out = String::new();
    let o = &mut out;
    family(
        o,
        "capstan_agent_build_info",
        "gauge",
        "Always 1: the agent's version and driver.",
    );
    sample(
        o,
        "capstan_agent_build_info",
        &[
            ("version", gauges.version),
            ("driver", gauges.driver.as_str()),
        ],
        1,
    );
    family(
        o,
        "capstan_agent_start_time_seconds",
        "gauge",
        "When the agent process started (Unix seconds); counters count from then.",
    );
    sample(
        o,
        "capstan_agent_start_time_seconds",
        &[],
        metrics.started().timestamp(),
    );
    family(
        o,
        "capstan_agent_log_last_seq",
        "gauge",
        "The seq of the last record in the log.",
    );
    sample(o, "capstan_agent_log_last_seq", &[], gauges.last_seq);
    if let Some(published) = gauges.published_seq {
        family(
            o,
            "capstan_agent_outbox_published_seq",
            "gauge",
            "The last log seq CAPSTAN_EVT acknowledged.",
        );
        sample(o, "capstan_agent_outbox_published_seq", &[], published);
        family(
            o,
            "capstan_agent_outbox_lag",
            "gauge",
            "Log records not yet in CAPSTAN_EVT.",
        );
        sample(
            o,
            "capstan_agent_outbox_lag",
            &[],
            gauges.last_seq.saturating_sub(published),
        );
    }
    family(
        o,
        "capstan_agent_degraded",
        "gauge",
        "1 while the log takes no writes (degraded, or a flush failed): every command is refused.",
    );
    sample(o, "capstan_agent_degraded", &[], u8::from(gauges.degraded));
    family(
        o,
        "capstan_agent_workloads",
        "gauge",
        "Workloads in the running intent by state (failed: the last attempt to reach intent failed).",
    );
    let w = gauges.workloads;
    for (state, n) in [
        ("running", w.running),
        ("stopped", w.stopped),
        ("failed", w.failed),
    ] {
        sample(o, "capstan_agent_workloads", &[("state", state)], n);
    }
    family(
        o,
        "capstan_agent_commands_total",
        "counter",
        "Commands answered since the agent started, by op, outcome and whether answered from the log (duplicate).",
    );
    for c in metrics.commands() {
        let duplicate = if c.duplicate { "true" } else { "false" };
        sample(
            o,
            "capstan_agent_commands_total",
            &[
                ("op", c.op),
                ("outcome", outcome_str(c.outcome)),
                ("duplicate", duplicate),
            ],
            c.count,
        );
    }
    let name = "capstan_agent_driver_op_duration_seconds";
    family(
        o,
        name,
        "histogram",
        "Driver operations by op and result (ok, or the error code), and how long they took.",
    );
    for (op, code, h) in metrics.driver_ops() {
        histogram(
            o,
            name,
            &[("op", op.as_str()), ("result", result_str(code))],
            &h,
        );
    }
    let (calls, durations) = metrics.hooks();
    family(
        o,
        "capstan_agent_hook_calls_total",
        "counter",
        "Hook calls by owner, phase and result (ok, or the code the call was recorded with).",
    );
    for (owner, phase, result, n) in calls {
        let pairs = [
            ("owner", owner.as_str()),
            ("phase", phase.as_str()),
            ("result", result),
        ];
        sample(o, "capstan_agent_hook_calls_total", &pairs, n);
    }
    let name = "capstan_agent_hook_call_duration_seconds";
    family(
        o,
        name,
        "histogram",
        "How long hook calls took, by owner and phase.",
    );
    for (owner, phase, h) in durations {
        histogram(
            o,
            name,
            &[("owner", owner.as_str()), ("phase", phase.as_str())],
            &h,
        );
    }
    out
}

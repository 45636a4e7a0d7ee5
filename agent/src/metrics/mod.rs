//! What the agent measures about itself, counted from process start, and how it is
//! shown: `GET /metrics` ([`serve`], rendered by [`render`]) and the key figures in
//! the heartbeat ([`Metrics::figures`]).
//!
//! Measured where the work happens: commands by the executor (one answer, one count),
//! hook calls where [`crate::hooks`] calls an owner, driver operations by
//! [`driver::Measured`], a decorator around the configured driver. The command path
//! pays atomics (commands) or one uncontended mutex (driver and hook durations);
//! gauges (log seq, outbox lag, workloads by state) are read when scraped.
//!
//! Every label value comes from a closed set (ops, outcomes, error codes, phases) or
//! from trusted local config (hook owner names): never command ids or workload names.

pub mod driver;
pub mod render;
pub mod serve;

use crate::intent::{Intent, RunIntent};
use capstan_common::answers::{CommandCounts, Figures, WorkloadCounts};
use capstan_common::{CommandResult, ErrorCode, Op, Outcome, Phase, KNOWN_OPS};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bounds in seconds, shared by driver operations and hook calls: from a
/// sim call (well under 1 ms) to an image pull or a slow hook (a minute).
pub const BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The `op` label of commands rejected before they were a command (unparseable,
/// unsigned, mis-signed, expired); the others are labelled with their [`Op::name`].
pub const NO_OP: &str = "none";

/// The `op` labels: every op this version knows ([`KNOWN_OPS`]), then [`NO_OP`].
fn op_label(i: usize) -> &'static str {
    KNOWN_OPS.get(i).copied().unwrap_or(NO_OP)
}

const OUTCOMES: [Outcome; 3] = [Outcome::Succeeded, Outcome::Failed, Outcome::Rejected];

/// The `outcome` label.
pub fn outcome_str(o: Outcome) -> &'static str {
    match o {
        Outcome::Succeeded => "succeeded",
        Outcome::Failed => "failed",
        Outcome::Rejected => "rejected",
    }
}

fn op_index(op: Option<&Op>) -> usize {
    op.and_then(|op| KNOWN_OPS.iter().position(|o| *o == op.name()))
        .unwrap_or(KNOWN_OPS.len())
}

fn outcome_index(o: Outcome) -> usize {
    match o {
        Outcome::Succeeded => 0,
        Outcome::Failed => 1,
        Outcome::Rejected => 2,
    }
}

/// A driver operation: the `op` label of driver latencies.
pub use capstan_driver::decorate::Operation as DriverOp;

/// Counts of observations at or under each of [`BUCKETS`], their count and sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Not cumulative: `buckets[i]` counts observations in `(BUCKETS[i-1], BUCKETS[i]]`.
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += secs;
    }

    /// `(upper bound, cumulative count)` per bucket, `+Inf` last.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let mut total = 0;
        BUCKETS
            .iter()
            .zip(self.buckets)
            .map(move |(b, n)| {
                total += n;
                (*b, total)
            })
            .chain(std::iter::once((f64::INFINITY, self.count)))
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// The result label of a driver operation: `ok`, or the error's stable code.
pub fn result_str(code: Option<ErrorCode>) -> &'static str {
    code.map_or("ok", ErrorCode::as_str)
}

#[derive(Default)]
struct HookFigures {
    /// By (owner, phase, result).
    calls: BTreeMap<(String, Phase, &'static str), u64>,
    /// By (owner, phase).
    durations: BTreeMap<(String, Phase), Histogram>,
}

/// One agent's figures (one per executor: `sim-fleet` hosts and tests do not share).
pub struct Metrics {
    started: chrono::DateTime<chrono::Utc>,
    /// By op × outcome × duplicate.
    commands: [[[AtomicU64; 2]; OUTCOMES.len()]; KNOWN_OPS.len() + 1],
    driver: Mutex<HashMap<(DriverOp, Option<ErrorCode>), Histogram>>,
    hooks: Mutex<HookFigures>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: chrono::Utc::now(),
            commands: Default::default(),
            driver: Mutex::default(),
            hooks: Mutex::default(),
        }
    }
}

/// A counter of commands: its labels and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandCount {
    pub op: &'static str,
    pub outcome: Outcome,
    pub duplicate: bool,
    pub count: u64,
}

/// A hook counter: owner, phase, result and value.
pub type HookCall = (String, Phase, &'static str, u64);

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// When counting began (the process start, as near as matters).
    pub fn started(&self) -> chrono::DateTime<chrono::Utc> {
        self.started
    }

    /// Counts one answered command (`op`: `None` when it never parsed).
    pub fn command(&self, op: Option<&Op>, result: &CommandResult) {
        self.commands[op_index(op)][outcome_index(result.outcome)][usize::from(result.duplicate)]
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Records one driver operation.
    pub fn driver_op(&self, op: DriverOp, code: Option<ErrorCode>, took: Duration) {
        self.driver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((op, code))
            .or_default()
            .observe(took);
    }

    /// Records one hook call; `result` is `ok` or the code it was recorded with.
    pub fn hook_call(&self, owner: &str, phase: Phase, result: &'static str, took: Duration) {
        let mut h = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
        *h.calls
            .entry((owner.to_string(), phase, result))
            .or_default() += 1;
        h.durations
            .entry((owner.to_string(), phase))
            .or_default()
            .observe(took);
    }

    /// Every command counter, zeros included (so a rate starts from 0).
    pub fn commands(&self) -> Vec<CommandCount> {
        let mut v = Vec::with_capacity(self.commands.len() * OUTCOMES.len() * 2);
        for (i, by_outcome) in self.commands.iter().enumerate() {
            for (j, outcome) in OUTCOMES.iter().enumerate() {
                for duplicate in [false, true] {
                    v.push(CommandCount {
                        op: op_label(i),
                        outcome: *outcome,
                        duplicate,
                        count: by_outcome[j][usize::from(duplicate)].load(Ordering::Relaxed),
                    });
                }
            }
        }
        v
    }

    /// Commands by outcome, duplicates apart (the heartbeat's figure).
    pub fn command_counts(&self) -> CommandCounts {
        let mut c = CommandCounts::default();
        for n in self.commands() {
            let slot = match (n.duplicate, n.outcome) {
                (true, _) => &mut c.duplicate,
                (false, Outcome::Succeeded) => &mut c.succeeded,
                (false, Outcome::Failed) => &mut c.failed,
                (false, Outcome::Rejected) => &mut c.rejected,
            };
            *slot += n.count;
        }
        c
    }

    /// Driver latencies by (op, code), sorted.
    pub fn driver_ops(&self) -> Vec<(DriverOp, Option<ErrorCode>, Histogram)> {
        let map = self.driver.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = map.iter().map(|((o, c), h)| (*o, *c, h.clone())).collect();
        v.sort_by(|a, b| (a.0, result_str(a.1)).cmp(&(b.0, result_str(b.1))));
        v
    }

    /// Hook calls by (owner, phase, result), and durations by (owner, phase).
    pub fn hooks(&self) -> (Vec<HookCall>, Vec<(String, Phase, Histogram)>) {
        let h = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
        let calls = h
            .calls
            .iter()
            .map(|((o, p, r), n)| (o.clone(), *p, *r, *n))
            .collect();
        let durations = h
            .durations
            .iter()
            .map(|((o, p), d)| (o.clone(), *p, d.clone()))
            .collect();
        (calls, durations)
    }

    /// The heartbeat's and `status`'s figures: `last_seq` as the same message reports
    /// it, `published` as the outbox last saw acknowledged.
    pub fn figures(&self, log: &crate::log::Log, last_seq: u64, published: u64) -> Figures {
        Figures {
            since: self.started,
            published_seq: published,
            outbox_lag: last_seq.saturating_sub(published),
            commands: self.command_counts(),
            workloads: log.with_intent(workloads),
        }
    }
}

/// Workloads by what the log says of them: `failed` (the last attempt to reach
/// intent failed), else their intent, `running` or `stopped`.
pub fn workloads(intent: &Intent) -> WorkloadCounts {
    let mut c = WorkloadCounts::default();
    for w in intent.workloads.values() {
        match (w.failed, w.intent) {
            (Some(_), _) => c.failed += 1,
            (None, RunIntent::Running) => c.running += 1,
            (None, RunIntent::Stopped) => c.stopped += 1,
        }
    }
    c
}

#[cfg(test)]
mod tests;

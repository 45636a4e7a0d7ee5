//! Where a capstan round's time went, from the agent's own log (its records' `at`,
//! read back through the coordinator): the agent runs on the same machine, so on the
//! same clock as the bench.

use crate::stack::Stack;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

/// Offsets from the round's first POST, in ms.
pub struct Timeline {
    pub first_received: f64,
    pub prepare_p50: f64,
    pub activate_p50: f64,
    pub activate_max: f64,
    pub last_completed: f64,
}

/// The timeline of the commands of revision `revision` (ids `p.…`/`a.…` ending in it).
pub async fn of(
    stack: &Stack,
    host: &str,
    started: DateTime<Utc>,
    revision: &str,
) -> anyhow::Result<Timeline> {
    let suffix = format!(".{revision}");
    let (mut received, mut completed) = (HashMap::new(), HashMap::new());
    let mut since = 0;
    loop {
        let page = stack
            .get(&format!("hosts/{host}/events?since={since}&limit=1000"))
            .await?;
        let records = page["events"].as_array().cloned().unwrap_or_default();
        let Some(last) = records.last() else { break };
        since = last["seq"].as_u64().unwrap_or(u64::MAX);
        for r in records {
            let (Some(id), Some(at)) = (r["command_id"].as_str(), r["at"].as_str()) else {
                continue;
            };
            if !id.ends_with(&suffix) || !(id.starts_with("p.") || id.starts_with("a.")) {
                continue;
            }
            let at = DateTime::parse_from_rfc3339(at)?.with_timezone(&Utc);
            let ms = (at - started).num_microseconds().unwrap_or_default() as f64 / 1e3;
            match r["kind"].as_str() {
                Some("command_received") => received.insert(id.to_string(), ms),
                Some("command_completed") => completed.insert(id.to_string(), ms),
                _ => None,
            };
        }
    }
    let took = |prefix: &str| -> Vec<f64> {
        let mut all: Vec<f64> = completed
            .iter()
            .filter(|(id, _)| id.starts_with(prefix))
            .filter_map(|(id, done)| Some(done - received.get(id)?))
            .collect();
        all.sort_by(f64::total_cmp);
        all
    };
    let (prepares, activates) = (took("p."), took("a."));
    anyhow::ensure!(
        !prepares.is_empty() && !activates.is_empty(),
        "no records of revision {revision} in the host's events"
    );
    Ok(Timeline {
        first_received: received.values().copied().fold(f64::MAX, f64::min),
        prepare_p50: prepares[prepares.len() / 2],
        activate_p50: activates[activates.len() / 2],
        activate_max: activates[activates.len() - 1],
        last_completed: completed.values().copied().fold(f64::MIN, f64::max),
    })
}

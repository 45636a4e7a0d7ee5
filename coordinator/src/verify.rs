//! `capstan verify HOST`: the host's log as published in `CAPSTAN_EVT` (the central
//! copy, a second witness) against the log the host holds now, record by record. A
//! log rewritten, truncated or forked after publication shows as the first seq where
//! the two differ; records the host has not published yet (its outbox's lag) are not
//! a difference. A host that pruned its log (retention: the records up to its anchor
//! were exported to files and removed) is compared from its anchor on; the first kept
//! record's `prev_hash` ties the kept chain to the anchor's hash.
//!
//! Both sides are read through the coordinator's API a page at a time
//! (`/v1/hosts/{host}/events` and the agent's own `/v1/hosts/{host}/log`); the
//! comparison itself ([`compare`]) is pure.

use crate::client::{Client, ClientError};
use serde::Serialize;
use serde_json::Value;

/// What `capstan verify` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub host: String,
    pub result: Finding,
    /// Records found equal on both sides.
    pub compared: u64,
    /// The last seq of the host's log.
    pub host_seq: u64,
    /// The last seq published in `CAPSTAN_EVT`.
    pub published_seq: u64,
    /// The host's anchor: it pruned records `1..=anchor_seq` (exported to files, see
    /// `docs/retention.md`), so the comparison starts after it. `None`: nothing pruned.
    pub anchor_seq: Option<u64>,
    /// Where the two first differ: the record on each side (`null` where that side has
    /// none).
    pub first_difference: Option<Difference>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// Every published record is in the host's log, unchanged.
    Ok,
    /// A record differs: the host's log was rewritten or forked after publication.
    Differs,
    /// The host's log ends before what was published: records were removed.
    Truncated,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub seq: u64,
    pub host: Option<Value>,
    pub published: Option<Value>,
}

/// One page of each side, from the same `since`: how many records are equal, and the
/// first difference, if any. The published records carry `host`, which the host's own
/// do not; nothing else is left out.
pub fn compare(host: &[Value], published: &[Value]) -> (u64, Option<Difference>) {
    let seq = |r: &Value| r["seq"].as_u64().unwrap_or(0);
    let mut equal = 0;
    for (mine, theirs) in host.iter().zip(published) {
        let mut theirs = theirs.clone();
        if let Some(o) = theirs.as_object_mut() {
            o.remove("host");
        }
        if *mine != theirs {
            let at = seq(mine).min(seq(&theirs));
            return (equal, Some(difference(at, host, published)));
        }
        equal += 1;
    }
    // One side ended first. The host ending first is a difference (published records
    // it no longer has); the published side ending first is the outbox's lag.
    match (host.get(published.len()), published.get(host.len())) {
        (None, Some(theirs)) => (equal, Some(difference(seq(theirs), host, published))),
        _ => (equal, None),
    }
}

fn difference(seq: u64, host: &[Value], published: &[Value]) -> Difference {
    let find = |records: &[Value]| records.iter().find(|r| r["seq"] == seq).cloned();
    Difference {
        seq,
        host: find(host),
        published: find(published),
    }
}

/// Reads both sides of `host` through `client` and compares them.
pub async fn verify(client: &Client, host: &str) -> Result<Verdict, VerifyError> {
    let mut verdict = Verdict {
        host: host.to_string(),
        result: Finding::Ok,
        compared: 0,
        host_seq: 0,
        published_seq: 0,
        anchor_seq: None,
        first_difference: None,
    };
    let mut since = 0;
    loop {
        // The published side first: the host's log only grows, and holds every
        // published record before it is published, so a record appended and
        // published between the two reads can never look like a truncated host.
        let theirs = client
            .get(&format!("/v1/hosts/{host}/events?since={since}"))
            .await?;
        let mine = client
            .get(&format!("/v1/hosts/{host}/log?since={since}"))
            .await?;
        let (Some(mine_records), Some(their_records)) =
            (mine["records"].as_array(), theirs["events"].as_array())
        else {
            return Err(VerifyError::Answer(format!("{mine} / {theirs}")));
        };
        verdict.host_seq = mine["last_seq"].as_u64().unwrap_or(verdict.host_seq);
        // The host keeps nothing at or before its anchor: compare from there (once).
        if let Some(anchor) = mine["anchor"]["seq"].as_u64().filter(|a| *a > since) {
            verdict.anchor_seq = Some(anchor);
            since = anchor;
            continue;
        }
        if let Some(last) = their_records.last().and_then(|r| r["seq"].as_u64()) {
            verdict.published_seq = last;
        }
        // The host's page may end early (its answers are bounded in bytes, to fit in a
        // NATS message) while its log goes on: compare only as far as it went.
        let mine_last = mine_records.last().and_then(|r| r["seq"].as_u64());
        let their_records: &[Value] = match mine_last {
            Some(m) if m < verdict.host_seq => {
                let upto = their_records
                    .iter()
                    .take_while(|r| r["seq"].as_u64().is_some_and(|s| s <= m))
                    .count();
                &their_records[..upto]
            }
            _ => their_records,
        };
        let (equal, difference) = compare(mine_records, their_records);
        verdict.compared += equal;
        if let Some(d) = difference {
            verdict.result = match d.host {
                None => Finding::Truncated,
                Some(_) => Finding::Differs,
            };
            verdict.first_difference = Some(d);
            return Ok(verdict);
        }
        // Both pages were equal as far as the shorter went: go on after it, until the
        // published side has no more.
        match their_records.last().and_then(|r| r["seq"].as_u64()) {
            Some(last) if equal > 0 => since = last,
            _ => return Ok(verdict),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot read the host's records")]
    Client(#[from] ClientError),
    #[error("an answer without records: {0}")]
    Answer(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(seq: u64, kind: &str) -> Value {
        json!({"seq": seq, "kind": kind, "prev_hash": format!("{seq:064}")})
    }

    fn published(seq: u64, kind: &str) -> Value {
        let mut r = record(seq, kind);
        r["host"] = "h1".into();
        r
    }

    #[test]
    fn equal_records_and_the_outbox_lag_are_no_difference() {
        let host = [record(1, "a"), record(2, "b"), record(3, "c")];
        let central = [published(1, "a"), published(2, "b")];
        assert_eq!(compare(&host, &central), (2, None));
    }

    #[test]
    fn a_rewritten_record_is_the_first_difference() {
        let host = [record(1, "a"), record(2, "forged"), record(3, "c")];
        let central = [published(1, "a"), published(2, "b"), published(3, "c")];
        let (equal, d) = compare(&host, &central);
        assert_eq!(equal, 1);
        let d = d.unwrap();
        assert_eq!(d.seq, 2);
        assert_eq!(d.host.unwrap()["kind"], "forged");
        assert_eq!(d.published.unwrap()["kind"], "b");
    }

    #[test]
    fn a_log_that_ends_before_what_was_published_is_truncated_there() {
        let host = [record(1, "a")];
        let central = [published(1, "a"), published(2, "b")];
        let (equal, d) = compare(&host, &central);
        assert_eq!(equal, 1);
        let d = d.unwrap();
        assert_eq!((d.seq, d.host.is_none()), (2, true));
    }
}

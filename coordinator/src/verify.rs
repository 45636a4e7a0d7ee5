//! `GET /v1/hosts/{host}/verify` (`capstan verify HOST`): the host's log as published
//! in `CAPSTAN_EVT` (the central copy, a second witness) against the log the host
//! holds now, record by record. A log rewritten, truncated or forked after
//! publication shows as the first seq where the two differ; records the host has not
//! published yet (its outbox's lag) are not a difference. A host that pruned its log (retention: the records up to its anchor
//! were exported to files and removed) is compared from its anchor on; the first kept
//! record's `prev_hash` ties the kept chain to the anchor's hash.
//!
//! Both sides are read a page at a time through a [`Pages`] source (the coordinator's
//! `GET /v1/hosts/{host}/verify` reads `CAPSTAN_EVT` and asks the agent's RPC `log`);
//! the comparison itself ([`compare`]) is pure.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;

/// What `capstan verify` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// Every published record is in the host's log, unchanged.
    Ok,
    /// A record differs: the host's log was rewritten or forked after publication.
    Differs,
    /// The host's log ends before what was published: records were removed.
    Truncated,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// One page of the host's own log (its RPC `log` answer).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostPage {
    /// Its records with seq > `since`, in order; fewer than asked when the page met
    /// its byte bound while the log goes on.
    pub records: Vec<Value>,
    /// The last seq of the host's log.
    pub last_seq: u64,
    /// The seq of the host's anchor (it pruned the records up to it), if any.
    pub anchor_seq: Option<u64>,
}

/// Where [`verify`] reads the two sides from, a page at a time.
pub trait Pages {
    type Error;
    /// The host's records published in `CAPSTAN_EVT` with seq > `since`, in order.
    fn published(
        &self,
        host: &str,
        since: u64,
    ) -> impl Future<Output = Result<Vec<Value>, Self::Error>> + Send;
    /// The host's own records with seq > `since`.
    fn held(
        &self,
        host: &str,
        since: u64,
    ) -> impl Future<Output = Result<HostPage, Self::Error>> + Send;
}

/// Reads both sides of `host` from `pages` and compares them.
pub async fn verify<P: Pages>(pages: &P, host: &str) -> Result<Verdict, P::Error> {
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
        let theirs = pages.published(host, since).await?;
        let mine = pages.held(host, since).await?;
        verdict.host_seq = verdict.host_seq.max(mine.last_seq);
        // The host keeps nothing at or before its anchor: compare from there (once).
        if let Some(anchor) = mine.anchor_seq.filter(|a| *a > since) {
            verdict.anchor_seq = Some(anchor);
            since = anchor;
            continue;
        }
        let seq = |r: &Value| r["seq"].as_u64();
        if let Some(last) = theirs.last().and_then(seq) {
            verdict.published_seq = last;
        }
        // The host's page may end early (its answers are bounded in bytes, to fit in a
        // NATS message) while its log goes on: compare only as far as it went.
        let their_records: &[Value] = match mine.records.last().and_then(seq) {
            Some(m) if m < mine.last_seq => {
                let upto = theirs
                    .iter()
                    .take_while(|r| seq(r).is_some_and(|s| s <= m))
                    .count();
                &theirs[..upto]
            }
            _ => &theirs,
        };
        let (equal, difference) = compare(&mine.records, their_records);
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
        match their_records.last().and_then(seq) {
            Some(last) if equal > 0 => since = last,
            _ => return Ok(verdict),
        }
    }
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

    /// Both sides in memory: the host's log pages at most `host_page` records (its
    /// byte bound), the published side `published_page`.
    struct Sides {
        host: Vec<Value>,
        anchor_seq: Option<u64>,
        published: Vec<Value>,
        host_page: usize,
        published_page: usize,
    }

    impl Pages for Sides {
        type Error = std::convert::Infallible;
        async fn published(&self, _: &str, since: u64) -> Result<Vec<Value>, Self::Error> {
            let after = self
                .published
                .iter()
                .filter(|r| r["seq"].as_u64() > Some(since));
            Ok(after.take(self.published_page).cloned().collect())
        }
        async fn held(&self, _: &str, since: u64) -> Result<HostPage, Self::Error> {
            let after = self.host.iter().filter(|r| r["seq"].as_u64() > Some(since));
            Ok(HostPage {
                records: after.take(self.host_page).cloned().collect(),
                last_seq: self.host.last().map_or(0, |r| r["seq"].as_u64().unwrap()),
                anchor_seq: self.anchor_seq,
            })
        }
    }

    fn sides(
        host: std::ops::RangeInclusive<u64>,
        published: std::ops::RangeInclusive<u64>,
    ) -> Sides {
        Sides {
            host: host.map(|s| record(s, "a")).collect(),
            anchor_seq: None,
            published: published.map(|s| self::published(s, "a")).collect(),
            host_page: 1000,
            published_page: 1000,
        }
    }

    fn run(sides: &Sides) -> Verdict {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(verify(sides, "h1")).unwrap()
    }

    #[test]
    fn pages_cut_short_by_the_hosts_byte_bound_are_compared_to_the_end() {
        // Given a host whose log pages 7 records at a time, published 10 at a time
        let mut given = sides(1..=25, 1..=25);
        (given.host_page, given.published_page) = (7, 10);
        // When it is verified
        let v = run(&given);
        // Then every record is compared, none twice
        assert_eq!((v.result, v.compared), (Finding::Ok, 25));
        assert_eq!((v.host_seq, v.published_seq), (25, 25));
    }

    #[test]
    fn a_host_that_pruned_is_compared_after_its_anchor() {
        // Given a host that pruned records 1..=10 (published before)
        let mut given = sides(11..=20, 1..=20);
        given.anchor_seq = Some(10);
        // When it is verified
        let v = run(&given);
        // Then the pruned records are no truncation
        assert_eq!(
            (v.result, v.compared, v.anchor_seq),
            (Finding::Ok, 10, Some(10))
        );
    }

    #[test]
    fn a_truncation_past_the_first_page_is_found_at_its_seq() {
        // Given a host whose log ends at 1500 while 1600 were published
        let given = sides(1..=1500, 1..=1600);
        // When it is verified
        let v = run(&given);
        // Then it is truncated at 1501, after 1500 equal records
        assert_eq!((v.result, v.compared), (Finding::Truncated, 1500));
        assert_eq!(v.first_difference.map(|d| d.seq), Some(1501));
    }

    #[test]
    fn records_not_yet_published_are_no_difference() {
        let v = run(&sides(1..=30, 1..=12));
        assert_eq!(
            (v.result, v.compared, v.host_seq, v.published_seq),
            (Finding::Ok, 12, 30, 12)
        );
    }

    /// `Verdict` in `openapi.json` (what `GET /v1/hosts/{host}/verify` answers) lists
    /// every field a verdict carries, each required, and every finding.
    #[test]
    fn the_verdict_is_what_the_openapi_description_says() {
        let spec: Value = serde_json::from_str(include_str!("openapi.json")).unwrap();
        let schema = &spec["components"]["schemas"]["Verdict"];
        let keys = |v: &Value| {
            let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            keys.sort();
            keys
        };
        let strings = |v: &Value| {
            let mut all: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect();
            all.sort();
            all
        };
        let verdict = serde_json::to_value(run(&sides(1..=1, 1..=2))).unwrap();
        assert_eq!(keys(&verdict), keys(&schema["properties"]));
        assert_eq!(keys(&verdict), strings(&schema["required"]));
        let difference = &schema["properties"]["first_difference"]["oneOf"][1];
        assert_eq!(
            keys(&verdict["first_difference"]),
            keys(&difference["properties"])
        );
        assert_eq!(
            keys(&verdict["first_difference"]),
            strings(&difference["required"])
        );
        let findings = [Finding::Ok, Finding::Differs, Finding::Truncated]
            .map(|f| serde_json::to_value(f).unwrap());
        assert_eq!(
            strings(&Value::from(findings.to_vec())),
            strings(&schema["properties"]["result"]["enum"])
        );
    }
}

//! `capstan log HOST [--follow]`: a host's records from the fleet's copy, in the table
//! `capstan-agent log` prints (`capstan_common::audit_table`).

use capstan_common::audit_table;
use capstan_coordinator::answers::EventsAnswer;
use capstan_coordinator::client::Client;
use serde::Deserialize as _;
use serde_json::Value;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

/// `capstan log HOST [--since SEQ] [--follow]`: the host's records from `CAPSTAN_EVT`,
/// page by page; following, new ones as they arrive, until interrupted.
pub(crate) async fn log(
    client: &Client,
    json: bool,
    host: &str,
    mut since: u64,
    follow: bool,
) -> anyhow::Result<ExitCode> {
    // Following, an outage of the coordinator (or of its NATS) is waited out:
    // said once on stderr, then retried every second from where it was.
    let mut outage = false;
    // The header once, above the first page read (as `capstan-agent log` prints it).
    let mut header = !json;
    loop {
        let page = match client
            .get(&format!("/v1/hosts/{host}/events?since={since}"))
            .await
        {
            Err(e) if follow && e.transient() => {
                if !outage {
                    eprintln!(
                        "capstan: {:#}; retrying every second",
                        anyhow::Error::new(e)
                    );
                    outage = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            page => page?,
        };
        if std::mem::take(&mut outage) {
            eprintln!("capstan: following again from seq {since}");
        }
        let events = expect_events(&page)?;
        let mut out = std::io::stdout().lock();
        if std::mem::take(&mut header) {
            writeln!(out, "{}", audit_table::header())?;
        }
        for e in &events {
            if json {
                writeln!(out, "{e}")?;
            } else {
                writeln!(out, "{}", audit_table::row(e))?;
            }
            since = since.max(e["seq"].as_u64().unwrap_or(since));
        }
        out.flush()?;
        // Page after page until one is short of a full page (the API fills every page
        // it can): the whole log, never its first page as if it were all.
        let short = events.len() < capstan_coordinator::api::MAX_EVENTS;
        if short && !follow {
            return Ok(ExitCode::SUCCESS);
        }
        if events.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// An answer that is not what was asked for is an error, never printed as the truth
/// (an empty log, an empty intent).
pub(crate) fn expect_events(page: &Value) -> anyhow::Result<Vec<Value>> {
    match EventsAnswer::deserialize(page) {
        Ok(answer) => Ok(answer.events),
        Err(e) => anyhow::bail!("the coordinator's answer has no events ({e}): {page}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_page_without_events_is_an_error_not_an_empty_log() {
        let err = expect_events(&json!({})).unwrap_err().to_string();
        assert!(err.contains("has no events"), "{err}");
        let err = expect_events(&json!({"host": "h1", "events": {}})).unwrap_err();
        assert!(err.to_string().contains("has no events"), "{err}");
        assert!(expect_events(&json!({"host": "h1", "events": []}))
            .unwrap()
            .is_empty());
    }
}

//! Every host's latest beat in one pass over the hosts bucket: an ordered consumer
//! that delivers the last message of each subject, with its body and headers (the
//! signature). A key listing followed by a direct get a host cost a round trip a
//! host: 5.9 s for 1,000 hosts on a three-node cluster (`capstan-bench --only
//! fleet`). A read that cannot complete is an error, never a shorter list.

use super::FleetError;
use async_nats::jetstream::consumer::{push, DeliverPolicy, ReplayPolicy};
use async_nats::jetstream::stream;
use futures::StreamExt as _;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long the read may wait for its next message before it fails.
const STALL: Duration = Duration::from_secs(10);

/// The latest entry of every key of the hosts bucket (its stream `stream`, its
/// subject prefix `prefix`, e.g. `$KV.capstan_hosts.`), deleted and purged keys
/// left out: `(key, message)`, by key. A beat put while the read goes on is
/// delivered too (the consumer reads on to the stream's end): it replaces the key's
/// earlier one, so each key is listed once.
pub(super) async fn latest(
    client: &async_nats::Client,
    stream: &stream::Stream,
    prefix: &str,
) -> Result<Vec<(String, async_nats::Message)>, FleetError> {
    let consumer = stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            description: Some("capstan: the latest beat of every host".into()),
            filter_subject: format!("{prefix}>"),
            deliver_policy: DeliverPolicy::LastPerSubject,
            replay_policy: ReplayPolicy::Instant,
            ..Default::default()
        })
        .await
        .map_err(FleetError::nats)?;
    let expected = consumer.cached_info().num_pending;
    let mut out = BTreeMap::new();
    if expected == 0 {
        return Ok(Vec::new());
    }
    let mut messages = consumer.messages().await.map_err(FleetError::nats)?;
    loop {
        let message = match tokio::time::timeout(STALL, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(FleetError::nats(e)),
            Ok(None) => {
                return Err(FleetError::Nats(format!(
                    "the read of the hosts bucket ended after {} of {expected} hosts",
                    out.len()
                )))
            }
            Err(_) => {
                return Err(FleetError::Nats(format!(
                    "the read of the hosts bucket stalled after {} of {expected} hosts",
                    out.len()
                )))
            }
        };
        let pending = message.info().map_err(FleetError::nats)?.pending;
        let message = message.message;
        keep_latest(&mut out, prefix, message);
        if pending == 0 {
            return Ok(out.into_iter().collect());
        }
    }
}

/// Takes `message` as its key's latest: a beat replaces an earlier one, a delete or
/// purge marker removes the key.
fn keep_latest(
    latest: &mut BTreeMap<String, async_nats::Message>,
    prefix: &str,
    message: async_nats::Message,
) {
    let Some(key) = message.subject.as_str().strip_prefix(prefix) else {
        return;
    };
    if removed(&message) {
        latest.remove(key);
    } else {
        latest.insert(key.to_string(), message);
    }
}

/// A delete or purge marker (`KV-Operation: DEL|PURGE`), not an entry.
fn removed(message: &async_nats::Message) -> bool {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get("KV-Operation"))
        .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(subject: &str, payload: &str, op: Option<&str>) -> async_nats::Message {
        let headers = op.map(|op| {
            let mut h = async_nats::HeaderMap::new();
            h.insert("KV-Operation", op);
            h
        });
        async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: payload.to_string().into(),
            headers,
            status: None,
            description: None,
            length: payload.len(),
        }
    }

    /// Given beats read on past the read's start, when a host's beat comes twice,
    /// then it is listed once, with the later beat; a deleted host is not listed.
    #[test]
    fn each_key_keeps_its_latest_entry_and_a_deleted_key_none() {
        let prefix = "$KV.capstan_hosts.";
        let mut latest = BTreeMap::new();
        for (subject, payload, op) in [
            ("$KV.capstan_hosts.h1", "first", None),
            ("$KV.capstan_hosts.h2", "only", None),
            ("$KV.capstan_hosts.h3", "gone", None),
            ("$KV.capstan_hosts.h1", "second", None),
            ("$KV.capstan_hosts.h3", "", Some("DEL")),
            ("$KV.other.h4", "not a host", None),
        ] {
            keep_latest(&mut latest, prefix, message(subject, payload, op));
        }
        let listed: Vec<(&str, &[u8])> = latest
            .iter()
            .map(|(k, m)| (k.as_str(), m.payload.as_ref()))
            .collect();
        assert_eq!(listed, [("h1", &b"second"[..]), ("h2", &b"only"[..])]);
    }
}

//! The fleet's hosts: their registered keys, asking their agents (RPC), and their
//! records in `CAPSTAN_EVT` (their beats: [`super::beats`]).

use super::{check_host, keys, position, read, read_subject, Fleet, FleetError};
use capstan_common::answers::Verb;
use capstan_common::nats_layout;
use capstan_common::published::{self, Publication};
use serde_json::Value;
use std::time::Duration;

/// What [`Fleet::submit`] does with a command for a host it does not know
/// ([`Fleet::known_host`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownHost {
    /// Refuse it: [`FleetError::UnknownHost`] (404 `host_not_found`).
    #[default]
    Refuse,
    /// Queue it all the same (`?unknown_host=queue`): a host being provisioned, whose
    /// key is registered later, takes it from `CAPSTAN_COMMANDS` once its agent runs.
    Queue,
}

impl Fleet {
    /// Checks that a command for `host` can reach it: on per-host accounts the host
    /// has an account (else [`FleetError::NoHostAccount`], whatever `unknown` says: it
    /// could never take the command), and, unless `unknown` is
    /// [`UnknownHost::Queue`], the host is known: it has a registered key or, with
    /// `allow_unregistered_hosts`, this coordinator has heard its beat (else
    /// [`FleetError::UnknownHost`]).
    pub(super) async fn known_host(
        &self,
        host: &str,
        unknown: UnknownHost,
    ) -> Result<(), FleetError> {
        if self.trust.host_accounts {
            self.stores.of(host).await?;
        }
        if unknown == UnknownHost::Queue {
            return Ok(());
        }
        let layout = self.layout().await?;
        if layout.keys.registered(host).await? {
            return Ok(());
        }
        if self.trust.allow_unregistered && self.liveness.heard(host) {
            return Ok(());
        }
        Err(FleetError::UnknownHost(host.to_string()))
    }

    /// Registers `public_key` (64 hex digits) for `host` and, on per-host accounts,
    /// makes the host's stream and bucket if they are not there yet.
    pub async fn register(&self, host: &str, public_key: &str) -> Result<keys::Entry, FleetError> {
        check_host(host)?;
        let layout = self.layout().await?;
        if self.trust.host_accounts {
            self.stores.of(host).await?;
        }
        layout.keys.add(host, public_key).await
    }

    /// The keys registered for `host`.
    pub async fn host_keys(&self, host: &str) -> Result<keys::Entry, FleetError> {
        check_host(host)?;
        let layout = self.layout().await?;
        layout
            .keys
            .entry(host)
            .await?
            .filter(|e| !e.public_keys.is_empty())
            .ok_or_else(|| FleetError::KeyNotFound(host.to_string()))
    }

    /// Removes one of `host`'s keys.
    pub async fn unregister(
        &self,
        host: &str,
        public_key: &str,
    ) -> Result<keys::Entry, FleetError> {
        check_host(host)?;
        let layout = self.layout().await?;
        layout.keys.remove(host, public_key).await
    }

    /// Asks the host's agent (`rpc.<host>.<verb>`): its answer, an error answer too
    /// (read it with [`capstan_common::answers::read_answer`]).
    pub async fn rpc(&self, host: &str, verb: Verb, body: Value) -> Result<Value, FleetError> {
        let verb = verb.as_str();
        check_host(host)?;
        if !self.connected() {
            return Err(FleetError::NatsUnavailable);
        }
        // A fresh nonce a request: the answer's signature covers it, so an answer
        // signed for another request (replayed by whoever holds the host's NATS
        // credentials) is refused.
        let nonce = request_nonce()?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(published::NONCE_HEADER, nonce.as_str());
        let request = self.reach.request_with_headers(
            nats_layout::rpc_subject(host, verb),
            headers,
            body.to_string().into(),
        );
        match tokio::time::timeout(Duration::from_secs(5), request).await {
            Err(_) => Err(FleetError::HostTimeout(host.into())),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                Err(FleetError::HostUnreachable(host.into()))
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::TimedOut => {
                Err(FleetError::HostTimeout(host.into()))
            }
            Ok(Err(e)) => Err(FleetError::nats(e)),
            Ok(Ok(reply)) => {
                let subject = nats_layout::rpc_subject(host, verb);
                self.check(
                    host,
                    Publication::Answer {
                        subject: &subject,
                        nonce: Some(&nonce),
                    },
                    &reply.payload,
                    reply.headers.as_ref(),
                )
                .await?;
                serde_json::from_slice(&reply.payload).map_err(FleetError::nats)
            }
        }
    }

    /// The host's records with seq > `since`, from `CAPSTAN_EVT` (the central copy:
    /// available when the host is not), each signed by the host, each once (a replay
    /// is refused: [`read::read_all`]). Where they begin in the stream is found by
    /// bisection ([`position::start_of`]), not by reading what comes before; when what
    /// that read finds is not the records right after `since` (a replay misled the
    /// bisection, or the stream no longer holds them), they are read again from the
    /// stream's start.
    pub async fn events(
        &self,
        host: &str,
        since: u64,
        limit: usize,
    ) -> Result<Vec<Value>, FleetError> {
        check_host(host)?;
        let storage = self.stores.of(host).await?;
        let subject = nats_layout::evt_subject(host);
        let from = position::start_of(&storage.evt, &subject, since).await?;
        let bounds = read::Bounds {
            records: limit,
            bytes: None,
        };
        let check = self.record_check(host).await?;
        let read = |from| {
            read_subject(
                &storage.evt,
                &subject,
                from,
                |e| e["seq"].as_u64().is_some_and(|s| s > since),
                |_| false,
                bounds,
                &check,
            )
        };
        let (events, _) = read(from).await?;
        if from <= 1 || position::whole_after(since, &events) && !events.is_empty() {
            return Ok(events);
        }
        if events.is_empty() {
            let last = position::last_seq(&storage.evt, &subject).await?;
            if last.is_none_or(|last| last <= since) {
                return Ok(events);
            }
        }
        tracing::warn!(
            host,
            since,
            from,
            "the host's records after `since` do not begin where the bisection found (a replayed record, or records aged out): reading from the stream's start"
        );
        Ok(read(1).await?.0)
    }
}

/// A fresh RPC nonce: 16 random bytes in hex ([`published::nonce_of`]'s form).
fn request_nonce() -> Result<String, FleetError> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).map_err(|e| FleetError::Nats(e.to_string()))?;
    Ok(capstan_common::signing::to_hex(&bytes))
}

//! The coordinator's HTTP API in process, over a real nats-server
//! (`capstan_testsupport`), for the integration tests of this crate.

#![allow(dead_code)] // each test binary uses its own part

use capstan_common::nats::Retention;
use capstan_common::published::Publication;
use capstan_common::signing::Signer;
use capstan_coordinator::api::{self, AppState};
use capstan_coordinator::auth::{self, Role, Tokens};
use capstan_coordinator::fleet::liveness::Pacing;
use capstan_coordinator::fleet::{Fleet, Trust};
use capstan_coordinator::guard::Limits;
use capstan_coordinator::metrics::Metrics;
use capstan_testsupport::NatsServer;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// A coordinator API on a free loopback port.
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    pub nats: NatsServer,
    /// What its handlers share: its limits and metrics, for tests to look at.
    pub state: Arc<AppState>,
}

/// An API with the default limits and metrics.
pub async fn api(tokens: Option<Tokens>) -> Api {
    api_with(tokens, Limits::default(), Metrics::default()).await
}

pub async fn api_with(tokens: Option<Tokens>, limits: Limits, metrics: Metrics) -> Api {
    let nats = NatsServer::start(&[]);
    let client = async_nats::connect(&nats.url).await.expect("connect");
    let fleet = Fleet::new(
        client,
        None,
        Signer::generate().expect("key"),
        Pacing::default(),
        Retention::default(),
        Trust::default(),
    );
    let state = Arc::new(AppState {
        fleet,
        metrics,
        tokens,
        limits,
    });
    tokio::spawn({
        let state = Arc::clone(&state);
        async move { state.fleet.serve_beats().await }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let router = api::router(Arc::clone(&state));
    tokio::spawn(async move { axum::serve(listener, router).await });
    Api {
        base,
        // Every request bounded: a stuck handler fails the test instead of hanging it.
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("HTTP client"),
        nats,
        state,
    }
}

impl Api {
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        content_type: Option<&str>,
        body: &str,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .body(body.to_string());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, token, None, "").await
    }

    pub async fn post(&self, token: Option<&str>, command: &Value) -> (u16, Value) {
        let body = command.to_string();
        let json = Some("application/json");
        self.send(reqwest::Method::POST, "/v1/commands", token, json, &body)
            .await
    }
}

pub fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}

/// A submit and a read token, and the tokens they load into.
pub fn two_tokens() -> (String, String, Tokens) {
    let (submit, submit_line) = auth::generate(Role::Submit, Some("ops")).expect("token");
    let (read, read_line) = auth::generate(Role::Read, None).expect("token");
    let tokens = Tokens::parse(
        std::path::Path::new("tokens"),
        &format!("{submit_line}\n{read_line}\n"),
    )
    .expect("tokens");
    (submit, read, tokens)
}

pub fn ns(id: &str, host: &str, namespace: &str) -> Value {
    json!({"id": id, "host": host, "op": "ensure_namespace", "namespace": namespace})
}

impl Api {
    /// Sends a fresh heartbeat of `host`, signed by its registered key (`healthy:
    /// false` says its log failed a flush), and waits until the coordinator has taken
    /// it.
    pub async fn beat(&self, host: &str, healthy: bool) {
        let key = registered(self, host).await;
        let body = beat_body(host, healthy);
        self.send_beat(host, &key, &body).await;
        let at: capstan_common::answers::HostBeat = serde_json::from_slice(&body).expect("beat");
        self.heard(host, at.at).await;
    }

    /// Publishes `body` as `host`'s beat signed by `key`, and waits until NATS has it.
    pub async fn send_beat(&self, host: &str, key: &Signer, body: &[u8]) {
        let client = async_nats::connect(&self.nats.url).await.expect("connect");
        client
            .publish_with_headers(
                capstan_common::nats_layout::beat_subject(host),
                signed(key, Publication::Beat, body),
                body.to_vec().into(),
            )
            .await
            .expect("publish");
        client.flush().await.expect("flush");
    }

    /// Waits (up to 10 s) until the coordinator lists `host` with its beat of `at`.
    pub async fn heard(&self, host: &str, at: chrono::DateTime<chrono::Utc>) {
        for _ in 0..1000 {
            let hosts = self.state.fleet.hosts().await.expect("hosts");
            if hosts
                .iter()
                .any(|h| h.host == host && h.beat.as_ref().is_some_and(|b| b.at == at))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the coordinator did not take {host}'s beat of {at}");
    }
}

/// A fresh heartbeat of `host`, as its agent sends it (`healthy: false` says its log
/// failed a flush).
pub fn beat_body(host: &str, healthy: bool) -> Vec<u8> {
    let beat = capstan_common::answers::HostBeat {
        host: host.into(),
        version: "test".into(),
        drivers: vec!["sim".into()],
        capabilities: Value::Null,
        last_seq: 1,
        healthy,
        degraded: None,
        log_failed: (!healthy).then(|| "flush failed".into()),
        outbox_alarm: None,
        figures: None,
        at: chrono::Utc::now(),
    };
    serde_json::to_vec(&beat).expect("beat")
}

/// Publishes `body` on `subject` as `what`, signed by `key`, and waits for its ack.
pub async fn publish_signed(
    js: &async_nats::jetstream::Context,
    subject: String,
    key: &Signer,
    what: Publication<'_>,
    body: Vec<u8>,
) {
    js.publish_with_headers(subject, signed(key, what, &body), body.into())
        .await
        .expect("publish")
        .await
        .expect("stored");
}

/// `host`'s key (the same for a name every time), registered through the API: what
/// the coordinator checks the host's publications against, and what makes a command
/// for the host taken rather than refused `host_not_found`.
pub async fn registered(api: &Api, host: &str) -> Signer {
    registered_as(api, host, None).await
}

/// [`registered`] with `token` (an API with a tokens file).
pub async fn registered_as(api: &Api, host: &str, token: Option<&str>) -> Signer {
    use sha2::Digest as _;
    let seed = capstan_common::signing::to_hex(&sha2::Sha256::digest(host.as_bytes()));
    let key = Signer::from_hex(&seed).expect("key");
    let body = json!({"public_key": key.public_hex()}).to_string();
    let (status, answer) = api
        .send(
            reqwest::Method::PUT,
            &format!("/v1/hosts/{host}/keys"),
            token,
            Some("application/json"),
            &body,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    key
}

/// `Capstan-Sig` of `payload` as `what`, by `key` (a record or result as a batch of
/// one, with its `Capstan-Proof`).
pub fn signed(key: &Signer, what: Publication<'_>, payload: &[u8]) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    if what.batched() {
        let batch = key.sign_batch(what, &[payload]);
        headers.insert(capstan_common::published::HEADER, batch.sig.as_str());
        headers.insert(
            capstan_common::published::PROOF_HEADER,
            batch.proofs[0].as_str(),
        );
    } else {
        headers.insert(
            capstan_common::published::HEADER,
            key.sign_publication(what, payload).as_str(),
        );
    }
    headers
}

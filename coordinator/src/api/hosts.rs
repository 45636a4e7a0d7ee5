//! The `/v1/hosts` handlers: the registry, what a host's agent answers (intent,
//! status, its log), its published records, their verification, and its keys.

use super::{ok, permit, require_json, ApiCode, ApiError, ApiResult, Shared, MAX_EVENTS};
use crate::answers::{EventsAnswer, HostsAnswer};
use crate::fleet::Fleet;
use crate::guard::Bound;
use crate::verify;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use capstan_common::answers::{
    read_answer, AnswerError, ErrorBody, IntentAnswer, LogAnswer, LogRequest, StatusAnswer, Verb,
};
use serde_json::{json, Value};
use std::collections::HashMap;

pub(super) async fn hosts(State(state): Shared) -> ApiResult {
    let hosts = state.fleet.hosts().await?;
    let pace = state.fleet.pace();
    let answer = HostsAnswer {
        hosts,
        beat_secs: pace.beat_secs,
        stale_after_secs: pace.stale_after.as_secs(),
    };
    ok(StatusCode::OK, answer)
}

pub(super) async fn intent(State(state): Shared, Path(host): Path<String>) -> ApiResult {
    let (_, answer) =
        ask_host::<IntentAnswer>(&state.fleet, &host, Verb::Intent, json!({})).await?;
    ok(StatusCode::OK, answer)
}

pub(super) async fn status(State(state): Shared, Path(host): Path<String>) -> ApiResult {
    let (_, answer) =
        ask_host::<StatusAnswer>(&state.fleet, &host, Verb::Status, json!({})).await?;
    ok(StatusCode::OK, answer)
}

/// `since` and `limit` of a records query: `since` 0 by default, `limit` at most (and
/// by default) [`MAX_EVENTS`].
fn page(query: &HashMap<String, String>) -> Result<(u64, usize), ApiError> {
    let number = |name: &str, default: u64| -> Result<u64, ApiError> {
        query.get(name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    ApiCode::InvalidRequest,
                    format!("`{name}` is a non-negative integer"),
                )
            })
        })
    };
    let since = number("since", 0)?;
    let limit = usize::try_from(number("limit", MAX_EVENTS as u64)?)
        .unwrap_or(MAX_EVENTS)
        .min(MAX_EVENTS);
    Ok((since, limit))
}

pub(super) async fn events(
    State(state): Shared,
    Path(host): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let (since, limit) = page(&query)?;
    let _read = permit(&state, Bound::StreamReads)?;
    let events = state.fleet.events(&host, since, limit).await?;
    ok(StatusCode::OK, EventsAnswer { host, events })
}

/// The host's own copy of its records (the agent's RPC `log`): what `capstan verify`
/// compares with the published one.
pub(super) async fn host_log(
    State(state): Shared,
    Path(host): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let (since, limit) = page(&query)?;
    let (_, answer) = read_host_log(&state.fleet, &host, since, limit).await?;
    ok(StatusCode::OK, answer)
}

/// An agent's error code ([`AgentCode`]) as this API answers it: the codes it shares
/// with the agent; `None` for one it does not pass on (`unknown_verb`: this API asks
/// only verbs agents know) or does not know (a newer agent's).
pub(super) fn agent_code(error: &ErrorBody) -> Option<ApiCode> {
    ApiCode::parse(error.agent_code()?.as_str())
}

/// The host's answer to `verb`, read as the `A` that verb gives, and as it came (what
/// this API passes on: a newer agent's fields kept); an error answer, or one that is
/// not an `A`, as this API's error.
async fn ask_host<A: serde::de::DeserializeOwned>(
    fleet: &Fleet,
    host: &str,
    verb: Verb,
    body: Value,
) -> Result<(A, Value), ApiError> {
    let answer = fleet.rpc(host, verb, body).await?;
    match read_answer::<A>(&answer) {
        Ok(read) => Ok((read, answer)),
        // The agent could not read its own log (`log_unreadable`): its fault, not ours.
        // A code this API does not know is answered as `host_error`, naming it.
        Err(AnswerError::Refused(error)) => Err(match agent_code(&error) {
            Some(known) => ApiError::new(StatusCode::BAD_GATEWAY, known, error.message),
            None => ApiError::new(
                StatusCode::BAD_GATEWAY,
                ApiCode::HostError,
                error.to_string(),
            ),
        }),
        Err(AnswerError::Malformed(e)) => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            ApiCode::HostError,
            format!("the host's `{verb}` answer is not one: {e}"),
        )),
    }
}

/// The agent's RPC `log` answer, its error as this API's.
async fn read_host_log(
    fleet: &Fleet,
    host: &str,
    since: u64,
    limit: usize,
) -> Result<(LogAnswer, Value), ApiError> {
    let request = LogRequest {
        since,
        limit: Some(limit),
        ..LogRequest::default()
    };
    let body = serde_json::to_value(request).expect("requests serialise");
    ask_host(fleet, host, Verb::Log, body).await
}

/// The host's log against its published copy ([`verify`]), read under one stream-read
/// permit.
pub(super) async fn verify_host(State(state): Shared, Path(host): Path<String>) -> ApiResult {
    let _read = permit(&state, Bound::StreamReads)?;
    let verdict = verify::verify(&FleetPages(&state.fleet), &host).await?;
    ok(StatusCode::OK, verdict)
}

/// [`verify::Pages`] read through NATS: `CAPSTAN_EVT` and the agent's RPC `log`.
struct FleetPages<'a>(&'a Fleet);

impl verify::Pages for FleetPages<'_> {
    type Error = ApiError;

    async fn published(&self, host: &str, since: u64) -> Result<Vec<Value>, ApiError> {
        Ok(self.0.events(host, since, MAX_EVENTS).await?)
    }

    async fn held(&self, host: &str, since: u64) -> Result<verify::HostPage, ApiError> {
        let (page, _) = read_host_log(self.0, host, since, MAX_EVENTS).await?;
        Ok(verify::HostPage {
            records: page.records,
            last_seq: page.last_seq,
            anchor_seq: page.anchor.map(|a| a.seq),
        })
    }
}

/// The body of `PUT /v1/hosts/{host}/keys`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Registration {
    public_key: String,
}

/// Registers a public key for the host (what its publications are checked against).
pub(super) async fn register(
    State(state): Shared,
    Path(host): Path<String>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> ApiResult {
    require_json(&headers)?;
    let registration: Registration = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ApiCode::InvalidRequest,
            format!("the body is `{{\"public_key\": \"<64 hex digits>\"}}`: {e}"),
        )
    })?;
    let entry = state
        .fleet
        .register(&host, &registration.public_key)
        .await?;
    tracing::info!(%host, key = %registration.public_key.trim(), "host key registered");
    ok(StatusCode::OK, entry)
}

pub(super) async fn host_keys(State(state): Shared, Path(host): Path<String>) -> ApiResult {
    ok(StatusCode::OK, state.fleet.host_keys(&host).await?)
}

pub(super) async fn unregister(
    State(state): Shared,
    Path((host, key)): Path<(String, String)>,
) -> ApiResult {
    let entry = state.fleet.unregister(&host, &key).await?;
    tracing::info!(%host, %key, "host key removed");
    ok(StatusCode::OK, entry)
}

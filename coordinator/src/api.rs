//! The HTTP/JSON API (axum). Every answer comes from NATS through [`Fleet`]; errors
//! are `{"error":{"code","message"}}` with a status that says whose fault it is.
//!
//! Every `/v1` request needs `Authorization: Bearer <token>` when the coordinator has
//! a tokens file ([`crate::auth`]): `GET` a `read` or `submit` token, `POST` a
//! `submit` token. `/healthz` and `/metrics` stay open (counts only, no host's data).
//! A `POST` body must be `application/json`, which a web page cannot send to another
//! origin without a CORS preflight (that this API never answers). Without a tokens
//! file, every request must name a loopback `Host` (403 `forbidden_host`): a page on
//! another site, its name rebound to 127.0.0.1, sends its own. Waits and reads through
//! a consumer of their own are bounded ([`crate::guard::Limits`]; 503 `busy`).

use crate::answers::{Accepted, CancelAnswer, EventsAnswer, HostsAnswer};
use crate::auth::{Role, Tokens};
use crate::fleet::{Fleet, FleetError};
use crate::guard::{self, Bound, Limits};
use crate::metrics::{FleetGauges, Metrics};
use crate::verify;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use capstan_common::answers::{
    read_answer, AnswerError, ErrorBody, ErrorReply, IntentAnswer, LogAnswer, LogRequest,
    StatusAnswer, Verb,
};
use capstan_common::{signing, Command, ErrorCode, MAX_COMMAND_BYTES};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest `wait` allowed.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// The most events one `events` answer carries.
pub const MAX_EVENTS: usize = 1000;

pub struct AppState {
    pub fleet: Fleet,
    pub metrics: Metrics,
    /// `None`: no authentication (a loopback development setup only; the config
    /// refuses anything else), and then only loopback `Host`s.
    pub tokens: Option<Tokens>,
    pub limits: Limits,
}

/// How long a client refused `busy` is told to wait (`Retry-After`, seconds).
pub const BUSY_RETRY_AFTER_SECS: u32 = 1;

type Shared = State<Arc<AppState>>;

/// The codes of this API's own errors (`error.code`); the rest are the protocol's
/// ([`capstan_common::ErrorCode`], a command the fleet refused). The description's
/// `ApiError` schema lists both (a test holds it to them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(test, derive(serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum ApiCode {
    /// A query parameter or body field is malformed (not a protocol command's fault).
    InvalidRequest,
    /// The body is not JSON.
    InvalidJson,
    /// The body, or the command as it would be signed, is over `MAX_COMMAND_BYTES`.
    TooLarge,
    /// A body that is not `application/json`.
    UnsupportedMediaType,
    /// No token, or one the tokens file does not hold.
    Unauthorized,
    /// The token's role does not cover the method.
    Forbidden,
    /// Without a tokens file, a `Host` that is not loopback.
    ForbiddenHost,
    /// No such endpoint.
    NotFound,
    /// No command under that id.
    CommandNotFound,
    /// The host has no account on the NATS server.
    HostNotFound,
    /// The host has no such registered key.
    KeyNotFound,
    /// The id was used for a command with different content.
    IdConflict,
    /// Every permit of a bound is taken (`Retry-After`).
    Busy,
    /// Not connected to NATS.
    NatsUnavailable,
    /// NATS answered with an error.
    NatsError,
    /// The host's agent does not answer (no responders).
    HostUnreachable,
    /// The host's agent did not answer in time.
    HostTimeout,
    /// What the host published is not signed by a key registered for it.
    Unverified,
    /// The host's result entry cannot be read.
    ResultUnreadable,
    /// The host's agent could not read its own log.
    LogUnreadable,
    /// The host's agent answered an error this API has no code of its own for, or an
    /// answer that is not what the verb gives.
    HostError,
}

impl ApiCode {
    /// Every code, in declaration order (kept complete by a test against the enum).
    pub const ALL: [ApiCode; 21] = [
        ApiCode::InvalidRequest,
        ApiCode::InvalidJson,
        ApiCode::TooLarge,
        ApiCode::UnsupportedMediaType,
        ApiCode::Unauthorized,
        ApiCode::Forbidden,
        ApiCode::ForbiddenHost,
        ApiCode::NotFound,
        ApiCode::CommandNotFound,
        ApiCode::HostNotFound,
        ApiCode::KeyNotFound,
        ApiCode::IdConflict,
        ApiCode::Busy,
        ApiCode::NatsUnavailable,
        ApiCode::NatsError,
        ApiCode::HostUnreachable,
        ApiCode::HostTimeout,
        ApiCode::Unverified,
        ApiCode::ResultUnreadable,
        ApiCode::LogUnreadable,
        ApiCode::HostError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiCode::InvalidRequest => "invalid_request",
            ApiCode::InvalidJson => "invalid_json",
            ApiCode::TooLarge => "too_large",
            ApiCode::UnsupportedMediaType => "unsupported_media_type",
            ApiCode::Unauthorized => "unauthorized",
            ApiCode::Forbidden => "forbidden",
            ApiCode::ForbiddenHost => "forbidden_host",
            ApiCode::NotFound => "not_found",
            ApiCode::CommandNotFound => "command_not_found",
            ApiCode::HostNotFound => "host_not_found",
            ApiCode::KeyNotFound => "key_not_found",
            ApiCode::IdConflict => "id_conflict",
            ApiCode::Busy => "busy",
            ApiCode::NatsUnavailable => "nats_unavailable",
            ApiCode::NatsError => "nats_error",
            ApiCode::HostUnreachable => "host_unreachable",
            ApiCode::HostTimeout => "host_timeout",
            ApiCode::Unverified => "unverified",
            ApiCode::ResultUnreadable => "result_unreadable",
            ApiCode::LogUnreadable => "log_unreadable",
            ApiCode::HostError => "host_error",
        }
    }

    /// The code spelt `code`, if it is one.
    fn parse(code: &str) -> Option<ApiCode> {
        ApiCode::ALL.into_iter().find(|c| c.as_str() == code)
    }
}

/// The code of an error answer: this API's own or the protocol's, and nothing else
/// (what the description's `ApiError` lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    Api(ApiCode),
    Protocol(ErrorCode),
}

impl Code {
    fn as_str(self) -> &'static str {
        match self {
            Code::Api(code) => code.as_str(),
            Code::Protocol(code) => code.as_str(),
        }
    }
}

/// An error answer.
pub struct ApiError {
    status: StatusCode,
    code: Code,
    message: String,
    /// `Retry-After` in seconds.
    retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, code: ApiCode, message: impl Into<String>) -> ApiError {
        ApiError::with_code(status, Code::Api(code), message)
    }

    /// An error with the protocol's code: a command the fleet refused.
    fn rejected(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError::with_code(status, Code::Protocol(code), message)
    }

    fn with_code(status: StatusCode, code: Code, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 503 `busy`: every permit of `bound` is taken.
    fn busy(bound: Bound) -> ApiError {
        let what = match bound {
            Bound::Waits => "waits",
            Bound::StreamReads => "reads of the event stream",
        };
        ApiError {
            retry_after: Some(BUSY_RETRY_AFTER_SECS),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ApiCode::Busy,
                format!(
                    "as many {what} as this coordinator allows (`{}`) are running; try again",
                    bound.key()
                ),
            )
        }
    }

    fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ApiCode::TooLarge, message)
    }
}

/// A permit of `bound` for the request's whole run, or 503 `busy`.
fn permit(state: &AppState, bound: Bound) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    state
        .limits
        .try_take(bound)
        .ok_or_else(|| ApiError::busy(bound))
}

impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> ApiError {
        let message = match &e {
            FleetError::BadCommand(r) => r.message.clone(),
            other => other.to_string(),
        };
        let (status, code) = match &e {
            FleetError::BadCommand(r) if r.code == ErrorCode::TooLarge => {
                return ApiError::rejected(StatusCode::PAYLOAD_TOO_LARGE, r.code, message);
            }
            FleetError::BadCommand(r) => {
                return ApiError::rejected(StatusCode::BAD_REQUEST, r.code, message);
            }
            FleetError::BadRequest(_) => (StatusCode::BAD_REQUEST, ApiCode::InvalidRequest),
            FleetError::CommandNotFound(_) => (StatusCode::NOT_FOUND, ApiCode::CommandNotFound),
            FleetError::IdConflict { .. } => (StatusCode::CONFLICT, ApiCode::IdConflict),
            FleetError::NatsUnavailable => {
                (StatusCode::SERVICE_UNAVAILABLE, ApiCode::NatsUnavailable)
            }
            FleetError::HostUnreachable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, ApiCode::HostUnreachable)
            }
            FleetError::HostTimeout(_) => (StatusCode::GATEWAY_TIMEOUT, ApiCode::HostTimeout),
            FleetError::NoHostAccount(_) => (StatusCode::NOT_FOUND, ApiCode::HostNotFound),
            FleetError::KeyNotFound(_) => (StatusCode::NOT_FOUND, ApiCode::KeyNotFound),
            FleetError::Unverified { .. } => (StatusCode::BAD_GATEWAY, ApiCode::Unverified),
            FleetError::Unreadable(_) => (StatusCode::BAD_GATEWAY, ApiCode::ResultUnreadable),
            FleetError::Nats(_) | FleetError::Setup(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, ApiCode::NatsError)
            }
        };
        if status.is_server_error() {
            tracing::warn!(error = %message, "request failed");
        }
        ApiError::new(status, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(ErrorReply::new(self.code.as_str(), self.message)),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        response
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(status: StatusCode, body: impl serde::Serialize) -> ApiResult {
    Ok((status, Json(body)).into_response())
}

pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/commands", post(submit))
        .route("/v1/commands/{id}", get(command))
        .route("/v1/commands/{id}/wait", get(wait))
        .route("/v1/commands/{id}/cancel", post(cancel))
        .route("/v1/hosts", get(hosts))
        .route("/v1/hosts/{host}/intent", get(intent))
        .route("/v1/hosts/{host}/status", get(status))
        .route("/v1/hosts/{host}/events", get(events))
        .route("/v1/hosts/{host}/log", get(host_log))
        .route("/v1/hosts/{host}/verify", get(verify_host))
        .route("/v1/hosts/{host}/keys", get(host_keys).put(register))
        .route("/v1/hosts/{host}/keys/{key}", delete(unregister))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            authorize,
        ));
    v1.route("/v1/openapi.json", get(openapi))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, ApiCode::NotFound, "no such endpoint")
        })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            loopback_only,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            count,
        ))
        .with_state(state)
}

async fn count(State(state): Shared, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    state.metrics.request(response.status().as_u16());
    response
}

/// Without tokens, the `Host` check of every request: 403 `forbidden_host` unless it
/// names a loopback host ([`guard::is_loopback_host`]; HTTP/2's `:authority` when
/// there is no `Host`). With tokens any `Host` goes: a rebinding page has no token.
async fn loopback_only(State(state): Shared, request: Request, next: Next) -> Response {
    if state.tokens.is_some() {
        return next.run(request).await;
    }
    let host = match request.headers().get(header::HOST) {
        Some(value) => value.to_str().ok().map(str::to_string),
        None => request.uri().authority().map(|a| a.as_str().to_string()),
    };
    if host.as_deref().is_some_and(guard::is_loopback_host) {
        return next.run(request).await;
    }
    tracing::warn!(host = ?host, path = %request.uri().path(), "refused a request for another host name (no tokens_file: loopback only)");
    ApiError::new(
        StatusCode::FORBIDDEN,
        ApiCode::ForbiddenHost,
        "without a tokens file this coordinator answers requests for localhost, 127.0.0.1 or [::1] only",
    )
    .into_response()
}

/// The token check of every `/v1` route: 401 `unauthorized` without a known token,
/// 403 `forbidden` when its role does not cover the method.
async fn authorize(State(state): Shared, request: Request, next: Next) -> Response {
    let Some(tokens) = &state.tokens else {
        return next.run(request).await;
    };
    let needed = if request.method() == Method::GET || request.method() == Method::HEAD {
        Role::Read
    } else {
        Role::Submit
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let Some(presented) = presented else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            ApiCode::Unauthorized,
            "this API needs `Authorization: Bearer <token>`",
        )
        .into_response();
    };
    let Some(caller) = tokens.check(presented) else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            ApiCode::Unauthorized,
            "the token is not in this coordinator's tokens file",
        )
        .into_response();
    };
    if !caller.role.allows(needed) {
        tracing::warn!(token = %caller.name, method = %request.method(), path = %request.uri().path(), "forbidden");
        return ApiError::new(
            StatusCode::FORBIDDEN,
            ApiCode::Forbidden,
            format!(
                "a `{}` token may not do this; it needs a `{}` token",
                caller.role.as_str(),
                needed.as_str()
            ),
        )
        .into_response();
    }
    if needed == Role::Submit {
        tracing::info!(token = %caller.name, path = %request.uri().path(), "submit");
    }
    next.run(request).await
}

/// True when the request says its body is `application/json` (parameters such as
/// `charset` allowed).
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

async fn submit(State(state): Shared, headers: axum::http::HeaderMap, body: Bytes) -> ApiResult {
    if !is_json(&headers) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiCode::UnsupportedMediaType,
            "the body must be `Content-Type: application/json`",
        ));
    }
    if body.len() > MAX_COMMAND_BYTES {
        return Err(ApiError::too_large(format!(
            "the body is {} bytes; the limit is {MAX_COMMAND_BYTES}",
            body.len()
        )));
    }
    let value: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ApiCode::InvalidJson,
            format!("not JSON: {e}"),
        )
    })?;
    if let Some(size) = signed_size(&value) {
        if size > MAX_COMMAND_BYTES {
            return Err(ApiError::too_large(format!(
                "the command is {size} bytes as signed (its canonical JSON spells out every field); the limit is {MAX_COMMAND_BYTES}"
            )));
        }
    }
    let (id, host) = state.fleet.submit(value).await?;
    state.metrics.submitted();
    ok(StatusCode::ACCEPTED, Accepted { id, host })
}

/// An `id` as long as any the fleet makes (`c-` and 16 hex digits).
const ID_PLACEHOLDER: &str = "c-0000000000000000";
/// An `issued_at` as long as any the fleet fills in (`Utc::now()`, at most nanoseconds).
const ISSUED_AT_PLACEHOLDER: &str = "2000-01-01T00:00:00.000000001Z";

/// The size of what the fleet would sign and publish for this body (the agent holds
/// that, not the body, to [`MAX_COMMAND_BYTES`]), or `None` when the body is no valid
/// command (the fleet says why). What the fleet fills in when absent — `v`, `id`,
/// `issued_at` — is filled in here with values at least as long as it would use, so
/// this is never less than the published size (at most 9 bytes more).
fn signed_size(body: &Value) -> Option<usize> {
    let mut probe = body.clone();
    let object = probe.as_object_mut()?;
    object.remove("sig");
    object
        .entry("v")
        .or_insert(json!(capstan_common::PROTOCOL_VERSION));
    object.entry("id").or_insert(json!(ID_PLACEHOLDER));
    object
        .entry("issued_at")
        .or_insert(json!(ISSUED_AT_PLACEHOLDER));
    match Command::parse(&probe.to_string()) {
        Ok(command) => Some(signing::signed_len(&command)),
        // Over the limit before it is even canonical.
        Err(r) if r.code == ErrorCode::TooLarge => Some(MAX_COMMAND_BYTES + 1),
        Err(_) => None,
    }
}

async fn command(State(state): Shared, Path(id): Path<String>) -> ApiResult {
    // A result entry that left its events out is completed from CAPSTAN_EVT.
    let _read = permit(&state, Bound::StreamReads)?;
    ok(StatusCode::OK, state.fleet.command(&id).await?)
}

/// Asks the command's host to cut it short (`cancel_command`): 202 with the cancel's
/// id and the command's status when one was sent, 200 with `cancel_id: null` when the
/// command is done (nothing sent, nothing changed). Its outcome, once done, says what
/// the cancel did: `failed` with `cancelled` if it was cut short or not begun.
async fn cancel(State(state): Shared, Path(id): Path<String>) -> ApiResult {
    let _read = permit(&state, Bound::StreamReads)?;
    let (cancel_id, command) = state.fleet.cancel(&id).await?;
    let code = match cancel_id {
        Some(_) => StatusCode::ACCEPTED,
        None => StatusCode::OK,
    };
    ok(code, CancelAnswer { cancel_id, command })
}

/// `30s`, `500ms`, `2m` or plain seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

async fn wait(
    State(state): Shared,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let timeout = match query.get("timeout") {
        None => Duration::from_secs(30),
        Some(t) => parse_duration(t).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                ApiCode::InvalidRequest,
                "timeout is like 30s, 500ms or 2m",
            )
        })?,
    };
    let _wait = permit(&state, Bound::Waits)?;
    ok(
        StatusCode::OK,
        state.fleet.wait(&id, timeout.min(MAX_WAIT)).await?,
    )
}

async fn hosts(State(state): Shared) -> ApiResult {
    let hosts = state.fleet.hosts().await?;
    ok(StatusCode::OK, HostsAnswer { hosts })
}

async fn intent(State(state): Shared, Path(host): Path<String>) -> ApiResult {
    let (_, answer) =
        ask_host::<IntentAnswer>(&state.fleet, &host, Verb::Intent, json!({})).await?;
    ok(StatusCode::OK, answer)
}

async fn status(State(state): Shared, Path(host): Path<String>) -> ApiResult {
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

async fn events(
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
async fn host_log(
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
fn agent_code(error: &ErrorBody) -> Option<ApiCode> {
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
    match read_answer::<A>(answer.clone()) {
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
async fn verify_host(State(state): Shared, Path(host): Path<String>) -> ApiResult {
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
async fn register(
    State(state): Shared,
    Path(host): Path<String>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> ApiResult {
    if !is_json(&headers) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiCode::UnsupportedMediaType,
            "the body must be `Content-Type: application/json`",
        ));
    }
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

async fn host_keys(State(state): Shared, Path(host): Path<String>) -> ApiResult {
    ok(StatusCode::OK, state.fleet.host_keys(&host).await?)
}

async fn unregister(State(state): Shared, Path((host, key)): Path<(String, String)>) -> ApiResult {
    let entry = state.fleet.unregister(&host, &key).await?;
    tracing::info!(%host, %key, "host key removed");
    ok(StatusCode::OK, entry)
}

/// This API's OpenAPI 3.1 description (`openapi.json`, kept in step with the routes
/// by a test; schemathesis checks the answers against it: `nats::openapi`).
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn healthz(State(state): Shared) -> ApiResult {
    if state.fleet.connected() {
        ok(StatusCode::OK, json!({"status": "ok", "nats": "connected"}))
    } else {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ApiCode::NatsUnavailable,
            "not connected to NATS",
        ))
    }
}

/// The metrics; the fleet gauges from [`crate::metrics::FleetCache`]: one registry
/// read per interval, however many scrape.
async fn metrics(State(state): Shared) -> Response {
    let read = || async {
        match state.fleet.hosts().await {
            Ok(hosts) => Some(FleetGauges::count(&hosts)),
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot read the host registry");
                None
            }
        }
    };
    let fleet = state.metrics.fleet.get(Instant::now(), read).await;
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(state.fleet.connected(), fleet),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::{is_json, parse_duration};
    use axum::http::{header, HeaderMap, HeaderValue};
    use std::time::Duration;

    #[test]
    fn only_json_is_json() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            is_json(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(!with("text/plain"));
        assert!(!with("application/x-www-form-urlencoded"));
        assert!(!with("multipart/form-data; boundary=x"));
        assert!(!with("application/jsonp"));
        assert!(!is_json(&HeaderMap::new()));
    }

    /// The description names exactly the routes `router` serves, with their methods.
    #[test]
    fn the_openapi_description_names_every_route_and_no_other() {
        let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        assert_eq!(spec["openapi"], "3.1.0");
        let mut described: Vec<String> = spec["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, ops)| {
                let ops = ops.as_object().unwrap();
                ops.keys()
                    .map(move |m| format!("{} {path}", m.to_uppercase()))
            })
            .collect();
        // The routes as this file declares them, in its calls of `route` with a path and
        // `get` or `post`.
        let source = include_str!("api.rs");
        // A route's methods: `get(a)`, or chained as `get(a).put(b)`.
        let mut served: Vec<String> = source
            .split(".route(\"")
            .skip(1)
            .filter_map(|rest| {
                let (path, rest) = rest.split_once('"')?;
                let call = rest.trim_start_matches(", ").split(')').collect::<Vec<_>>();
                let methods: Vec<String> = call
                    .iter()
                    .take_while(|part| {
                        let name = part.trim_start_matches('.').split('(').next().unwrap_or("");
                        ["get", "post", "put", "delete"].contains(&name)
                    })
                    .map(|part| {
                        let name = part.trim_start_matches('.').split('(').next().unwrap_or("");
                        format!("{} {path}", name.to_uppercase())
                    })
                    .collect();
                Some(methods)
            })
            .flatten()
            .collect();
        described.sort();
        served.sort();
        assert_eq!(described, served);
        assert!(served.len() >= 10, "{served:?}");
    }

    /// Every operation has an operationId, camelCase and its own (what a generated
    /// client names its methods by), and the server listed is the default `listen`.
    #[test]
    fn the_operations_have_their_own_camel_case_ids_and_the_server_is_the_default() {
        let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        let mut ids = Vec::new();
        for (path, ops) in spec["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                let id = op["operationId"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{method} {path}: no operationId"));
                let camel = id.starts_with(|c: char| c.is_ascii_lowercase())
                    && id.chars().all(|c| c.is_ascii_alphanumeric())
                    && id.chars().any(|c| c.is_ascii_uppercase());
                assert!(camel, "{method} {path}: {id} is not camelCase of words");
                ids.push(id.to_string());
            }
        }
        let count = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), count, "an operationId used twice: {ids:?}");
        let url = format!("http://{}", crate::config::default_listen());
        assert_eq!(spec["servers"][0]["url"], url.as_str());
    }

    /// `Spec.image` carries the image grammar the server enforces: the pattern and
    /// length `validate::is_image_ref` is held to (in common's tests).
    #[test]
    fn the_described_image_pattern_is_the_validators() {
        use capstan_common::validate::{IMAGE_REF_MAX_LEN, IMAGE_REF_PATTERN};
        let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        let image = &spec["components"]["schemas"]["Spec"]["properties"]["image"];
        assert_eq!(image["pattern"], IMAGE_REF_PATTERN);
        assert_eq!(image["maxLength"], IMAGE_REF_MAX_LEN);
    }

    /// The `enum` of a schema of the description, as strings.
    fn described_enum(pointer: &str) -> Vec<String> {
        let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        spec.pointer(pointer)
            .and_then(|v| v.as_array())
            .unwrap_or_else(|| panic!("no enum at {pointer}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

    /// `ApiError`'s `error.code` lists exactly the codes an error answer can carry:
    /// every protocol code (a command the fleet refused answers with its own) and
    /// every code of this API's (what `ApiError` is built from: [`ApiCode`] or
    /// [`ErrorCode`], nothing else); `ErrorCode` lists the protocol's.
    #[test]
    fn the_described_error_codes_are_every_code_an_answer_can_carry() {
        use super::ApiCode;
        use capstan_common::ErrorCode;
        use std::collections::BTreeSet;
        let protocol: BTreeSet<String> = ErrorCode::ALL
            .iter()
            .map(|c| c.as_str().to_string())
            .collect();
        let mut every = protocol.clone();
        every.extend(ApiCode::ALL.iter().map(|c| c.as_str().to_string()));
        for (pointer, codes) in [
            (
                "/components/schemas/ApiError/properties/error/properties/code/enum",
                &every,
            ),
            ("/components/schemas/ErrorCode/enum", &protocol),
        ] {
            let described = described_enum(pointer);
            let set: BTreeSet<String> = described.iter().cloned().collect();
            let missing: Vec<_> = codes.difference(&set).collect();
            let unknown: Vec<_> = set.difference(codes).collect();
            assert!(
                missing.is_empty() && unknown.is_empty(),
                "{pointer}: missing {missing:?}, no such code {unknown:?}"
            );
            assert_eq!(described.len(), set.len(), "{pointer}: a code listed twice");
        }
    }

    /// `CommandStatus` in the description is what `status::summarize` writes (the
    /// agent's result entries, answered as they are): its `status` values, and an
    /// `error` whose fields are the described ones, `code` an `ErrorCode`, `retryable`
    /// a boolean.
    #[test]
    fn the_described_command_status_is_what_summarize_writes() {
        use capstan_common::status::summarize;
        use serde_json::json;
        let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        let schema = &spec["components"]["schemas"]["CommandStatus"];
        let statuses = described_enum("/components/schemas/CommandStatus/properties/status/enum");
        assert_eq!(schema["properties"]["status"]["type"], "string");
        let error = schema["properties"]["error"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["type"] == "object")
            .expect("an object form of error");
        assert_eq!(
            error["properties"]["code"]["$ref"],
            "#/components/schemas/ErrorCode"
        );
        assert_eq!(error["properties"]["retryable"]["type"], "boolean");
        let codes = described_enum("/components/schemas/ErrorCode/enum");
        for (code, outcome) in [
            ("hook_failed", "failed"),
            ("namespace_not_found", "failed"),
            ("expired", "rejected"),
        ] {
            let events = vec![
                json!({"seq": 1, "kind": "command_received", "command_id": "a"}),
                json!({"seq": 2, "kind": "command_completed", "command_id": "a",
                    "outcome": outcome, "code": code, "message": "m"}),
            ];
            let status = serde_json::to_value(summarize("a", "h1", events)).unwrap();
            assert!(
                statuses.iter().any(|s| status["status"] == s.as_str()),
                "{status}"
            );
            for key in schema["required"].as_array().unwrap() {
                assert!(
                    status.get(key.as_str().unwrap()).is_some(),
                    "{key}: {status}"
                );
            }
            let answered = status["error"].as_object().unwrap();
            for key in error["required"].as_array().unwrap() {
                assert!(answered.contains_key(key.as_str().unwrap()), "{key}");
            }
            for key in answered.keys() {
                assert!(
                    error["properties"].get(key).is_some(),
                    "`{key}` undescribed"
                );
            }
            assert!(codes.iter().any(|c| answered["code"] == c.as_str()));
            assert!(answered["retryable"].is_boolean());
        }
    }

    /// Every code an agent answers is passed on under the same code, but
    /// `unknown_verb` (this API asks agents only verbs they know): `host_error` then.
    #[test]
    fn an_agents_codes_are_this_apis_but_unknown_verb() {
        use capstan_common::answers::AgentCode;
        let body = |code: &str| super::ErrorBody {
            code: code.into(),
            message: "m".into(),
        };
        for code in AgentCode::ALL {
            let passed = super::agent_code(&body(code.as_str())).map(|c| c.as_str());
            match code {
                AgentCode::UnknownVerb => assert_eq!(passed, None),
                _ => assert_eq!(passed, Some(code.as_str())),
            }
        }
        assert_eq!(super::agent_code(&body("a_newer_agents_code")), None);
    }

    /// `ApiCode::ALL` lists every variant once, as `as_str` spells it: serde's derive
    /// sees the enum itself and names every variant in its "expected one of" list.
    #[test]
    fn api_code_all_lists_every_code_of_the_enum() {
        use super::ApiCode;
        let refused = serde_json::from_str::<ApiCode>("\"no_such_code\"").unwrap_err();
        let message = refused.to_string();
        let (_, expected) = message
            .split_once("expected one of ")
            .unwrap_or_else(|| panic!("{message}"));
        let declared: Vec<&str> = expected
            .split(", ")
            .map(|v| v.trim_matches('`').split('`').next().unwrap())
            .collect();
        let listed: Vec<&str> = ApiCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            listed, declared,
            "ApiCode::ALL is not the enum's variants in order"
        );
        for code in ApiCode::ALL {
            assert_eq!(ApiCode::parse(code.as_str()), Some(code));
        }
    }

    /// Given bodies with and without the fields the fleet fills in, when sized, then
    /// the size is never less than what the fleet signs and publishes for them, and at
    /// most 9 bytes more; a body that is no command has none.
    #[test]
    fn the_signed_size_of_a_body_bounds_what_the_fleet_publishes() {
        use capstan_common::signing::Signer;
        let signer = Signer::generate().unwrap();
        let ports: Vec<serde_json::Value> = (1..=50)
            .map(|p| serde_json::json!({"container_port": p}))
            .collect();
        for body in [
            serde_json::json!({"host": "h1", "op": "ensure_namespace", "namespace": "ns"}),
            serde_json::json!({"v": 1, "id": "mine", "issued_at": "2026-11-29T10:00:00+01:00",
                "host": "h1", "op": "prepare_revision", "namespace": "ns", "workload": "w",
                "revision": "r1", "spec": {"driver": "sim", "ports": ports}, "sig": "ab"}),
        ] {
            let size = super::signed_size(&body).unwrap();
            // As the fleet fills it in: a fresh id, the time now.
            let mut filled = body.clone();
            let object = filled.as_object_mut().unwrap();
            object.remove("sig");
            object.entry("v").or_insert(1.into());
            object.entry("id").or_insert("c-0123456789abcdef".into());
            object
                .entry("issued_at")
                .or_insert(serde_json::json!(chrono::Utc::now()));
            let command = capstan_common::Command::parse(&filled.to_string()).unwrap();
            let published = signer.signed_json(&command).len();
            assert!(
                (published..=published + 9).contains(&size),
                "{size} for {published}"
            );
        }
        assert_eq!(super::signed_size(&serde_json::json!([1])), None);
        assert_eq!(
            super::signed_size(&serde_json::json!({"op": "reboot"})),
            None
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("15"), Some(Duration::from_secs(15)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("5h"), None);
    }
}

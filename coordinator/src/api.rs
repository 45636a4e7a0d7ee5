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

use crate::auth::{Role, Tokens};
use crate::fleet::Fleet;
use crate::guard::{self, Bound, Limits};
use crate::metrics::{FleetGauges, Metrics};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod commands;
mod error;
mod hosts;

pub use commands::parse_duration;
use commands::{cancel, command, submit, wait};
pub use error::{ApiCode, ApiError};
use hosts::{
    events, host_keys, host_log, hosts, intent, register, status, unregister, verify_host,
};

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

/// A permit of `bound` for the request's whole run, or 503 `busy`.
fn permit(state: &AppState, bound: Bound) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    state
        .limits
        .try_take(bound)
        .ok_or_else(|| ApiError::busy(bound))
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

/// 415 `unsupported_media_type` unless the body is `application/json` ([`is_json`]).
fn require_json(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    if !is_json(headers) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiCode::UnsupportedMediaType,
            "the body must be `Content-Type: application/json`",
        ));
    }
    Ok(())
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
        state
            .metrics
            .render(state.fleet.connected(), fleet, &state.fleet.beat_receipts()),
    )
        .into_response()
}

#[cfg(test)]
mod tests;

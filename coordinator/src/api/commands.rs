//! The `/v1/commands` handlers: submit (sized as the fleet will sign it), read, wait
//! for and cancel a command.

use super::{ok, permit, require_json, ApiCode, ApiError, ApiResult, Shared, MAX_WAIT};
use crate::answers::{Accepted, CancelAnswer};
use crate::fleet::UnknownHost;
use crate::guard::Bound;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use capstan_common::{signing, Command, ErrorCode, Op, MAX_COMMAND_BYTES};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

/// `POST /v1/commands[?unknown_host=queue]`: 202 once the command is on its way; a
/// command for a host nobody knows is 404 `host_not_found` unless the query asks to
/// queue it (a host being provisioned).
pub(super) async fn submit(
    State(state): Shared,
    Query(query): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> ApiResult {
    require_json(&headers)?;
    let unknown = match query.get("unknown_host").map(String::as_str) {
        None | Some("refuse") => UnknownHost::Refuse,
        Some("queue") => UnknownHost::Queue,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                ApiCode::InvalidRequest,
                format!("unknown_host is `refuse` (the default) or `queue`, not {other:?}"),
            ))
        }
    };
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
    let (id, host) = state.fleet.submit(value, unknown).await?;
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
pub(super) fn signed_size(body: &Value) -> Option<usize> {
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
        Ok(mut command) => {
            // As the fleet will publish it: a built-in driver's section canonical.
            if let Op::PrepareRevision { spec, .. } = &mut command.op {
                crate::spec_rules::admit(spec).ok()?;
            }
            Some(signing::signed_len(&command))
        }
        // Over the limit before it is even canonical.
        Err(r) if r.code == ErrorCode::TooLarge => Some(MAX_COMMAND_BYTES + 1),
        Err(_) => None,
    }
}

pub(super) async fn command(State(state): Shared, Path(id): Path<String>) -> ApiResult {
    // A result entry that left its events out is completed from CAPSTAN_EVT.
    let _read = permit(&state, Bound::StreamReads)?;
    ok(StatusCode::OK, state.fleet.command(&id).await?)
}

/// Asks the command's host to cut it short (`cancel_command`): 202 with the cancel's
/// id and the command's status when one was sent, 200 with `cancel_id: null` when the
/// command is done (nothing sent, nothing changed). Its outcome, once done, says what
/// the cancel did: `failed` with `cancelled` if it was cut short or not begun.
pub(super) async fn cancel(State(state): Shared, Path(id): Path<String>) -> ApiResult {
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

pub(super) async fn wait(
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

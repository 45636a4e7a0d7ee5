//! The errors of this API: its own codes ([`ApiCode`]), and [`ApiError`], an error
//! answer (`{"error":{"code","message"}}` and its status), made from a [`FleetError`].

use super::BUSY_RETRY_AFTER_SECS;
use crate::fleet::FleetError;
use crate::guard::Bound;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use capstan_common::answers::ErrorReply;
use capstan_common::ErrorCode;

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
    /// The host has no account on the NATS server, or (a command submitted for it)
    /// no registered key.
    HostNotFound,
    /// The host has no such registered key.
    KeyNotFound,
    /// The key is registered for another host.
    KeyConflict,
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
    pub const ALL: [ApiCode; 22] = [
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
        ApiCode::KeyConflict,
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
            ApiCode::KeyConflict => "key_conflict",
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
    pub(super) fn parse(code: &str) -> Option<ApiCode> {
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
    pub(super) fn new(status: StatusCode, code: ApiCode, message: impl Into<String>) -> ApiError {
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
    pub(super) fn busy(bound: Bound) -> ApiError {
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

    pub(super) fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ApiCode::TooLarge, message)
    }
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
            FleetError::NoHostAccount(_) | FleetError::UnknownHost(_) => {
                (StatusCode::NOT_FOUND, ApiCode::HostNotFound)
            }
            FleetError::KeyNotFound(_) => (StatusCode::NOT_FOUND, ApiCode::KeyNotFound),
            FleetError::KeyConflict { .. } => (StatusCode::CONFLICT, ApiCode::KeyConflict),
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

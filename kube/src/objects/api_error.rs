//! How the driver treats an error the apiserver answers: retried, or reported with a
//! stable code.

use capstan_common::ErrorCode;

/// How the driver treats an API error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFailure {
    /// The same request may succeed when sent again at once (a 409 from an update
    /// that raced another writer, a 429, a 5xx): retried a few times.
    Retry,
    /// Reported with this code.
    Code(ErrorCode),
}

/// What an API error (status `code`, `reason`, and whether its causes name a field
/// manager conflict) means for the driver.
pub fn api_failure(code: u16, reason: &str, field_manager_conflict: bool) -> ApiFailure {
    match (code, reason) {
        (403, _) => ApiFailure::Code(ErrorCode::Forbidden),
        (409, _) if field_manager_conflict => ApiFailure::Code(ErrorCode::FieldConflict),
        (409, _) | (429, _) | (500..=599, _) => ApiFailure::Retry,
        (404, _) => ApiFailure::Code(ErrorCode::BackendMissing),
        (422, _) | (400, _) => ApiFailure::Code(ErrorCode::InvalidSpec),
        _ => ApiFailure::Code(ErrorCode::DriverFailed),
    }
}

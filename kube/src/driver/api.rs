//! Requests to the apiserver: sent again when it asks for it, a few times, and what
//! fails mapped to a driver error with a stable code.

use super::ATTEMPTS;
use crate::objects::{self, ApiFailure};
use capstan_driver::DriverError;
use std::future::Future;
use std::time::Duration;

/// Whether the apiserver's answer names a field another manager owns.
fn field_conflict(status: &kube::core::Status) -> bool {
    status
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "FieldManagerConflict"))
}

/// Whether the answer to a write that carried a resourceVersion says the object has
/// another one now (409 Conflict, no field manager named).
pub(super) fn stale(status: &kube::core::Status) -> bool {
    status.code == 409 && !field_conflict(status)
}

/// Sends a request, again when the apiserver asks for it (a few times), and maps
/// what fails to a driver error with a stable code.
pub(super) async fn call<T, F, Fut>(
    op: &'static str,
    target: &(dyn std::fmt::Display + Sync),
    mut request: F,
) -> Result<T, DriverError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let err = match request().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        match &err {
            kube::Error::Api(status) => {
                match objects::api_failure(status.code, &status.reason, field_conflict(status)) {
                    ApiFailure::Retry if attempt < ATTEMPTS => {
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                        continue;
                    }
                    ApiFailure::Retry => {
                        return Err(DriverError::Backend {
                            op,
                            target: target.to_string(),
                            source: err.into(),
                        })
                    }
                    ApiFailure::Code(code) => {
                        return Err(DriverError::refused(
                            op,
                            target,
                            code,
                            status.message.clone(),
                        ))
                    }
                }
            }
            // Not an answer from the apiserver (connection refused or cut, TLS, a
            // timeout): retryable, every operation is idempotent.
            _ => {
                return Err(DriverError::Unavailable {
                    op,
                    target: target.to_string(),
                    source: err.into(),
                })
            }
        }
    }
}

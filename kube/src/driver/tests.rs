use super::*;
use kube::core::response::{Status, StatusDetails};
use std::sync::atomic::{AtomicU32, Ordering};

fn conflict(field_manager: bool) -> kube::Error {
    let mut status = Status::failure("the object has been modified", "Conflict").with_code(409);
    if field_manager {
        let details: StatusDetails = serde_json::from_value(serde_json::json!({
            "causes": [{"reason": "FieldManagerConflict",
                "message": "conflict with \"ops\"", "field": ".spec.replicas"}],
        }))
        .unwrap();
        status = status.with_details(details);
    }
    kube::Error::Api(status.boxed())
}

#[tokio::test]
async fn a_409_from_a_raced_update_is_sent_again() {
    let sent = AtomicU32::new(0);
    let answer = call("activate", &"ns/web@r1", || async {
        match sent.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Err(conflict(false)),
            _ => Ok("applied"),
        }
    })
    .await;
    assert_eq!(answer.unwrap(), "applied");
    assert_eq!(sent.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_field_manager_conflict_is_not_retried_and_keeps_its_code() {
    let sent = AtomicU32::new(0);
    let answer: Result<(), _> = call("stop", &"ns/web@r1", || async {
        sent.fetch_add(1, Ordering::SeqCst);
        Err(conflict(true))
    })
    .await;
    assert_eq!(answer.unwrap_err().code(), ErrorCode::FieldConflict);
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn retries_are_bounded() {
    let sent = AtomicU32::new(0);
    let answer: Result<(), _> = call("activate", &"ns/web@r1", || async {
        sent.fetch_add(1, Ordering::SeqCst);
        Err(conflict(false))
    })
    .await;
    assert_eq!(answer.unwrap_err().code(), ErrorCode::DriverFailed);
    assert_eq!(sent.load(Ordering::SeqCst), ATTEMPTS);
}

//! The node stand-in's decisions, without a cluster.

use capstan_tests::kube::node::{status_for, Outcome};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn pod(image: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "n"},
        "spec": {"containers": [{"name": "main", "image": image}]},
    }))
    .unwrap()
}

#[test]
fn a_pod_is_written_once_per_outcome() {
    let mut p = pod("capstan-test/app:1");
    let status = status_for(&p, "2026-01-01T00:00:00Z").expect("a fresh pod gets a status");
    assert_eq!(status["status"]["phase"], "Running");
    assert_eq!(status["status"]["containerStatuses"][0]["ready"], true);
    p.status = Some(serde_json::from_value(status["status"].clone()).unwrap());
    assert_eq!(status_for(&p, "2026-01-01T00:00:01Z"), None);
}

#[test]
fn images_ask_for_failures() {
    assert_eq!(
        Outcome::of("capstan-test/missing:1"),
        Outcome::ImagePullError
    );
    let missing = status_for(&pod("capstan-test/missing:1"), "t").unwrap();
    assert_eq!(missing["status"]["phase"], "Pending");
    assert_eq!(
        missing["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
        "ErrImagePull"
    );
    let crash = status_for(&pod("capstan-test/crashloop:1"), "t").unwrap();
    assert_eq!(
        crash["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
        "CrashLoopBackOff"
    );
}

#[test]
fn a_pod_being_deleted_is_left_alone() {
    let mut p = pod("capstan-test/app:1");
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    assert_eq!(status_for(&p, "t"), None);
}

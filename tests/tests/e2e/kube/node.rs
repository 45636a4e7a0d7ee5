//! The node stand-in's decisions, without a cluster.

use capstan_tests::kube::node::{probed_ready_status, status_for, Outcome};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::time::Duration;

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

fn probed(image: &str, probe: serde_json::Value) -> Pod {
    let mut p = pod(image);
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.readiness_probe = Some(serde_json::from_value(probe).unwrap());
    p
}

#[test]
fn a_probed_pod_runs_not_ready_first_and_is_ready_after_its_probes_pass() {
    let probe = json!({"tcpSocket": {"port": 80}, "initialDelaySeconds": 1,
        "periodSeconds": 2, "successThreshold": 3});
    let mut p = probed("capstan-test/app:1", probe);
    assert_eq!(
        Outcome::of_pod(&p),
        Some(Outcome::ReadyAfter(Duration::from_secs(1 + 2 * 3)))
    );
    let first = status_for(&p, "2026-01-01T00:00:00Z").expect("a fresh pod gets a status");
    assert_eq!(first["status"]["phase"], "Running");
    let c = &first["status"]["containerStatuses"][0];
    assert_eq!((&c["ready"], &c["started"]), (&json!(false), &json!(true)));
    assert!(c["state"]["running"].is_object(), "{c}");
    assert_eq!(first["status"]["conditions"][3]["type"], "Ready");
    assert_eq!(first["status"]["conditions"][3]["status"], "False");
    // Its own write does not bring another: the late ready comes from a timer.
    p.status = Some(serde_json::from_value(first["status"].clone()).unwrap());
    assert_eq!(status_for(&p, "2026-01-01T00:00:01Z"), None);
    let ready =
        probed_ready_status(&p, "2026-01-01T00:00:07Z").expect("ready once the probes pass");
    assert_eq!(ready["status"]["containerStatuses"][0]["ready"], true);
    assert_eq!(ready["status"]["conditions"][3]["status"], "True");
    // The API's defaults: no delay, 10 s apart, one success.
    let bare = probed("capstan-test/app:1", json!({"exec": {"command": ["true"]}}));
    assert_eq!(
        Outcome::of_pod(&bare),
        Some(Outcome::ReadyAfter(Duration::from_secs(10)))
    );
}

#[test]
fn an_unready_image_runs_and_is_never_ready() {
    let p = probed("capstan-test/unready:2", json!({"tcpSocket": {"port": 80}}));
    assert_eq!(Outcome::of_pod(&p), Some(Outcome::Unready));
    let status = status_for(&p, "t").unwrap();
    assert_eq!(status["status"]["phase"], "Running");
    assert_eq!(status["status"]["containerStatuses"][0]["ready"], false);
    assert_eq!(status["status"]["containerStatuses"][0]["started"], true);
    // Failures the image asks for come before the probe.
    let missing = probed("capstan-test/missing:1", json!({"tcpSocket": {"port": 80}}));
    assert_eq!(Outcome::of_pod(&missing), Some(Outcome::ImagePullError));
    assert_eq!(
        Outcome::of_pod(&pod("capstan-test/app:1")),
        Some(Outcome::Ready)
    );
}

//! What goes wrong in the cluster, as the driver names it: pod failures and API
//! errors as stable codes, container restarts as exits, replicas another manager
//! took, failures shown by watched objects and reported once.

use super::*;

fn pod(waiting: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "capstan-web-abc"},
        "status": {"containerStatuses": [{
            "name": "main", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": waiting}}}]},
    }))
    .unwrap()
}

#[test]
fn pod_failures_get_stable_codes() {
    assert_eq!(
        pod_failure(&[pod("ContainerCreating"), pod("ImagePullBackOff")]),
        Some((
            ErrorCode::ImageNotFound,
            "pod capstan-web-abc container main: ImagePullBackOff".into()
        ))
    );
    assert_eq!(
        pod_failure(&[pod("CrashLoopBackOff")]).map(|f| f.0),
        Some(ErrorCode::BackendFailed)
    );
    assert_eq!(pod_failure(&[pod("ContainerCreating")]), None);
}

#[test]
fn api_errors_map_to_stable_codes_or_a_retry() {
    assert_eq!(
        api_failure(403, "Forbidden", false),
        ApiFailure::Code(ErrorCode::Forbidden)
    );
    assert_eq!(
        api_failure(409, "Conflict", true),
        ApiFailure::Code(ErrorCode::FieldConflict)
    );
    assert_eq!(api_failure(409, "Conflict", false), ApiFailure::Retry);
    assert_eq!(
        api_failure(503, "ServiceUnavailable", false),
        ApiFailure::Retry
    );
    assert_eq!(
        api_failure(422, "Invalid", false),
        ApiFailure::Code(ErrorCode::InvalidSpec)
    );
}

#[test]
fn each_restart_of_a_pods_container_is_one_exit_of_its_revision() {
    let crashing = |restarts: i32| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "capstan-web-abc", "namespace": "team",
                "labels": {WORKLOAD: "web", REVISION: "r1"}},
            "status": {"containerStatuses": [{
                "name": "main", "image": "x", "imageID": "", "ready": false,
                "restartCount": restarts,
                "lastState": {"terminated": {"exitCode": 2}},
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
        }))
        .unwrap()
    };
    let mut seen = BTreeMap::new();
    let exits = exits_of(&crashing(1), &mut seen);
    assert_eq!(
        exits,
        [capstan_driver::Exit {
            namespace: "team".into(),
            workload: "web".into(),
            revision: "r1".into(),
            exit_code: Some(2),
        }]
    );
    assert!(
        exits_of(&crashing(1), &mut seen).is_empty(),
        "reported once"
    );
    assert_eq!(exits_of(&crashing(3), &mut seen).len(), 1);
    assert!(
        exits_of(&pod("Running"), &mut seen).is_empty(),
        "not labelled ours"
    );
}

#[test]
fn replicas_another_field_manager_took_are_a_change_outside_capstan() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let applied = deployment(HOST, rev("r1"), &t, 1, 1, 600);
    let with_managers = |entries: Value| {
        let mut d = live(applied.clone(), json!({}));
        d.metadata.managed_fields = serde_json::from_value(entries).unwrap();
        d.spec.as_mut().unwrap().replicas = Some(3);
        d
    };
    let replicas = json!({"f:spec": {"f:replicas": {}}});
    let template = json!({"f:spec": {"f:template": {}}});
    let scaled = with_managers(json!([
        {"manager": "capstan", "operation": "Apply", "fieldsV1": template},
        {"manager": "kubectl", "operation": "Update", "subresource": "scale", "fieldsV1": replicas},
    ]));
    assert_eq!(
        replicas_changed(&scaled),
        Some("replicas set to 3 by kubectl".into())
    );
    let ours = with_managers(json!([
        {"manager": "capstan", "operation": "Apply", "fieldsV1": replicas},
    ]));
    assert_eq!(replicas_changed(&ours), None);
    assert_eq!(replicas_changed(&live(applied, json!({}))), None);
}

/// `pod(waiting)` as one of workload `web`'s pods of `revision` in `team`.
fn pod_of(revision: &str, waiting: &str) -> Pod {
    let mut p = pod(waiting);
    p.metadata.namespace = Some("team".into());
    p.metadata.labels = Some(
        [(WORKLOAD, "web"), (REVISION, revision)]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
    );
    p
}

#[test]
fn a_watched_object_shows_the_failure_of_its_revision() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let given_up = live(
        deployment(HOST, rev("r1"), &t, 1, 1, 600),
        json!({"observedGeneration": 2, "replicas": 1, "conditions": [{
            "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}),
    );
    let failure = Watched::Deployment(&given_up).failure().expect("a failure");
    assert_eq!(failure.rev(), rev("r1"));
    assert_eq!(failure.code, ErrorCode::BackendFailed);
    assert_eq!(
        failure.reason,
        "Deployment capstan-web: ProgressDeadlineExceeded"
    );
    let progressing = live(
        deployment(HOST, rev("r1"), &t, 1, 1, 600),
        json!({"observedGeneration": 2, "replicas": 1}),
    );
    assert_eq!(Watched::Deployment(&progressing).failure(), None);

    let pulled = Watched::Pod(&pod_of("r2", "ErrImagePull")).failure();
    let pulled = pulled.expect("a failure");
    assert_eq!(
        (pulled.rev(), pulled.code),
        (rev("r2"), ErrorCode::ImageNotFound)
    );
    assert_eq!(
        Watched::Pod(&pod_of("r2", "ContainerCreating")).failure(),
        None
    );
    // Not one of our workloads' pods: no revision to fail.
    assert_eq!(Watched::Pod(&pod("CrashLoopBackOff")).failure(), None);
}

#[test]
fn a_failure_is_reported_once_while_its_object_shows_it() {
    let failing = |code| {
        Some(capstan_driver::Failure {
            namespace: "team".into(),
            workload: "web".into(),
            revision: "r1".into(),
            code,
            reason: format!("{code}"),
        })
    };
    let mut reported = Reported::default();
    let pod = "team/capstan-web-abc".to_string();
    assert!(reported
        .update(pod.clone(), failing(ErrorCode::ImageNotFound))
        .is_some());
    assert!(reported
        .update(pod.clone(), failing(ErrorCode::ImageNotFound))
        .is_none());
    // Another failure of the same object is news.
    assert!(reported
        .update(pod.clone(), failing(ErrorCode::BackendFailed))
        .is_some());
    // Cleared, then shown again: reported again.
    assert!(reported.update(pod.clone(), None).is_none());
    assert!(reported
        .update(pod.clone(), failing(ErrorCode::BackendFailed))
        .is_some());
    reported.forget(&pod);
    assert!(reported
        .update(pod.clone(), failing(ErrorCode::BackendFailed))
        .is_some());
    reported.clear();
    assert!(reported
        .update(pod, failing(ErrorCode::BackendFailed))
        .is_some());
}

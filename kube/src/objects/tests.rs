use super::*;
use capstan_common::{DriverKind, PortMapping};
use k8s_openapi::api::apps::v1::Deployment;

const HOST: &str = "c1";

fn rev(revision: &str) -> RevisionRef<'_> {
    RevisionRef {
        namespace: "team",
        workload: "web",
        revision,
    }
}

fn spec() -> Spec {
    Spec {
        driver: DriverKind::Kube,
        image: Some("registry.example/web:1".into()),
        command: vec!["serve".into(), "--port=8080".into()],
        env: [("MODE".to_string(), "prod".to_string())].into(),
        working_dir: Some("/srv".into()),
        mounts: vec![],
        ports: vec![PortMapping {
            container_port: 8080,
            host_port: 0,
            host_ip: None,
            protocol: Protocol::Tcp,
        }],
        systemd: Default::default(),
        kube: Default::default(),
        readiness: None,
        strategy: Default::default(),
    }
}

fn launch() -> LaunchEnv {
    [("TOKEN_REF".to_string(), "opaque-abc".to_string())].into()
}

/// A live Deployment as the apiserver would answer it for what we applied.
fn live(applied: Value, status: Value) -> Deployment {
    let mut d = applied;
    d["metadata"]["generation"] = json!(2);
    d["status"] = status;
    serde_json::from_value(d).unwrap()
}

#[test]
fn the_deployment_carries_the_revision_env_and_replicas() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = deployment(HOST, rev("r1"), &t, 3, 3, 600);
    assert_eq!(d["metadata"]["name"], "capstan-web");
    assert_eq!(d["metadata"]["namespace"], "team");
    assert_eq!(d["metadata"]["labels"][REVISION], "r1");
    assert_eq!(d["metadata"]["annotations"][REVISION], "r1");
    assert_eq!(d["metadata"]["annotations"][REPLICAS], "3");
    assert_eq!(d["spec"]["replicas"], 3);
    let pod = &d["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"][REVISION], "r1");
    assert_eq!(pod["metadata"]["annotations"][REVISION], "r1");
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["name"], CONTAINER);
    assert_eq!(c["args"], json!(["serve", "--port=8080"]));
    assert_eq!(
        c["env"],
        json!([{"name": "MODE", "value": "prod"}, {"name": "TOKEN_REF", "value": "opaque-abc"}])
    );
    assert_eq!(c["workingDir"], "/srv");
    assert_eq!(
        c["ports"],
        json!([{"containerPort": 8080, "protocol": "TCP"}])
    );
    // The selector never names the revision: it is immutable once created.
    assert!(d["spec"]["selector"]["matchLabels"].get(REVISION).is_none());
}

#[test]
fn a_template_reads_back_from_the_live_deployment() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = live(deployment(HOST, rev("r1"), &t, 0, 2, 600), json!({}));
    assert_eq!(Template::from_live(&d), Some(t));
    assert_eq!(runs_with(&d), 2);
    assert_eq!(revision_of(&d), Some("r1"));
}

#[test]
fn given_an_empty_env_value_the_apiserver_left_out_when_read_back_then_it_is_kept() {
    let mut s = spec();
    s.env.insert("EMPTY".into(), String::new());
    let t = Template::from_spec(&s, &launch()).unwrap();
    let mut applied = deployment(HOST, rev("r1"), &t, 1, 1, 600);
    // As the apiserver answers it: `value` omitted when empty.
    let env = &mut applied["spec"]["template"]["spec"]["containers"][0]["env"];
    for e in env.as_array_mut().unwrap() {
        if e["value"] == "" {
            e.as_object_mut().unwrap().remove("value");
        }
    }
    let read = Template::from_live(&live(applied, json!({}))).unwrap();
    assert_eq!(read.env["EMPTY"], "");
    assert_eq!(read, t);
}

#[test]
fn specs_the_driver_cannot_run_are_refused() {
    let mut no_image = spec();
    no_image.image = None;
    assert!(Template::from_spec(&no_image, &launch()).is_err());
    let mut mounts = spec();
    mounts.mounts = vec![capstan_common::Mount {
        source: "/data".into(),
        target: "/data".into(),
        read_only: false,
    }];
    assert!(Template::from_spec(&mounts, &launch()).is_err());
    for replicas in [0, MAX_REPLICAS + 1] {
        let mut s = spec();
        s.kube.replicas = replicas;
        assert!(Template::from_spec(&s, &launch()).is_err(), "{replicas}");
    }
}

#[test]
fn the_staged_revision_holds_the_spec_and_no_launch_env() {
    let c = staged(HOST, rev("r1"), &spec());
    assert_eq!(c["metadata"]["name"], "capstan-web-r1");
    assert_eq!(c["metadata"]["labels"][REVISION], "r1");
    let held: Spec = serde_json::from_str(c["data"]["spec.json"].as_str().unwrap()).unwrap();
    assert_eq!(held, spec());
    assert!(!c.to_string().contains("opaque-abc"));
}

#[test]
fn only_objects_labelled_for_this_host_are_ours() {
    let ours: BTreeMap<String, String> = [(MANAGED, "true"), (HOST_LABEL, HOST)]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut other_host = ours.clone();
    other_host.insert(HOST_LABEL.into(), "c2".into());
    assert_eq!(Owner::of(None, HOST), Owner::Absent);
    assert_eq!(Owner::of(Some(Some(&ours)), HOST), Owner::Ours);
    assert_eq!(Owner::of(Some(Some(&other_host)), HOST), Owner::NotOurs);
    assert_eq!(Owner::of(Some(None), HOST), Owner::NotOurs);
}

const HOST_LABEL: &str = super::HOST;

#[test]
fn retire_and_stop_touch_only_a_deployment_on_their_revision() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = live(deployment(HOST, rev("r2"), &t, 1, 1, 600), json!({}));
    assert_eq!(OnRevision::of(Some(&d), "r2"), OnRevision::This);
    assert_eq!(OnRevision::of(Some(&d), "r1"), OnRevision::Other);
    assert_eq!(OnRevision::of(None, "r1"), OnRevision::Absent);
}

#[test]
fn a_rollout_completes_when_every_replica_is_updated_and_available() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let applied = deployment(HOST, rev("r1"), &t, 2, 2, 600);
    let going = live(
        applied.clone(),
        json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2}),
    );
    assert_eq!(
        rollout(&going, "r1"),
        Rollout::Progressing {
            updated: 2,
            available: 2,
            wanted: 2
        }
    );
    let stale = live(
        applied.clone(),
        json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}),
    );
    assert!(matches!(rollout(&stale, "r1"), Rollout::Progressing { .. }));
    let done = live(
        applied.clone(),
        json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}),
    );
    assert_eq!(rollout(&done, "r1"), Rollout::Complete);
    assert_eq!(rollout(&done, "r0"), Rollout::Superseded);
    let stopped = live(
        deployment(HOST, rev("r1"), &t, 0, 2, 600),
        json!({"observedGeneration": 2}),
    );
    assert_eq!(rollout(&stopped, "r1"), Rollout::Complete);
}

#[test]
fn a_progress_deadline_fails_the_rollout() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = live(
        deployment(HOST, rev("r1"), &t, 1, 1, 600),
        json!({"observedGeneration": 2, "replicas": 1, "conditions": [{
            "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}),
    );
    assert_eq!(
        rollout(&d, "r1"),
        Rollout::Failed {
            reason: "ProgressDeadlineExceeded".into()
        }
    );
}

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

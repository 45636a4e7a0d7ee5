use super::*;
use capstan_common::{DriverKind, PortMapping, Readiness};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};

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

fn readiness(check: Check, interval_ms: u32, timeout_ms: u32, threshold: u32) -> Readiness {
    Readiness {
        check,
        interval_ms,
        timeout_ms,
        threshold,
        deadline_ms: 8_000,
    }
}

/// The `main` container's readinessProbe of the Deployment for `spec`.
fn probe_of(spec: &Spec) -> Value {
    let t = Template::from_spec(spec, &launch()).unwrap();
    let d = deployment(HOST, rev("r1"), &t, 1, 1, 600);
    d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"].clone()
}

#[test]
fn each_readiness_check_becomes_the_containers_readiness_probe() {
    assert_eq!(probe_of(&spec()), Value::Null, "no readiness, no probe");
    let mut s = spec();
    let exec = Check::Exec {
        command: vec!["test".into(), "-f".into(), "/ready".into()],
    };
    s.readiness = Some(readiness(exec, 1_000, 1_000, 1));
    assert_eq!(
        probe_of(&s),
        json!({"exec": {"command": ["test", "-f", "/ready"]},
            "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1})
    );
    let http = Check::Http {
        port: 8080,
        path: "/healthz?full=1".into(),
    };
    s.readiness = Some(readiness(http, 2_000, 500, 3));
    assert_eq!(
        probe_of(&s),
        json!({"httpGet": {"port": 8080, "path": "/healthz?full=1"},
            "periodSeconds": 2, "timeoutSeconds": 1, "successThreshold": 3})
    );
    s.readiness = Some(readiness(Check::Tcp { port: 5432 }, 1_500, 2_001, 2));
    assert_eq!(
        probe_of(&s),
        json!({"tcpSocket": {"port": 5432},
            "periodSeconds": 2, "timeoutSeconds": 3, "successThreshold": 2})
    );
}

#[test]
fn probe_intervals_and_timeouts_round_up_to_whole_seconds_of_at_least_one() {
    let probe = |interval_ms, timeout_ms| {
        ReadinessProbe::of(&readiness(
            Check::Tcp { port: 1 },
            interval_ms,
            timeout_ms,
            1,
        ))
    };
    for (ms, seconds) in [(10, 1), (999, 1), (1_000, 1), (1_001, 2), (600_000, 600)] {
        assert_eq!(probe(ms, ms).period_seconds, seconds, "{ms} ms");
        assert_eq!(probe(ms, ms).timeout_seconds, seconds, "{ms} ms");
    }
    assert_eq!(probe(1, 1).timeout_seconds, 1);
}

#[test]
fn start_first_rolls_one_pod_at_a_time_keeping_the_old_ones_and_stop_first_recreates() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = deployment(HOST, rev("r1"), &t, 5, 5, 600);
    assert_eq!(
        d["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
    let mut s = spec();
    s.strategy = Strategy::StopFirst;
    let t = Template::from_spec(&s, &launch()).unwrap();
    let d = deployment(HOST, rev("r1"), &t, 5, 5, 600);
    assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
}

#[test]
fn the_probe_and_the_strategy_read_back_from_the_live_deployment() {
    for strategy in [Strategy::StartFirst, Strategy::StopFirst] {
        for check in [
            Check::Exec {
                command: vec!["true".into()],
            },
            Check::Http {
                port: 80,
                path: "/".into(),
            },
            Check::Tcp { port: 443 },
        ] {
            let mut s = spec();
            s.strategy = strategy;
            s.readiness = Some(readiness(check, 2_500, 300, 4));
            let t = Template::from_spec(&s, &launch()).unwrap();
            let mut applied = deployment(HOST, rev("r1"), &t, 0, 1, 600);
            // As the apiserver answers it: defaults filled in.
            let probe = &mut applied["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
            probe["failureThreshold"] = json!(3);
            if let Some(http) = probe.get_mut("httpGet") {
                http["scheme"] = json!("HTTP");
            }
            let read = Template::from_live(&live(applied, json!({}))).unwrap();
            assert_eq!(read, t, "{strategy:?}");
        }
    }
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
    assert_eq!(
        Template::from_spec(&no_image, &launch()),
        Err("a kube workload needs an image".to_string())
    );
    let mut mounts = spec();
    mounts.mounts = vec![capstan_common::Mount {
        source: "/data".into(),
        target: "/data".into(),
        read_only: false,
    }];
    assert_eq!(
        Template::from_spec(&mounts, &launch()),
        Err("the kube driver does not mount host paths".to_string())
    );
    for replicas in [0, MAX_REPLICAS + 1] {
        let mut s = spec();
        s.kube.replicas = replicas;
        assert_eq!(
            Template::from_spec(&s, &launch()),
            Err(format!("kube.replicas must be 1 to {MAX_REPLICAS}")),
            "{replicas}"
        );
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

#[test]
fn a_probe_is_ready_once_the_deployment_is_on_the_revision_and_rolled_out() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let applied = deployment(HOST, rev("r2"), &t, 1, 1, 600);
    let done = live(
        applied.clone(),
        json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}),
    );
    assert_eq!(probe(Some(&done), "r2"), Ok(Probe::Ready));
    let unready = live(
        applied,
        json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}),
    );
    assert_eq!(
        probe(Some(&unready), "r2"),
        Ok(Probe::NotReady(
            "the rollout is not complete: 1 of 1 pods on the revision, 1 available of any revision"
                .into()
        ))
    );
    assert_eq!(
        probe(Some(&done), "r3"),
        Ok(Probe::NotReady("the Deployment is on revision r2".into()))
    );
    assert!(!probe(None, "r2").unwrap().is_ready());
}

#[test]
fn a_probe_of_a_rollout_the_cluster_gave_up_fails_with_backend_failed() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = live(
        deployment(HOST, rev("r2"), &t, 1, 1, 600),
        json!({"observedGeneration": 2, "replicas": 1, "conditions": [{
            "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}),
    );
    let (code, reason) = probe(Some(&d), "r2").unwrap_err();
    assert_eq!(code, capstan_common::ErrorCode::BackendFailed);
    assert_eq!(reason, "the rollout failed: ProgressDeadlineExceeded");
}

/// A ReplicaSet of workload `web` at `revision`, as the deployment controller makes
/// it: the pod template's labels, owned by Deployment `owner`, its revision number.
fn replica_set(t: &Template, revision: &str, owner: &str, number: u32) -> ReplicaSet {
    let d = deployment(HOST, rev(revision), t, 1, 1, 600);
    let mut template = d["spec"]["template"].clone();
    template["metadata"]["labels"]["pod-template-hash"] = json!(format!("h{number}"));
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("capstan-web-h{number}"),
            "labels": template["metadata"]["labels"],
            "annotations": {"deployment.kubernetes.io/revision": number.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                "name": "capstan-web", "uid": owner}],
        },
        "spec": {"selector": d["spec"]["selector"], "template": template},
    }))
    .unwrap()
}

#[test]
fn a_revision_is_found_in_its_replica_set_of_the_same_deployment() {
    let mut s1 = spec();
    s1.readiness = Some(readiness(Check::Tcp { port: 8080 }, 1_000, 1_000, 1));
    let t1 = Template::from_spec(&s1, &launch()).unwrap();
    let t2 = Template::from_spec(&spec(), &LaunchEnv::new()).unwrap();
    let mut now = live(deployment(HOST, rev("r2"), &t2, 1, 1, 600), json!({}));
    now.metadata.uid = Some("uid-1".into());
    let sets = [
        replica_set(&t2, "r2", "uid-1", 2),
        replica_set(&t1, "r1", "uid-0", 7),
        replica_set(&t1, "r1", "uid-1", 1),
    ];
    let found = replica_set_of(&sets, &now, "r1", HOST).expect("r1's ReplicaSet");
    assert_eq!(
        found.metadata.name.as_deref(),
        Some("capstan-web-h1"),
        "owned by this Deployment"
    );
    let template = found.spec.as_ref().unwrap().template.as_ref().unwrap();
    let back = Template::from_pod_template(template, Strategy::StartFirst).unwrap();
    assert_eq!(back, t1, "launch env and probe included");
    assert!(replica_set_of(&sets, &now, "r0", HOST).is_none());
    assert!(
        replica_set_of(&sets, &now, "r1", "c2").is_none(),
        "another host's"
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

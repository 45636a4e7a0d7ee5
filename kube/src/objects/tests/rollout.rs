//! Ownership, which revision a Deployment is on, rollout progress and readiness
//! probes, and finding a revision's ReplicaSet.

use super::*;

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

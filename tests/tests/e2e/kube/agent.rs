//! The cluster agent (`driver = "kube"`) against the real apiserver, under the shipped
//! ClusterRole: commands through `apply` with an exec hook's placeholder reaching the
//! pod template and never the log; agent kills and restarts that touch nothing; a
//! Deployment deleted by hand and one made by hand reported at startup; a crash loop recorded from the pod
//! watch and left to the cluster; failures after the rollout (a progress deadline, an
//! image pull error) recorded from the Deployment and pod watch, across an apiserver
//! restart.

use capstan_tests::agent::{Agent, AgentBuilder};
use capstan_tests::command::Spec;
use capstan_tests::hooks::Hook;
use capstan_tests::kube::KubeCluster;
use capstan_tests::process::Process;
use capstan_tests::unique;
use capstan_tests::{wait_until, READY};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::{json, Value};

const ALL: &[&str] = &[
    "after_namespace_prepared",
    "before_workload_start",
    "before_workload_stop",
    "before_namespace_delete",
];

/// Owner `iam`: contributes `DB_TOKEN=opaque-db.tok:42` to every start.
fn iam() -> Hook {
    let body = "[ \"$phase\" = before_workload_start ] && \
                echo '{\"env\":{\"DB_TOKEN\":\"opaque-db.tok:42\"}}'\nexit 0";
    Hook::new("iam", ALL, body)
}

fn agent(cluster: &KubeCluster, name: &str) -> AgentBuilder {
    let kubeconfig = cluster.agent_kubeconfig("capstan-agent", &[]);
    Agent::builder(&unique(name)).kube(&kubeconfig).hook(iam())
}

fn spec(image: &str) -> Spec {
    Spec::docker(image)
        .with("driver", "kube")
        .env("MODE", "test")
}

/// The live Deployment of workload `web` in namespace `ns`.
fn web(cluster: &KubeCluster) -> Option<Deployment> {
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "ns");
    cluster.block_on(api.get_opt("capstan-web")).unwrap()
}

fn env_of(d: &Deployment) -> Vec<(String, String)> {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

/// Writes `pod`'s status, as its kubelet would.
fn write_status(cluster: &KubeCluster, pod: &Pod, status: Value) {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "ns");
    cluster
        .block_on(pods.patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(status),
        ))
        .expect("write the pod's status");
}

/// A status of web's pod as its kubelet writes it: `main` not ready, waiting on
/// `reason`, after `restarts` restarts (the last one ended with exit 2).
fn waiting(reason: &str, restarts: i32) -> Value {
    let mut status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{
            "name": "main", "image": "capstan-test/web:1", "imageID": "", "ready": false,
            "restartCount": restarts,
            "state": {"waiting": {"reason": reason}}}],
    }});
    if restarts > 0 {
        status["status"]["containerStatuses"][0]["lastState"] =
            json!({"terminated": {"exitCode": 2}});
    }
    status
}

/// The first pod of workload `web` in namespace `ns`, if there is one.
fn web_pod(cluster: &KubeCluster) -> Option<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "ns");
    let of_web = ListParams::default().labels("io.capstan.workload=web");
    cluster.block_on(pods.list(&of_web)).unwrap().items.pop()
}

fn revision(d: &Deployment) -> &str {
    capstan_kube::objects::revision_of(d).unwrap()
}

#[test]
fn the_cluster_agent_rolls_out_with_the_hooks_placeholder_in_the_pod_template_only() {
    let cluster = KubeCluster::start();
    let a = agent(&cluster, "kroll").build();
    let c = a.commands("ns");
    let mut outputs = Vec::new();
    outputs.push(a.apply_ok(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "web", "r1", spec("capstan-test/web:1")),
    ]));
    assert!(web(&cluster).is_none(), "prepared, not rolled out");
    outputs.push(a.apply_ok(&[c.activate("a1", "web", "r1")]));
    let d = web(&cluster).expect("the Deployment");
    assert_eq!(revision(&d), "r1");
    let want = [("DB_TOKEN", "opaque-db.tok:42"), ("MODE", "test")]
        .map(|(k, v)| (k.to_string(), v.to_string()));
    assert_eq!(env_of(&d), want);

    outputs.push(a.apply_ok(&[c.stop("s1", "web")]));
    assert_eq!(web(&cluster).unwrap().spec.unwrap().replicas, Some(0));
    outputs.push(a.apply_ok(&[c.start("st1", "web")]));
    assert_eq!(web(&cluster).unwrap().spec.unwrap().replicas, Some(1));

    outputs.push(a.apply_ok(&[
        c.prepare("p2", "web", "r2", spec("capstan-test/web:2")),
        c.activate("a2", "web", "r2"),
        c.retire("x1", "web", "r1"),
    ]));
    let d = web(&cluster).expect("r2's Deployment");
    assert_eq!(revision(&d), "r2", "retiring r1 left r2 alone");
    assert_eq!(env_of(&d), want);

    let intent = a.intent();
    assert_eq!(
        intent["workloads"]["ns/web"]["intent"], "running",
        "{intent}"
    );
    // The placeholder is in the pod template, never in the log or the output.
    let text = format!(
        "{}{}",
        serde_json::to_string(&a.log()).unwrap(),
        outputs.iter().map(ToString::to_string).collect::<String>()
    );
    assert!(
        !text.contains("opaque-"),
        "a placeholder reached the log or output"
    );
    cluster.stop();
}

/// A cluster and an agent `name` that has rolled `web@r1` out in `ns`.
fn rolled_out(name: &str) -> (KubeCluster, Agent) {
    let cluster = KubeCluster::start();
    let a = agent(&cluster, name).build();
    let c = a.commands("ns");
    a.apply_ok(&c.rollout(&["web"], "r1", |_| spec("capstan-test/web:1")));
    (cluster, a)
}

/// The daemon's "startup reconciliation done" line's fields.
fn reconciled(daemon: &Process) -> Value {
    daemon.wait_for_line("startup reconciliation done", |l| {
        l["fields"]["message"] == "startup reconciliation done"
    })["fields"]
        .clone()
}

#[test]
fn an_agent_killed_and_restarted_touches_nothing_in_the_cluster() {
    let (cluster, a) = rolled_out("kkill");
    let before = web(&cluster).expect("the Deployment");
    let intent = a.intent();

    let daemon = a.run();
    let fields = reconciled(&daemon);
    assert_eq!(fields["started"], 0, "{fields}");
    assert_eq!(fields["drift"], 0, "{fields}");
    daemon.kill();
    assert_eq!(
        a.intent()["workloads"],
        intent["workloads"],
        "rebuilt from the log"
    );
    let daemon = a.run();
    reconciled(&daemon);
    daemon.stop();

    let after = web(&cluster).expect("the Deployment is still there");
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "never applied again"
    );
    assert_eq!(after.spec.unwrap().replicas, Some(1), "never scaled");
    cluster.stop();
}

#[test]
fn drift_made_by_hand_is_reported_at_startup_and_left_alone() {
    let (cluster, a) = rolled_out("kdrift");
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "ns");
    cluster
        .block_on(api.delete("capstan-web", &Default::default()))
        .expect("delete the Deployment by hand");
    wait_until("the Deployment to be gone", READY, || {
        web(&cluster).is_none()
    });
    // A Deployment labelled as this agent's that intent does not know.
    let template = capstan_kube::objects::Template {
        image: "capstan-test/ghost:1".into(),
        args: vec![],
        env: Default::default(),
        working_dir: None,
        ports: vec![],
        readiness: None,
        strategy: Default::default(),
    };
    let ghost = capstan_driver::RevisionRef {
        namespace: "ns",
        workload: "ghost",
        revision: "g1",
    };
    let object = capstan_kube::objects::deployment(&a.host, ghost, &template, 1, 1, 600);
    cluster
        .block_on(api.patch(
            "capstan-ghost",
            &PatchParams::apply("ops"),
            &Patch::Apply(object),
        ))
        .expect("apply a Deployment by hand");

    let daemon = a.run();
    let fields = reconciled(&daemon);
    assert_eq!(fields["failed"], 1, "{fields}");
    assert_eq!(fields["drift"], 1, "{fields}");
    assert_eq!(fields["started"], 0, "{fields}");
    daemon.stop();
    let failed = a.events("workload_failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["code"], "backend_missing", "{failed:?}");
    let drift = a.events("drift_detected");
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!(drift[0]["workload"], "ghost", "{drift:?}");
    assert_eq!(drift[0]["reaped"], false, "{drift:?}");
    assert!(
        web(&cluster).is_none(),
        "the cluster agent does not recreate it"
    );
    assert!(
        cluster
            .block_on(api.get_opt("capstan-ghost"))
            .unwrap()
            .is_some(),
        "nor removes what it does not know"
    );
    assert_eq!(a.intent()["workloads"]["ns/web"]["intent"], "running");
    cluster.stop();
}

#[test]
fn a_crash_loop_after_the_rollout_is_recorded_and_left_to_the_cluster() {
    let (cluster, a) = rolled_out("kcrash");
    let before = web(&cluster).expect("the Deployment");
    let daemon = a.run();
    reconciled(&daemon);
    // Play the kubelet: the container crashed twice (exit 2) and is backing off.
    let pod = web_pod(&cluster).expect("web's pod");
    write_status(&cluster, &pod, waiting("CrashLoopBackOff", 2));
    // The log is the daemon's while it runs: wait on what it says, then read the log.
    // Recorded once, by whichever sees it first: the exit (then `state`) or the
    // failure watch.
    daemon.wait_for_line("the crash loop recorded", |l| {
        let message = &l["fields"]["message"];
        message == "the backend gave up on it"
            || (message == "failure recorded" && l["fields"]["code"] == "backend_failed")
    });
    // The failure watch may see it before the exit is read: wait for both records.
    daemon.wait_for_line("the exit recorded", |l| {
        l["fields"]["message"] == "workload exited"
    });
    daemon.stop();
    let failed = &a.events("workload_failed")[0];
    assert_eq!(failed["code"], "backend_failed", "{failed}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("CrashLoopBackOff"),
        "{failed}"
    );
    let exited = a.events("workload_exited");
    assert_eq!(exited[0]["exit_code"], 2, "{exited:?}");
    let after = web(&cluster).expect("the Deployment");
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "the cluster restarts pods, not the agent"
    );
    cluster.stop();
}

/// The daemon's "failure recorded" line for a failure with `code`.
fn failure_recorded(daemon: &Process, code: &str) {
    daemon.wait_for_line(&format!("a {code} failure recorded"), |l| {
        l["fields"]["message"] == "failure recorded" && l["fields"]["code"] == code
    });
}

#[test]
fn failures_after_the_rollout_are_recorded_from_the_watch_across_an_apiserver_restart() {
    let (mut cluster, a) = rolled_out("kwatch");
    let before = web(&cluster).expect("the Deployment");
    let daemon = a.run();
    reconciled(&daemon);
    // The status written below lasts only until the deployment controller's next
    // sync rewrites it: the agent must be watching before it is written, or a list
    // after the rewrite never shows it (this test failed so, now and then).
    daemon.wait_for_line("the failure watch listed the Deployments", |l| {
        l["fields"]["message"] == "failure watch listed" && l["fields"]["watch"] == "deployments"
    });
    // The cluster gives up on the rollout: the Deployment's status, as the
    // deployment controller writes it after progressDeadlineSeconds.
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "ns");
    let given_up = json!({"status": {"conditions": [{
        "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
        "message": "ReplicaSet has timed out progressing."}]}});
    cluster
        .block_on(api.patch_status(
            "capstan-web",
            &PatchParams::default(),
            &Patch::Merge(given_up),
        ))
        .expect("write the Deployment's status");
    failure_recorded(&daemon, "backend_failed");

    // The watch outlives the apiserver: a failure made after its restart is recorded.
    cluster.stop_apiserver();
    cluster.restart_apiserver();
    // Play the kubelet: the pod's image can no longer be pulled; nothing exited.
    let pod = web_pod(&cluster).expect("web's pod");
    write_status(&cluster, &pod, waiting("ErrImagePull", 0));
    failure_recorded(&daemon, "image_not_found");
    daemon.stop();

    let failed: Vec<(Value, String)> = a
        .events("workload_failed")
        .into_iter()
        .map(|f| {
            (
                f["code"].clone(),
                f["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(failed.len(), 2, "one record each: {failed:?}");
    assert_eq!(failed[0].0, "backend_failed", "{failed:?}");
    assert!(
        failed[0].1.contains("ProgressDeadlineExceeded"),
        "{failed:?}"
    );
    assert_eq!(failed[1].0, "image_not_found", "{failed:?}");
    assert!(failed[1].1.contains("ErrImagePull"), "{failed:?}");
    assert!(a.events("workload_exited").is_empty(), "nothing exited");
    let after = web(&cluster).expect("the Deployment");
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "the agent records, the cluster retries"
    );
    cluster.stop();
}

#[test]
fn a_deployment_scaled_by_hand_is_reported_at_startup_and_left_scaled() {
    let (cluster, a) = rolled_out("kscale");
    // `kubectl scale deployment capstan-web --replicas=3`: the scale subresource.
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "ns");
    let kubectl = PatchParams {
        field_manager: Some("kubectl".into()),
        ..PatchParams::default()
    };
    cluster
        .block_on(api.patch_scale(
            "capstan-web",
            &kubectl,
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        ))
        .expect("scale by hand");

    let daemon = a.run();
    let fields = reconciled(&daemon);
    assert_eq!(fields["drift"], 1, "{fields}");
    assert_eq!(fields["started"], 0, "{fields}");
    daemon.wait_for_text("replicas set to 3 by kubectl");
    daemon.stop();
    let drift = a.events("drift_detected");
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!(drift[0]["workload"], "web", "{drift:?}");
    assert_eq!(drift[0]["revision"], "r1", "{drift:?}");
    assert_eq!(drift[0]["reaped"], false, "{drift:?}");
    assert_eq!(
        web(&cluster).unwrap().spec.unwrap().replicas,
        Some(3),
        "the cluster agent leaves it as it is"
    );
    cluster.stop();
}

#[test]
fn an_agent_killed_during_a_rollout_finishes_it_after_restart_without_applying_twice() {
    let cluster = KubeCluster::start();
    // No hooks: the command's only effect is the driver's.
    let kubeconfig = cluster.agent_kubeconfig("capstan-agent", &[]);
    let a = Agent::builder(&unique("kmid")).kube(&kubeconfig).build();
    let c = a.commands("ns");
    a.apply_ok(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "web", "r1", spec("capstan-test/pending:1")),
    ]);
    // The node stand-in never reports `pending` pods: the rollout waits.
    let input = a.write_input(&[c.activate("a1", "web", "r1")]);
    let apply = a.start_apply(Some(&input));
    let pod = wait_until("the rollout's pod", READY, || web_pod(&cluster));
    apply.kill();
    assert!(a.in_progress("a1"), "killed mid-command");
    let generation = web(&cluster).unwrap().metadata.generation;

    // Play the kubelet: the pod comes up; the restarted agent finishes the command.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let ready = capstan_tests::kube::node::ready_status(&pod, &now).expect("a status");
    write_status(&cluster, &pod, ready);
    a.recover();
    let done: Vec<Value> = a
        .log_of("a1")
        .into_iter()
        .filter(|r| r["kind"] == "command_completed")
        .collect();
    assert_eq!(done.len(), 1, "{done:?}");
    if done[0]["outcome"] != "succeeded" {
        let code: capstan_common::ErrorCode =
            serde_json::from_value(done[0]["code"].clone()).expect("a code");
        assert!(code.is_retryable(), "{done:?}");
    }
    let after = web(&cluster).unwrap();
    assert_eq!(after.metadata.generation, generation, "never applied twice");
    eprintln!("the interrupted activate ended: {}", done[0]);
    cluster.stop();
}

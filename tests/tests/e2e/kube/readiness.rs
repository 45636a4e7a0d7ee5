//! Readiness and strategies on a real cluster, through the cluster agent: a spec's
//! `readiness` is its pods' readinessProbe (the node stand-in plays the kubelet's
//! probes: `unready` images never pass, other probed pods pass after
//! `periodSeconds × successThreshold`), the agent probes the rollout until the
//! readiness deadline, and one not ready by then is rolled back by resuming the
//! previous revision from its ReplicaSet. `stop-first` is a `Recreate` Deployment. A
//! kill mid-rollout is recovered the same way, by probing the Deployment again.

use capstan_kube::objects::{self, Rollout};
use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::hooks::{assert_grants_follow, grant_recorder};
use capstan_tests::kube::KubeCluster;
use capstan_tests::process::Exit;
use capstan_tests::{unique, wait_until, READY};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::Api;
use serde_json::{json, Value};

/// A cluster agent whose one owner records grants ([`grant_recorder`]): a crash
/// inside a command that began granting is recovered, not carried out again.
fn agent(cluster: &KubeCluster, name: &str) -> Agent {
    let kubeconfig = cluster.agent_kubeconfig("capstan-agent", &[]);
    Agent::builder(&unique(name))
        .kube(&kubeconfig)
        .hook(grant_recorder("exit 0"))
        .build()
}

/// Only `web@revision` holds grants.
#[track_caller]
fn grants_held_by(a: &Agent, revision: &str) {
    let running = [("web".to_string(), revision.to_string())].into();
    assert_grants_follow(a, &running);
}

fn spec(image: &str) -> Spec {
    Spec::docker(image).with("driver", "kube")
}

/// `spec(image)` with a `tcp` check on 8080, probed every second.
fn checked(image: &str, deadline_ms: u32) -> Spec {
    spec(image).with(
        "readiness",
        json!({"check": {"tcp": {"port": 8080}}, "interval_ms": 1000, "deadline_ms": deadline_ms}),
    )
}

/// Workload `web`'s live Deployment in namespace `ns`.
fn web(cluster: &KubeCluster) -> Deployment {
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "ns");
    cluster
        .block_on(api.get("capstan-web"))
        .expect("the Deployment")
}

/// The pods of `web@revision`, by name, with whether each is ready.
fn pods_of(cluster: &KubeCluster, revision: &str) -> Vec<(String, bool)> {
    let api: Api<Pod> = Api::namespaced(cluster.client(), "ns");
    let of = ListParams::default().labels(&format!(
        "io.capstan.workload=web,io.capstan.revision={revision}"
    ));
    let listed = cluster.block_on(api.list(&of)).expect("list pods");
    let ready = |p: &Pod| {
        let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
        conditions
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    };
    listed
        .items
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), ready(p)))
        .collect()
}

/// Asserts the Deployment is on `revision`, rolled out, its one pod ready.
#[track_caller]
fn rolled_out_on(cluster: &KubeCluster, revision: &str) -> Deployment {
    let d = web(cluster);
    assert_eq!(objects::revision_of(&d), Some(revision));
    assert_eq!(
        objects::rollout(&d, revision),
        Rollout::Complete,
        "{:?}",
        d.status
    );
    let available = d.status.as_ref().and_then(|s| s.available_replicas);
    assert_eq!(available, Some(1), "{:?}", d.status);
    d
}

/// The main container of the Deployment's pod template.
fn main_container(d: &Deployment) -> &k8s_openapi::api::core::v1::Container {
    let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    &pod.containers[0]
}

#[test]
fn a_revision_never_ready_fails_not_ready_and_the_deployment_is_back_on_r1_serving() {
    let cluster = KubeCluster::start();
    let a = agent(&cluster, "kready-never");
    let c = a.commands("ns");
    let mut setup = c.rollout(&["web"], "r1", |_| checked("capstan-test/web:1", 60_000));
    setup.push(c.prepare("p2", "web", "r2", checked("capstan-test/unready:2", 8_000)));
    a.apply_ok(&setup);
    rolled_out_on(&cluster, "r1");
    let r1_pods = pods_of(&cluster, "r1");
    assert!(matches!(&r1_pods[..], [(_, true)]), "{r1_pods:?}");

    let applied = a.apply(&[c.activate("a2", "web", "r2")]);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    let r = applied.result("a2");
    assert_eq!(r["error"]["code"], "not_ready", "{r}");
    assert_eq!(r["retryable"], true, "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("was not ready within 8000 ms"),
        "{message}"
    );
    assert!(
        message.contains("the last: the rollout is not complete"),
        "{message}"
    );

    let d = rolled_out_on(&cluster, "r1");
    assert!(
        main_container(&d).readiness_probe.is_some(),
        "r1's template, probe included"
    );
    assert_eq!(
        pods_of(&cluster, "r1"),
        r1_pods,
        "r1's pod served throughout, never replaced"
    );
    wait_until("r2's pods gone", READY, || {
        pods_of(&cluster, "r2").is_empty()
    });
    let intent = a.intent();
    assert_eq!(intent["workloads"]["ns/web"]["active_revision"], "r1");
    assert_eq!(intent["workloads"]["ns/web"]["intent"], "running");
    grants_held_by(&a, "r1");
    cluster.stop();
}

/// The agent waits for the rollout itself, so what cuts a wait short on the other
/// drivers cuts it here: the command's deadline passing mid-wait (as a cancel or the
/// agent's stop would) ends it `cancelled` with r1 serving, resumed from its
/// ReplicaSet, long before the readiness deadline.
#[test]
fn a_deadline_passing_during_the_rollout_wait_cancels_it_and_the_deployment_is_back_on_r1() {
    let cluster = KubeCluster::start();
    let a = agent(&cluster, "kready-cut");
    let c = a.commands("ns");
    let mut setup = c.rollout(&["web"], "r1", |_| spec("capstan-test/web:1"));
    setup.push(c.prepare(
        "p2",
        "web",
        "r2",
        checked("capstan-test/unready:2", 3_600_000),
    ));
    a.apply_ok(&setup);
    let r1_pods = pods_of(&cluster, "r1");
    let soon = chrono::Utc::now() + chrono::Duration::seconds(5);
    let cut = c
        .activate("a2", "web", "r2")
        .with("deadline", soon.to_rfc3339());
    let applied = a.apply(&[cut]);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    let r = applied.result("a2");
    assert_eq!(r["error"]["code"], "cancelled", "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cancelled while waiting for ns/web@r2"),
        "{message}"
    );
    rolled_out_on(&cluster, "r1");
    assert_eq!(pods_of(&cluster, "r1"), r1_pods, "r1's pod never replaced");
    grants_held_by(&a, "r1");
    cluster.stop();
}

#[test]
fn a_revision_ready_after_two_probes_activates_once_its_pod_is_ready() {
    let cluster = KubeCluster::start();
    let a = agent(&cluster, "kready-late");
    let c = a.commands("ns");
    let mut setup = c.rollout(&["web"], "r1", |_| spec("capstan-test/web:1"));
    let late = spec("capstan-test/web:2").with(
        "readiness",
        json!({"check": {"http": {"port": 8080, "path": "/healthz"}}, "interval_ms": 1000,
            "threshold": 2}),
    );
    setup.push(c.prepare("p2", "web", "r2", late));
    a.apply_ok(&setup);

    a.apply_ok(&[c.activate("a2", "web", "r2")]);
    let d = rolled_out_on(&cluster, "r2");
    let probe = main_container(&d).readiness_probe.clone().expect("a probe");
    let http = probe.http_get.expect("httpGet");
    assert_eq!(
        (http.port, http.path.as_deref()),
        (
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080),
            Some("/healthz")
        )
    );
    assert_eq!(
        (probe.period_seconds, probe.success_threshold),
        (Some(1), Some(2))
    );
    // The stand-in writes the pod ready only after two periods: an activation that
    // did not wait for it could not have seen the rollout complete.
    let r2_pods = pods_of(&cluster, "r2");
    assert!(matches!(&r2_pods[..], [(_, true)]), "{r2_pods:?}");
    wait_until("r1's pod replaced", READY, || {
        pods_of(&cluster, "r1").is_empty()
    });
    assert_eq!(a.intent()["workloads"]["ns/web"]["active_revision"], "r2");
    grants_held_by(&a, "r2");
    cluster.stop();
}

#[test]
fn stop_first_is_a_recreate_deployment_and_activates() {
    let cluster = KubeCluster::start();
    let a = agent(&cluster, "kstopfirst");
    let c = a.commands("ns");
    let mut setup = c.rollout(&["web"], "r1", |_| spec("capstan-test/web:1"));
    let r2 = checked("capstan-test/web:2", 60_000).with("strategy", "stop-first");
    setup.push(c.prepare("p2", "web", "r2", r2));
    a.apply_ok(&setup);
    let strategy = |d: &Deployment| d.spec.as_ref().unwrap().strategy.clone().unwrap();
    let rolling = strategy(&web(&cluster));
    assert_eq!(rolling.type_.as_deref(), Some("RollingUpdate"));
    let update = rolling.rolling_update.expect("rollingUpdate");
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int;
    assert_eq!(
        (update.max_surge, update.max_unavailable),
        (Some(Int(1)), Some(Int(0)))
    );

    a.apply_ok(&[c.activate("a2", "web", "r2")]);
    let d = rolled_out_on(&cluster, "r2");
    let recreate = strategy(&d);
    assert_eq!(recreate.type_.as_deref(), Some("Recreate"), "{recreate:?}");
    assert!(recreate.rolling_update.is_none(), "{recreate:?}");
    wait_until("r1's pod gone", READY, || {
        pods_of(&cluster, "r1").is_empty()
    });
    assert_eq!(a.intent()["workloads"]["ns/web"]["active_revision"], "r2");
    cluster.stop();
}

#[test]
fn a_kill_during_a_never_ready_rollout_is_interrupted_and_r1_resumed_from_its_replica_set() {
    let cluster = KubeCluster::start();
    let a = agent(&cluster, "kready-kill");
    let c = a.commands("ns");
    a.apply_ok(&c.rollout(&["web"], "r1", |_| {
        spec("capstan-test/web:1").env("LAUNCHED", "as r1")
    }));
    let r1_env = main_container(&rolled_out_on(&cluster, "r1")).env.clone();
    let r1_pods = pods_of(&cluster, "r1");

    // Killed while r2's rollout waits for a readiness that never comes.
    let input = a.write_input(&[
        c.prepare("p2", "web", "r2", checked("capstan-test/unready:2", 10_000)),
        c.activate("a2", "web", "r2"),
    ]);
    let apply = a.start_apply(Some(&input));
    wait_until("r2's pod", READY, || !pods_of(&cluster, "r2").is_empty());
    apply.kill();
    assert!(a.in_progress("a2"), "killed mid-activation");
    assert_eq!(objects::revision_of(&web(&cluster)), Some("r2"));

    // Recovery probes r2 until its deadline, then rolls back: r1 resumed from its
    // ReplicaSet, its template (env included) as it was, before r2 is stopped.
    let recovered = a.recover();
    assert_eq!(recovered.exit, Exit::OK, "{recovered}");
    let done: Vec<Value> = a
        .log_of("a2")
        .into_iter()
        .filter(|r| r["kind"] == "command_completed")
        .collect();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0]["outcome"], "failed", "{done:?}");
    assert_eq!(done[0]["code"], "interrupted", "{done:?}");
    // The roll-back's resume of r1 succeeded (from the ReplicaSet: the Deployment
    // was on r2), not `workload_failed` with `backend_missing`.
    assert!(
        a.events("workload_failed").is_empty(),
        "{:?}",
        a.events("workload_failed")
    );
    let resumed: Vec<Value> = a
        .events("workload_started")
        .into_iter()
        .filter(|e| e["cause"] == "supervisor")
        .collect();
    assert!(
        matches!(&resumed[..], [e] if e["revision"] == "r1"),
        "{resumed:?}"
    );
    let d = rolled_out_on(&cluster, "r1");
    assert_eq!(main_container(&d).env, r1_env, "r1's template as it was");
    assert_eq!(
        pods_of(&cluster, "r1"),
        r1_pods,
        "r1's pod served throughout: resumed before r2 was stopped"
    );
    wait_until("r2's pods gone", READY, || {
        pods_of(&cluster, "r2").is_empty()
    });
    let intent = a.intent();
    assert_eq!(intent["workloads"]["ns/web"]["active_revision"], "r1");
    assert_eq!(intent["workloads"]["ns/web"]["intent"], "running");
    grants_held_by(&a, "r1");
    cluster.stop();
}

//! Grants follow what runs on a real cluster after a SIGKILL mid-activation: the agent
//! is killed while `r2` rolls out (its grants given, the Deployment already on `r2`)
//! and, on another workload, inside `r2`'s grant (the Deployment still on `r1`). After
//! the restart, for each workload, the revision the Deployment is on is the one intent
//! runs and the only one holding grants, as an exec hook recorded them, and the
//! recovered activation completed only once its rollout was (`Driver::settle`).

use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::hooks::{assert_grants_follow, grant_recorder, Hook};
use capstan_tests::kube::KubeCluster;
use capstan_tests::process::Exit;
use capstan_tests::{unique, wait_until, READY};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use std::collections::BTreeSet;

/// Owner `rec` ([`grant_recorder`]), which also kills the agent (its parent) inside
/// the first grant of `api@r2`.
fn recorder() -> Hook {
    grant_recorder(
        r#"if [ "$phase" = before_workload_start ] && [ "$wl.$rev" = api.r2 ] && [ ! -e "$d/crashed" ]; then
  touch "$d/crashed"; kill -KILL $PPID; exit 1
fi
exit 0"#,
    )
}

fn spec(image: &str) -> Spec {
    Spec::docker(image).with("driver", "kube")
}

/// The revision workload `wl`'s Deployment in `ns` is on.
fn on(cluster: &KubeCluster, wl: &str) -> String {
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "ns");
    let d = cluster
        .block_on(api.get(&format!("capstan-{wl}")))
        .expect("the Deployment");
    capstan_kube::objects::revision_of(&d).unwrap().to_string()
}

fn pod_of(cluster: &KubeCluster, wl: &str, rev: &str) -> Option<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "ns");
    let of = ListParams::default().labels(&format!(
        "io.capstan.workload={wl},io.capstan.revision={rev}"
    ));
    cluster.block_on(pods.list(&of)).unwrap().items.pop()
}

/// `wl`'s Deployment is on `rev` with its rollout complete (every replica updated
/// and available, none other) and every other ReplicaSet of it scaled to 0.
fn assert_rolled_out(cluster: &KubeCluster, wl: &str, rev: &str) {
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "ns");
    let d = cluster
        .block_on(api.get(&format!("capstan-{wl}")))
        .expect("the Deployment");
    assert_eq!(capstan_kube::objects::revision_of(&d), Some(rev));
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = d.status.clone().unwrap_or_default();
    let counts = (
        status.replicas.unwrap_or(0),
        status.updated_replicas.unwrap_or(0),
        status.available_replicas.unwrap_or(0),
    );
    assert_eq!(counts, (want, want, want), "rollout complete: {status:?}");
    let sets: Api<ReplicaSet> = Api::namespaced(cluster.client(), "ns");
    let of_wl = ListParams::default().labels(&format!("io.capstan.workload={wl}"));
    for set in cluster.block_on(sets.list(&of_wl)).unwrap().items {
        let on = set.labels().get("io.capstan.revision").cloned();
        let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        if on.as_deref() != Some(rev) {
            assert_eq!(replicas, 0, "{wl}@{on:?} scaled down: {:?}", set.status);
        }
    }
}

#[test]
fn a_kill_mid_activation_leaves_the_revision_the_cluster_runs_holding_the_grants() {
    let cluster = KubeCluster::start();
    let kubeconfig = cluster.agent_kubeconfig("capstan-agent", &[]);
    let a = Agent::builder(&unique("kgrants"))
        .kube(&kubeconfig)
        .hook(recorder())
        .build();
    let c = a.commands("ns");
    a.apply_ok(&c.rollout(&["web", "api"], "r1", |_| spec("capstan-test/web:1")));

    // Killed in the rollout of web@r2: the node stand-in never readies `pending`.
    let input = a.write_input(&[
        c.prepare("wp2", "web", "r2", spec("capstan-test/pending:2")),
        c.activate("wa2", "web", "r2"),
    ]);
    let apply = a.start_apply(Some(&input));
    let pod = wait_until("web@r2's pod", READY, || pod_of(&cluster, "web", "r2"));
    apply.kill();
    assert!(a.in_progress("wa2"), "killed mid-activation");
    assert_eq!(on(&cluster, "web"), "r2", "the cluster already runs r2");
    // Recovery finds the Deployment on r2 with its rollout not done, and waits for
    // it as the activation would have (before, it completed the command at once).
    let nothing: &[&str] = &[];
    let recovery = a.start_apply(Some(&a.write_input(nothing)));
    recovery.wait_for_text("waiting until the driver has it started");
    // Play the kubelet: r2's pod comes up.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let ready = capstan_tests::kube::node::ready_status(&pod, &now).expect("a status");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "ns");
    cluster
        .block_on(pods.patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(ready),
        ))
        .expect("write the pod's status");
    recovery.wait_expecting(Exit::OK);
    assert!(!a.in_progress("wa2"), "recovered");
    // Recovered, the activation completed as one that ran through does: once the
    // rollout is complete (not merely once the Deployment was found on r2).
    assert_rolled_out(&cluster, "web", "r2");

    // Killed inside api@r2's grant, before anything was applied.
    let applied = a.apply(&[
        c.prepare("ap2", "api", "r2", spec("capstan-test/web:2")),
        c.activate("aa2", "api", "r2"),
    ]);
    assert_eq!(applied.exit, Exit::KILLED, "{applied}");
    assert!(a.in_progress("aa2"), "killed mid-activation");
    let recovered = a.recover();
    assert_eq!(recovered.exit, Exit::OK, "{recovered}");

    let intent = a.intent();
    let mut running = BTreeSet::new();
    for wl in ["web", "api"] {
        let w = &intent["workloads"][format!("ns/{wl}")];
        let rev = on(&cluster, wl);
        assert_eq!(
            w["active_revision"],
            rev.as_str(),
            "{wl}: intent runs what the cluster runs: {w}"
        );
        assert_eq!(w["intent"], "running", "{wl}: {w}");
        running.insert((wl.to_string(), rev));
    }
    assert_grants_follow(&a, &running);
    assert!(
        intent["in_flight"].as_object().unwrap().is_empty(),
        "{intent}"
    );
    cluster.stop();
}

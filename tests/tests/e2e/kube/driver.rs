//! The kube driver against the real apiserver, called directly, under the ClusterRole
//! shipped in `packaging/kube/` (RBAC on): the command sequence and the objects it
//! leaves, retires that leave a newer revision alone, a verb taken out of the role,
//! another field manager's field, an image that cannot be pulled, and objects under
//! our names that are not ours.

use capstan_common::{DriverKind, ErrorCode, Settings as _, Spec};
use capstan_driver::{BackendState, Driver, DriverError, LaunchEnv, RevisionRef};
use capstan_kube::objects::{self, FIELD_MANAGER};
use capstan_kube::{KubeConfig, KubeDriver, KubeSpec};
use capstan_tests::kube::KubeCluster;
use capstan_tests::unique;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

pub(super) const HOST: &str = "c1";

/// A driver for cluster `c1` under the shipped role (as `role`, less `without`).
pub(super) fn driver(cluster: &KubeCluster, role: &str, without: &[(&str, &str)]) -> KubeDriver {
    let kubeconfig = cluster.agent_kubeconfig(role, without);
    let config = KubeConfig {
        kubeconfig: Some(kubeconfig),
        rollout_timeout_secs: 60,
        ..KubeConfig::default()
    };
    cluster
        .block_on(KubeDriver::connect(HOST, config))
        .expect("connect to the test cluster")
}

pub(super) fn spec(image: &str) -> Spec {
    Spec {
        driver: DriverKind::KUBE,
        image: Some(image.into()),
        command: vec!["serve".into()],
        env: [("MODE".to_string(), "test".to_string())].into(),
        ..Default::default()
    }
}

pub(super) fn rev<'a>(ns: &'a str, revision: &'a str) -> RevisionRef<'a> {
    RevisionRef {
        namespace: ns,
        workload: "web",
        revision,
    }
}

fn launch() -> LaunchEnv {
    [("TOKEN_REF".to_string(), "opaque-tok.123".to_string())].into()
}

fn code(result: Result<(), DriverError>) -> ErrorCode {
    result.expect_err("the operation fails").code()
}

#[test]
fn the_command_sequence_leaves_the_objects_it_should() {
    let cluster = KubeCluster::start();
    let d = driver(&cluster, "capstan-agent", &[]);
    let ns = unique("kube-seq");
    let (r1, r2) = (rev(&ns, "r1"), rev(&ns, "r2"));
    // Two pods when it runs: start_workload scales back to the spec's replicas.
    let mut web1 = spec("capstan-test/web:1");
    KubeSpec::edit(&mut web1, |c| c.replicas = 2);
    let admin = cluster.client();
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    let staged: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let live = || {
        cluster
            .block_on(deployments.get_opt("capstan-web"))
            .unwrap()
    };

    cluster.block_on(async {
        d.ensure_namespace(&ns).await.unwrap();
        d.ensure_namespace(&ns)
            .await
            .expect("ensure_namespace is idempotent");
        d.prepare(r1, &web1).await.unwrap();
    });
    let namespace = cluster
        .block_on(Api::<Namespace>::all(admin.clone()).get(&ns))
        .unwrap();
    let labels = namespace.metadata.labels.unwrap();
    assert_eq!(labels[objects::MANAGED], "true");
    assert_eq!(labels[objects::HOST], HOST);
    assert!(cluster
        .block_on(staged.get_opt("capstan-web-r1"))
        .unwrap()
        .is_some());
    assert!(live().is_none(), "prepare stages without rolling out");

    cluster
        .block_on(d.activate(r1, &web1, &launch(), None))
        .unwrap();
    let dep = live().expect("the Deployment");
    assert_eq!(
        dep.metadata.labels.as_ref().unwrap()[objects::REVISION],
        "r1"
    );
    assert_eq!(
        dep.metadata.annotations.as_ref().unwrap()[objects::REVISION],
        "r1"
    );
    let managers: Vec<_> = dep
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| Some((m.manager.clone()?, m.operation.clone()?)))
        .collect();
    assert!(
        managers.contains(&(FIELD_MANAGER.to_string(), "Apply".to_string())),
        "{managers:?}"
    );
    let spec_ = dep.spec.as_ref().unwrap();
    assert_eq!(spec_.replicas, Some(2));
    let template = &spec_.template;
    assert_eq!(
        template.metadata.as_ref().unwrap().labels.as_ref().unwrap()[objects::REVISION],
        "r1"
    );
    let env: Vec<(String, String)> = template.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        env,
        [("MODE", "test"), ("TOKEN_REF", "opaque-tok.123")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
    );
    assert_eq!(dep.status.as_ref().unwrap().available_replicas, Some(2));

    // stop scales to 0, start back to what it ran with; nothing else changes.
    cluster.block_on(d.stop(r1)).unwrap();
    assert_eq!(live().unwrap().spec.unwrap().replicas, Some(0));
    assert_eq!(
        cluster.block_on(d.state(r1)).unwrap(),
        Some(BackendState::Stopped)
    );
    cluster.block_on(d.start(r1, &web1, &launch())).unwrap();
    assert_eq!(live().unwrap().spec.unwrap().replicas, Some(2));
    assert_eq!(
        cluster.block_on(d.state(r1)).unwrap(),
        Some(BackendState::Running)
    );
    // resume (infrastructure restarts) runs it as last configured, launch env included.
    cluster.block_on(async {
        d.stop(r1).await.unwrap();
        d.resume(r1).await.unwrap();
    });
    let resumed = live().unwrap();
    assert_eq!(resumed.spec.as_ref().unwrap().replicas, Some(2));
    assert_eq!(
        resumed.spec.unwrap().template.spec.unwrap().containers[0].env,
        dep.spec.unwrap().template.spec.unwrap().containers[0].env
    );

    // A newer revision rolls out on the same Deployment; retiring the older one
    // removes only what it staged.
    cluster.block_on(async {
        d.prepare(r2, &spec("capstan-test/web:2")).await.unwrap();
        d.activate(r2, &spec("capstan-test/web:2"), &launch(), Some("r1"))
            .await
            .unwrap();
        d.retire(r1).await.unwrap();
        d.stop(r1)
            .await
            .expect("stopping an older revision touches nothing");
    });
    let dep = live().expect("the Deployment is still there");
    assert_eq!(objects::revision_of(&dep), Some("r2"));
    assert_eq!(dep.spec.unwrap().replicas, Some(1));
    assert!(cluster
        .block_on(staged.get_opt("capstan-web-r1"))
        .unwrap()
        .is_none());
    assert!(cluster
        .block_on(staged.get_opt("capstan-web-r2"))
        .unwrap()
        .is_some());
    let observed = cluster.block_on(d.observe()).unwrap();
    assert!(observed.namespaces.contains(&ns));
    assert_eq!(
        observed.workloads[&capstan_common::workload_key(&ns, "web")],
        [("r2".to_string(), BackendState::Running)].into()
    );

    // The namespace is only deleted once it holds no workload of ours.
    assert_eq!(
        code(cluster.block_on(d.delete_namespace(&ns))),
        ErrorCode::NamespaceNotEmpty
    );
    cluster.block_on(async {
        d.retire(r2).await.unwrap();
        d.delete_namespace(&ns).await.unwrap();
    });
    assert!(live().is_none());
    cluster.stop();
}

#[test]
fn objects_that_are_not_ours_are_refused_and_left_alone() {
    let cluster = KubeCluster::start();
    let d = driver(&cluster, "capstan-agent", &[]);
    let theirs = unique("kube-theirs");
    let admin = cluster.client();
    let namespaces: Api<Namespace> = Api::all(admin);
    cluster.block_on(async {
        namespaces
            .patch(
                &theirs,
                &PatchParams::apply("ops"),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": theirs}})),
            )
            .await
            .unwrap();
        assert_eq!(code(d.ensure_namespace(&theirs).await), ErrorCode::NotOwned);
        assert_eq!(code(d.delete_namespace(&theirs).await), ErrorCode::NotOwned);
        assert_eq!(
            code(
                d.prepare(rev(&theirs, "r1"), &spec("capstan-test/web:1"))
                    .await
            ),
            ErrorCode::NotOwned
        );
    });
    let ns = cluster.block_on(namespaces.get(&theirs)).unwrap();
    assert!(!ns
        .metadata
        .labels
        .unwrap_or_default()
        .contains_key(objects::MANAGED));
    cluster.stop();
}

#[test]
fn a_configmap_that_is_not_ours_is_never_adopted_by_prepare_nor_deleted_by_retire() {
    let cluster = KubeCluster::start();
    let d = driver(&cluster, "capstan-agent", &[]);
    let ns = unique("kube-cm");
    let (r1, r2) = (rev(&ns, "r1"), rev(&ns, "r2"));
    let staged: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
    let hand_made = |name: &str, labels: serde_json::Value| {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels}, "data": {"theirs": "yes"}});
        cluster
            .block_on(staged.patch(name, &PatchParams::apply("ops"), &Patch::Apply(object)))
            .unwrap();
    };
    let untouched = |name: &str, labels: serde_json::Value| {
        let cm = cluster
            .block_on(staged.get(name))
            .expect("it is still there");
        let data = cm.data.unwrap_or_default();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            ["theirs"],
            "{name}: {data:?}"
        );
        let got = serde_json::to_value(cm.metadata.labels.unwrap_or_default()).unwrap();
        assert_eq!(got, labels, "{name}: its labels");
    };
    cluster.block_on(d.ensure_namespace(&ns)).unwrap();

    // Unlabelled, under r1's name: prepare refuses it and writes nothing.
    hand_made("capstan-web-r1", json!({}));
    let err = cluster
        .block_on(d.prepare(r1, &spec("capstan-test/web:1")))
        .expect_err("prepare over a ConfigMap that is not ours");
    assert_eq!(err.code(), ErrorCode::NotOwned, "{}", err.report());
    assert!(
        err.report().contains("ConfigMap capstan-web-r1"),
        "{}",
        err.report()
    );
    untouched("capstan-web-r1", json!({}));
    assert_eq!(
        code(cluster.block_on(d.retire(r1))),
        ErrorCode::NotOwned,
        "retire never deletes it"
    );
    untouched("capstan-web-r1", json!({}));

    // Another cluster agent's: the same; and a retire refused for it leaves the
    // Deployment of ours running, nothing half done.
    cluster.block_on(async {
        d.prepare(r2, &spec("capstan-test/web:2")).await.unwrap();
        d.activate(r2, &spec("capstan-test/web:2"), &launch(), None)
            .await
            .unwrap();
        staged
            .delete("capstan-web-r2", &Default::default())
            .await
            .unwrap();
    });
    let other = json!({objects::MANAGED: "true", objects::HOST: "c2"});
    hand_made("capstan-web-r2", other.clone());
    assert_eq!(code(cluster.block_on(d.retire(r2))), ErrorCode::NotOwned);
    untouched("capstan-web-r2", other);
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns);
    let dep = cluster
        .block_on(deployments.get_opt("capstan-web"))
        .unwrap();
    assert_eq!(dep.as_ref().and_then(objects::revision_of), Some("r2"));
    cluster.stop();
}

#[test]
fn a_verb_taken_out_of_the_role_fails_forbidden_and_leaves_nothing_half_done() {
    let cluster = KubeCluster::start();
    let full = driver(&cluster, "capstan-agent", &[]);
    let no_patch = driver(
        &cluster,
        "capstan-agent-no-patch",
        &[("deployments", "patch")],
    );
    let ns = unique("kube-rbac");
    let r1 = rev(&ns, "r1");
    cluster.block_on(async {
        full.ensure_namespace(&ns).await.unwrap();
        no_patch
            .prepare(r1, &spec("capstan-test/web:1"))
            .await
            .unwrap();
        let err = no_patch
            .activate(r1, &spec("capstan-test/web:1"), &launch(), None)
            .await
            .expect_err("activate needs patch on deployments");
        assert_eq!(err.code(), ErrorCode::Forbidden, "{}", err.report());
        assert!(err.report().contains("deployments"), "{}", err.report());
    });
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns);
    assert!(cluster
        .block_on(deployments.get_opt("capstan-web"))
        .unwrap()
        .is_none());
    cluster.stop();
}

#[test]
fn a_field_another_manager_owns_is_a_conflict_and_an_image_pull_error_is_reported() {
    let cluster = KubeCluster::start();
    let d = driver(&cluster, "capstan-agent", &[]);
    let ns = unique("kube-conflict");
    let r1 = rev(&ns, "r1");
    cluster.block_on(async {
        d.ensure_namespace(&ns).await.unwrap();
        d.activate(r1, &spec("capstan-test/web:1"), &launch(), None)
            .await
            .unwrap();
    });
    // An operator takes the replicas over with their own field manager (forced).
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns);
    cluster.block_on(async {
        deployments
            .patch(
                "capstan-web",
                &PatchParams::apply("ops").force(),
                &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "capstan-web"}, "spec": {"replicas": 2}})),
            )
            .await
            .unwrap();
        let err = d
            .stop(r1)
            .await
            .expect_err("stop sets the replicas ops owns");
        assert_eq!(err.code(), ErrorCode::FieldConflict, "{}", err.report());
    });
    assert_eq!(
        cluster
            .block_on(deployments.get("capstan-web"))
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(2),
        "nothing changed"
    );

    let api = RevisionRef {
        namespace: &ns,
        workload: "api",
        revision: "r1",
    };
    let err = cluster
        .block_on(d.activate(api, &spec("capstan-test/missing:1"), &launch(), None))
        .expect_err("the image cannot be pulled");
    assert_eq!(err.code(), ErrorCode::ImageNotFound, "{}", err.report());
    assert!(err.report().contains("ErrImagePull"), "{}", err.report());
    cluster.stop();
}

#[test]
fn an_apiserver_restart_mid_rollout_completes_or_fails_retryably_and_applies_once() {
    let mut cluster = KubeCluster::start();
    let d = std::sync::Arc::new(driver(&cluster, "capstan-agent", &[]));
    let ns = unique("kube-restart");
    cluster.block_on(async {
        d.ensure_namespace(&ns).await.unwrap();
        d.prepare(rev(&ns, "r1"), &spec("capstan-test/web:1"))
            .await
            .unwrap();
    });
    let activate = {
        let (d, ns) = (d.clone(), ns.clone());
        move || {
            let (d, ns) = (d.clone(), ns.clone());
            async move {
                d.activate(rev(&ns, "r1"), &spec("capstan-test/web:1"), &launch(), None)
                    .await
            }
        }
    };
    let in_flight = cluster.spawn(activate());
    cluster.stop_apiserver();
    cluster.restart_apiserver();
    match cluster.block_on(in_flight).expect("the activate task") {
        Ok(()) => eprintln!("the activate in flight completed across the restart"),
        Err(e) => {
            eprintln!("the activate in flight failed: {}", e.report());
            assert!(e.code().is_retryable(), "{}", e.report());
        }
    }
    // The retry (the executor's, after a retryable failure) converges.
    cluster
        .block_on(activate())
        .expect("activate again after the restart");
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns);
    let dep = cluster.block_on(deployments.get("capstan-web")).unwrap();
    assert_eq!(dep.metadata.generation, Some(1), "applied once in effect");
    assert_eq!(dep.status.unwrap().available_replicas, Some(1));
    cluster.stop();
}

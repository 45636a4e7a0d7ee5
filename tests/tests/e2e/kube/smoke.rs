//! The harness itself: a Deployment applied to the real apiserver becomes available
//! (the controller-manager makes its ReplicaSet and pods, the node stand-in makes them
//! Running/Ready), RBAC is enforced for a ServiceAccount, and every process stops
//! cleanly.

use capstan_tests::kube::{KubeCluster, MANAGER};
use capstan_tests::{unique, wait_until, READY};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

#[test]
fn a_deployment_becomes_available() {
    let cluster = KubeCluster::start();
    eprintln!(
        "kube-apiserver was ready {} ms after it started",
        cluster.apiserver_ready_in.as_millis()
    );
    let ns = unique("kube-smoke");
    let client = cluster.client();
    let pp = PatchParams::apply(MANAGER);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    cluster.block_on(async {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        namespaces
            .patch(&ns, &pp, &Patch::Apply(namespace))
            .await
            .expect("apply the namespace");
        let deployment = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "main", "image": "capstan-test/web:1"}]},
                },
            },
        });
        deployments
            .patch("web", &pp, &Patch::Apply(deployment))
            .await
            .expect("apply the deployment");
    });
    let available = wait_until("the deployment to be available", READY, || {
        let d = cluster
            .block_on(deployments.get("web"))
            .expect("get the deployment");
        let status = d.status?;
        let available = status
            .conditions?
            .into_iter()
            .any(|c| c.type_ == "Available" && c.status == "True");
        (available && status.available_replicas == Some(2)).then_some(status.ready_replicas)
    });
    assert_eq!(available, Some(2));

    // RBAC is on: a ServiceAccount bound to `view` reads but cannot write.
    let viewer = cluster.client_for(&cluster.kubeconfig_for("smoke-viewer", "view"));
    let as_viewer: Api<Deployment> = Api::namespaced(viewer, &ns);
    cluster.block_on(async {
        as_viewer
            .get("web")
            .await
            .expect("view may read deployments");
        let err = as_viewer
            .patch(
                "web",
                &pp,
                &Patch::Apply(json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "web", "namespace": ns},
                    "spec": {"replicas": 0},
                })),
            )
            .await
            .expect_err("view may not write");
        let kube::Error::Api(status) = err else {
            panic!("not an API error: {err}");
        };
        assert_eq!(status.code, 403, "{status:?}");
    });
    cluster.stop();
}

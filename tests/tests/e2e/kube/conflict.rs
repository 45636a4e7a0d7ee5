//! A 409 from the real apiserver, retried: `stop` and `resume` apply a Deployment
//! computed from the live one over the resourceVersion they read, so a change made
//! in between makes the apiserver answer 409 Conflict, and the driver reads it again.
//! The change is made at that very point through the driver's test hook
//! (`capstan_kube::test_hooks`, compiled for the e2e tests only).

use super::driver::{driver, rev, spec};
use capstan_driver::{Driver, LaunchEnv};
use capstan_kube::test_hooks::Hook;
use capstan_tests::kube::KubeCluster;
use capstan_tests::unique;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

#[test]
fn a_deployment_changed_between_the_drivers_read_and_write_is_a_409_read_again() {
    let cluster = KubeCluster::start();
    let d = driver(&cluster, "capstan-agent", &[]);
    let ns = unique("kube-409");
    let r1 = rev(&ns, "r1");
    let web = spec("capstan-test/web:1");
    cluster.block_on(async {
        d.ensure_namespace(&ns).await.unwrap();
        d.prepare(r1, &web).await.unwrap();
        d.activate(r1, &web, &LaunchEnv::new(), None).await.unwrap();
    });
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns);

    // After the driver's first read and before its write, another writer changes the
    // Deployment (a field of its own: no field manager conflict).
    let reads = Arc::new(AtomicU32::new(0));
    let hook: Hook = {
        let (reads, deployments) = (Arc::clone(&reads), deployments.clone());
        Arc::new(move || {
            let first = reads.fetch_add(1, Ordering::SeqCst) == 0;
            let deployments = deployments.clone();
            Box::pin(async move {
                if first {
                    let theirs = json!({
                        "apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": "capstan-web",
                            "annotations": {"example.com/owner": "ops"}},
                    });
                    deployments
                        .patch(
                            "capstan-web",
                            &PatchParams::apply("ops"),
                            &Patch::Apply(theirs),
                        )
                        .await
                        .expect("change the Deployment in between");
                }
            })
        })
    };
    d.test_hooks().set_between_read_and_write(hook);
    cluster
        .block_on(d.stop(r1))
        .expect("the stop succeeds once it read the Deployment again");
    // Only a 409 from a write over what it read makes the driver read again (more
    // than twice when the deployment controller's status write also came in between).
    let stop_reads = reads.load(Ordering::SeqCst);
    assert!(
        stop_reads >= 2,
        "read, 409, read again, written: {stop_reads} reads"
    );
    let live = cluster.block_on(deployments.get("capstan-web")).unwrap();
    assert_eq!(live.spec.as_ref().unwrap().replicas, Some(0));
    let annotations = live.metadata.annotations.unwrap();
    assert_eq!(
        annotations["example.com/owner"], "ops",
        "their change stays"
    );

    cluster
        .block_on(d.resume(r1))
        .expect("resume reads it again too");
    assert!(reads.load(Ordering::SeqCst) > stop_reads);
    cluster.stop();
}

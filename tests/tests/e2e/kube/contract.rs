//! The kube driver, called directly under the shipped role, keeps the driver contract
//! (`capstan_driver::testkit`), the launch environment included: the kit reads the
//! env of the Deployment's pod template (what its pods are made with). One Deployment
//! per workload (`docs/kube.md`, *Mapping*): a revision only prepared, or replaced by
//! a newer one, has no backend, where other drivers keep it stopped
//! ([`Kit::one_backend_per_workload`]). A deleted Namespace is observed until the
//! cluster has finalized it, so its deletion is checked here as eventual.

use super::driver::{driver, spec};
use capstan_driver::testkit::{EnvProbe, Kit};
use capstan_driver::{Driver, RevisionRef};
use capstan_kube::objects;
use capstan_tests::kube::KubeCluster;
use capstan_tests::{unique, wait_until, READY};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use std::collections::BTreeMap;
use std::time::Instant;

/// The env of the `main` container of the pod template of a revision's Deployment
/// (which must be on that revision), read by the admin.
struct TemplateEnv(kube::Client);

#[async_trait::async_trait]
impl EnvProbe for TemplateEnv {
    async fn env(&self, rev: RevisionRef<'_>) -> Result<BTreeMap<String, String>, String> {
        let api: Api<Deployment> = Api::namespaced(self.0.clone(), rev.namespace);
        let name = objects::deployment_name(rev.workload);
        let dep = api
            .get(&name)
            .await
            .map_err(|e| format!("get Deployment {name}: {e}"))?;
        let on = objects::revision_of(&dep).map(str::to_string);
        if on.as_deref() != Some(rev.revision) {
            return Err(format!("Deployment {name} is on {on:?}, not {rev}"));
        }
        let template = dep.spec.and_then(|s| s.template.spec);
        let main = template
            .into_iter()
            .flat_map(|t| t.containers)
            .find(|c| c.name == "main")
            .ok_or_else(|| format!("Deployment {name} has no container main"))?;
        main.env
            .into_iter()
            .flatten()
            .map(|e| match e.value_from {
                None => Ok((e.name, e.value.unwrap_or_default())),
                Some(from) => Err(format!("{} is taken from {from:?}", e.name)),
            })
            .collect()
    }
}

#[test]
fn the_driver_keeps_the_contract() {
    let cluster = KubeCluster::start();
    let d = driver(&cluster, "capstan-agent", &[]);
    let ns = unique("kube-kit");
    // Env `MODE`, a name the kit's launch env shares.
    let spec = spec("capstan-test/web:1");
    let probe = TemplateEnv(cluster.client());
    let kit = Kit::new(&d, &ns, spec)
        .with_env_probe(&probe)
        .one_backend_per_workload();
    cluster
        .block_on(kit.run_until_namespace_deletion())
        .unwrap_or_else(|e| panic!("{}", capstan_common::report(&e)));
    // The kit's last rule (`delete_namespace_converges`) wants the namespace no
    // longer observed once `delete_namespace` returns. A Namespace is deleted in the
    // background (`Terminating` until the namespace controller has emptied it), and
    // the driver's `observe` lists it until it is gone: both deletions must succeed,
    // and the namespace must then go by itself.
    let deleted = Instant::now();
    cluster
        .block_on(async {
            d.delete_namespace(&ns).await?;
            d.delete_namespace(&ns).await
        })
        .unwrap_or_else(|e| panic!("delete_namespace twice: {}", e.report()));
    let phase = cluster
        .block_on(Api::<Namespace>::all(cluster.client()).get_opt(&ns))
        .unwrap()
        .and_then(|n| n.status?.phase);
    wait_until(format_args!("{ns} to be no longer observed"), READY, || {
        let observed = cluster.block_on(d.observe()).unwrap();
        !observed.namespaces.contains(&ns)
    });
    eprintln!(
        "{ns}: {phase:?} after delete_namespace, no longer observed {:?} after it",
        deleted.elapsed()
    );
    cluster.stop();
}

//! Grants follow what runs on a real cluster across SIGKILLs at random points
//! ([`crate::nats::grant_loop`]): a controller sends each command until it succeeds
//! while the kube agent is killed at random moments of activations, retires, stops and
//! starts. Afterwards each workload's Deployment is on its last revision, intent runs
//! that revision, and an exec hook's record of every grant and revoke shows exactly
//! those revisions holding grants.

use crate::nats::crash::kills;
use crate::nats::grant_loop::{plan, under_kills};
use crate::nats::Fleet;
use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::hooks::{assert_grants_follow, grant_recorder};
use capstan_tests::kube::KubeCluster;
use capstan_tests::unique;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};
use std::collections::BTreeSet;

const WORKLOADS: usize = 2;
/// A run lives up to 1.5 s: a command with a rollout takes 0.1–1 s here.
const MAX_LIFE_MS: u64 = 1_500;

#[test]
fn grants_follow_what_the_cluster_runs_across_sigkills_at_random_points() {
    let kills = kills(8);
    let rounds = (kills / 2).max(4);
    let cluster = KubeCluster::start();
    let kubeconfig = cluster.agent_kubeconfig("capstan-agent", &[]);
    let fleet = Fleet::start();
    let agent: Agent = fleet
        .join(
            Agent::builder(&unique("kgrantloop"))
                .kube(&kubeconfig)
                .hook(grant_recorder("sleep 0.1; exit 0")),
        )
        .build();
    let plan = plan(&agent.commands("ns"), WORKLOADS, rounds, |_, rev| {
        Spec::docker(&format!("capstan-test/web:{rev}")).with("driver", "kube")
    });
    let daemon = under_kills(&fleet.coordinator, &agent, &plan, kills, MAX_LIFE_MS);

    let (ok, verify) = agent.verify();
    assert!(ok && verify.starts_with("ok "), "log verify: {verify}");
    let last = format!("r{rounds}");
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "ns");
    let deployments = cluster
        .block_on(api.list(&ListParams::default()))
        .expect("list the Deployments")
        .items;
    let running: BTreeSet<_> = deployments
        .iter()
        .filter(|d| d.spec.as_ref().and_then(|s| s.replicas) != Some(0))
        .map(|d| {
            let name = d.metadata.name.clone().unwrap_or_default();
            let wl = name.trim_start_matches("capstan-").to_string();
            let rev = capstan_kube::objects::revision_of(d).unwrap_or_default();
            (wl, rev.to_string())
        })
        .collect();
    let want: BTreeSet<_> = (0..WORKLOADS)
        .map(|w| (format!("w{w}"), last.clone()))
        .collect();
    assert_eq!(running, want, "each Deployment runs its last revision");
    let intent = agent.intent();
    for (wl, rev) in &want {
        let w = &intent["workloads"][format!("ns/{wl}")];
        assert_eq!(w["active_revision"], rev.as_str(), "{wl}: {w}");
        assert_eq!(w["intent"], "running", "{wl}: {w}");
    }
    assert_grants_follow(&agent, &running);
    daemon.stop();
    fleet.stop();
    cluster.stop();
}

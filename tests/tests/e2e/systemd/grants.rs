//! Grants follow what runs across SIGKILLs at random points, on a real systemd
//! ([`crate::nats::grant_loop`]): afterwards each workload's last revision's unit is
//! active, every retired one is gone, and an exec hook's record of every grant and
//! revoke shows exactly the running revisions holding grants.

use super::spec_running;
use crate::nats::crash::kills;
use crate::nats::grant_loop::{plan, under_kills};
use crate::nats::Fleet;
use capstan_driver::RevisionRef;
use capstan_systemd::naming;
use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::hooks::{assert_grants_follow, grant_recorder};
use capstan_tests::systemd::SystemdHost;
use capstan_tests::unique;
use std::collections::BTreeSet;

const WORKLOADS: usize = 3;
/// A run lives up to 1 s: systemd commands with a hook take 0.05–0.5 s.
const MAX_LIFE_MS: u64 = 1_000;

#[test]
fn grants_follow_what_runs_across_sigkills_at_random_points() {
    let host = SystemdHost::boot();
    // Enough work for every kill: about 10 commands a round, 4 rounds at least.
    let kills = kills(8);
    let rounds = (kills / 2).max(4);
    let fleet = Fleet::start();
    let builder = Agent::builder(&unique("sdgrantloop")).systemd(&host);
    let agent = fleet.join(builder.hook(grant_recorder("exit 0"))).build();
    let plan = plan(&agent.commands("ns"), WORKLOADS, rounds, |wl, rev| {
        Spec::from(spec_running(&host, "ns", wl)).env("REV", rev)
    });
    let daemon = under_kills(&fleet.coordinator, &agent, &plan, kills, MAX_LIFE_MS);

    let (ok, verify) = agent.verify();
    assert!(ok && verify.starts_with("ok "), "log verify: {verify}");
    let mut running = BTreeSet::new();
    for w in 0..WORKLOADS {
        let workload = format!("w{w}");
        for round in 1..=rounds {
            let revision = format!("r{round}");
            let unit = naming::unit_name(RevisionRef {
                namespace: "ns",
                workload: &workload,
                revision: &revision,
            });
            let state = host.property(&unit, "ActiveState");
            if round == rounds {
                assert_eq!(state, "active", "{unit}: {}", host.log());
                running.insert((workload.clone(), revision));
            } else {
                assert_eq!(
                    host.property(&unit, "LoadState"),
                    "not-found",
                    "{unit} retired"
                );
            }
        }
    }
    assert_grants_follow(&agent, &running);
    daemon.stop();
    fleet.stop();
}

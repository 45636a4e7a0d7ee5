//! Grants follow what runs across SIGKILLs at random points, on the real engines
//! ([`crate::nats::grant_loop`]): afterwards each workload runs its last revision, and
//! an exec hook's record of every grant and revoke shows exactly the running revisions
//! holding grants — every grant of a revision that stopped was revoked.

use crate::nats::crash::kills;
use crate::nats::grant_loop::{plan, under_kills};
use crate::nats::Fleet;
use capstan_tests::docker::{agent, serve, Engine};
use capstan_tests::hooks::{assert_grants_follow, grant_recorder};
use std::collections::BTreeSet;

capstan_tests::each_engine!(grants_follow_what_runs_across_sigkills_at_random_points);

const WORKLOADS: usize = 3;
/// A run lives up to 1.5 s: docker commands with a hook take 0.1–1 s.
const MAX_LIFE_MS: u64 = 1_500;

fn grants_follow_what_runs_across_sigkills_at_random_points(engine: Engine) {
    // Enough work for every kill: about 10 commands a round, 4 rounds at least.
    let kills = kills(8);
    let rounds = (kills / 2).max(4);
    let fleet = Fleet::start();
    let agent = fleet
        .join(agent(engine, "grantloop").hook(grant_recorder("exit 0")))
        .build();
    let plan = plan(&agent.commands(&agent.host), WORKLOADS, rounds, |_, rev| {
        serve(rev)
    });
    let daemon = under_kills(&fleet.coordinator, &agent, &plan, kills, MAX_LIFE_MS);

    let (ok, verify) = agent.verify();
    assert!(ok && verify.starts_with("ok "), "log verify: {verify}");
    let last = format!("r{rounds}");
    let containers = agent.containers();
    let running: BTreeSet<_> = containers
        .iter()
        .filter(|c| c.running)
        .map(|c| (c.workload.clone(), c.revision.clone()))
        .collect();
    let want: BTreeSet<_> = (0..WORKLOADS)
        .map(|w| (format!("w{w}"), last.clone()))
        .collect();
    assert_eq!(
        running, want,
        "each workload runs its last revision: {containers:?}"
    );
    assert_eq!(
        containers.len(),
        WORKLOADS,
        "retired ones removed: {containers:?}"
    );
    assert_grants_follow(&agent, &running);
    // A graceful stop then stops them (docker: the agent manages their lifecycle).
    daemon.stop();
    fleet.stop();
}

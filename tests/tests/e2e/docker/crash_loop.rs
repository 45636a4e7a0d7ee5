//! The crash loop over NATS on the docker driver (the sim's is `nats::crash`, whose
//! helpers this reuses): a stream of commands to one agent, SIGKILLed at random
//! moments of its work `CAPSTAN_CRASH_KILLS` times (5 here; the full run 200,
//! docs/benchmarks.md) and started again. Afterwards every command was received and
//! completed exactly once and succeeded, every activation and start logged one
//! `workload_started`, `log verify` is ok, the intent is the model's, `CAPSTAN_EVT`
//! holds every record once — and the engine holds exactly what the intent says: one
//! container per workload, its last revision, running; every retired one gone.

use crate::nats::crash::{every_command_once, kill_loop, kills, stream};
use crate::nats::Fleet;
use capstan_tests::docker::{agent, serve, Engine};

capstan_tests::each_engine!(commands_over_nats_complete_exactly_once_across_sigkills);

/// A docker command takes tens to hundreds of milliseconds: a run lives up to 1.5 s
/// after its chunk was posted, so kills land anywhere in a chunk's work.
const MAX_LIFE_US: u64 = 1_500_000;

fn commands_over_nats_complete_exactly_once_across_sigkills(engine: Engine) {
    let kills = kills(5);
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let agent = fleet.join(agent(engine, "crashloop")).build();
    let host = agent.host.clone();
    // Namespaces (networks) named after the unique host: tests sharing the engine
    // never meet.
    let rounds = (kills / 4).max(3);
    let (lines, starts, expected) =
        stream(&agent, rounds, &format!("{host}-"), |_, _, rev| serve(rev));
    kill_loop(coordinator, &agent, &lines, kills, MAX_LIFE_US);

    let daemon = agent.run();
    every_command_once(coordinator, &agent, &host, &lines, &starts, &expected);
    let last = format!("r{rounds}");
    let containers = agent.containers();
    for key in expected.keys() {
        let workload = key.rsplit('/').next().expect("namespace/workload");
        let of: Vec<_> = containers
            .iter()
            .filter(|c| c.workload == workload)
            .collect();
        assert_eq!(
            of.len(),
            1,
            "{key}: one container, retired ones removed: {of:?}"
        );
        assert_eq!(of[0].revision, last, "{key}: {of:?}");
        assert!(of[0].running, "{key}: {of:?}");
    }
    assert_eq!(containers.len(), expected.len(), "{containers:?}");
    eprintln!("{kills} kills on {}", engine.name());
    daemon.stop();
    fleet.stop();
}

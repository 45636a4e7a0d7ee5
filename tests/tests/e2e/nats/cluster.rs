//! A rollout over a three-node JetStream cluster (`replicas = 3` everywhere) while one
//! server is SIGKILLed mid-rollout and later restarted: every command is carried out
//! exactly once, every record of every host reaches CAPSTAN_EVT exactly once, the
//! coordinator answers again after a bounded failover, and the killed server rejoins.
//!
//! Two victims: the JetStream meta leader (the cluster's API: stream and consumer
//! create/info, placement), whatever streams it leads too; and the leader of
//! `CAPSTAN_COMMANDS` (which stores the commands the agents read by position),
//! moved first to a node that is not the meta leader, so that only the data path
//! fails over. (In a fresh cluster the meta leader usually leads some streams as
//! well, so the first is the harsher test and the second the one that isolates the
//! command stream.)
//!
//! And the migration: a layout made with `replicas = 1` is scaled to three by a
//! coordinator configured with `replicas = 3`.

use capstan_tests::agent::Agent;
use capstan_tests::command::{Cmd, Spec};
use capstan_tests::nats::{Coordinator, Keys, NatsCluster};
use capstan_tests::process::Process;
use capstan_tests::{wait_until, READY};
use serde_json::Value;
use std::time::{Duration, Instant};

const HOSTS: [&str; 3] = ["h1", "h2", "h3"];
/// How long the coordinator may answer 503 (or a submit or wait fail for want of
/// NATS) after a server of the cluster died.
const FAILOVER: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
enum Victim {
    MetaLeader,
    StreamLeader(&'static str),
}

#[test]
fn a_rollout_survives_the_loss_of_the_meta_leader() {
    rollout_losing(Victim::MetaLeader);
}

#[test]
fn a_rollout_survives_the_loss_of_the_command_stream_leader() {
    rollout_losing(Victim::StreamLeader("CAPSTAN_COMMANDS"));
}

/// The commands of `host`, in order: its namespace, then `web` r1 and r2 prepared and
/// activated.
fn rollout(agent: &Agent, host: &str) -> Vec<Cmd> {
    let c = agent.commands("shop");
    vec![
        c.ensure_namespace(&format!("ns.{host}")),
        c.prepare(&format!("p1.{host}"), "web", "r1", Spec::sim()),
        c.activate(&format!("a1.{host}"), "web", "r1"),
        c.prepare(&format!("p2.{host}"), "web", "r2", Spec::sim()),
        c.activate(&format!("a2.{host}"), "web", "r2"),
    ]
}

fn rollout_losing(victim: Victim) {
    let mut cluster = NatsCluster::start(3);
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&cluster.url(), &keys, "replicas = 3");
    let agents: Vec<Agent> = HOSTS
        .iter()
        .map(|h| {
            Agent::builder(h)
                .nats(&cluster.url())
                .nats_extra("replicas = 3")
                .signing(&keys.public)
                .registered_with(&coordinator.url, &coordinator.token)
                .build()
        })
        .collect();
    let daemons: Vec<Process> = agents.iter().map(Agent::run).collect();

    // `replicas = 3`: every stream and bucket of the layout has three replicas, all
    // current.
    for stream in LAYOUT {
        assert_replicas(&cluster, stream, 3);
    }

    let plans: Vec<Vec<Cmd>> = agents
        .iter()
        .zip(HOSTS)
        .map(|(a, h)| rollout(a, h))
        .collect();
    // The namespaces first, with the whole cluster up.
    for plan in &plans {
        submit(&coordinator, &plan[0]);
    }
    for plan in &plans {
        assert_succeeded(&coordinator, plan[0].id());
    }

    // Mid-rollout: the first preparations are published, then a server dies.
    for plan in &plans {
        submit(&coordinator, &plan[1]);
    }
    let meta = cluster.leader();
    let killed = match victim {
        Victim::MetaLeader => meta,
        Victim::StreamLeader(stream) => cluster.lead_stream_elsewhere(stream, meta),
    };
    let cmd_leader = cluster.stream_leader("CAPSTAN_COMMANDS");
    let evt_leader = cluster.stream_leader("CAPSTAN_EVT");
    eprintln!(
        "cluster: meta leader {}, CAPSTAN_COMMANDS leader {}, CAPSTAN_EVT leader {}; killing {} ({victim:?})",
        cluster.name(meta),
        cluster.name(cmd_leader),
        cluster.name(evt_leader),
        cluster.name(killed)
    );
    if let Victim::StreamLeader(_) = victim {
        assert_ne!(killed, meta, "the stream leader is not the meta leader");
    }
    cluster.kill(killed);
    let killed_at = Instant::now();

    // The rest of the rollout goes in while the cluster fails over.
    for plan in &plans {
        for command in &plan[2..] {
            submit(&coordinator, command);
        }
    }
    // The coordinator answers again (a 503 meanwhile is allowed, for a bounded time).
    retry_nats(&coordinator, &["hosts"], "capstan hosts");
    eprintln!(
        "the coordinator answered again {:?} after the kill",
        killed_at.elapsed()
    );
    // A new meta leader among the survivors; the streams have leaders again.
    let new_meta = cluster.leader();
    assert_ne!(new_meta, killed);
    for plan in &plans {
        for command in &plan[1..] {
            assert_succeeded(&coordinator, command.id());
        }
    }
    eprintln!(
        "every command succeeded {:?} after the kill",
        killed_at.elapsed()
    );

    // The killed server rejoins: current again, the cluster has 3 current peers.
    // (Waited on, each: right after a rejoin a peer may be catching up for a moment,
    // which a one-off check once caught on a loaded CI machine.)
    cluster.restart(killed);
    for i in 0..3 {
        cluster.wait_current(i);
    }

    // Everything each agent logged is in CAPSTAN_EVT before the agents stop (the
    // heartbeat's `last_seq` says how far the log is); then the log, stopped, must be
    // exactly the host's events.
    for host in HOSTS {
        wait_until(
            format_args!("{host}'s records in CAPSTAN_EVT"),
            READY,
            || {
                let beat = host_beat(&coordinator, host)?;
                // (A 503 while the cluster settles is a retry, not a failure.)
                let events = coordinator.try_events(host)?;
                (events.last().map(|e| &e["seq"]) == Some(&beat["last_seq"])).then_some(())
            },
        );
    }
    for daemon in daemons {
        daemon.stop();
    }
    for ((agent, host), plan) in agents.iter().zip(HOSTS).zip(&plans) {
        let local = agent.log();
        let events = wait_until(
            format_args!("{host}: every record of its log in CAPSTAN_EVT"),
            READY,
            || {
                let events = coordinator.try_events(host)?;
                (events.len() >= local.len()).then_some(events)
            },
        );
        assert_eq!(events.len(), local.len(), "{host}: {events:?}");
        for (i, (e, l)) in events.iter().zip(&local).enumerate() {
            assert_eq!(e["seq"], (i + 1) as u64, "{host}: {e}");
            assert_eq!(e["host"], host);
            assert_eq!(
                (&e["seq"], &e["kind"], &e["prev_hash"], &e["command_id"]),
                (&l["seq"], &l["kind"], &l["prev_hash"], &l["command_id"]),
                "{host}: record {}",
                i + 1
            );
        }

        // Each command once: received once, completed once, never rejected; the
        // coordinator says succeeded, from one completion.
        for command in plan {
            let id = command.id();
            let count = |kind: &str| {
                local
                    .iter()
                    .filter(|r| r["kind"] == kind && r["command_id"] == id)
                    .count()
            };
            assert_eq!(count("command_received"), 1, "{host} {id}: {local:?}");
            assert_eq!(count("command_completed"), 1, "{host} {id}: {local:?}");
            assert_eq!(count("command_rejected"), 0, "{host} {id}: {local:?}");
            let status = coordinator.cli_json(&["status", id], 0);
            assert_eq!(status["status"], "succeeded", "{status}");
            let completions = status["events"]
                .as_array()
                .expect("events")
                .iter()
                .filter(|e| e["kind"] == "command_completed")
                .count();
            assert_eq!(completions, 1, "{status}");
        }
        // The effects too: each revision started once.
        let sim = agent.sim_host();
        for revision in ["shop/web@r1", "shop/web@r2"] {
            assert_eq!(sim["revisions"][revision]["starts"], 1, "{host}: {sim}");
        }
    }
    coordinator.stop();
    cluster.stop();
}

/// The streams and buckets (their streams) of the layout.
const LAYOUT: [&str; 4] = [
    "CAPSTAN_COMMANDS",
    "CAPSTAN_EVT",
    "KV_capstan_commands",
    "KV_capstan_host_keys",
];

/// Waits until `stream` has `replicas` replicas, all current (its leader and
/// `replicas - 1` others); asserts its config says so.
#[track_caller]
fn assert_replicas(cluster: &NatsCluster, stream: &str, replicas: usize) {
    let s = wait_until(
        format_args!("{stream} with {replicas} current replicas"),
        READY,
        || {
            cluster.stream(stream).filter(|s| {
                s["config"]["num_replicas"] == replicas
                    && s["cluster"]["replicas"].as_array().map_or(0, Vec::len) + 1 == replicas
                    && s["cluster"]["replicas"]
                        .as_array()
                        .is_none_or(|r| r.iter().all(|r| r["current"] == true))
            })
        },
    );
    assert_eq!(s["config"]["num_replicas"], replicas, "{stream}: {s}");
}

#[test]
fn a_coordinator_scales_an_r1_layout_to_its_replicas() {
    let cluster = NatsCluster::start(3);
    let keys = Keys::generate();
    // The default, `replicas = 1`: every stream and bucket on one server.
    let r1 = Coordinator::start(&cluster.url(), &keys, "");
    for stream in LAYOUT {
        assert_replicas(&cluster, stream, 1);
    }
    r1.stop();
    // A coordinator with `replicas = 3` migrates them on its first request.
    let r3 = Coordinator::start(&cluster.url(), &keys, "replicas = 3");
    for stream in LAYOUT {
        assert_replicas(&cluster, stream, 3);
    }
    // Commands go through the scaled layout.
    let agent = Agent::builder("h1")
        .nats(&cluster.url())
        .nats_extra("replicas = 3")
        .signing(&keys.public)
        .registered_with(&r3.url, &r3.token)
        .build();
    let daemon = agent.run();
    submit(&r3, &agent.commands("shop").ensure_namespace("ns"));
    assert_succeeded(&r3, "ns");
    daemon.stop();
    r3.stop();
    cluster.stop();
}

/// Whether a failed `capstan` call failed for want of NATS (a 503 from the
/// coordinator: `nats_unavailable`, `nats_error`), which the failover may cause.
fn nats_failure(out: &std::process::Output) -> bool {
    let stderr = String::from_utf8_lossy(&out.stderr);
    out.status.code() == Some(2)
        && (stderr.contains("nats_unavailable") || stderr.contains("nats_error"))
}

/// Runs `capstan ARGS` until it succeeds, retrying NATS failures for at most
/// [`FAILOVER`]; any other failure fails the test. Returns its JSON answer.
#[track_caller]
fn retry_nats(coordinator: &Coordinator, args: &[&str], what: &str) -> Value {
    let started = Instant::now();
    let mut refused = 0;
    wait_until(format_args!("{what} to succeed"), FAILOVER, || {
        let out = coordinator.cli(args);
        if out.status.success() {
            if refused > 0 {
                eprintln!("{what}: {refused} NATS failures in {:?}", started.elapsed());
            }
            return Some(serde_json::from_slice(&out.stdout).expect("capstan --json output"));
        }
        refused += 1;
        assert!(
            nats_failure(&out),
            "{what} failed {:?} into the failover, not for want of NATS: {} {}",
            started.elapsed(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        None
    })
}

/// Submits `command` (without `issued_at`), retrying NATS failures: a re-post of the
/// same id and content is the same command (the coordinator re-publishes it, the
/// agent answers it from its log).
#[track_caller]
fn submit(coordinator: &Coordinator, command: &Cmd) {
    let file = coordinator.write(
        &format!("{}.json", command.id()),
        &command.clone().without("issued_at").to_string(),
    );
    let v = retry_nats(
        coordinator,
        &["submit", file.to_str().expect("path")],
        &format!("submit {}", command.id()),
    );
    assert_eq!(v["id"], command.id(), "{v}");
}

/// Waits for command `id` to be done and asserts it succeeded.
#[track_caller]
fn assert_succeeded(coordinator: &Coordinator, id: &str) {
    let done = retry_nats(
        coordinator,
        &["wait", id, "--timeout", "60s"],
        &format!("wait {id}"),
    );
    assert_eq!(done["status"], "succeeded", "{done}");
}

/// `host`'s last heartbeat in `capstan hosts`, if the coordinator lists one.
fn host_beat(coordinator: &Coordinator, host: &str) -> Option<Value> {
    let hosts = coordinator.cli_json(&["hosts"], 0);
    hosts["hosts"]
        .as_array()?
        .iter()
        .find(|h| h["host"] == host)
        .map(|h| h["beat"].clone())
        .filter(|b| !b.is_null())
}

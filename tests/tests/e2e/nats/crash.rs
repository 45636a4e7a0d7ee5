//! The crash loop over NATS: a stream of commands queued for one agent, which is
//! SIGKILLed at random points of its log and started again, `CAPSTAN_CRASH_KILLS` times
//! (20 here; the full run 200, docs/benchmarks.md). Afterwards every command was
//! received and completed exactly once and succeeded, every activation started its
//! workload once, `log verify` is ok, the intent is the one the command stream implies
//! (computed here, independently of the agent), and `CAPSTAN_EVT` holds every record
//! of the log exactly once, equal to the host's own (`capstan verify`).

use super::Fleet;
use capstan_tests::agent::Agent;
use capstan_tests::command::{Cmd, Spec};
use capstan_tests::nats::Coordinator;
use capstan_tests::{wait_until, Rng, READY};
use serde_json::{json, Value};
use std::collections::HashMap;

const NAMESPACES: usize = 4;
const WORKLOADS: usize = 12;

/// The stream: each workload's revisions prepared, activated and the previous one
/// retired, round after round, and every second round stopped and started, in the
/// namespaces `<prefix>ns0`… Each revision's spec is `spec(namespace, workload,
/// revision)` with env `ROUND`. Returns the commands, the ids that start a workload, and the expected
/// intent of each workload (`namespace/workload` → its answer in `intent --json`).
pub(crate) fn stream(
    agent: &Agent,
    rounds: usize,
    prefix: &str,
    spec: impl Fn(&str, &str, &str) -> Spec,
) -> (Vec<Cmd>, Vec<String>, HashMap<String, Value>) {
    let mut lines = Vec::new();
    let mut starts = Vec::new();
    let namespace = |n: usize| format!("{prefix}ns{}", n % NAMESPACES);
    for n in 0..NAMESPACES {
        let ns = namespace(n);
        lines.push(agent.commands(&ns).ensure_namespace(&ns));
    }
    for round in 1..=rounds {
        for w in 0..WORKLOADS {
            let (ns, wl) = (namespace(w), format!("w{w}"));
            let c = agent.commands(&ns);
            let id = |what: &str| format!("{wl}.{round}.{what}");
            let rev = format!("r{round}");
            let spec = spec(&ns, &wl, &rev).env("ROUND", &round.to_string());
            lines.push(c.prepare(&id("prepare"), &wl, &rev, spec));
            lines.push(c.activate(&id("activate"), &wl, &rev));
            starts.push(id("activate"));
            if round > 1 {
                lines.push(c.retire(&id("retire"), &wl, &format!("r{}", round - 1)));
            }
            if round % 2 == 0 {
                lines.push(c.stop(&id("stop"), &wl));
                lines.push(c.start(&id("start"), &wl));
                starts.push(id("start"));
            }
        }
    }
    // The model: the last round's revision runs, every earlier one is retired.
    let mut revisions = serde_json::Map::new();
    for round in 1..rounds {
        revisions.insert(format!("r{round}"), "retired".into());
    }
    revisions.insert(format!("r{rounds}"), "active".into());
    let expected = (0..WORKLOADS)
        .map(|w| {
            let key = format!("{}/w{w}", namespace(w));
            let intent = json!({"intent": "running", "active_revision": format!("r{rounds}"),
                                "failed": null, "revisions": revisions.clone()});
            (key, intent)
        })
        .collect();
    (lines, starts, expected)
}

/// How long a run lives at most after its chunk was posted, in microseconds.
const MAX_LIFE_US: u64 = 4_000;

/// Queues `commands` for the host through the coordinator (JSON lines, one `submit`).
pub(crate) fn submit(coordinator: &Coordinator, n: usize, commands: &[Cmd]) {
    if commands.is_empty() {
        return;
    }
    let text: Vec<String> = commands
        .iter()
        .map(|c| c.clone().without("issued_at").to_string())
        .collect();
    let file = coordinator.write(&format!("chunk-{n}.jsonl"), &(text.join("\n") + "\n"));
    let out = coordinator.cli(&["submit", file.to_str().expect("path")]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn commands_over_nats_complete_exactly_once_across_sigkills_of_the_agent() {
    let kills = kills(20);
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let host = capstan_tests::unique("crashloop");
    let agent = fleet.agent(&host).build();
    // About 11 commands a kill (44 a round).
    let (lines, starts, expected) = stream(&agent, (kills / 4).max(5), "", |_, _, _| Spec::sim());
    kill_loop(coordinator, &agent, &lines, kills, MAX_LIFE_US);

    // Started once more, it works through what is left.
    let daemon = agent.run();
    every_command_once(coordinator, &agent, &host, &lines, &starts, &expected);
    eprintln!("{kills} kills");
    daemon.stop();
    fleet.stop();
}

/// The number of kills: `CAPSTAN_CRASH_KILLS`, else `short` (the CI run's).
pub(crate) fn kills(short: usize) -> usize {
    std::env::var("CAPSTAN_CRASH_KILLS").map_or(short, |v| v.parse().expect("a number"))
}

/// Feeds `lines` to the agent in `kills` chunks, one while each run takes commands
/// (the commands arrive one by one as `submit` posts them), and SIGKILLs the run
/// within `max_life_us` after the last was posted: at a random point of its work on
/// them, a chaos schedule rather than a wait for anything. Returns how many kills
/// landed mid-command (a command received, not completed); none fails the test.
pub(crate) fn kill_loop(
    coordinator: &Coordinator,
    agent: &Agent,
    lines: &[Cmd],
    kills: usize,
    max_life_us: u64,
) -> usize {
    let mut rng = Rng::from_env_or_time("crashloop");
    let chunk = lines.len().div_ceil(kills);
    let mut mid_command = 0;
    let mut queued = 0;
    for kill in 0..kills {
        let next = &lines[queued.min(lines.len())..(queued + chunk).min(lines.len())];
        queued += next.len();
        let daemon = agent.run();
        // Ready before NATS (it serves its local API offline): the chunk is for
        // a run that hears its bells.
        daemon.wait_for_text("connected to NATS");
        submit(coordinator, kill, next);
        let spin = std::time::Instant::now();
        let life = std::time::Duration::from_micros(rng.below(max_life_us));
        // Long lives (a slow driver's) sleep first, leaving the CPU to the agent;
        // the last millisecond is spun, to land anywhere in it.
        std::thread::sleep(life.saturating_sub(std::time::Duration::from_millis(1)));
        while spin.elapsed() < life {
            std::hint::spin_loop();
        }
        mid_command += usize::from(killed_mid_command(agent, daemon, kill));
    }
    assert_eq!(queued, lines.len());
    eprintln!("{mid_command} of {kills} kills landed mid-command");
    assert!(
        mid_command > 0,
        "no kill landed mid-command: nothing was tested"
    );
    mid_command
}

/// SIGKILLs `daemon` (asserting it was running and died of it) and says whether the
/// kill landed mid-command: the log shows a command received and not completed.
pub(crate) fn killed_mid_command(
    agent: &Agent,
    daemon: capstan_tests::process::Process,
    kill: usize,
) -> bool {
    daemon.kill();
    let intent = agent.intent();
    let cut = intent["in_flight"]
        .as_object()
        .is_some_and(|o| !o.is_empty());
    eprintln!(
        "kill {kill}: SIGKILL at log seq {}{}",
        intent["applied_seq"],
        if cut { ", mid-command" } else { "" }
    );
    cut
}

/// Waits until every command of `lines` succeeded, then asserts each was received and
/// completed once, each of `starts` started its workload once and nothing else did,
/// `log verify` is ok, the intent's workloads are `expected`, and `CAPSTAN_EVT` holds
/// the whole log once, equal to the host's (`capstan verify`).
pub(crate) fn every_command_once(
    coordinator: &Coordinator,
    agent: &Agent,
    host: &str,
    lines: &[Cmd],
    starts: &[String],
    expected: &HashMap<String, Value>,
) {
    for c in lines {
        let status = coordinator.cli_json(&["wait", c.id(), "--timeout", "120s"], 0);
        assert_eq!(status["status"], "succeeded", "{status}");
    }
    let (ok, verify) = agent.verify();
    assert!(ok && verify.starts_with("ok "), "log verify: {verify}");

    let log = agent.log();
    let mut received: HashMap<&str, usize> = HashMap::new();
    let mut completed: HashMap<&str, usize> = HashMap::new();
    let mut started: HashMap<&str, usize> = HashMap::new();
    for r in &log {
        let id = r["command_id"].as_str().unwrap_or_default();
        match r["kind"].as_str().expect("kind") {
            "command_received" => *received.entry(id).or_default() += 1,
            "command_completed" => {
                assert_eq!(r["outcome"], "succeeded", "{r}");
                *completed.entry(id).or_default() += 1;
            }
            "workload_started" if !id.is_empty() => *started.entry(id).or_default() += 1,
            _ => {}
        }
    }
    for c in lines {
        assert_eq!(received.get(c.id()), Some(&1), "{} received once", c.id());
        assert_eq!(completed.get(c.id()), Some(&1), "{} completed once", c.id());
    }
    assert_eq!(
        (received.len(), completed.len()),
        (lines.len(), lines.len())
    );
    for id in starts {
        assert_eq!(
            started.get(id.as_str()),
            Some(&1),
            "{id} started its workload once"
        );
    }
    assert_eq!(started.len(), starts.len(), "no other start by a command");

    let intent = agent.intent();
    assert_eq!(intent["in_flight"], json!({}));
    let workloads = intent["workloads"].as_object().expect("workloads");
    assert_eq!(workloads.len(), expected.len());
    for (key, want) in expected {
        assert_eq!(&workloads[key], want, "{key}");
    }

    // The central copy: every record once, equal to the host's.
    let verdict = wait_until("CAPSTAN_EVT to hold the whole log", READY, || {
        let v = coordinator.cli_json(&["verify", host], 0);
        (v["published_seq"] == v["host_seq"]).then_some(v)
    });
    assert_eq!(verdict["result"], "ok", "{verdict}");
    assert_eq!(verdict["compared"], verdict["host_seq"], "{verdict}");
    assert_eq!(log.last().expect("records")["seq"], log.len() as u64);
    // The daemon runs on: the backend's own news (an engine's late `die` event) may
    // have been recorded since the log was read, never a command's record.
    let compared = verdict["compared"].as_u64().expect("a count") as usize;
    assert!(compared >= log.len(), "{verdict}");
    for r in agent
        .log()
        .iter()
        .skip(log.len())
        .take(compared - log.len())
    {
        assert!(
            r["command_id"].is_null(),
            "a command's record after all completed: {r}"
        );
        eprintln!("recorded after the log was read: {r}");
    }
    eprintln!(
        "{} commands, each once; {} records, each once in CAPSTAN_EVT",
        lines.len(),
        log.len()
    );
}

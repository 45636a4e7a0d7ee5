//! Crash safety: SIGKILL `capstan-agent apply` at random moments while it works
//! through thousands of commands; re-applying the same file must complete every
//! command exactly once, keep the chain intact and reach the expected intent.

use capstan_tests::agent::Agent;
use capstan_tests::command::{Cmd, Spec};
use capstan_tests::Rng;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};

const NAMESPACES: usize = 5;
const WORKLOADS: usize = 50;
const ROUNDS: usize = 30;
/// Kills spread over the first half of the script…
const KILLS: usize = 20;
/// …and, when none of them landed mid-command (how often one does depends on the
/// machine's load), more over what is left, up to this many in all.
const MAX_KILLS: usize = 60;

/// Rounds of prepare → activate → retire-previous (and every third round stop →
/// start), interleaved across workloads. Returns the lines and, per kind, the ids.
fn script(agent: &Agent) -> (Vec<Cmd>, Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut starts = Vec::new(); // ids of activate_revision and start_workload
    let mut retires = Vec::new();
    for n in 0..NAMESPACES {
        lines.push(
            agent
                .commands(&format!("ns{n}"))
                .ensure_namespace(&format!("ns{n}")),
        );
    }
    for round in 1..=ROUNDS {
        for w in 0..WORKLOADS {
            let (c, wl) = (
                agent.commands(&format!("ns{}", w % NAMESPACES)),
                format!("w{w}"),
            );
            let id = |what: &str| format!("{wl}.{round}.{what}");
            let spec = Spec::sim()
                .with("image", format!("app:{round}"))
                .command(&["serve"])
                .env("ROUND", &round.to_string());
            let rev = format!("r{round}");
            lines.push(c.prepare(&id("prepare"), &wl, &rev, spec));
            lines.push(c.activate(&id("activate"), &wl, &rev));
            starts.push(id("activate"));
            if round > 1 {
                lines.push(c.retire(&id("retire"), &wl, &format!("r{}", round - 1)));
                retires.push(id("retire"));
            }
            if round % 3 == 0 {
                lines.push(c.stop(&id("stop"), &wl));
                lines.push(c.start(&id("start"), &wl));
                starts.push(id("start"));
            }
        }
    }
    (lines, starts, retires)
}

#[test]
fn every_command_completes_exactly_once_across_sigkills() {
    let agent = Agent::builder("crash-host").build();
    let (lines, start_ids, retire_ids) = script(&agent);
    assert!(lines.len() >= 5000, "{} commands", lines.len());
    let mut rng = Rng::from_env_or_time("crash");

    let mut done = 0usize; // answers every run gets back before it reaches new commands
    let mut mid_command = 0usize;
    let mut kill = 0usize;
    while kill < KILLS || (mid_command == 0 && kill < MAX_KILLS) {
        // Fed through a pipe held open until after the kill.
        let (mut apply, feed) = agent.start_apply_fed(&lines);
        // Kill after a random number of answers past what is already done (at most
        // all but the last, so the reads below always end), plus a random
        // sub-millisecond delay so the kill lands inside a command, not only between
        // two. The first KILLS kills spread over the first half of the script, any
        // more over the rest: a busy machine may make every one of the first land
        // between commands, and the later ones still have commands to land in.
        let spread = if kill < KILLS {
            lines.len() / (2 * KILLS)
        } else {
            (lines.len() - done) / (MAX_KILLS - kill)
        };
        let target = (done + 1 + rng.below(spread.max(1) as u64 * 2) as usize).min(lines.len() - 1);
        let mut seen = 0;
        let mut reader = BufReader::new(apply.stdout());
        let mut line = String::new();
        while seen < target {
            line.clear();
            if reader.read_line(&mut line).expect("read apply output") == 0 {
                break; // it died: `kill` below says how
            }
            seen += 1;
        }
        let spin = std::time::Instant::now();
        let delay = std::time::Duration::from_micros(rng.below(1500));
        while spin.elapsed() < delay {
            std::hint::spin_loop();
        }
        // Asserts it was still running and that SIGKILL ended it.
        apply.kill();
        feed.close();
        let answered = seen + reader.lines().count();
        // The kill landed mid-command when the first unanswered command was received
        // and not completed.
        let state = match lines.get(answered) {
            Some(next) if agent.in_progress(next.id()) => {
                mid_command += 1;
                "mid-command"
            }
            // Between commands, or after a completion and before its answer.
            Some(_) => "not mid-command",
            None => "after the last answer",
        };
        done = done.max(answered);
        eprintln!("kill {kill}: SIGKILL after {answered} answers, {state}");
        kill += 1;
    }
    eprintln!("{mid_command} of {kill} kills landed mid-command");
    assert!(
        mid_command > 0,
        "no kill of {kill} landed mid-command: nothing was tested"
    );

    // Apply the same file to the end.
    agent.apply_ok(&lines);

    let (ok, verify) = agent.verify();
    assert!(ok && verify.starts_with("ok "), "log verify: {verify}");

    // Every command received once and completed once, successfully.
    let log = agent.log();
    let mut received: HashMap<String, usize> = HashMap::new();
    let mut completed: HashMap<String, usize> = HashMap::new();
    let mut started: HashMap<String, usize> = HashMap::new();
    let mut retired: HashMap<String, usize> = HashMap::new();
    for r in &log {
        let id = r["command_id"].as_str().unwrap_or_default().to_string();
        match r["kind"].as_str().unwrap() {
            "command_received" => *received.entry(id).or_default() += 1,
            "command_completed" => {
                assert_eq!(r["outcome"], "succeeded", "{r}");
                *completed.entry(id).or_default() += 1
            }
            "workload_started" if !id.is_empty() => *started.entry(id).or_default() += 1,
            "revision_retired" => *retired.entry(id).or_default() += 1,
            _ => {}
        }
    }
    assert_eq!(received.len(), lines.len());
    assert!(
        received.values().all(|n| *n == 1),
        "a command was received twice"
    );
    assert_eq!(completed.len(), lines.len());
    assert!(
        completed.values().all(|n| *n == 1),
        "a command was completed twice"
    );
    assert_eq!(
        started.len(),
        start_ids.len(),
        "one workload_started per activation/start"
    );
    for id in &start_ids {
        assert_eq!(started.get(id), Some(&1), "workload_started for {id}");
    }
    for id in &retire_ids {
        assert_eq!(retired.get(id), Some(&1), "revision_retired for {id}");
    }

    // The intent is the expected one, and so is the simulated host.
    let intent = agent.intent();
    assert_eq!(intent["in_flight"], serde_json::json!({}));
    let host = agent.sim_host();
    for w in 0..WORKLOADS {
        let key = format!("ns{}/w{w}", w % NAMESPACES);
        let wl = &intent["workloads"][&key];
        assert_eq!(wl["intent"], "running", "{key}: {wl}");
        assert_eq!(wl["active_revision"], format!("r{ROUNDS}"), "{key}");
        let on_host: Vec<&str> = host["revisions"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with(&format!("{key}@")))
            .map(String::as_str)
            .collect();
        assert_eq!(
            on_host,
            vec![format!("{key}@r{ROUNDS}")],
            "only the active revision remains"
        );
        assert_eq!(
            host["revisions"][format!("{key}@r{ROUNDS}")]["state"],
            "running"
        );
    }
}

//! Crash safety: SIGKILL `capstan-agent apply` at random moments while it works
//! through thousands of commands; re-applying the same file must complete every
//! command exactly once, keep the chain intact and reach the expected intent.

use capstan_tests::agent::{command, Agent};
use capstan_tests::Rng;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

const NAMESPACES: usize = 5;
const WORKLOADS: usize = 50;
const ROUNDS: usize = 30;
const KILLS: usize = 20;

/// Rounds of prepare → activate → retire-previous (and every third round stop →
/// start), interleaved across workloads. Returns the lines and, per kind, the ids.
fn script(host: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut starts = Vec::new(); // ids of activate_revision and start_workload
    let mut retires = Vec::new();
    for n in 0..NAMESPACES {
        lines.push(command(
            host,
            &format!("ns{n}"),
            &format!(r#""op":"ensure_namespace","namespace":"ns{n}""#),
        ));
    }
    for round in 1..=ROUNDS {
        for w in 0..WORKLOADS {
            let (ns, wl) = (format!("ns{}", w % NAMESPACES), format!("w{w}"));
            let at = |op: &str| format!(r#""op":"{op}","namespace":"{ns}","workload":"{wl}""#);
            let id = |what: &str| format!("{wl}.{round}.{what}");
            let spec = format!(
                r#""spec":{{"driver":"sim","image":"app:{round}","command":["serve"],"env":{{"ROUND":"{round}"}}}}"#
            );
            lines.push(command(
                host,
                &id("prepare"),
                &format!(r#"{},"revision":"r{round}",{spec}"#, at("prepare_revision")),
            ));
            lines.push(command(
                host,
                &id("activate"),
                &format!(r#"{},"revision":"r{round}""#, at("activate_revision")),
            ));
            starts.push(id("activate"));
            if round > 1 {
                lines.push(command(
                    host,
                    &id("retire"),
                    &format!(r#"{},"revision":"r{}""#, at("retire_revision"), round - 1),
                ));
                retires.push(id("retire"));
            }
            if round % 3 == 0 {
                lines.push(command(host, &id("stop"), &at("stop_workload")));
                lines.push(command(host, &id("start"), &at("start_workload")));
                starts.push(id("start"));
            }
        }
    }
    (lines, starts, retires)
}

#[test]
fn every_command_completes_exactly_once_across_sigkills() {
    let agent = Agent::new("crash-host");
    let (lines, start_ids, retire_ids) = script(&agent.host);
    assert!(lines.len() >= 5000, "{} commands", lines.len());
    let input = agent.write_input("commands.jsonl", &lines);
    let mut rng = Rng::from_env_or_time("crash");

    let mut done = 0usize; // commands known completed (non-duplicate answers seen)
    for kill in 0..KILLS {
        let mut child = agent
            .command()
            .arg("apply")
            .arg(&input)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn apply");
        // Kill after a random number of answers past what is already done, plus a
        // random sub-millisecond delay so the kill lands inside a command, not only
        // between two.
        let target = done + 1 + rng.below(lines.len() as u64 / KILLS as u64 * 2) as usize;
        let mut seen = 0;
        let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        while seen < target {
            line.clear();
            if reader.read_line(&mut line).expect("read apply output") == 0 {
                break;
            }
            seen += 1;
        }
        let spin = std::time::Instant::now();
        let delay = std::time::Duration::from_micros(rng.below(1500));
        while spin.elapsed() < delay {
            std::hint::spin_loop();
        }
        child.kill().expect("SIGKILL apply");
        child.wait().expect("reap apply");
        done = done.max(seen.saturating_sub(1));
        eprintln!("kill {kill}: after {seen} answers");
    }

    // Apply the same file to the end.
    let (out, results) = agent.apply(&input);
    assert!(
        out.status.success(),
        "final apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(results.len(), lines.len());
    for r in &results {
        assert_eq!(r["outcome"], "succeeded", "{r}");
    }

    let (ok, verify) = agent.verify();
    assert!(ok && verify.starts_with("ok "), "log verify: {verify}");

    // Every command received once and completed once, successfully.
    let log = agent.log_json();
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
    let host: serde_json::Value =
        serde_json::from_slice(&std::fs::read(agent.data_dir().join("sim-host.json")).unwrap())
            .unwrap();
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

//! `fleet`: a rollout to N simulated hosts over a three-node JetStream cluster
//! (`replicas = 3` for every stream and bucket), for each N of `--fleet-sizes`.
//!
//! For each size: three nats-servers (the harness's `NatsCluster`) on the documented
//! secure layout — an account per host (`capstan-coordinator nats-config`) —, a
//! coordinator, and `capstan-agent sim-fleet` processes of at most
//! `--fleet-per-process` hosts each, started at once, each host connecting with its
//! own nkey (`--nats-credentials`); every host's key registered; every host alive in
//! `GET /v1/hosts`.
//! Then one rollout, three steps, each `capstan --json rollout FILE --hosts alive`
//! (the CLI, as an operator runs it): ensure a namespace, prepare a revision, activate
//! it. Measured: each step's wall time, the coordinator's CPU and memory over the
//! rollout, `GET /v1/hosts` at that size, and every host's heartbeats throughout (a
//! watch of the hosts bucket: the longest any host went without a beat, against the
//! coordinator's `stale_after_secs`). A size that fails ends the curve there, with
//! why.
//!
//! The figure is the largest size's slowest step; the baseline the same step time at
//! the smallest size scaled by the hosts (what linear growth would give); ratio < 1
//! is better than linear.

use crate::cpu;
use crate::Args;
use anyhow::Context as _;
use capstan_common::nats_layout;
use capstan_tests::agent::Agent;
use capstan_tests::nats::{alive_count, Accounts, Coordinator, Keys, NatsCluster};
use capstan_tests::process::Process;
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the fleet processes may take to start every host.
const START_TIMEOUT: Duration = Duration::from_secs(900);
/// Each step must end within this (the target).
const STEP_TARGET_MS: f64 = 10_000.0;

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let mut curve = Vec::new();
    for &hosts in &args.fleet_sizes {
        eprintln!("fleet: {hosts} hosts");
        match size(args, hosts).await {
            Ok(point) => {
                eprintln!("fleet: {hosts} hosts: {point}");
                curve.push(point);
            }
            // A smoke run's tiny size must work: its failure is the run's.
            Err(e) if args.smoke => return Err(e.context(format!("fleet: {hosts} hosts"))),
            Err(e) => {
                eprintln!("fleet: {hosts} hosts failed: {e:#}");
                curve.push(json!({"hosts": hosts, "failed": format!("{e:#}")}));
                break;
            }
        }
    }
    let done: Vec<&Value> = curve.iter().filter(|p| p["failed"].is_null()).collect();
    let slowest = |p: &Value| {
        p["steps_ms"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .fold(0.0, f64::max)
    };
    let (figure, baseline, ratio) = match (done.first(), done.last()) {
        (Some(first), Some(last)) => {
            let scale =
                last["hosts"].as_f64().unwrap_or(1.0) / first["hosts"].as_f64().unwrap_or(1.0);
            let linear = slowest(first) * scale;
            (slowest(last), linear, slowest(last) / linear)
        }
        _ => (0.0, 0.0, 0.0),
    };
    let largest = done.last().map(|p| p["hosts"].clone()).unwrap_or(json!(0));
    let met = done.last().is_some_and(|p| {
        p["hosts"] == json!(10_000)
            && slowest(p) < STEP_TARGET_MS
            && p["beats"]["longest_gap_s"].as_f64().unwrap_or(f64::MAX)
                < p["beats"]["stale_after_s"].as_f64().unwrap_or(0.0)
    });
    println!(
        "{}",
        json!({
            "bench": "fleet",
            "hosts": largest,
            "slowest_step_ms": round(figure),
            "baseline": {
                "what": "the smallest size's slowest step, scaled linearly to the largest",
                "ms": round(baseline),
            },
            "ratio": round(ratio),
            "target": "10,000 hosts, every host succeeded, each step < 10 s, every beat within stale_after (which grows with the fleet's pace: GET /v1/hosts)",
            "met": met,
            "curve": curve,
        })
    );
    Ok(())
}

/// One size: the cluster, coordinator and fleet started, the rollout run, all stopped.
async fn size(args: &Args, hosts: usize) -> anyhow::Result<Value> {
    let per = args.fleet_per_process.max(1);
    let step_timeout = format!("{}s", args.fleet_step_timeout.max(1));
    let prefixes: Vec<(String, usize)> = (0..hosts)
        .step_by(per)
        .enumerate()
        .map(|(n, first)| (format!("f{n}"), per.min(hosts - first)))
        .collect();
    let names: Vec<String> = prefixes
        .iter()
        .flat_map(|(prefix, count)| crate::stack::sim_names(*count, prefix))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // With replicas = 3 the fleet's account holds the command stream three times.
    let accounts = Accounts::generate_with(&names, "1G", "8G");
    let cluster = NatsCluster::start_with(3, Some(&accounts.config()));
    let keys = Keys::generate();
    let coordinator_nats = format!("replicas = 3\n{}", accounts.nats_lines("coordinator"));
    let coordinator = Coordinator::start(&cluster.url(), &keys, &coordinator_nats);
    let credentials = accounts.credentials_dir().display().to_string();
    let t = Instant::now();
    let mut fleets: Vec<(Agent, Process, usize)> = Vec::new();
    for (prefix, count) in prefixes {
        // The shared config names no credentials: each host connects with its own.
        let config = Agent::builder(&prefix)
            .without_hooks()
            .nats(&cluster.url())
            .nats_extra("replicas = 3")
            .signing(&keys.public)
            .build();
        let process =
            config.spawn_sim_fleet_with(count, &prefix, &["--nats-credentials", &credentials]);
        fleets.push((config, process, count));
    }
    for (config, process, _) in &fleets {
        capstan_tests::wait_until("a sim fleet ready", START_TIMEOUT, || {
            if let Some(code) = process.exited() {
                panic!("sim-fleet ended ({code}): {}", tail(&process.stderr()));
            }
            process.stderr().contains("sim fleet ready")
        });
        let keys = config.data_dir().join(capstan_agent::sim_fleet::KEYS_FILE);
        let out = coordinator.cli(&["register", "--file", &keys.display().to_string()]);
        anyhow::ensure!(
            out.status.success(),
            "capstan register --file: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let started_s = t.elapsed().as_secs_f64();
    let beats = Beats::watch(&cluster.url(), &accounts.seed("coordinator")).await?;
    let http = reqwest::Client::new();
    let list = |http: reqwest::Client| {
        let url = format!("{}/v1/hosts", coordinator.url);
        let token = coordinator.token.clone();
        async move {
            let t = Instant::now();
            let v: Value = http
                .get(url)
                .bearer_auth(token)
                .send()
                .await?
                .json()
                .await?;
            anyhow::Ok((v, t.elapsed()))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    let (list_ms, pace) = loop {
        let (v, took) = list(http.clone()).await?;
        let alive = alive_count(&v);
        if alive == hosts {
            let pace = (v["beat_secs"].clone(), v["stale_after_secs"].clone());
            break (took.as_secs_f64() * 1000.0, pace);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{alive} of {hosts} hosts alive after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let alive_s = t.elapsed().as_secs_f64();
    eprintln!("fleet: {hosts} hosts alive in {alive_s:.1} s (GET /v1/hosts {list_ms:.0} ms)");
    // Where the machine's CPU goes with the fleet idle (heartbeats, consumers), then
    // during the rollout.
    let processes = Processes {
        nats: cluster.pids(),
        fleets: fleets.iter().map(|(_, p, _)| p.id()).collect(),
        coordinator: coordinator.pid(),
    };
    let idle_from = processes.ticks()?;
    let idle_t = Instant::now();
    // A smoke run only checks the window is measured.
    tokio::time::sleep(if args.smoke { SMOKE_IDLE } else { IDLE }).await;
    let idle = processes.percent(&idle_from, idle_t.elapsed())?;
    eprintln!("fleet: {hosts} hosts idle: CPU % {idle}");
    let rollout_from = processes.ticks()?;

    let pid = coordinator.pid();
    let rollout_t = Instant::now();
    let beats_from = beats.longest_gap();
    let steps = [
        json!({"id": format!("fleet{hosts}-ns"), "op": "ensure_namespace", "namespace": "shop"}),
        json!({"id": format!("fleet{hosts}-p1"), "op": "prepare_revision", "namespace": "shop",
            "workload": "web", "revision": "r1", "spec": {"driver": "sim"}}),
        json!({"id": format!("fleet{hosts}-a1"), "op": "activate_revision", "namespace": "shop",
            "workload": "web", "revision": "r1"}),
    ];
    let mut steps_ms = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let file = coordinator.write(&format!("step-{i}.json"), &step.to_string());
        let t = Instant::now();
        let url = coordinator.url.clone();
        let token = coordinator.token.clone();
        let step_timeout = step_timeout.clone();
        // The CLI's own `--timeout` ends it first; this bounds a CLI that hangs.
        let bound = Duration::from_secs(args.fleet_step_timeout.max(1) + 60);
        let out = tokio::task::spawn_blocking(move || {
            capstan_tests::nats::capstan_cli_within(
                &url,
                &token,
                &[
                    "rollout",
                    &file.display().to_string(),
                    "--hosts",
                    "alive",
                    "--timeout",
                    &step_timeout,
                ],
                bound,
            )
        })
        .await?;
        let took = t.elapsed().as_secs_f64() * 1000.0;
        let summary: Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "capstan rollout (step {i}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        anyhow::ensure!(
            out.status.success() && summary["succeeded"] == json!(hosts),
            "step {i}: {} of {hosts} succeeded (exit {:?})",
            summary["succeeded"],
            out.status.code()
        );
        eprintln!("fleet: {hosts} hosts: step {i} in {took:.0} ms");
        steps_ms.push(round(took));
    }
    let rollout_s = rollout_t.elapsed().as_secs_f64();
    let busy = processes.percent(&rollout_from, rollout_t.elapsed())?;
    let cpu_s = processes.seconds(&rollout_from)?[2];
    let coordinator_memory = memory(pid)?;
    let rss = |pids: &[u32]| -> anyhow::Result<f64> {
        Ok(round(
            pids.iter()
                .map(|&p| memory(p).map(|m| m.0))
                .sum::<anyhow::Result<f64>>()?,
        ))
    };
    let rss_mib =
        json!({"nats_servers": rss(&processes.nats)?, "sim_fleets": rss(&processes.fleets)?});
    let gap = beats.longest_gap().max(beats_from);
    let beats_seen = beats.hosts();
    beats.stop();

    for (_, process, _) in fleets {
        process.stop();
    }
    coordinator.stop();
    cluster.stop();
    Ok(json!({
        "hosts": hosts,
        "processes": hosts.div_ceil(per),
        "start_s": round(started_s),
        "all_alive_s": round(alive_s),
        "hosts_list_ms": round(list_ms),
        "steps_ms": steps_ms,
        "rollout_s": round(rollout_s),
        "coordinator": {
            "cpu_s": round(cpu_s),
            "cpu_percent": round(cpu_s / rollout_s * 100.0),
            "cpu_ms_per_command": (cpu_s * 1e6 / (hosts * steps.len()) as f64).round() / 1000.0,
            "rss_mib": coordinator_memory.0,
            "peak_rss_mib": coordinator_memory.1,
        },
        "cpu_percent_idle": idle,
        "rss_mib": rss_mib,
        "cpu_percent_rollout": busy,
        "beats": {
            "hosts_seen": beats_seen,
            "longest_gap_s": round(gap),
            "beat_s": pace.0,
            "stale_after_s": pace.1,
        },
    }))
}

/// How long the fleet is watched idle, all hosts alive, before the rollout.
const IDLE: Duration = Duration::from_secs(10);
/// [`IDLE`] in a smoke run.
const SMOKE_IDLE: Duration = Duration::from_secs(1);

/// The processes of one size's run, for the CPU each kind used.
struct Processes {
    nats: Vec<u32>,
    fleets: Vec<u32>,
    coordinator: u32,
}

impl Processes {
    /// utime + stime of each kind: nats-servers, sim-fleets, coordinator.
    fn ticks(&self) -> anyhow::Result<[u64; 3]> {
        let sum =
            |pids: &[u32]| -> anyhow::Result<u64> { pids.iter().map(|&p| cpu::ticks(p)).sum() };
        Ok([
            sum(&self.nats)?,
            sum(&self.fleets)?,
            cpu::ticks(self.coordinator)?,
        ])
    }

    /// Seconds of CPU each kind used since `from`.
    fn seconds(&self, from: &[u64; 3]) -> anyhow::Result<[f64; 3]> {
        let now = self.ticks()?;
        let per_s = cpu::ticks_per_second()?;
        Ok(std::array::from_fn(|i| (now[i] - from[i]) as f64 / per_s))
    }

    /// The CPU each kind used since `from`, over `elapsed`, in % of one core (the
    /// machine has `nproc` × 100 %).
    fn percent(&self, from: &[u64; 3], elapsed: Duration) -> anyhow::Result<Value> {
        let used = self.seconds(from)?;
        let pct = |i: usize| round(used[i] / elapsed.as_secs_f64() * 100.0);
        Ok(json!({"nats_servers": pct(0), "sim_fleets": pct(1), "coordinator": pct(2)}))
    }
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn memory(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |field: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((round(kib("VmRSS:") / 1024.0), round(kib("VmHWM:") / 1024.0)))
}

/// Every host's beats, watched on their subjects (`capstan.v1.beat.*`): the longest any host
/// went without one, between two beats or since its last.
struct Beats {
    last: Arc<Mutex<HashMap<String, Instant>>>,
    longest: Arc<Mutex<Duration>>,
    task: tokio::task::JoinHandle<()>,
}

impl Beats {
    /// As the coordinators' user (`seed`): the beats reach the fleet's account.
    async fn watch(url: &str, seed: &str) -> anyhow::Result<Beats> {
        let servers = url
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<async_nats::ServerAddr>, _>>()?;
        let client = async_nats::ConnectOptions::with_nkey(seed.to_string())
            .connect(servers)
            .await?;
        let mut beats = client.subscribe(nats_layout::beat_subject("*")).await?;
        let last: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let longest: Arc<Mutex<Duration>> = Arc::default();
        let (l, g) = (last.clone(), longest.clone());
        let task = tokio::spawn(async move {
            let _client = client;
            while let Some(m) = beats.next().await {
                let host = m.subject.rsplit('.').next().unwrap_or_default().to_string();
                let now = Instant::now();
                if let Some(before) = l.lock().expect("beats").insert(host, now) {
                    let mut g = g.lock().expect("gap");
                    *g = (*g).max(now - before);
                }
            }
        });
        Ok(Beats {
            last,
            longest,
            task,
        })
    }

    /// The longest gap so far, counting each host's time since its last beat.
    fn longest_gap(&self) -> f64 {
        let now = Instant::now();
        let since_last = self
            .last
            .lock()
            .expect("beats")
            .values()
            .map(|t| now - *t)
            .max()
            .unwrap_or_default();
        (*self.longest.lock().expect("gap"))
            .max(since_last)
            .as_secs_f64()
    }

    fn hosts(&self) -> usize {
        self.last.lock().expect("beats").len()
    }

    fn stop(self) {
        self.task.abort();
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

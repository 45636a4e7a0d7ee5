//! The soak: mixed commands on one sim agent over NATS for `CAPSTAN_SOAK_SECS`
//! seconds (45 here; the full run 1800 with `CAPSTAN_TEST_TIMEOUT=2400`,
//! docs/benchmarks.md), retention on. Generation after generation, each of
//! [`NAMESPACES`] namespaces is made, its workloads prepared, activated, rolled to a
//! second revision, stopped, started and retired, and the namespace deleted — so the
//! intent is bounded and what grows is the log alone, which retention must bound.
//!
//! After each generation it samples the agent's RSS (`VmRSS`) and the data dir's disk
//! use, prints the curve, and asserts boundedness by shape, not by time: the largest
//! sample of the last third is at most [`GROWTH`] times the largest of the first
//! third plus [`SLACK_KB`] (a leak of a few KiB a generation grows past it over the
//! run; noise does not: it is the peak, not a rate) — for the data dir, less what the
//! log keeps of each command pruned since ([`DISK_BYTES_PER_PRUNED_ID`]). And by count: after the load the
//! log keeps at most `max_records` plus one snapshot interval, every pruned record is
//! in exactly one export file, and the exports, with `log export` of the rest, verify
//! as one chain from record 1 against the log.

use super::Fleet;
use capstan_tests::agent::Agent;
use capstan_tests::command::{Cmd, Spec};
use capstan_tests::{wait_until, READY};
use std::path::Path;
use std::time::{Duration, Instant};

const NAMESPACES: usize = 4;
const WORKLOADS: usize = 6;
/// `[log.retention] max_records`.
const MAX_RECORDS: u64 = 1000;
/// The log's snapshot interval (`LogOptions::default`): records after the newest
/// snapshot are never pruned.
const SNAPSHOT_EVERY: u64 = 1024;
/// The last third's peak may be this many times the first third's…
const GROWTH: f64 = 1.5;
/// … plus this much (KiB): sled's page cache and allocator arenas settle in steps.
const SLACK_KB: u64 = 8 * 1024;
/// The data dir's bound: the records kept (`MAX_RECORDS + SNAPSHOT_EVERY`, plus one
/// generation) at most this many bytes each on disk, sled's write amplification and
/// segments included, plus [`DISK_FIXED_KB`] for sled's own files and the sim host.
const DISK_BYTES_PER_RECORD: u64 = 8 * 1024;
const DISK_FIXED_KB: u64 = 16 * 1024;
/// What the log keeps of each command it prunes (`pruned_ids`: id, content hash,
/// outcome), at most this many bytes on disk: kept `pruned_ids_max_age_secs` (at least
/// 7 days, `docs/retention.md`), so within a run the data dir grows by this much a
/// command — by design, not a leak — on top of the records retention bounds.
/// (Measured: about 1.2 KiB a command, 2026-12-04.)
const DISK_BYTES_PER_PRUNED_ID: u64 = 4 * 1024;

/// One generation's commands; the ids to wait for (each namespace's delete, which runs
/// after everything else in it and only once no revision there is live).
fn generation(agent: &Agent, g: usize) -> (Vec<Cmd>, Vec<String>) {
    let mut lines = Vec::new();
    let mut last = Vec::new();
    for n in 0..NAMESPACES {
        let ns = format!("ns{n}");
        let c = agent.commands(&ns);
        let id = |what: &str| format!("g{g}.{ns}.{what}");
        lines.push(c.ensure_namespace(&id("ensure")));
        for w in (0..WORKLOADS).filter(|w| w % NAMESPACES == n) {
            let wl = format!("w{w}");
            let id = |what: &str| format!("g{g}.{wl}.{what}");
            let spec = |r: &str| Spec::sim().env("GEN", &g.to_string()).env("REV", r);
            lines.push(c.prepare(&id("prepare1"), &wl, "r1", spec("r1")));
            lines.push(c.activate(&id("activate1"), &wl, "r1"));
            lines.push(c.prepare(&id("prepare2"), &wl, "r2", spec("r2")));
            lines.push(c.activate(&id("activate2"), &wl, "r2"));
            lines.push(c.retire(&id("retire1"), &wl, "r1"));
            lines.push(c.stop(&id("stop"), &wl));
            lines.push(c.start(&id("start"), &wl));
            lines.push(c.retire(&id("retire2"), &wl, "r2"));
        }
        lines.push(c.delete_namespace(&id("delete")));
        last.push(id("delete"));
    }
    (lines, last)
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The disk space the files under `dir` use, in KiB.
fn disk_kb(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue; // removed meanwhile (sled's segments come and go)
        };
        total += if meta.is_dir() {
            disk_kb(&entry.path())
        } else {
            meta.blocks() * 512 / 1024
        };
    }
    total
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    secs: u64,
    generation: usize,
    /// Commands sent so far.
    commands: usize,
    rss_kb: u64,
    disk_kb: u64,
}

/// The largest of `f` over the first and over the last third of `samples`.
fn thirds(samples: &[Sample], f: impl Fn(&Sample) -> u64) -> (u64, u64) {
    let third = (samples.len() / 3).max(1);
    let first = samples[..third].iter().map(&f).max().unwrap_or(0);
    let last = samples[samples.len() - third..]
        .iter()
        .map(&f)
        .max()
        .unwrap_or(0);
    (first, last)
}

#[test]
fn rss_and_disk_stay_bounded_under_mixed_commands_with_retention() {
    let secs: u64 = std::env::var("CAPSTAN_SOAK_SECS").map_or(45, |v| v.parse().expect("a number"));
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let host = capstan_tests::unique("soak");
    let exports = tempfile::tempdir().expect("export dir");
    let agent = fleet
        .agent(&host)
        .extra_toml(&format!(
            "[log.retention]\nmax_records = {MAX_RECORDS}\nexport_dir = {:?}\ninterval_secs = 1\n",
            exports.path().display().to_string()
        ))
        .build();
    let daemon = agent.run();
    let pid = daemon.id();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut commands = 0;
    let mut g = 0;
    // Warm-up: one generation before the first sample.
    while g == 0 || started.elapsed() < Duration::from_secs(secs) {
        let (lines, last) = generation(&agent, g);
        super::crash::submit(coordinator, g, &lines);
        commands += lines.len();
        for id in &last {
            let status = coordinator.cli_json(&["wait", id, "--timeout", "120s"], 0);
            assert_eq!(status["status"], "succeeded", "{status}");
        }
        if g > 0 {
            samples.push(Sample {
                secs: started.elapsed().as_secs(),
                generation: g,
                commands,
                rss_kb: rss_kb(pid),
                disk_kb: disk_kb(&agent.data_dir()),
            });
        }
        g += 1;
    }
    assert!(
        samples.len() >= 6,
        "too few generations for a curve: {samples:?}"
    );
    let step = (samples.len() / 30).max(1);
    eprintln!("soak curve (s, generation, RSS KiB, data dir KiB):");
    for s in samples.iter().step_by(step).chain(samples.last()) {
        eprintln!(
            "  {:>5} {:>6} {:>8} {:>8}",
            s.secs, s.generation, s.rss_kb, s.disk_kb
        );
    }

    // After the load, retention catches up: the log keeps at most `max_records` and
    // the records after the newest snapshot.
    let kept_bound = MAX_RECORDS + SNAPSHOT_EVERY;
    let verify = wait_until("retention to bound the log", READY, || {
        let (ok, text) = agent.verify();
        assert!(ok, "log verify: {text}");
        let kept: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
        (text.contains("from anchor seq") && kept <= kept_bound).then_some(text)
    });
    let (rss_first, rss_last) = thirds(&samples, |s| s.rss_kb);
    let (disk_first, disk_last) = thirds(&samples, |s| s.disk_kb);
    let ids_kb = |n: usize| n as u64 * DISK_BYTES_PER_PRUNED_ID / 1024;
    let disk_bound =
        DISK_FIXED_KB + (kept_bound + 200) * DISK_BYTES_PER_RECORD / 1024 + ids_kb(commands);
    // The disk may grow by the pruned ids of the commands sent after the first third.
    let third = (samples.len() / 3).max(1);
    let later = commands - samples[third - 1].commands;
    eprintln!(
        "soak: {secs} s, {g} generations, {commands} commands; RSS peak first third {rss_first} KiB, last third {rss_last} KiB; data dir peak {disk_first} KiB then {disk_last} KiB (bound {disk_bound} KiB); {}",
        verify.trim()
    );
    let bounded = |first: u64, last: u64| (last as f64) <= first as f64 * GROWTH + SLACK_KB as f64;
    assert!(
        bounded(rss_first, rss_last),
        "RSS grew: {rss_first} → {rss_last} KiB"
    );
    assert!(
        bounded(disk_first, disk_last.saturating_sub(ids_kb(later))),
        "disk grew: {disk_first} → {disk_last} KiB, more than the ids of {later} commands pruned since"
    );
    assert!(
        disk_last <= disk_bound,
        "data dir {disk_last} KiB over {disk_bound} KiB"
    );

    // The central copy agrees with what the host kept, compared after its anchor.
    let verdict = coordinator.cli_json(&["verify", &host], 0);
    assert_eq!(verdict["result"], "ok", "{verdict}");
    assert!(
        verdict["anchor_seq"].as_u64().is_some_and(|a| a > 0),
        "{verdict}"
    );
    assert!(verdict["compared"].as_u64() > Some(0), "{verdict}");

    // Every record once: the retention exports, then `log export` of the rest, verify
    // as one chain from record 1 (the agent stopped first: no prune in between).
    daemon.stop();
    let rest = exports.path().join("rest.jsonl");
    agent.cli_ok(&["log", "export", "-o", rest.to_str().expect("path")]);
    let host_dir = exports.path().join(&host);
    let mut files: Vec<String> = std::fs::read_dir(&host_dir)
        .expect("export files")
        .map(|e| e.expect("entry").path().display().to_string())
        .collect();
    files.push(rest.display().to_string());
    let mut args = vec!["log", "verify", "--export"];
    args.extend(files.iter().map(String::as_str));
    let out = String::from_utf8(agent.cli_ok(&args)).expect("utf-8");
    assert!(out.contains("linked from the first record"), "{out}");
    eprintln!("exports: {} files; {}", files.len(), out.trim());

    let intent = agent.intent();
    assert_eq!(intent["workloads"], serde_json::json!({}), "{intent}");
    fleet.stop();
}

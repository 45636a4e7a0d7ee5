//! The crash loop over NATS on the systemd driver (the sim's is `nats::crash`, whose
//! helpers this reuses; docker's `docker::crash_loop`): a stream of commands to one
//! agent on a real systemd, SIGKILLed at random moments of its work
//! `CAPSTAN_CRASH_KILLS` times (20 here, as the sim's, about 45 s; the full run 200,
//! docs/benchmarks.md) and started again. Afterwards every command was received and
//! completed exactly once and succeeded, every activation and start logged one
//! `workload_started`, `log verify` is ok, the intent is the model's, `CAPSTAN_EVT`
//! holds every record once — and systemd holds exactly what the intent says: per
//! workload one unit of ours, its last revision's, loaded, active (running) and
//! enabled, its process the one that started last (with the last round's env); every
//! retired revision's unit gone (not loaded, not running, no file, no drop-ins); in
//! the unit dir nothing else of ours but the namespaces' slices, and exactly the
//! current units enabled.

use super::{dump, spec_running};
use crate::nats::crash::{every_command_once, kill_loop, kills, stream};
use crate::nats::Fleet;
use capstan_driver::RevisionRef;
use capstan_systemd::naming;
use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::systemd::SystemdHost;
use capstan_tests::unique;
use std::collections::BTreeSet;
use std::path::Path;

/// A systemd command takes tens to hundreds of milliseconds (unit files, a reload, a
/// start job): a run lives up to 1 s after its chunk was posted, so kills land
/// anywhere in a chunk's work.
const MAX_LIFE_US: u64 = 1_000_000;

/// Where systemd's links for enabled units are, in the unit dir.
const WANTS: &str = "multi-user.target.wants";

/// The names in `dir`.
fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

#[test]
fn commands_over_nats_complete_exactly_once_across_sigkills_of_the_agent() {
    let kills = kills(20);
    let host = SystemdHost::boot();
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let name = unique("sdcrashloop");
    let agent = fleet.join(Agent::builder(&name).systemd(&host)).build();
    // Namespaces named after the unique host, though the systemd is this test's own.
    let rounds = (kills / 4).max(3);
    let (lines, starts, expected) = stream(&agent, rounds, &format!("{name}-"), |ns, w, _| {
        Spec::from(spec_running(&host, ns, w))
    });
    kill_loop(coordinator, &agent, &lines, kills, MAX_LIFE_US);

    let daemon = agent.run();
    every_command_once(coordinator, &agent, &name, &lines, &starts, &expected);
    let last = rounds.to_string();
    let mut ours = BTreeSet::new();
    for key in expected.keys() {
        let (ns, workload) = key.split_once('/').expect("namespace/workload");
        let unit = |round: usize| {
            naming::unit_name(RevisionRef {
                namespace: ns,
                workload,
                revision: &format!("r{round}"),
            })
        };
        let current = unit(rounds);
        for (property, want) in [
            ("LoadState", "loaded"),
            ("ActiveState", "active"),
            ("SubState", "running"),
            ("UnitFileState", "enabled"),
        ] {
            assert_eq!(host.property(&current, property), want, "{current}");
        }
        let seen = dump(&host, ns, workload);
        assert_eq!(seen["env"]["ROUND"], last.as_str(), "{key} runs r{last}");
        assert_eq!(
            seen["pid"].to_string(),
            host.property(&current, "MainPID"),
            "{key}: its unit's process wrote the last dump"
        );
        // Every retired revision's unit: no file, not loaded, not running.
        let retired: Vec<String> = (1..rounds).map(unit).collect();
        let mut show = vec!["show", "-p", "LoadState,ActiveState"];
        show.extend(retired.iter().map(String::as_str));
        let states = host.systemctl_ok(&show);
        let gone = "LoadState=not-found\nActiveState=inactive";
        assert_eq!(
            states.trim().split("\n\n").collect::<Vec<_>>(),
            vec![gone; retired.len()],
            "{key}'s retired units {retired:?}"
        );
        ours.insert(current.clone());
        ours.insert(naming::dropin_dir(&current));
        ours.insert(naming::slice_name(ns));
    }
    // Loaded units of ours: exactly the current ones (a retired revision's unit is
    // neither loaded nor running).
    let listed = host.systemctl_ok(&[
        "list-units",
        "--all",
        "--plain",
        "--no-legend",
        "--full",
        "capstan-*.service",
    ]);
    let loaded: BTreeSet<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let current: BTreeSet<&str> = ours
        .iter()
        .map(String::as_str)
        .filter(|u| u.ends_with(".service"))
        .collect();
    assert_eq!(loaded, current, "systemd's units of ours:\n{listed}");
    // Enabled (started at boot): exactly the current ones, as intent wants them running.
    let mut files = entries(&host.unit_dir());
    assert!(files.remove(WANTS), "{WANTS} in {files:?}");
    let enabled = entries(&host.unit_dir().join(WANTS));
    assert_eq!(
        enabled.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        current
    );
    assert_eq!(
        files, ours,
        "the unit dir holds the current units and slices"
    );
    eprintln!("{kills} kills on systemd; {} units checked", expected.len());
    daemon.stop();
    fleet.stop();
}

//! The agent package with the **systemd driver** on three fleet hosts, installed with
//! `capstan install`, each with an exec hook owner that grants every workload a
//! placeholder of its own (`docs/hooks.md`). A rollout through the coordinator runs
//! two systemd workloads on every host, each process seeing its spec env and its
//! host's placeholder; a reboot brings the agent back from its enabled unit (ready by
//! notify, the same intent) and the workloads with it; a 30 s partition shows the host
//! `stale`, never `gone`, leaves its workloads running, and once healed its records all
//! reach the coordinator and the commands queued meanwhile run once each; an upgrade
//! restarts every agent and no workload unit.

use super::install::{each, install, started};
use capstan_common::DriverKind;
use capstan_driver::RevisionRef;
use capstan_systemd::naming;
use capstan_tests::command::{Cmd, Commands, Spec};
use capstan_tests::fleet::{Fleet, FleetHost};
use capstan_tests::nats::{Coordinator, Keys, NatsServer};
use capstan_tests::{build_packages, build_packages_as, unique, wait_until, READY};
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

/// How long the partition lasts: what the issue asks for.
const PARTITION: Duration = Duration::from_secs(30);

/// Where each host's hook owner is installed (read-only for the agent: it only runs it).
const HOOK: &str = "/usr/local/lib/capstan/hooks/placeholders";

/// Where each host gets a copy of `packaging/examples/hook-example.sh`, a second owner
/// run as shipped: it keeps its grants in `/var/lib/capstan/hooks/example/`.
const EXAMPLE: &str = "/usr/local/lib/capstan/hooks/example";

/// The workloads of every host.
const WORKLOADS: &[&str] = &["web", "db"];

/// The hook owner of `host`: on `before_workload_start` it grants the workload the
/// placeholder `HOST_GRANT=opaque-<host>.<workload>`; every other call succeeds with
/// nothing to say. Stateless, hence idempotent.
fn hook_script(host: &str) -> String {
    format!(
        "#!/bin/sh\n\
         # capstan hook owner of the fleet test: a placeholder per host and workload.\n\
         req=$(cat)\n\
         case \"$req\" in\n\
         *'\"phase\":\"before_workload_start\"'*)\n\
         \x20   workload=$(printf '%s' \"$req\" | sed -n 's/.*\"workload\":\"\\([^\"]*\\)\".*/\\1/p')\n\
         \x20   printf '{{\"env\":{{\"HOST_GRANT\":\"opaque-%s.%s\"}}}}\\n' '{host}' \"$workload\"\n\
         \x20   ;;\n\
         esac\n\
         exit 0\n"
    )
}

/// The agent.toml of `host`: the systemd driver (its defaults), the hook owner, NATS
/// on the fleet's hub and the coordinator's key.
fn config(host: &str, nats: &str, public_key: &str) -> String {
    format!(
        "host = \"{host}\"\ndriver = \"systemd\"\n\n\
         [systemd]\n# every key at its default: the system bus, /etc/systemd/system\n\n\
         [[hooks]]\nname = \"placeholders\"\nkind = \"exec\"\nargv = [{HOOK:?}]\n\
         phases = [\"before_workload_start\", \"before_workload_stop\"]\n\n\
         [[hooks]]\nname = \"example\"\nkind = \"exec\"\nargv = [{EXAMPLE:?}]\n\
         phases = [\"before_workload_start\", \"before_workload_stop\"]\n\n\
         [nats]\nurl = {nats:?}\n\n[signing]\npublic_keys = [{public_key:?}]\n"
    )
}

/// `workload`'s spec: `/bin/sleep infinity` (its environment is what systemd gave it)
/// with two variables of its own.
fn spec(workload: &str) -> Spec {
    Spec::from(capstan_common::Spec {
        driver: DriverKind::SYSTEMD,
        command: vec!["/bin/sleep".into(), "infinity".into()],
        env: [("SITE", "fleet"), ("WORKLOAD", workload)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
}

/// What `workload`'s process on `host` must see besides systemd's own variables: the
/// spec's env, the host's placeholder and the example owner's.
fn expected_env(host: &str, ns: &str, workload: &str) -> BTreeMap<String, String> {
    [
        ("SITE", "fleet".to_string()),
        ("WORKLOAD", workload.to_string()),
        ("HOST_GRANT", format!("opaque-{host}.{workload}")),
        ("DB_CREDENTIAL", format!("opaque-db.{ns}.{workload}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn unit(ns: &str, workload: &str) -> String {
    naming::unit_name(RevisionRef {
        namespace: ns,
        workload,
        revision: "r1",
    })
}

/// The unit's `MainPID` (asserting it runs) and `ActiveEnterTimestamp`.
#[track_caller]
fn running(host: &FleetHost<'_>, unit: &str) -> (String, String) {
    assert_eq!(
        host.property(unit, "ActiveState"),
        "active",
        "{}: {unit}",
        host.name()
    );
    let pid = host.property(unit, "MainPID");
    assert_ne!(pid, "0", "{}: {unit} has a process", host.name());
    (pid, host.property(unit, "ActiveEnterTimestamp"))
}

/// The environment of `unit`'s main process, read from `/proc/<MainPID>/environ` inside
/// the host, without the variables systemd sets itself.
#[track_caller]
fn environ(host: &FleetHost<'_>, unit: &str) -> BTreeMap<String, String> {
    let (pid, _) = running(host, unit);
    let raw = host.nsenter_ok(&["cat", &format!("/proc/{pid}/environ")]);
    raw.split('\0')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
        .filter(|(name, _)| !crate::systemd::systemd_own(name))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every workload of `host` runs, its process sees exactly its expected env, and the
/// example owner holds its grant on the host's disk.
#[track_caller]
fn assert_envs(host: &FleetHost<'_>, ns: &str) {
    for w in WORKLOADS {
        assert_eq!(
            environ(host, &unit(ns, w)),
            expected_env(host.name(), ns, w),
            "{}: {w}'s process environment",
            host.name()
        );
        let grant = host.path(&format!("/var/lib/capstan/hooks/example/{ns}.{w}"));
        assert_eq!(
            std::fs::read_to_string(&grant).unwrap_or_default(),
            format!("opaque-db.{ns}.{w}"),
            "{}",
            grant.display()
        );
    }
}

/// Each workload's `(MainPID, ActiveEnterTimestamp)` on `host`.
fn units(host: &FleetHost<'_>, ns: &str) -> Vec<(String, String)> {
    WORKLOADS
        .iter()
        .map(|w| running(host, &unit(ns, w)))
        .collect()
}

/// `command` with its id prefixed by its host: ids are the coordinator's keys, one
/// namespace of commands per host.
fn on(host: &str, command: Cmd) -> Cmd {
    let id = format!("{host}.{}", command.id());
    command.with("id", id)
}

/// Submits every command first (hosts work side by side), then waits for each to
/// succeed; returns their ids.
#[track_caller]
fn run_everywhere(coordinator: &Coordinator, commands: &[Cmd]) -> Vec<String> {
    let ids: Vec<String> = commands.iter().map(|c| coordinator.submit(c)).collect();
    for id in &ids {
        let status = coordinator.cli_json(&["wait", id, "--timeout", "120s"], 0);
        assert_eq!(status["status"], "succeeded", "{status}");
    }
    ids
}

/// `host`'s entry in a `/v1/hosts` answer.
fn entry<'v>(hosts: &'v Value, host: &str) -> &'v Value {
    hosts["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .find(|h| h["host"] == host)
        .unwrap_or_else(|| panic!("{host} is in the registry: {hosts}"))
}

/// How many records in `events` about `workload` are of `kind`.
fn count(events: &[Value], kind: &str, workload: &str) -> usize {
    events
        .iter()
        .filter(|e| e["kind"] == kind && e["workload"] == workload)
        .count()
}

/// The records of command `id` of `kind` in `events`.
fn of_command(events: &[Value], id: &str, kind: &str) -> usize {
    events
        .iter()
        .filter(|e| e["kind"] == kind && e["command_id"] == id)
        .count()
}

/// Waits until the coordinator holds every record `host`'s agent logged (as its
/// heartbeat's `last_seq` says, with nothing left in its outbox) and checks they are
/// `1..=last_seq`, each once, in order. Returns them.
#[track_caller]
fn all_events(coordinator: &Coordinator, host: &str) -> Vec<Value> {
    wait_until(
        format_args!("{host}'s records all at the coordinator"),
        READY,
        || {
            let hosts = coordinator.cli_json(&["hosts"], 0);
            let beat = &entry(&hosts, host)["beat"];
            let last = beat["last_seq"].as_u64()?;
            if entry(&hosts, host)["status"] != "alive" || beat["figures"]["outbox_lag"] != 0 {
                return None;
            }
            let events = coordinator.events(host);
            (events.last().and_then(|e| e["seq"].as_u64()) == Some(last)).then_some(events)
        },
    )
    .into_iter()
    .enumerate()
    .map(|(i, e)| {
        assert_eq!(e["seq"], (i + 1) as u64, "{host}: record {i} {e}");
        e
    })
    .collect()
}

#[test]
fn systemd_workloads_with_hook_placeholders_roll_out_on_three_hosts_and_outlive_a_reboot_a_30s_partition_and_an_agent_upgrade(
) {
    let t0 = Instant::now();
    let debs = tempfile::tempdir().expect("a temp dir");
    let deb = build_packages(debs.path()).remove(0);
    let fleet = Fleet::create();
    let mut hosts = super::hosts::boot_all(&fleet, &["sd-a", "sd-b", "sd-c"]);
    let server = NatsServer::start_on(&fleet.hub_addr().to_string());
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, "");
    let ns = unique("fleetsd");

    // Each host: its hook owners on its disk, its config for `capstan install`.
    let work = tempfile::tempdir().expect("a temp dir");
    let configs = work.path().join("configs");
    std::fs::create_dir(&configs).expect("mkdir configs");
    let mut hosts_file = String::new();
    for host in &hosts {
        let hook = host.path(HOOK);
        std::fs::create_dir_all(hook.parent().expect("its dir")).expect("mkdir the hooks dir");
        std::fs::write(&hook, hook_script(host.name())).expect("write the hook");
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let example = host.path(EXAMPLE);
        std::fs::copy(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../packaging/examples/hook-example.sh"
            ),
            &example,
        )
        .expect("copy the example hook");
        std::fs::set_permissions(&example, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        hosts_file.push_str(&format!("root@{}\n", host.addr()));
        std::fs::write(
            configs.join(format!("{}.toml", host.addr())),
            config(host.name(), &server.url(), &keys.public),
        )
        .expect("write a config");
    }
    let hosts_path = work.path().join("hosts");
    std::fs::write(&hosts_path, hosts_file).expect("write the hosts file");
    let known = work.path().join("known_hosts");
    let args = [
        "--hosts-file",
        hosts_path.to_str().expect("path"),
        "--config-dir",
        configs.to_str().expect("path"),
        "--known-hosts",
        known.to_str().expect("path"),
        "--accept-new",
        "--timeout",
        "60s",
    ];
    let (out, err) = install(&coordinator, &fleet, &args, &deb, 0);
    assert_eq!(out, each(&hosts, "installed"), "stderr {err}");
    for host in &hosts {
        let status = host.property("capstan-agent.service", "StatusText");
        let ready = format!("ready: host {}, log seq ", host.name());
        assert!(status.starts_with(&ready), "{status}");
    }
    let registry = coordinator.cli_json(&["hosts"], 0);
    for host in &hosts {
        assert_eq!(
            entry(&registry, host.name())["beat"]["drivers"][0],
            "systemd",
            "{registry}"
        );
    }
    let installed = t0.elapsed();

    // 1. The rollout: namespace, then each workload prepared and activated, on all three.
    let mut rollout = Vec::new();
    for host in &hosts {
        let c = Commands::new(host.name(), &ns);
        rollout.push(on(host.name(), c.ensure_namespace("ns")));
        for w in WORKLOADS {
            rollout.push(on(
                host.name(),
                c.prepare(&format!("p.{w}"), w, "r1", spec(w)),
            ));
            rollout.push(on(host.name(), c.activate(&format!("a.{w}"), w, "r1")));
        }
    }
    run_everywhere(&coordinator, &rollout);
    for host in &hosts {
        assert_envs(host, &ns);
        for w in WORKLOADS {
            assert_eq!(host.property(&unit(&ns, w), "UnitFileState"), "enabled");
        }
    }
    let rolled_out = t0.elapsed();

    // 2. A reboot of sd-a: the agent starts from its enabled unit, ready by notify,
    // with the intent it had; systemd brings the workloads back (enabled units).
    let intent = coordinator.cli_json(&["intent", "sd-a"], 0);
    let agent_before = hosts[0].property("capstan-agent.service", "MainPID");
    assert_eq!(
        hosts[0].property("capstan-agent.service", "UnitFileState"),
        "enabled"
    );
    let units_before = units(&hosts[0], &ns);
    hosts[0].reboot();
    let a = &hosts[0];
    assert_eq!(a.property("capstan-agent.service", "Type"), "notify");
    assert_eq!(a.property("capstan-agent.service", "ActiveState"), "active");
    assert_eq!(a.property("capstan-agent.service", "NRestarts"), "0");
    assert_ne!(a.property("capstan-agent.service", "MainPID"), agent_before);
    let status = a.property("capstan-agent.service", "StatusText");
    assert!(status.starts_with("ready: host sd-a, log seq "), "{status}");
    let again = wait_until("sd-a to answer `intent` again", READY, || {
        let out = coordinator.cli(&["intent", "sd-a"]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).expect("JSON"))
    });
    assert_eq!(again["namespaces"], intent["namespaces"], "{again}");
    for (before, after) in units_before.iter().zip(units(a, &ns)) {
        assert_ne!(before.0, after.0, "a new process after the reboot");
    }
    assert_envs(a, &ns);
    let rebooted = t0.elapsed();

    // 3. sd-b partitioned for 30 s, while a stop and a start of its web are submitted.
    let b = &hosts[1];
    let web = unit(&ns, "web");
    let db = unit(&ns, "db");
    let b_units = units(b, &ns);
    b.partition();
    let began = Instant::now();
    let commands = Commands::new("sd-b", &ns);
    let stop = coordinator.submit(&on("sd-b", commands.stop("stop", "web")));
    let start = coordinator.submit(&on("sd-b", commands.start("start", "web")));
    let mut seen = BTreeMap::<String, u32>::new();
    wait_until("the partition to last 30 s", PARTITION + READY, || {
        let hosts = coordinator.cli_json(&["hosts"], 0);
        let status = entry(&hosts, "sd-b")["status"].as_str().unwrap_or_default();
        assert!(
            status == "alive" || status == "stale",
            "sd-b is {status} while partitioned ({:?} in): {hosts}",
            began.elapsed()
        );
        *seen.entry(status.to_string()).or_default() += 1;
        began.elapsed() >= PARTITION
    });
    let at_end = coordinator.cli_json(&["hosts"], 0);
    assert_eq!(entry(&at_end, "sd-b")["status"], "stale", "{at_end}");
    assert!(seen.contains_key("stale"), "{seen:?}");
    for id in [&stop, &start] {
        assert_eq!(
            coordinator.cli_json(&["status", id], 0)["status"],
            "pending"
        );
    }
    assert_eq!(units(b, &ns), b_units, "its workloads ran on, untouched");
    b.heal();
    let healed = Instant::now();
    for id in [&stop, &start] {
        let status = coordinator.cli_json(&["wait", id, "--timeout", "120s"], 0);
        assert_eq!(status["status"], "succeeded", "{status}");
        let events = status["events"].as_array().expect("events");
        assert_eq!(of_command(events, id, "command_received"), 1, "{status}");
        assert_eq!(of_command(events, id, "command_completed"), 1, "{status}");
    }
    let commands_ran = healed.elapsed();
    // The agent gave its silent connection up (its pings went unanswered) instead of
    // waiting for TCP to revive it: `capstan_common::nats::PING_INTERVAL`.
    let journal = b.journal(&["--unit", "capstan-agent.service", "--output", "cat"]);
    assert!(journal.contains("disconnected from NATS"), "{journal}");
    let (web_pid, _) = running(b, &web);
    assert_ne!(web_pid, b_units[0].0, "web was stopped and started");
    assert_eq!(running(b, &db), b_units[1], "db ran on, untouched");
    assert_envs(b, &ns);
    let events = all_events(&coordinator, "sd-b");
    let caught_up = healed.elapsed();
    assert_eq!(count(&events, "workload_started", "web"), 2, "{events:?}");
    assert_eq!(count(&events, "workload_stopped", "web"), 1, "{events:?}");
    assert_eq!(count(&events, "workload_started", "db"), 1, "{events:?}");
    for id in [&stop, &start] {
        assert_eq!(of_command(&events, id, "command_completed"), 1);
    }
    coordinator.wait_for_hosts("sd-b alive again", |v| {
        entry(v, "sd-b")["status"] == "alive"
    });
    let partitioned = t0.elapsed();

    // 4. An upgrade: every agent a new process, no workload unit restarted.
    let version = format!("{}+systemd-upgrade", env!("CARGO_PKG_VERSION"));
    let newer = build_packages_as(debs.path(), Some(&version)).remove(0);
    let agents = started(&hosts);
    let workloads: Vec<_> = hosts.iter().map(|h| units(h, &ns)).collect();
    let mut upgrade = args.to_vec();
    upgrade.push("--upgrade");
    let (out, err) = install(&coordinator, &fleet, &upgrade, &newer, 0);
    assert_eq!(out, each(&hosts, "upgraded"), "stderr {err}");
    for ((host, (_, before)), (_, after)) in hosts.iter().zip(&agents).zip(started(&hosts)) {
        assert_ne!(*before, after, "{}: a new agent", host.name());
    }
    for (host, before) in hosts.iter().zip(&workloads) {
        assert_eq!(
            &units(host, &ns),
            before,
            "{}: the units ran on through the upgrade",
            host.name()
        );
    }
    let upgraded = t0.elapsed();

    // Every host's log, record for record, is what the coordinator holds (the agent
    // stopped first: the log is the agent's alone while it runs).
    for host in &hosts {
        let at_coordinator = all_events(&coordinator, host.name());
        host.nsenter_ok(&["systemctl", "stop", "capstan-agent"]);
        let local = capstan_tests::parse_lines(
            host.nsenter_ok(&[
                "capstan-agent",
                "--data-dir",
                "/var/lib/capstan",
                "log",
                "--json",
            ])
            .as_bytes(),
        );
        let events = wait_until(
            format_args!("{}'s last records at the coordinator", host.name()),
            READY,
            || {
                let events = coordinator.events(host.name());
                (events.len() >= local.len()).then_some(events)
            },
        );
        assert!(events.len() >= at_coordinator.len());
        assert_eq!(events.len(), local.len(), "{}", host.name());
        for (e, l) in events.iter().zip(&local) {
            assert_eq!(
                (&e["seq"], &e["kind"], &e["prev_hash"]),
                (&l["seq"], &l["kind"], &l["prev_hash"]),
                "{}",
                host.name()
            );
        }
        // One start per activation: the rollout's (and sd-b's start_workload); the
        // reboot, the partition and the upgrade started nothing.
        let starts = if host.name() == "sd-b" { 2 } else { 1 };
        assert_eq!(
            count(&local, "workload_started", "web"),
            starts,
            "{local:?}"
        );
        assert_eq!(count(&local, "workload_started", "db"), 1, "{local:?}");
        // Its workloads outlive the agent (systemd keeps them; the driver leaves
        // their lifecycle to it).
        units(host, &ns);
    }
    eprintln!(
        "fleet::systemd: installed {installed:?}, rolled out {rolled_out:?}, rebooted {rebooted:?}, \
         partition over {partitioned:?} (commands ran {commands_ran:?} and records caught up \
         {caught_up:?} after the heal), upgraded {upgraded:?}, all {:?}",
        t0.elapsed()
    );
    coordinator.stop();
    for host in hosts {
        host.kill();
    }
}

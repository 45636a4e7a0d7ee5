//! The shipped capstan-agent package (`packaging/deb/build.sh`, from this build's
//! binaries) on a fleet host: `dpkg -i` over SSH enables its unit, and with an
//! agent.toml written the way an operator would, `systemctl start capstan-agent`
//! returns once the agent said it was ready (`Type=notify`). Joined to nats-server and
//! the coordinator on the machine side (on the fleet's hub address), it carries out a
//! rollout the coordinator sends it, and after a reboot of its host it is back,
//! started at boot, with the same intent.

use super::ssh_ok;
use capstan_tests::command::{Commands, Spec};
use capstan_tests::fleet::Fleet;
use capstan_tests::nats::{Coordinator, Keys, NatsServer};
use capstan_tests::{build_packages, wait_until, READY};

#[test]
fn the_agent_package_installs_on_a_fleet_host_and_takes_commands_from_the_machine_side() {
    let debs = tempfile::tempdir().expect("a temp dir");
    let deb = build_packages(debs.path()).remove(0);
    assert!(
        deb.to_string_lossy().contains("capstan-agent_"),
        "{}",
        deb.display()
    );
    let fleet = Fleet::create();
    let mut host = fleet.boot("agent-1");
    std::fs::copy(&deb, host.path("/root/capstan-agent.deb")).expect("copy the package in");

    ssh_ok(&host, &["dpkg", "-i", "/root/capstan-agent.deb"]);
    assert_eq!(
        host.property("capstan-agent.service", "UnitFileState"),
        "enabled"
    );
    assert_eq!(
        host.property("capstan-agent.service", "ActiveState"),
        "inactive"
    );
    // The operator's config: the sim driver, no NATS, this host's name.
    let config = format!("host = \"{}\"\ndriver = \"sim\"\n", host.name());
    std::fs::write(host.path("/etc/capstan/agent.toml"), config).expect("write agent.toml");

    ssh_ok(&host, &["systemctl", "start", "capstan-agent"]);
    assert_eq!(
        host.property("capstan-agent.service", "ActiveState"),
        "active"
    );
    assert_eq!(host.property("capstan-agent.service", "Type"), "notify");
    let status = host.property("capstan-agent.service", "StatusText");
    assert!(
        status.starts_with(&format!("ready: host {}", host.name())),
        "{status}"
    );

    // The machine side: nats-server on the fleet's hub, the coordinator beside it.
    let server = NatsServer::start_on(&fleet.hub_addr().to_string());
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, "");
    let config = format!(
        "host = \"{}\"\ndriver = \"sim\"\n\n[nats]\nurl = {:?}\n\n[signing]\npublic_keys = [{:?}]\n",
        host.name(),
        server.url(),
        keys.public
    );
    std::fs::write(host.path("/etc/capstan/agent.toml"), config).expect("write agent.toml");
    // The host's key (made by `host-key` as by the agent's first start), registered:
    // what the coordinator checks everything the host publishes against.
    let config_arg = "--config=/etc/capstan/agent.toml";
    let key = ssh_ok(&host, &["capstan-agent", config_arg, "host-key"]);
    let out = coordinator.cli(&["register", host.name(), key.trim()]);
    assert!(out.status.success(), "{out:?}");
    ssh_ok(&host, &["systemctl", "restart", "capstan-agent"]);
    assert_eq!(
        host.property("capstan-agent.service", "ActiveState"),
        "active"
    );
    let hosts = coordinator.wait_for_hosts("agent-1 alive in the registry", |v| {
        v["hosts"][0]["host"] == host.name() && v["hosts"][0]["status"] == "alive"
    });
    assert_eq!(hosts["hosts"][0]["beat"]["drivers"][0], "sim", "{hosts}");
    let c = Commands::new(host.name(), "shop");
    coordinator.run_all(&[
        c.ensure_namespace("ns"),
        c.prepare("prep", "web", "r1", Spec::sim()),
        c.activate("act", "web", "r1"),
    ]);
    let intent = coordinator.cli_json(&["intent", host.name()], 0);
    assert!(intent["namespaces"]["shop"].is_object(), "{intent}");

    // A reboot: the enabled unit starts at boot (the boot is over once it is ready),
    // and the agent answers from the log on its disk.
    let pid = host.property("capstan-agent.service", "MainPID");
    host.reboot();
    assert_eq!(
        host.property("capstan-agent.service", "ActiveState"),
        "active"
    );
    assert_ne!(host.property("capstan-agent.service", "MainPID"), pid);
    // Ready means reconciled; its NATS connection may come a moment later.
    let again = wait_until("agent-1 to answer `intent` again", READY, || {
        let out = coordinator.cli(&["intent", host.name()]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON"))
    });
    assert_eq!(again["namespaces"], intent["namespaces"], "{again}");

    ssh_ok(&host, &["systemctl", "stop", "capstan-agent"]);
    assert_eq!(host.property("capstan-agent.service", "Result"), "success");
    let journal = host.journal(&["--unit", "capstan-agent.service", "--output", "cat"]);
    assert!(journal.contains("capstan-agent ready"), "{journal}");
    coordinator.stop();
    host.kill();
}

/// Whether `path` exists on the host's disk (a symlink itself, not its target: an
/// absolute target means another file seen from the machine).
fn exists(host: &capstan_tests::fleet::FleetHost<'_>, path: &str) -> bool {
    host.path(path).symlink_metadata().is_ok()
}

/// The maintainer scripts' remove and purge paths on a booted host: `dpkg -r` stops
/// the agent (its `shutdown` decides: the sim workload is stopped) and keeps the
/// config and the log; `dpkg --purge` removes the config and the unit's enablement but
/// keeps the event log, which a reinstall reads back; `CAPSTAN_PURGE_LOG=yes` removes
/// it too.
#[test]
fn removing_stops_the_agent_and_purging_keeps_the_event_log_unless_asked() {
    let debs = tempfile::tempdir().expect("a temp dir");
    let deb = build_packages(debs.path()).remove(0);
    let fleet = Fleet::create();
    let host = fleet.boot("purge-1");
    std::fs::copy(&deb, host.path("/root/capstan-agent.deb")).expect("copy the package in");
    ssh_ok(&host, &["dpkg", "-i", "/root/capstan-agent.deb"]);
    let config = format!("host = \"{}\"\ndriver = \"sim\"\n", host.name());
    std::fs::write(host.path("/etc/capstan/agent.toml"), &config).expect("write agent.toml");
    // A workload, by the operator's own `apply`, then the service.
    let c = Commands::new(host.name(), "shop");
    let lines: Vec<String> = c
        .rollout(&["web"], "r1", |_| Spec::sim())
        .iter()
        .map(ToString::to_string)
        .collect();
    std::fs::write(host.path("/root/rollout.jsonl"), lines.join("\n") + "\n").expect("write");
    let apply = [
        "capstan-agent",
        "--config",
        "/etc/capstan/agent.toml",
        "apply",
    ];
    ssh_ok(&host, &[&apply[..], &["/root/rollout.jsonl"]].concat());
    ssh_ok(&host, &["systemctl", "start", "capstan-agent"]);
    assert_eq!(
        host.property("capstan-agent.service", "ActiveState"),
        "active"
    );
    let wants = "/etc/systemd/system/multi-user.target.wants/capstan-agent.service";
    assert!(exists(&host, wants));

    ssh_ok(&host, &["dpkg", "-r", "capstan-agent"]);
    assert!(!exists(&host, "/usr/bin/capstan-agent"));
    let journal = host.journal(&["--unit", "capstan-agent.service", "--output", "cat"]);
    assert!(
        journal.contains("shutdown sweep finished") && journal.contains("stopped=1"),
        "the removal stopped the agent, which stopped its workload: {journal}"
    );
    assert!(
        exists(&host, "/etc/capstan/agent.toml"),
        "remove keeps the conffile"
    );
    assert!(exists(&host, "/var/lib/capstan/log"), "and the log");

    let purged = host.ssh(&["dpkg", "--purge", "capstan-agent"]);
    assert!(purged.status.success(), "{purged:?}");
    let said = String::from_utf8_lossy(&purged.stderr);
    assert!(
        said.contains("kept the event log in /var/lib/capstan"),
        "{said}"
    );
    assert!(
        !exists(&host, "/etc/capstan/agent.toml"),
        "purge removes the config"
    );
    assert!(!exists(&host, "/etc/capstan"), "and its empty dir");
    assert!(!exists(&host, wants), "and the unit's enablement");
    assert!(
        exists(&host, "/var/lib/capstan/log"),
        "but never the log unasked"
    );

    // Installed again, the agent reads the kept log: the same intent.
    ssh_ok(&host, &["dpkg", "-i", "/root/capstan-agent.deb"]);
    std::fs::write(host.path("/etc/capstan/agent.toml"), &config).expect("write agent.toml");
    let intent = ssh_ok(
        &host,
        &[
            "capstan-agent",
            "--config",
            "/etc/capstan/agent.toml",
            "intent",
            "--json",
        ],
    );
    let intent: serde_json::Value = serde_json::from_str(&intent).expect("intent JSON");
    assert_eq!(
        intent["workloads"]["shop/web"]["active_revision"], "r1",
        "{intent}"
    );

    ssh_ok(
        &host,
        &[
            "env",
            "CAPSTAN_PURGE_LOG=yes",
            "dpkg",
            "--purge",
            "capstan-agent",
        ],
    );
    assert!(
        !exists(&host, "/var/lib/capstan"),
        "asked, purge removes the log"
    );
    host.kill();
}

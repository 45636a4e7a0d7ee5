//! capstan's own units (`systemd/units/`), as shipped: `systemd-analyze verify` takes
//! them, and the agent runs as `capstan-agent.service` in a real systemd — ready
//! (`Type=notify`) only once the host is reconciled, feeding the watchdog, stopping
//! cleanly on `systemctl stop` — under the unit's hardening, while it drives that
//! systemd over D-Bus. The test changes only what a test must, in a drop-in: the
//! binary's and the dirs' paths, and a short `WatchdogSec=`.

use super::spec_running;
use capstan_driver::RevisionRef;
use capstan_systemd::naming;
use capstan_tests::agent::Agent;
use capstan_tests::nats::{http_get, Keys, NatsServer};
use capstan_tests::systemd::SystemdHost;
use capstan_tests::{binary, unique, wait_until, READY};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const AGENT_UNIT: &str = "capstan-agent.service";
const COORDINATOR_UNIT: &str = "capstan-coordinator.service";

/// The shipped unit files.
fn units() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/units")
}

fn shipped(name: &str) -> String {
    let path = units().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn the_shipped_units_pass_systemd_analyze_verify() {
    // `verify` checks that ExecStart's binary exists: point it at the built ones.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = Vec::new();
    for name in [AGENT_UNIT, COORDINATOR_UNIT] {
        let text = shipped(name);
        let bin = format!("/usr/bin/{}", name.trim_end_matches(".service"));
        assert!(
            text.contains(&format!("ExecStart={bin} ")),
            "{name}: {text}"
        );
        let built = binary(name.trim_end_matches(".service"));
        let path = dir.path().join(name);
        std::fs::write(&path, text.replace(&bin, &built.to_string_lossy())).expect("write");
        files.push(path);
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&files)
        .output()
        .expect("run systemd-analyze (Debian's systemd package)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    assert!(
        !said.contains("capstan"),
        "systemd-analyze has something to say about our units: {said}"
    );
    // The sysusers.d entry parses, and makes exactly the coordinator's user.
    let out = Command::new("systemd-sysusers")
        .arg("--dry-run")
        .arg(units().join("capstan.sysusers"))
        .output()
        .expect("run systemd-sysusers");
    assert!(
        out.status.success(),
        "systemd-sysusers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of `key` in `/proc/<pid>/status` inside `host`.
fn proc_status(host: &SystemdHost, pid: &str, key: &str) -> String {
    let out = host.nsenter(&["cat", &format!("/proc/{pid}/status")]);
    assert!(out.status.success(), "read /proc/{pid}/status");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

#[test]
fn the_agent_runs_as_its_shipped_unit_ready_once_reconciled_fed_and_stopped_cleanly() {
    let host = SystemdHost::boot();
    let name = unique("sdsvc");
    // The agent manages its units' lifecycle, so its startup starts what is meant to
    // run and its stop stops it: both happen inside the service's start and stop.
    let a = Agent::builder(&name)
        .systemd(&host)
        .systemd_lifecycle(true)
        .build_in(host.dir());
    let c = a.commands("ns");
    a.apply_ok(&c.rollout(&["web"], "r1", |_| spec_running(&host, "ns", "web").into()));
    let web = naming::unit_name(RevisionRef {
        namespace: "ns",
        workload: "web",
        revision: "r1",
    });
    assert_eq!(host.property(&web, "ActiveState"), "active");
    host.systemctl_ok(&["stop", &web]);

    // The shipped unit, and a drop-in with this test's paths. Inside the host, the
    // system bus is the default one: drop the machine-side `bus` from the config.
    let config = std::fs::read_to_string(a.config_file()).expect("read the config");
    let inside = a.path("inside.toml");
    let config: String = config
        .lines()
        .filter(|l| !l.starts_with("bus = "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&inside, config).expect("write the config");
    let bin = host.install(&binary("capstan-agent"));
    install_unit(
        &host,
        AGENT_UNIT,
        &format!(
            "ExecStart=\nExecStart={bin} --config {config} --data-dir {data} --host {name} \
             --log-format json run\nStateDirectory=\nReadWritePaths={dir}\nWatchdogSec=1s\n",
            bin = bin.display(),
            config = inside.display(),
            data = a.data_dir().display(),
            dir = host.dir().display(),
        ),
    );

    // `systemctl start` returns once READY=1 came: the host is reconciled by then.
    host.systemctl_ok(&["start", AGENT_UNIT]);
    assert_eq!(host.property(AGENT_UNIT, "ActiveState"), "active");
    assert_eq!(
        host.property(&web, "ActiveState"),
        "active",
        "started by the agent's startup, before it said it was ready"
    );
    let status = host.property(AGENT_UNIT, "StatusText");
    assert!(
        status.starts_with(&format!("ready: host {name}, log seq ")),
        "{status}"
    );

    // The hardening holds, and the agent works under it (it just started a unit).
    let pid = host.property(AGENT_UNIT, "MainPID");
    assert_eq!(proc_status(&host, &pid, "CapEff"), "0000000000000000");
    assert_eq!(proc_status(&host, &pid, "CapBnd"), "0000000000000000");
    assert_eq!(proc_status(&host, &pid, "NoNewPrivs"), "1");

    // The watchdog is fed (WatchdogSec=1s: a ping every 0.5 s).
    let mut pings = BTreeSet::new();
    wait_until("three watchdog pings", READY, || {
        let at = host.property(AGENT_UNIT, "WatchdogTimestampMonotonic");
        if at != "0" {
            pings.insert(at);
        }
        pings.len() >= 3
    });
    assert_eq!(host.property(AGENT_UNIT, "NRestarts"), "0");
    assert_eq!(
        host.property(AGENT_UNIT, "MainPID"),
        pid,
        "the same process"
    );

    // `systemctl stop`: SIGTERM, STOPPING=1, the shutdown sweep, a clean exit.
    host.systemctl_ok(&["stop", AGENT_UNIT]);
    assert_eq!(host.property(AGENT_UNIT, "ActiveState"), "inactive");
    assert_eq!(host.property(AGENT_UNIT, "Result"), "success");
    assert_eq!(host.property(AGENT_UNIT, "ExecMainStatus"), "0");
    assert_eq!(
        host.property(&web, "ActiveState"),
        "inactive",
        "the shutdown sweep stopped it"
    );
    let journal = host.journal(&["--unit", AGENT_UNIT, "--output", "cat"]);
    for line in [
        "capstan-agent ready",
        "SIGTERM: stopping",
        "capstan-agent stopped",
    ] {
        assert!(
            journal.contains(line),
            "{line:?} not in the journal: {journal}"
        );
    }
    let stopped = a.events("workload_stopped");
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(stopped[0]["cause"], "agent_shutdown");
}

/// Writes the shipped `unit` into `host` with a drop-in of `settings` (`[Service]`
/// lines), and reloads.
pub(crate) fn install_unit(host: &SystemdHost, unit: &str, settings: &str) {
    std::fs::write(host.unit_dir().join(unit), shipped(unit)).expect("unit");
    let dropins = host.unit_dir().join(format!("{unit}.d"));
    std::fs::create_dir_all(&dropins).expect("drop-in dir");
    std::fs::write(dropins.join("test.conf"), format!("[Service]\n{settings}")).expect("drop-in");
    host.systemctl_ok(&["daemon-reload"]);
}

#[test]
fn the_coordinator_runs_as_its_shipped_unit_ready_once_it_listens() {
    let host = SystemdHost::boot();
    // The hosts share the machine's network: the server is on its loopback.
    let nats = NatsServer::start();
    let keys = Keys::generate();
    let dir = tempfile::tempdir_in(host.dir()).expect("dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let key = dir.path().join("signing.key");
    std::fs::write(&key, keys.secret_hex()).expect("key");
    let config = dir.path().join("coordinator.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nsigning_key_file = {:?}\n[nats]\nurl = {:?}\n",
            key.display().to_string(),
            nats.url()
        ),
    )
    .expect("config");
    let bin = host.install(&binary("capstan-coordinator"));
    // `User=capstan` comes from the package's sysusers.d entry, which this machine
    // has not run: the test runs it as `nobody` instead, as unprivileged.
    install_unit(
        &host,
        COORDINATOR_UNIT,
        &format!(
            "ExecStart=\nExecStart={} run --config {}\nUser=nobody\nGroup=nogroup\nWatchdogSec=1s\n",
            bin.display(),
            config.display()
        ),
    );

    host.systemctl_ok(&["start", COORDINATOR_UNIT]);
    let status = host.property(COORDINATOR_UNIT, "StatusText");
    let port: u16 = status
        .strip_prefix("ready: listening on 127.0.0.1:")
        .unwrap_or_else(|| panic!("{status}"))
        .parse()
        .expect("a port");
    // Ready means listening: the API answers at once (503 `nats_unavailable` until its
    // NATS connection is up, as when NATS goes away later), then with the fleet.
    let (code, _) = http_get(port, "/v1/hosts").expect("the API answers at once");
    assert!(code == 200 || code == 503, "{code}");
    wait_until("the API with NATS behind it", READY, || {
        http_get(port, "/v1/hosts").is_some_and(|(code, _)| code == 200)
    });
    let pid = host.property(COORDINATOR_UNIT, "MainPID");
    assert_eq!(proc_status(&host, &pid, "CapEff"), "0000000000000000");
    assert_eq!(proc_status(&host, &pid, "NoNewPrivs"), "1");
    let mut pings = BTreeSet::new();
    wait_until("three watchdog pings", READY, || {
        let at = host.property(COORDINATOR_UNIT, "WatchdogTimestampMonotonic");
        if at != "0" {
            pings.insert(at);
        }
        pings.len() >= 3
    });

    host.systemctl_ok(&["stop", COORDINATOR_UNIT]);
    assert_eq!(host.property(COORDINATOR_UNIT, "Result"), "success");
    assert_eq!(host.property(COORDINATOR_UNIT, "ExecMainStatus"), "0");
    assert_eq!(host.property(COORDINATOR_UNIT, "NRestarts"), "0");
}

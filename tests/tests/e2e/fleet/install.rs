//! `capstan install` (russh) onto three fleet hosts at once, from a hosts file with a
//! config per host: the first run installs, configures and starts the agent on each
//! (learning their host keys with `--accept-new`) and returns once all three are
//! `alive` in the coordinator's registry; a second run changes nothing (no reinstall,
//! no restart) and says `unchanged`; a known_hosts holding another key for one host
//! fails that host naming both fingerprints while the other two go on. A changed
//! config is written and its agent alone restarted (`reconfigured`); a user other
//! than root is refused. A package of
//! another version is refused without `--upgrade`; with it every host says
//! `upgraded`, each agent is a new process, and a workload running on one of them
//! was not restarted (the package's leave-running stop). An older package is refused
//! without `--allow-downgrade`; with it, one whose build does not read the hosts' log
//! layout is refused, and one that does says `downgraded`, the workload running on.

use super::hosts::boot_all;
use capstan_tests::command::{Commands, Spec};
use capstan_tests::fleet::Fleet;
use capstan_tests::fleet::FleetHost;
use capstan_tests::nats::{Coordinator, Keys, NatsServer};
use capstan_tests::{build_packages, build_packages_as};
use std::path::Path;
use std::process::Command;

/// `capstan install ARGS… PACKAGE` against `coordinator`, with the fleet's key;
/// panics unless it exits with `code`. Returns its stdout and stderr.
#[track_caller]
pub(super) fn install(
    coordinator: &Coordinator,
    fleet: &Fleet,
    args: &[&str],
    package: &Path,
    code: i32,
) -> (String, String) {
    let mut c = Command::new(capstan_tests::binary("capstan"));
    c.arg("--coordinator")
        .arg(&coordinator.url)
        .arg("install")
        .arg("--identity")
        .arg(fleet.key())
        .args(args)
        .arg(package)
        .env("CAPSTAN_TOKEN", &coordinator.token)
        .env_remove("CAPSTAN_TOKEN_FILE");
    // Its own bounds are per host (connect 10 s, `alive` 60 s): the upload and the
    // dpkg run of each come on top.
    let out = capstan_tests::process::output(
        format_args!("capstan install {args:?}"),
        2 * capstan_tests::READY,
        c,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout {stdout} stderr {stderr}"
    );
    (stdout, stderr)
}

/// `<addr> <word>` for each host, a line each: the summary of a run alike on all.
pub(super) fn each(hosts: &[FleetHost<'_>], word: &str) -> String {
    hosts
        .iter()
        .map(|h| format!("{} {word}\n", h.addr()))
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The host's own ed25519 host key, `ssh-ed25519 AAAA… comment`.
fn host_key(host: &FleetHost<'_>) -> String {
    std::fs::read_to_string(host.path("/etc/ssh/ssh_host_ed25519_key.pub"))
        .expect("the host's public host key")
        .trim()
        .to_string()
}

/// `SHA256:…` of an OpenSSH public key, as `ssh-keygen -l` prints it.
fn fingerprint(dir: &Path, public: &str) -> String {
    let file = dir.join("key.pub");
    std::fs::write(&file, format!("{public}\n")).expect("write the key");
    let out = Command::new("ssh-keygen")
        .arg("-l")
        .arg("-f")
        .arg(&file)
        .output()
        .expect("run ssh-keygen -l");
    assert!(out.status.success(), "{out:?}");
    text(&out.stdout)
        .split_whitespace()
        .nth(1)
        .expect("a fingerprint")
        .to_string()
}

/// Each host's agent's `ActiveEnterTimestamp` and `MainPID`: a restart changes both.
pub(super) fn started(hosts: &[FleetHost<'_>]) -> Vec<(String, String)> {
    hosts
        .iter()
        .map(|h| {
            (
                h.property("capstan-agent.service", "ActiveEnterTimestamp"),
                h.property("capstan-agent.service", "MainPID"),
            )
        })
        .collect()
}

#[test]
fn capstan_install_puts_the_agent_on_three_hosts_once_refuses_a_changed_host_key_and_upgrades_leaving_workloads_running(
) {
    let debs = tempfile::tempdir().expect("a temp dir");
    let deb = build_packages(debs.path()).remove(0);
    let fleet = Fleet::create();
    let hosts = boot_all(&fleet, &["inst-a", "inst-b", "inst-c"]);
    let server = NatsServer::start_on(&fleet.hub_addr().to_string());
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, "");

    let work = tempfile::tempdir().expect("a temp dir");
    let configs = work.path().join("configs");
    std::fs::create_dir(&configs).expect("mkdir configs");
    let mut hosts_file = String::from("# the fleet under test\n");
    for host in &hosts {
        hosts_file.push_str(&format!("root@{}\n", host.addr()));
        let config = format!(
            "host = \"{}\"\ndriver = \"sim\"\n\n[nats]\nurl = {:?}\n\n[signing]\npublic_keys = [{:?}]\n",
            host.name(),
            server.url(),
            keys.public
        );
        std::fs::write(configs.join(format!("{}.toml", host.addr())), config)
            .expect("write a config");
    }
    let hosts_path = work.path().join("hosts");
    std::fs::write(&hosts_path, hosts_file).expect("write the hosts file");
    let learned = work.path().join("learned_known_hosts");
    let common = [
        "--hosts-file",
        hosts_path.to_str().expect("path"),
        "--config-dir",
        configs.to_str().expect("path"),
        "--timeout",
        "60s",
    ];

    // First run: trust on first use, into a known_hosts file that does not exist yet.
    let mut args = common.to_vec();
    args.extend([
        "--accept-new",
        "--known-hosts",
        learned.to_str().expect("path"),
    ]);
    let (first_out, first_err) = install(&coordinator, &fleet, &args, &deb, 0);
    let expected = each(&hosts, "installed");
    assert_eq!(first_out, expected, "stderr {}", first_err);
    let progress = first_err;
    for host in &hosts {
        assert!(
            progress.contains(&format!("{}: installing capstan-agent", host.addr())),
            "{progress}"
        );
        assert!(
            progress.contains(&format!("{}: {} is alive", host.addr(), host.name())),
            "{progress}"
        );
    }
    // It returned once all three were alive: the registry says so already.
    let registry = coordinator.cli_json(&["hosts"], 0);
    for host in &hosts {
        let entry = registry["hosts"]
            .as_array()
            .expect("hosts")
            .iter()
            .find(|h| h["host"] == host.name())
            .unwrap_or_else(|| panic!("{} registered: {registry}", host.name()));
        assert_eq!(entry["status"], "alive", "{registry}");
        assert_eq!(
            host.property("capstan-agent.service", "ActiveState"),
            "active"
        );
        assert_eq!(
            host.property("capstan-agent.service", "UnitFileState"),
            "enabled"
        );
        let mode = host.nsenter_ok(&["stat", "-c", "%a %U %G", "/etc/capstan/agent.toml"]);
        assert_eq!(mode.trim(), "640 root root");
    }
    // --accept-new recorded each host's own key.
    let known = std::fs::read_to_string(&learned).expect("the learned known_hosts");
    for host in &hosts {
        let key = host_key(host);
        let key = key.rsplit_once(' ').map_or(key.as_str(), |(k, _)| k);
        assert!(known.contains(&format!("{} {key}", host.addr())), "{known}");
    }

    // Second run, checking against the learned file: nothing to do on any host.
    let before = started(&hosts);
    let mut args = common.to_vec();
    args.extend(["--known-hosts", learned.to_str().expect("path")]);
    let (second_out, second_err) = install(&coordinator, &fleet, &args, &deb, 0);
    let expected = each(&hosts, "unchanged");
    assert_eq!(second_out, expected, "stderr {}", second_err);
    let after = started(&hosts);
    assert_eq!(before, after, "no host's agent was restarted");
    assert!(!second_err.contains("installing"), "{}", second_err);

    // A changed config on the third host: written, the agent restarted, no dpkg.
    let third_config = configs.join(format!("{}.toml", hosts[2].addr()));
    let mut config = std::fs::read_to_string(&third_config).expect("read its config");
    config.push_str("# changed by the test\n");
    std::fs::write(&third_config, &config).expect("change its config");
    let (changed_out, changed_err) = install(&coordinator, &fleet, &args, &deb, 0);
    let expected = format!(
        "{} unchanged\n{} unchanged\n{} reconfigured\n",
        hosts[0].addr(),
        hosts[1].addr(),
        hosts[2].addr()
    );
    assert_eq!(changed_out, expected, "stderr {changed_err}");
    let restarted = started(&hosts);
    assert_eq!(restarted[..2], after[..2], "the others were not restarted");
    assert_ne!(restarted[2].1, after[2].1, "the third agent was restarted");
    let on_host =
        std::fs::read_to_string(hosts[2].path("/etc/capstan/agent.toml")).expect("its agent.toml");
    assert_eq!(on_host, config);
    assert!(!changed_err.contains("installing"), "{changed_err}");

    // Not as root: refused before anything is uploaded.
    hosts[2].nsenter_ok(&[
        "sh",
        "-c",
        "useradd -m -s /bin/sh ops && install -d -o ops -m 0700 /home/ops/.ssh \
         && install -o ops -m 0600 /root/.ssh/authorized_keys /home/ops/.ssh/",
    ]);
    let ops = format!("ops@{}", hosts[2].addr());
    let one = [
        "--ssh",
        &ops,
        "--config",
        third_config.to_str().expect("path"),
        "--known-hosts",
        learned.to_str().expect("path"),
    ];
    let (ops_out, ops_err) = install(&coordinator, &fleet, &one, &deb, 1);
    assert!(
        ops_out.starts_with(&format!(
            "{} failed: {ops} is not root (uid ",
            hosts[2].addr()
        )),
        "{ops_out} {ops_err}"
    );
    assert!(!ops_err.contains("uploading"), "{ops_err}");

    // A known_hosts holding another key for the second host.
    let other = work.path().join("other_key");
    capstan_tests::fleet::ssh::keygen(&other, "not-inst-b");
    let other_key =
        std::fs::read_to_string(work.path().join("other_key.pub")).expect("its public key");
    let mut forged = String::new();
    for (i, host) in hosts.iter().enumerate() {
        let key = if i == 1 {
            other_key.trim().to_string()
        } else {
            host_key(host)
        };
        forged.push_str(&format!("{} {key}\n", host.addr()));
    }
    let forged_path = work.path().join("forged_known_hosts");
    std::fs::write(&forged_path, forged).expect("write the forged known_hosts");
    let mut args = common.to_vec();
    // --accept-new trusts unknown hosts only, never a changed key.
    args.extend([
        "--accept-new",
        "--known-hosts",
        forged_path.to_str().expect("path"),
    ]);
    let (third_out, third_err) = install(&coordinator, &fleet, &args, &deb, 1);
    let failed = format!("{}: failed: HOST KEY MISMATCH", hosts[1].addr());
    assert!(third_err.contains(&failed), "{third_err}");
    let lines: Vec<String> = third_out.lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0], format!("{} unchanged", hosts[0].addr()));
    assert_eq!(lines[2], format!("{} unchanged", hosts[2].addr()));
    let presented = fingerprint(work.path(), &host_key(&hosts[1]));
    let recorded = fingerprint(work.path(), other_key.trim());
    assert!(
        lines[1].starts_with(&format!("{} failed: HOST KEY MISMATCH", hosts[1].addr())),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains(&presented),
        "{} lacks {presented}",
        lines[1]
    );
    assert!(
        lines[1].contains(&recorded),
        "{} lacks {recorded}",
        lines[1]
    );
    assert_eq!(
        std::fs::read_to_string(&forged_path)
            .expect("read it")
            .lines()
            .count(),
        3,
        "the mismatch was not recorded"
    );

    // A workload on the first host, then a package of another version.
    let c = Commands::new(hosts[0].name(), "shop");
    coordinator.run_all(&[
        c.ensure_namespace("ns"),
        c.prepare("prep", "web", "r1", Spec::sim()),
        c.activate("act", "web", "r1"),
    ]);
    let web = || {
        let host = capstan_driver::sim::SimHost::load(&hosts[0].path("/var/lib/capstan"))
            .expect("the sim driver's state on the host");
        let web = serde_json::to_value(host).expect("JSON")["revisions"]["shop/web@r1"].clone();
        (web["state"].clone(), web["starts"].clone())
    };
    assert_eq!(web(), (serde_json::json!("running"), serde_json::json!(1)));
    let upgrade = format!("{}+upgrade-test", env!("CARGO_PKG_VERSION"));
    let newer = build_packages_as(debs.path(), Some(&upgrade)).remove(0);
    let before = started(&hosts);
    let mut args = common.to_vec();
    args.extend(["--known-hosts", learned.to_str().expect("path")]);
    let (refused_out, refused_err) = install(&coordinator, &fleet, &args, &newer, 1);
    assert!(!refused_err.contains("upgrading"), "{refused_err}");
    assert_eq!(refused_out.lines().count(), hosts.len(), "{refused_out}");
    for (line, host) in refused_out.lines().zip(&hosts) {
        assert!(
            line.starts_with(&format!("{} failed: capstan-agent ", host.addr())),
            "{line}"
        );
        assert!(line.ends_with("pass --upgrade to replace it"), "{line}");
    }
    assert_eq!(started(&hosts), before, "a refused upgrade touched nothing");

    args.push("--upgrade");
    let (upgraded_out, upgraded_err) = install(&coordinator, &fleet, &args, &newer, 0);
    let expected = each(&hosts, "upgraded");
    assert_eq!(upgraded_out, expected, "stderr {}", upgraded_err);
    for ((host, (_, pid_before)), (_, pid_after)) in hosts.iter().zip(&before).zip(started(&hosts))
    {
        assert_ne!(
            *pid_before,
            pid_after,
            "{}: the agent was restarted by the upgrade",
            host.name()
        );
        let version = host.nsenter_ok(&["dpkg-query", "-W", "-f=${Version}", "capstan-agent"]);
        assert_eq!(version, upgrade);
    }
    assert_eq!(
        web(),
        (serde_json::json!("running"), serde_json::json!(1)),
        "the workload kept running through the upgrade, never restarted"
    );
    let journal = hosts[0].journal(&["--unit", "capstan-agent.service", "--output", "cat"]);
    assert!(journal.contains("leaving workloads running"), "{journal}");

    let installed = Installed {
        coordinator: &coordinator,
        fleet: &fleet,
        hosts: &hosts,
        version: &upgrade,
    };
    downgrades(&installed, &args, debs.path(), &web);

    coordinator.stop();
    for host in hosts {
        host.kill();
    }
}

/// The fleet as the upgrade left it: every host on `version`.
struct Installed<'a> {
    coordinator: &'a Coordinator,
    fleet: &'a Fleet,
    hosts: &'a [FleetHost<'a>],
    version: &'a str,
}

/// `deb` repacked into `dir` declaring that its build reads log layouts `layouts`.
fn declaring(deb: &Path, layouts: &str, dir: &Path) -> std::path::PathBuf {
    let tree = dir.join("repack");
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("dpkg-deb")
            .args(args)
            .output()
            .expect("dpkg-deb");
        assert!(out.status.success(), "dpkg-deb {args:?}: {out:?}");
    };
    run(&["-R".as_ref(), deb.as_os_str(), tree.as_os_str()]);
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).expect("the control file");
    let text: String = text
        .lines()
        .map(|l| match l.starts_with("X-Capstan-Log-Layouts:") {
            true => format!("X-Capstan-Log-Layouts: {layouts}\n"),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&control, text).expect("write the control file");
    let out = dir.join("blind.deb");
    run(&[
        "--root-owner-group".as_ref(),
        "-b".as_ref(),
        tree.as_os_str(),
        out.as_os_str(),
    ]);
    out
}

/// An older package: refused without `--allow-downgrade`; with it refused when its
/// build does not read the hosts' log layout (2), else `downgraded`, with a new
/// agent on each host and `web` (its state and starts) as it was.
fn downgrades(
    at: &Installed<'_>,
    args: &[&str],
    debs: &Path,
    web: &dyn Fn() -> (serde_json::Value, serde_json::Value),
) {
    let older = build_packages_as(debs, Some("0.0.0+downgrade-test")).remove(0);
    let before = started(at.hosts);
    let web_before = web();
    let (refused, _) = install(at.coordinator, at.fleet, args, &older, 1);
    let why = format!(
        "failed: downgrade from {} to 0.0.0+downgrade-test refused",
        at.version
    );
    assert_eq!(
        refused,
        each(at.hosts, &format!("{why}: pass --allow-downgrade"))
    );
    let mut allowed = args.to_vec();
    allowed.push("--allow-downgrade");
    let blind = declaring(&older, "1", debs);
    let (refused, _) = install(at.coordinator, at.fleet, &allowed, &blind, 1);
    assert_eq!(
        refused,
        each(
            at.hosts,
            &format!("{why}: the package reads log layouts 1, its log is in layout 2")
        )
    );
    assert_eq!(
        started(at.hosts),
        before,
        "a refused downgrade touched nothing"
    );

    let (out, err) = install(at.coordinator, at.fleet, &allowed, &older, 0);
    assert_eq!(out, each(at.hosts, "downgraded"), "stderr {err}");
    for ((host, (_, pid_before)), (_, pid_after)) in
        at.hosts.iter().zip(&before).zip(started(at.hosts))
    {
        assert_ne!(*pid_before, pid_after, "{}: a new agent", host.name());
        let version = host.nsenter_ok(&["dpkg-query", "-W", "-f=${Version}", "capstan-agent"]);
        assert_eq!(version, "0.0.0+downgrade-test");
    }
    assert_eq!(
        web(),
        web_before,
        "the workload ran on through the downgrade"
    );
}

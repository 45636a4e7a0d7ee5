//! The harness itself: a `SystemdHost` boots to `running` with nothing but the stock
//! units, answers on its bus address from the machine, runs a unit written into its
//! unit dir with the environment and argv the unit gives, tells a clean stop from a
//! failure, reboots keeping its unit dir, state and journal, and several hosts run
//! side by side with the same unit name without seeing each other's units or
//! processes. `capstan-envdump` keeps every byte of its argv and env.

use capstan_tests::systemd::{envdump, SystemdHost};
use capstan_tests::{unique, wait_until, READY};
use serde_json::{json, Value};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::time::Instant;

/// Writes `<name>.service` running `capstan-envdump <dump> ARGS` with `env` (lines of
/// `Environment=`) into the host's unit dir; returns the dump's path.
fn write_unit(host: &SystemdHost, name: &str, args: &str, env: &[&str]) -> std::path::PathBuf {
    let dump = host.state_dir().join(format!("{name}.json"));
    let mut unit = format!(
        "[Unit]\nDescription=capstan smoke test\n\n[Service]\nExecStart={} {} {args}\n",
        host.envdump().display(),
        dump.display()
    );
    for e in env {
        unit.push_str(&format!("Environment={e}\n"));
    }
    std::fs::write(host.unit_dir().join(format!("{name}.service")), unit).expect("write unit");
    dump
}

/// Waits for a dump file and parses it.
fn read_dump(path: &Path) -> Value {
    let text = wait_until(format_args!("{}", path.display()), READY, || {
        std::fs::read_to_string(path).ok()
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn a_unit_runs_the_workload_with_its_environment_and_argv() {
    let host = SystemdHost::boot();
    assert!(
        host.systemctl_ok(&[
            "list-units",
            "--all",
            "--plain",
            "--no-legend",
            "ssh*",
            "docker*"
        ])
        .trim()
        .is_empty(),
        "the machine's own enabled units are not in the test host"
    );
    // The bus address works from the machine, as the driver uses it.
    let bus = std::process::Command::new("busctl")
        .arg(format!("--address={}", host.bus_address()))
        .args([
            "get-property",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "SystemState",
        ])
        .output()
        .expect("run busctl");
    assert_eq!(
        String::from_utf8_lossy(&bus.stdout).trim(),
        "s \"running\"",
        "{}",
        String::from_utf8_lossy(&bus.stderr)
    );
    let name = format!("smoke-{}", unique("smoke"));
    let dump = write_unit(
        &host,
        &name,
        "first \"second arg\"",
        &["SMOKE=opaque-1 \"SPACED=a b\""],
    );
    host.systemctl_ok(&["daemon-reload"]);
    host.systemctl_ok(&["start", &format!("{name}.service")]);
    let got = read_dump(&dump);
    assert_eq!(
        got["argv"],
        json!([
            host.envdump().to_str().expect("utf-8 path"),
            dump.to_str().expect("utf-8 path"),
            "first",
            "second arg"
        ]),
        "{got}"
    );
    assert_eq!(got["env"]["SMOKE"], "opaque-1", "{got}");
    assert_eq!(got["env"]["SPACED"], "a b", "{got}");
    let env = got["env"].as_object().expect("env object");
    assert!(
        !env.keys()
            .any(|k| k.starts_with("CARGO") || k == "container"),
        "the test's own environment does not leak into units: {got}"
    );
    let unit = format!("{name}.service");
    assert_eq!(host.property(&unit, "ActiveState"), "active");
    assert_eq!(
        host.property(&unit, "MainPID"),
        got["pid"].to_string(),
        "the pid it wrote is its pid inside the host's PID namespace"
    );

    // SIGTERM is a clean exit 0: the unit goes inactive, not failed.
    host.systemctl_ok(&["stop", &unit]);
    assert_eq!(host.property(&unit, "ActiveState"), "inactive");
    assert_eq!(host.property(&unit, "ExecMainStatus"), "0");

    // ENVDUMP_EXIT: write, then exit with that code at once; the unit fails with it.
    let crashy = format!("crashy-{}", unique("crashy"));
    let crash_dump = write_unit(&host, &crashy, "", &["ENVDUMP_EXIT=3"]);
    host.systemctl_ok(&["daemon-reload"]);
    host.systemctl_ok(&["start", &format!("{crashy}.service")]);
    assert_eq!(read_dump(&crash_dump)["env"]["ENVDUMP_EXIT"], "3");
    let unit = format!("{crashy}.service");
    wait_until("the crashy unit to fail", READY, || {
        host.property(&unit, "ActiveState") == "failed"
    });
    assert_eq!(host.property(&unit, "Result"), "exit-code");
    assert_eq!(host.property(&unit, "ExecMainStatus"), "3");

    let pid = host.pid();
    host.kill();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "systemd {pid} is gone"
    );
}

#[test]
fn three_hosts_boot_in_parallel_and_keep_to_themselves() {
    let started = Instant::now();
    let hosts: Vec<SystemdHost> = std::thread::scope(|s| {
        let boots: Vec<_> = (0..3).map(|_| s.spawn(SystemdHost::boot)).collect();
        boots
            .into_iter()
            .map(|b| b.join().expect("a host boots"))
            .collect()
    });
    eprintln!(
        "3 systemd hosts booted in parallel in {} ms",
        started.elapsed().as_millis()
    );
    // The same unit name in each host: separate unit dirs, separate cgroups.
    let name = format!("same-{}", unique("same"));
    let dumps: Vec<_> = hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let dump = write_unit(host, &name, &format!("host-{i}"), &[]);
            host.systemctl_ok(&["daemon-reload"]);
            host.systemctl_ok(&["start", &format!("{name}.service")]);
            dump
        })
        .collect();
    for (i, (host, dump)) in hosts.iter().zip(&dumps).enumerate() {
        let got = read_dump(dump);
        assert_eq!(got["argv"][2], format!("host-{i}"), "{got}");
        let cgroup = host.property(&format!("{name}.service"), "ControlGroup");
        assert!(
            cgroup.ends_with(&format!("/system.slice/{name}.service"))
                && cgroup.contains("capstan-tests/"),
            "each host has its own cgroup tree: {cgroup}"
        );
    }
    // Stopping the unit in one host leaves the others' running.
    let unit = format!("{name}.service");
    hosts[0].systemctl_ok(&["stop", &unit]);
    assert_eq!(hosts[0].property(&unit, "ActiveState"), "inactive");
    for host in &hosts[1..] {
        assert_eq!(host.property(&unit, "ActiveState"), "active");
        assert_eq!(host.property(&unit, "NRestarts"), "0");
    }
    for host in hosts {
        host.kill();
    }
}

#[test]
fn a_reboot_keeps_the_unit_dir_state_and_journal() {
    let mut host = SystemdHost::boot();
    let name = format!("boot-{}", unique("boot"));
    let dump = write_unit(&host, &name, "", &[]);
    // Enabled by hand, as `systemctl enable` would (WantedBy=multi-user.target).
    let wants = host.unit_dir().join("multi-user.target.wants");
    std::fs::create_dir(&wants).expect("wants dir");
    std::os::unix::fs::symlink(
        host.unit_dir().join(format!("{name}.service")),
        wants.join(format!("{name}.service")),
    )
    .expect("enable");
    host.systemctl_ok(&["daemon-reload"]);
    host.systemctl_ok(&["start", &format!("{name}.service")]);
    let first = read_dump(&dump)["pid"].clone();
    let before = host.pid();
    std::fs::remove_file(&dump).expect("remove the first dump");

    host.reboot();
    assert_ne!(host.pid(), before, "a new systemd");
    assert!(
        !Path::new(&format!("/proc/{before}")).exists(),
        "the old one is gone"
    );
    // The enabled unit started again at boot, before `running`.
    let again = read_dump(&dump);
    assert_eq!(
        host.property(&format!("{name}.service"), "MainPID"),
        again["pid"].to_string(),
        "{again} (first boot's pid {first})"
    );
    let boots = host.journal(&["--list-boots"]);
    assert_eq!(
        boots.lines().count(),
        2,
        "one journal across reboots:\n{boots}"
    );
    host.kill();
}

#[test]
fn envdump_keeps_every_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("dump.json");
    let status = std::process::Command::new(envdump())
        .arg(&out)
        .arg(std::ffi::OsStr::from_bytes(b"not utf-8: \xff\xfe"))
        .arg("ünïcode")
        .env("BYTES", std::ffi::OsStr::from_bytes(b"\x80x"))
        .env("ENVDUMP_EXIT", "7")
        .status()
        .expect("run capstan-envdump");
    assert_eq!(status.code(), Some(7));
    let got = read_dump(&out);
    assert_eq!(got["argv"][2], json!({"hex": "6e6f74207574662d383a20fffe"}));
    assert_eq!(got["argv"][3], "ünïcode");
    assert_eq!(got["env"]["BYTES"], json!({"hex": "8078"}));
    assert_eq!(got["pid"].as_u64().map(|p| p > 0), Some(true), "{got}");
}

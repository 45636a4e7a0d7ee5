//! The .deb packages (`packaging/deb/build.sh`), built from this build's binaries:
//! what each holds (binaries, units, sysusers/tmpfiles entries, conffiles, docs), its
//! control fields and scripts, and that building twice gives the same bytes.
//! Installing them on booted hosts is the fleet harness's part (issue 12).

use capstan_tests::{bin_dir, build_packages};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new("dpkg-deb")
        .args(args)
        .arg(deb)
        .output()
        .expect("run dpkg-deb");
    assert!(out.status.success(), "dpkg-deb {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The regular files in `deb`, as absolute paths.
fn files(deb: &Path) -> BTreeSet<String> {
    dpkg_deb(&["--contents"], deb)
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let path = l.split_whitespace().last().expect("a path");
            path.trim_start_matches('.').to_string()
        })
        .collect()
}

/// `deb`'s control file `name` (`control`, `conffiles`, `postinst`, …).
fn control(deb: &Path, name: &str) -> String {
    let out = Command::new("dpkg-deb")
        .args(["--info"])
        .arg(deb)
        .arg(name)
        .output()
        .expect("run dpkg-deb");
    assert!(out.status.success(), "no {name} in {}", deb.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_packages_hold_binaries_units_and_conffiles_and_build_reproducibly() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (debs, again) = std::thread::scope(|s| {
        let again = s.spawn(|| build_packages(second.path()));
        (
            build_packages(first.path()),
            again.join().expect("the second build"),
        )
    });
    assert_eq!(debs.len(), 2, "{debs:?}");
    for (a, b) in debs.iter().zip(&again) {
        assert_eq!(
            std::fs::read(a).unwrap(),
            std::fs::read(b).unwrap(),
            "{} is not reproducible",
            a.display()
        );
    }
    let (agent, coordinator) = (&debs[0], &debs[1]);
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        agent
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("capstan-agent_{version}_")),
        "{}",
        agent.display()
    );

    let has = files(agent);
    for file in [
        "/usr/bin/capstan-agent",
        "/usr/lib/systemd/system/capstan-agent.service",
        "/usr/lib/tmpfiles.d/capstan.conf",
        "/etc/capstan/agent.toml",
        "/usr/share/doc/capstan-agent/copyright",
        "/usr/share/doc/capstan-agent/README.md",
        "/usr/share/doc/capstan-agent/install.md",
    ] {
        assert!(has.contains(file), "capstan-agent lacks {file}: {has:?}");
    }
    assert!(!has.iter().any(|f| f.contains("coordinator")), "{has:?}");
    let has = files(coordinator);
    for file in [
        "/usr/bin/capstan-coordinator",
        "/usr/bin/capstan",
        "/usr/lib/systemd/system/capstan-coordinator.service",
        "/usr/lib/sysusers.d/capstan.conf",
        "/etc/capstan/coordinator.toml",
        "/usr/share/doc/capstan-coordinator/examples/nats-server.conf",
    ] {
        assert!(
            has.contains(file),
            "capstan-coordinator lacks {file}: {has:?}"
        );
    }

    // The log layouts the agent reads, as its own --version says, for `capstan
    // install` to read before it unpacks anything.
    let says = Command::new(capstan_tests::binary("capstan-agent"))
        .arg("--version")
        .output()
        .expect("capstan-agent --version");
    let says = String::from_utf8(says.stdout).unwrap();
    let layouts = says
        .lines()
        .find_map(|l| l.strip_prefix("log layouts: "))
        .unwrap_or_else(|| panic!("{says}"));
    assert_eq!(layouts, "1 2", "{says}");
    assert_eq!(
        dpkg_deb(&["-f"], agent)
            .lines()
            .find(|l| l.starts_with("X-Capstan-Log-Layouts")),
        Some(format!("X-Capstan-Log-Layouts: {layouts}").as_str())
    );
    assert!(!control(coordinator, "control").contains("X-Capstan"));
    assert_eq!(control(agent, "conffiles"), "/etc/capstan/agent.toml\n");
    assert_eq!(
        control(coordinator, "conffiles"),
        "/etc/capstan/coordinator.toml\n"
    );
    for (deb, name) in [
        (agent, "capstan-agent"),
        (coordinator, "capstan-coordinator"),
    ] {
        let fields = control(deb, "control");
        assert!(fields.contains(&format!("Package: {name}\n")), "{fields}");
        assert!(
            fields.contains(&format!("Version: {version}\n")),
            "{fields}"
        );
        assert!(fields.contains("Depends: libc6 (>= 2."), "{fields}");
        for script in ["postinst", "prerm", "postrm"] {
            let text = control(deb, script);
            assert!(text.starts_with("#!/bin/sh\n"), "{name} {script}");
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(script);
            std::fs::write(&path, &text).unwrap();
            let check = Command::new("sh").arg("-n").arg(&path).output().unwrap();
            assert!(check.status.success(), "{name} {script}: {check:?}");
        }
    }
    // The upgrade leaves workloads running: the prerm asks for it with SIGUSR2.
    let prerm = control(agent, "prerm");
    assert!(prerm.contains("--signal=SIGUSR2"), "{prerm}");
    // The shipped config parses: `capstan-agent intent` reads it before anything else.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin_dir().join("capstan-agent"))
        .arg("--config")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/etc/agent.toml"))
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--host", "h1", "intent", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "the shipped agent.toml: {out:?}");
}

#[test]
fn the_shipped_coordinator_config_parses() {
    // Parsed before anything is read: a run gets as far as the tokens file it names
    // (absent on a machine without the package).
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/etc/coordinator.toml");
    if Path::new("/etc/capstan/tokens").exists() {
        panic!("this machine has /etc/capstan/tokens: the test cannot tell parsing from running");
    }
    let out = Command::new(bin_dir().join("capstan-coordinator"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Any start error of `capstan-coordinator` is exit 2 (`main.rs`).
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/etc/capstan/tokens"), "{stderr}");
}

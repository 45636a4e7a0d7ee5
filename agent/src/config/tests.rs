//! The config's tests: what `agent.toml` may hold, the defaults it resolves to, and
//! how a bad setting is named.

use super::*;
use crate::hooks::HookKind;

#[test]
fn unknown_keys_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "host = \"h1\"\nshutdwon = \"stop\"\n").unwrap();
    let err = AgentConfig::load(Some(&path)).unwrap_err();
    let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(text.contains("shutdwon"), "{text}");
}

#[test]
fn reads_shutdown_mode_and_sim_failures() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(
        &path,
        "host = \"h1\"\nshutdown = \"leave-running\"\n[sim]\nmanages_lifecycle = false\n[[sim.failures]]\nop = \"activate\"\ntimes = 1\n",
    )
    .unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(c.shutdown, ShutdownMode::LeaveRunning);
    assert!(!c.sim.manages_lifecycle);
    assert_eq!(c.sim.failures[0].times, Some(1));
}

#[test]
fn hooks_are_validated_at_load_and_the_error_names_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(
        &path,
        "[[hooks]]\nname = \"iam\"\nkind = \"exec\"\nargv = [\"/bin/true\"]\nphases = [\"before_workload_start\", \"before_workload_stop\"]\ntimeout = 2.5\n[[hooks]]\nname = \"net\"\nkind = \"exec\"\nargv = [\"/no/such/hook\"]\nphases = [\"before_workload_stop\"]\n",
    )
    .unwrap();
    let err = AgentConfig::load(Some(&path)).unwrap_err();
    let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        text.contains("\"net\"") && text.contains("/no/such/hook"),
        "{text}"
    );
    std::fs::write(
        &path,
        "hook_cleanup_budget = 2\n[[hooks]]\nname = \"iam\"\nkind = \"exec\"\nargv = [\"/bin/true\"]\nphases = [\"before_workload_start\", \"before_workload_stop\"]\ntimeout = 2.5\n",
    )
    .unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(c.hook_owners[0].timeout, Duration::from_millis(2500));
    assert_eq!(c.resolved().cleanup_budget, Duration::from_secs(2));
}

#[test]
fn reads_nats_and_signing_and_names_bad_keys_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(
        &path,
        "[nats]\nurl = \"nats://10.0.0.1:4222\"\nuser = \"h1\"\npassword = \"p\"\n[signing]\npublic_keys = [\"00\"]\nmax_age_secs = 60\n",
    )
    .unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(c.nats.unwrap().user.as_deref(), Some("h1"));
    assert_eq!(c.signing.max_age_secs, 60);
    std::fs::write(&path, "[nats]\nurl = \"x\"\npasword = \"p\"\n").unwrap();
    let err = AgentConfig::load(Some(&path)).unwrap_err();
    let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(text.contains("pasword"), "{text}");
    std::fs::write(
        &path,
        "[nats]\nhost_accounts = true\nhosts_nkey_seed_file = \"/etc/hostname\"\n",
    )
    .unwrap();
    let err = AgentConfig::load(Some(&path)).unwrap_err();
    assert!(matches!(err, ConfigError::HostsSeed), "{err}");
}

#[test]
fn an_empty_file_resolves_to_the_defaults_and_so_does_no_file() {
    let empty = AgentConfig::from_toml("", PathBuf::from("agent.toml")).unwrap();
    assert_eq!(empty.resolved(), &Resolved::default());
    assert_eq!(AgentConfig::default().resolved(), &Resolved::default());
    let d = Resolved::default();
    assert_eq!(d.shutdown_concurrency, 16);
    assert_eq!(d.cleanup_budget, Duration::from_secs(5));
}

#[test]
fn shutdown_concurrency_is_bounded_and_defaults_to_16() {
    for (n, ok) in [(0, false), (1, true), (1024, true), (1025, false)] {
        let text = format!("shutdown_concurrency = {n}\n");
        match AgentConfig::from_toml(&text, PathBuf::from("agent.toml")) {
            Ok(c) if ok => assert_eq!(c.resolved().shutdown_concurrency, n),
            Err(ConfigError::ShutdownConcurrency) if !ok => {}
            other => panic!("{n}: {other:?}"),
        }
    }
}

#[test]
fn commands_in_flight_is_bounded_and_defaults_to_32() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "host = \"h1\"\n").unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(c.resolved().commands_in_flight, 32);
    for (n, ok) in [(0, false), (1, true), (1024, true), (1025, false)] {
        std::fs::write(&path, format!("commands_in_flight = {n}\n")).unwrap();
        match AgentConfig::load(Some(&path)) {
            Ok(c) if ok => assert_eq!(c.resolved().commands_in_flight, n),
            Err(ConfigError::InFlight) if !ok => {}
            other => panic!("{n}: {other:?}"),
        }
    }
}

#[cfg(feature = "external")]
#[test]
fn reads_an_external_driver_and_names_bad_keys_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(
        &path,
        "driver = \"external\"\n[external]\nsocket = \"/run/d.sock\"\nconnect_timeout = 2.5\nkind = \"sim\"\nallowed_uids = [0, 990]\nallowed_gids = [990]\n",
    )
    .unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(c.driver, DriverSetting::External);
    assert_eq!(c.external.socket, Path::new("/run/d.sock"));
    assert_eq!(c.external.connect_timeout(), Duration::from_millis(2500));
    assert_eq!(c.external.kind, Some(DriverKind::SIM));
    assert!(c.external.trusts(990, 1) && c.external.trusts(5, 990));
    assert!(!c.external.trusts(5, 5));
    std::fs::write(&path, "[external]\nconnect_timeout = 0\n").unwrap();
    assert!(matches!(
        AgentConfig::load(Some(&path)),
        Err(ConfigError::External(
            capstan_external::ExternalConfigError::ConnectTimeout
        ))
    ));
    for (text, says) in [
        (
            "driver = \"external\"\n[external]\nsockett = \"x\"\n",
            "sockett",
        ),
        (
            "driver = \"extrenal\"\n",
            "sim, docker, systemd, kube, vm, or external",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let err = AgentConfig::load(Some(&path)).unwrap_err();
        let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(text.contains(says), "{text}");
    }
}

#[test]
fn metrics_are_on_at_loopback_by_default_and_a_bad_address_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "host = \"h1\"\n").unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(
        c.resolved().metrics_listen,
        Some("127.0.0.1:9464".parse().unwrap())
    );
    std::fs::write(&path, "[metrics]\nlisten = \"[::1]:0\"\n").unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(
        c.resolved().metrics_listen,
        Some("[::1]:0".parse().unwrap())
    );
    std::fs::write(&path, "[metrics]\nenabled = false\nlisten = \"x\"\n").unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(c.resolved().metrics_listen, None);
    for (text, says) in [
        (
            "[metrics]\nlisten = \"localhost:9464\"\n",
            "\"localhost:9464\"",
        ),
        ("[metrics]\nlisten = \"127.0.0.1\"\n", "IP address and port"),
        ("[metrics]\nlisen = \"127.0.0.1:1\"\n", "lisen"),
    ] {
        std::fs::write(&path, text).unwrap();
        let err = AgentConfig::load(Some(&path)).unwrap_err();
        let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(text.contains(says), "{text}");
    }
}

#[test]
fn log_retention_is_off_by_default_and_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "host = \"h1\"\n").unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    assert_eq!(c.resolved().retention, None);
    std::fs::write(
        &path,
        "[log.retention]\nmax_records = 1000\nmax_age_secs = 86400\nexport_dir = \"/var/lib/capstan/export\"\ninterval_secs = 5\n",
    )
    .unwrap();
    let c = AgentConfig::load(Some(&path)).unwrap();
    let p = c.resolved().retention.clone().unwrap();
    assert_eq!(p.max_records, Some(1000));
    assert_eq!(p.max_age, Some(Duration::from_secs(86400)));
    assert_eq!(p.interval, Duration::from_secs(5));
    assert_eq!(
        p.pruned_ids_max_age,
        Duration::from_secs(30 * 86_400),
        "30 days by default"
    );
    // The least window for pruned ids: 7 days plus `[signing] max_age_secs`.
    let at_least = "[log.retention]\npruned_ids_max_age_secs = 608400\n";
    std::fs::write(&path, at_least).unwrap();
    assert!(AgentConfig::load(Some(&path)).is_ok(), "7 days + 3600 s");
    for (text, says) in [
        ("[log.retention]\nmax_records = 10\n", "export_dir"),
        ("[log.retention]\nmax_recrods = 10\n", "max_recrods"),
        (
            "[log.retention]\npruned_ids_max_age_secs = 608399\n",
            "`pruned_ids_max_age_secs` must be at least 608400",
        ),
        (
            "[signing]\nmax_age_secs = 7200\n[log.retention]\npruned_ids_max_age_secs = 608400\n",
            "at least 612000",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let err = AgentConfig::load(Some(&path)).unwrap_err();
        let mut text = err.to_string();
        if let Some(s) = std::error::Error::source(&err) {
            text = format!("{text}: {s}");
        }
        assert!(text.contains(says), "{text}");
    }
}

#[test]
fn a_bad_host_name_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "host = \"Bad_Host\"\n").unwrap();
    assert!(matches!(
        AgentConfig::load(Some(&path)),
        Err(ConfigError::Host(_))
    ));
}

#[test]
fn a_nats_hooks_connection_settings_are_validated_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "p\n").unwrap();
    let hook = |nats: &str| {
        format!(
            "[[hooks]]\nname = \"vault\"\nkind = \"nats\"\nsubject = \"vault.hooks\"\nphases = [\"before_workload_start\", \"before_workload_stop\"]\n{nats}"
        )
    };
    let load = |text: String| {
        std::fs::write(&path, text).unwrap();
        AgentConfig::load(Some(&path))
    };
    let good = format!(
        "[hooks.nats]\nurl = \"nats://10.0.0.2:4222\"\nuser = \"h1\"\npassword_file = {:?}\n",
        secret.display().to_string()
    );
    let c = load(hook(&good)).unwrap();
    let HookKind::Nats { nats, .. } = &c.hook_owners[0].kind else {
        panic!("{:?}", c.hook_owners[0])
    };
    assert_eq!(
        (nats.url.as_str(), nats.user.as_deref()),
        ("nats://10.0.0.2:4222", Some("h1"))
    );
    for (nats, says) in [
        ("[hooks.nats]\nuser = \"h1\"\n", "exactly one of `password`"),
        (
            "[hooks.nats]\nuser = \"h1\"\npassword_file = \"/no/such/secret\"\n",
            "/no/such/secret",
        ),
        (
            "[hooks.nats]\nnkey_seed_file = \"/no/such/seed\"\n",
            "/no/such/seed",
        ),
        (
            "[hooks.nats]\ntls_cert_file = \"/etc/hostname\"\n",
            "go together",
        ),
        ("url = \"nats://a:4222\"\n[hooks.nats]\n", "not both"),
        ("[hooks.nats]\npasword = \"p\"\n", "pasword"),
    ] {
        let err = load(hook(nats)).unwrap_err();
        let text = capstan_common::report(&err);
        assert!(text.contains(says), "{nats}: {text}");
        assert!(!text.contains("\"p\\n\""), "no password in errors");
    }
}

#[test]
fn reconcile_interval_is_bounded_defaults_to_60_and_0_turns_the_loop_off() {
    let d = Resolved::default();
    assert_eq!(d.reconcile_interval, Some(Duration::from_secs(60)));
    for (n, expect) in [
        (0, Some(None)),
        (1, Some(Some(1))),
        (86_400, Some(Some(86_400))),
        (86_401, None),
    ] {
        let text = format!("reconcile_interval_secs = {n}\n");
        match (
            AgentConfig::from_toml(&text, PathBuf::from("agent.toml")),
            expect,
        ) {
            (Ok(c), Some(secs)) => assert_eq!(
                c.resolved().reconcile_interval,
                secs.map(Duration::from_secs)
            ),
            (Err(ConfigError::ReconcileInterval), None) => {}
            (other, _) => panic!("{n}: {other:?}"),
        }
    }
}

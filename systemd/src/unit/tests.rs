use super::*;
use crate::escape::decode::{self, hostile};
use crate::SystemdSpec;
use capstan_common::Settings as _;
use capstan_common::{DriverKind, ErrorCode};
use capstan_driver::{merged_env, LaunchEnv};

fn rev<'a>(namespace: &'a str, workload: &'a str, revision: &'a str) -> RevisionRef<'a> {
    RevisionRef {
        namespace,
        workload,
        revision,
    }
}

fn spec() -> Spec {
    Spec {
        driver: DriverKind::SYSTEMD,
        command: vec!["/usr/bin/sleep".into(), "infinity".into()],
        env: BTreeMap::from([("GREETING".into(), "hello world".into())]),
        ..Default::default()
    }
}

fn settings() -> UnitSettings {
    UnitSettings::new("/var/lib/capstan/ns/team-a".into())
}

/// The value of the one line setting `key`; panics unless there is exactly one.
fn the<'a>(text: &'a str, key: &str) -> &'a str {
    let values: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect();
    assert_eq!(values.len(), 1, "{key} in:\n{text}");
    values[0]
}

/// The lines systemd would read as section headers.
fn sections(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('['))
        .collect()
}

#[test]
fn given_a_rendered_service_when_its_markers_are_read_then_they_are_the_revisions() {
    let s = spec();
    let text = service("host-1", rev("team-a", "web", "r1"), &s, &settings()).unwrap();
    assert!(text.starts_with(&format!("{HEADER}\n[Unit]\n")));
    assert_eq!(
        markers(&text),
        Some(Markers {
            host: "host-1".into(),
            namespace: "team-a".into(),
            workload: "web".into(),
            revision: "r1".into(),
            spec_hash: naming::spec_hash(&s),
        })
    );
    assert_eq!(slice_markers(&text), None);
    assert_eq!(sections(&text), ["[Unit]", "[Service]", "[Install]"]);
}

#[test]
fn given_a_spec_with_settings_when_rendered_then_each_appears_once() {
    let mut s = spec();
    s.working_dir = Some("/srv/app".into());
    SystemdSpec {
        user: Some("svc".into()),
        group: Some("1000".into()),
        read_write_paths: vec!["/srv/data".into(), "/srv/with space".into()],
        memory_max_bytes: Some(1 << 20),
        cpu_quota_percent: Some(150),
        capabilities: vec!["CAP_NET_BIND_SERVICE".into(), "CAP_IPC_LOCK".into()],
        syscalls: vec!["@mount".into(), "ptrace".into()],
    }
    .write_into(&mut s);
    let settings = UnitSettings {
        stop_timeout_secs: 45,
        start_limit_interval_secs: 120,
        start_limit_burst: 7,
        restart_sec_ms: 1500,
        ..settings()
    };
    let text = service("h", rev("team-a", "web", "r1"), &s, &settings).unwrap();
    for (key, value) in [
        ("Description", "capstan team-a/web@r1"),
        ("StartLimitIntervalSec", "120"),
        ("StartLimitBurst", "7"),
        ("Type", "exec"),
        ("WorkingDirectory", "/srv/app"),
        ("Restart", "on-failure"),
        ("RestartSec", "1500ms"),
        ("TimeoutStopSec", "45"),
        ("Slice", r"capstan-team\x2da.slice"),
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("DynamicUser", "yes"),
        ("User", "svc"),
        ("Group", "1000"),
        ("StateDirectory", "capstan/ns/team-a"),
        ("CapabilityBoundingSet", "CAP_NET_BIND_SERVICE CAP_IPC_LOCK"),
        ("AmbientCapabilities", "CAP_NET_BIND_SERVICE CAP_IPC_LOCK"),
        ("MemoryMax", "1048576"),
        ("CPUQuota", "150%"),
    ] {
        assert_eq!(the(&text, key), value, "{key}");
    }
    // The spec's system calls are allowed besides the default set.
    let filters: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("SystemCallFilter="))
        .collect();
    assert_eq!(filters, ["@system-service", "@mount ptrace"]);
    let exec = format!("ExecStart={}", the(&text, "ExecStart"));
    assert_eq!(decode::exec_start(&exec), Ok(s.command.clone()));
    let rw = format!("ReadWritePaths={}", the(&text, "ReadWritePaths"));
    assert_eq!(
        decode::path_list(&rw, "ReadWritePaths"),
        Ok(vec!["/srv/data".to_string(), "/srv/with space".into()])
    );
    assert!(!text.contains("Environment"));
    assert_eq!(text.matches("[Install]").count(), 1);
    assert!(text.ends_with("[Install]\nWantedBy=multi-user.target\n"));
}

/// Given a spec that asks for nothing, when rendered, then the unit runs as the
/// namespace's dynamic user with no capabilities, the default system call filter and
/// every sandboxing setting, in the state directory systemd makes for it.
#[test]
fn given_a_spec_without_settings_when_rendered_then_the_unit_is_hardened() {
    let text = service("h", rev("team-a", "web", "r1"), &spec(), &settings()).unwrap();
    assert_eq!(
        the(&text, "WorkingDirectory"),
        "/var/lib/private/capstan/ns/team-a"
    );
    assert_eq!(the(&text, "StateDirectory"), "capstan/ns/team-a");
    assert_eq!(the(&text, "StateDirectoryMode"), "0700");
    assert_eq!(the(&text, "DynamicUser"), "yes");
    assert_eq!(the(&text, "User"), "capstan-team-a");
    assert_eq!(the(&text, "CapabilityBoundingSet"), "");
    assert_eq!(the(&text, "AmbientCapabilities"), "");
    assert_eq!(the(&text, "SystemCallFilter"), "@system-service");
    for setting in HARDENING {
        let (key, value) = setting.split_once('=').unwrap();
        assert_eq!(the(&text, key), value, "{key}");
    }
    assert_eq!(the(&text, "StartLimitBurst"), "10");
    for absent in [
        "Group=",
        "ReadWritePaths=",
        "MemoryMax=",
        "CPUQuota=",
        "MemoryDenyWriteExecute=",
    ] {
        assert!(!text.contains(absent), "{absent}");
    }
}

/// Given values a spec or the config could hold that no unit file may carry — a
/// newline, a byte outside ASCII, a capability not on the list, a state dir systemd
/// cannot make — when rendered, then refused naming the field, nothing rendered.
#[test]
fn given_hardening_values_that_could_add_a_directive_when_rendered_then_refused() {
    let r = rev("ns", "web", "r1");
    for (field, change) in [
        (
            "systemd.user",
            (|s: &mut Spec| SystemdSpec::edit(s, |c| c.user = Some("app\nUser=root".into())))
                as fn(&mut Spec),
        ),
        ("systemd.user", |s| {
            SystemdSpec::edit(s, |c| c.user = Some("ápp".into()))
        }),
        ("systemd.group", |s| {
            SystemdSpec::edit(s, |c| c.group = Some("g\r[Service]".into()))
        }),
        ("systemd.capabilities[0]", |s| {
            SystemdSpec::edit(s, |c| {
                c.capabilities = vec!["CAP_CHOWN\nCapabilityBoundingSet=CAP_SYS_ADMIN".into()]
            })
        }),
        ("systemd.capabilities[1]", |s| {
            SystemdSpec::edit(s, |c| {
                c.capabilities = vec!["CAP_CHOWN".into(), "CAP_SYS_ADMIN".into()]
            })
        }),
        ("systemd.syscalls[0]", |s| {
            SystemdSpec::edit(s, |c| c.syscalls = vec!["read\nUser=root".into()])
        }),
        ("systemd.syscalls[0]", |s| {
            SystemdSpec::edit(s, |c| c.syscalls = vec!["réad".into()])
        }),
    ] {
        let mut s = spec();
        change(&mut s);
        let err = service("h", r, &s, &settings()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidSpec, "{field}");
        assert!(err.to_string().starts_with(&format!("{field}: ")), "{err}");
    }
    for dir in [
        "/srv/capstan/ns",
        "/var/lib",
        "/var/lib/a b/ns",
        "/var/lib/a\n[Service]/ns",
    ] {
        let err = service("h", r, &spec(), &UnitSettings::new(dir.into())).unwrap_err();
        assert!(err.to_string().starts_with("state_dir: "), "{dir:?}: {err}");
    }
}

/// Given a namespace, when its cleanup unit is rendered, then it is a oneshot that
/// removes exactly its state directory, both where systemd keeps it and its symlink,
/// and it is recognised as this host's cleanup unit only.
#[test]
fn given_a_namespace_when_its_cleanup_unit_is_rendered_then_it_removes_its_state_only() {
    let text = cleanup(
        "host-1",
        "team-a",
        std::path::Path::new("/var/lib/capstan/units/team-a"),
    )
    .unwrap();
    assert_eq!(sections(&text), ["[Unit]", "[Service]"]);
    assert_eq!(the(&text, "Type"), "oneshot");
    let exec = format!("ExecStart={}", the(&text, "ExecStart"));
    assert_eq!(
        decode::exec_start(&exec),
        Ok([
            "/bin/rm",
            "-rf",
            "--one-file-system",
            "--",
            "/var/lib/private/capstan/units/team-a",
            "/var/lib/capstan/units/team-a"
        ]
        .map(String::from)
        .to_vec())
    );
    assert!(is_cleanup("host-1", &text));
    assert!(!is_cleanup("host-2", &text));
    assert_eq!(markers(&text), None);
    assert_eq!(slice_markers(&text), None);
    let service = service("host-1", rev("team-a", "web", "r1"), &spec(), &settings()).unwrap();
    assert!(!is_cleanup("host-1", &service));
    assert!(!is_cleanup("host-1", &slice("host-1", "team-a").unwrap()));
    let err = cleanup("h", "ns", std::path::Path::new("/srv/ns")).unwrap_err();
    assert!(
        matches!(
            err,
            EscapeError::Invalid {
                field: "state_dir",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.code(), ErrorCode::InvalidSpec);
}

#[test]
fn given_hostile_arguments_when_rendered_then_one_line_a_directive_and_no_new_section() {
    let mut s = spec();
    s.command = std::iter::once("/usr/bin/printf".to_string())
        .chain(hostile())
        .chain(["\nX-Capstan-Host=evil".into(), "\n[Install]".into()])
        .collect();
    s.working_dir = Some("/srv/%h/$HOME/\"x\";y".into());
    SystemdSpec::edit(&mut s, |c| {
        c.read_write_paths = vec!["/srv/\"\\ ; %h".into()]
    });
    let text = service("host-1", rev("ns", "web", "r1"), &s, &settings()).unwrap();
    assert_eq!(sections(&text), ["[Unit]", "[Service]", "[Install]"]);
    let exec = format!("ExecStart={}", the(&text, "ExecStart"));
    assert_eq!(decode::exec_start(&exec), Ok(s.command.clone()));
    let wd = format!("WorkingDirectory={}", the(&text, "WorkingDirectory"));
    assert_eq!(
        decode::path(&wd, "WorkingDirectory"),
        Ok("/srv/%h/$HOME/\"x\";y".into())
    );
    assert_eq!(markers(&text).unwrap().host, "host-1");
    // Every other line is a setting, each setting once: 8 in [Unit]; in [Service] 7,
    // then 6 of user, state and capabilities, the hardening and `ReadWritePaths=`; 1
    // in [Install].
    let service = 7 + 6 + HARDENING.len() + 1;
    let keys: std::collections::BTreeSet<&str> = text
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty() && !l.starts_with('['))
        .map(|l| l.split_once('=').expect("a setting").0)
        .collect();
    assert_eq!(keys.len(), 8 + service + 1);
    assert_eq!(text.lines().count(), 1 + 3 + 2 + 8 + service + 1);
}

#[test]
fn given_a_hostile_environment_when_written_as_a_dropin_then_each_variable_is_one_line() {
    let s = spec();
    let launch: LaunchEnv = hostile()
        .into_iter()
        .enumerate()
        .map(|(i, v)| (format!("HOSTILE_{i:02}"), v))
        .collect();
    let env = merged_env(&s, &launch);
    let text = env_dropin(&env).unwrap();
    assert!(text.starts_with(&format!("{HEADER}\n[Service]\n")));
    assert_eq!(sections(&text), ["[Service]"]);
    let lines: Vec<&str> = text.lines().skip(2).collect();
    assert_eq!(lines.len(), env.len());
    for (l, (name, value)) in lines.iter().zip(&env) {
        assert_eq!(decode::environment(l), Ok((name.clone(), value.clone())));
    }
}

#[test]
fn given_values_that_cannot_be_written_when_rendered_then_refused_with_their_field() {
    let r = rev("ns", "web", "r1");
    let mut s = spec();
    SystemdSpec::edit(&mut s, |c| c.user = Some("root\nUser=0".into()));
    let err = service("h", r, &s, &settings()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidSpec);
    assert!(err.to_string().starts_with("systemd.user: "), "{err}");

    let mut s = spec();
    SystemdSpec::edit(&mut s, |c| c.read_write_paths = vec!["relative".into()]);
    let err = service("h", r, &s, &settings()).unwrap_err();
    assert!(
        err.to_string().starts_with("systemd.read_write_paths[0]: "),
        "{err}"
    );

    let mut s = spec();
    s.working_dir = Some("/srv/a\\".into());
    let err = service("h", r, &s, &settings()).unwrap_err();
    assert!(err.to_string().starts_with("working_dir: "), "{err}");

    let err = service("h\n[Service]", r, &spec(), &settings()).unwrap_err();
    assert!(err.to_string().starts_with("host: "), "{err}");

    let env = BTreeMap::from([("BAD NAME".to_string(), "v".to_string())]);
    assert_eq!(env_dropin(&env).unwrap_err().code(), ErrorCode::InvalidEnv);
    let err = slice("h", "ns\n[Slice]").unwrap_err();
    assert!(
        matches!(
            err,
            EscapeError::Invalid {
                field: "namespace",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.code(), ErrorCode::InvalidSpec);
}

#[test]
fn given_a_slice_when_its_markers_are_read_then_host_and_namespace() {
    let text = slice("host-1", "team-a").unwrap();
    assert_eq!(sections(&text), ["[Unit]", "[Slice]"]);
    assert_eq!(the(&text, "Description"), "capstan namespace team-a");
    assert_eq!(
        slice_markers(&text),
        Some(("host-1".to_string(), "team-a".to_string()))
    );
    assert_eq!(markers(&text), None);
}

#[test]
fn given_files_without_the_header_or_a_marker_when_read_then_they_are_not_ours() {
    let text = service("h", rev("ns", "web", "r1"), &spec(), &settings()).unwrap();
    assert!(markers(&text).is_some());
    let without_header = text.replacen(HEADER, "# Written by someone else", 1);
    assert_eq!(markers(&without_header), None);
    assert_eq!(markers(&format!("\n{text}")), None);
    assert_eq!(markers(""), None);
    for key in [HOST, NAMESPACE, WORKLOAD, REVISION, SPEC_HASH] {
        let missing: String = text
            .lines()
            .filter(|l| !l.starts_with(key))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(markers(&missing), None, "without {key}");
    }
    let twice = text.replacen("[Unit]\n", "[Unit]\nX-Capstan-Host=other\n", 1);
    assert_eq!(markers(&twice), None);
    let empty = text.replacen("X-Capstan-Host=h", "X-Capstan-Host=", 1);
    assert_eq!(markers(&empty), None);
    // A marker outside [Unit] does not count.
    let moved = text.replacen("X-Capstan-Host=h\n", "", 1).replacen(
        "[Service]\n",
        "[Service]\nX-Capstan-Host=h\n",
        1,
    );
    assert_eq!(markers(&moved), None);
}

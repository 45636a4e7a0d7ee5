use super::*;
use crate::escape::decode::{self, hostile};
use capstan_common::{DriverKind, ErrorCode, SystemdSpec};
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
        driver: DriverKind::Systemd,
        image: None,
        command: vec!["/usr/bin/sleep".into(), "infinity".into()],
        env: BTreeMap::from([("GREETING".into(), "hello world".into())]),
        working_dir: None,
        mounts: vec![],
        ports: vec![],
        systemd: SystemdSpec::default(),
        kube: Default::default(),
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
    s.systemd = SystemdSpec {
        user: Some("svc".into()),
        group: Some("1000".into()),
        read_write_paths: vec!["/srv/data".into(), "/srv/with space".into()],
        memory_max_bytes: Some(1 << 20),
        cpu_quota_percent: Some(150),
    };
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
        ("ProtectHome", "read-only"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("User", "svc"),
        ("Group", "1000"),
        ("MemoryMax", "1048576"),
        ("CPUQuota", "150%"),
    ] {
        assert_eq!(the(&text, key), value, "{key}");
    }
    let exec = format!("ExecStart={}", the(&text, "ExecStart"));
    assert_eq!(decode::exec_start(&exec), Ok(s.command.clone()));
    let rw = format!("ReadWritePaths={}", the(&text, "ReadWritePaths"));
    assert_eq!(
        decode::path_list(&rw, "ReadWritePaths"),
        Ok(vec![
            "/var/lib/capstan/ns/team-a".to_string(),
            "/srv/data".into(),
            "/srv/with space".into()
        ])
    );
    assert!(!text.contains("Environment"));
    assert_eq!(text.matches("[Install]").count(), 1);
    assert!(text.ends_with("[Install]\nWantedBy=multi-user.target\n"));
}

#[test]
fn given_a_spec_without_settings_when_rendered_then_the_state_dir_is_the_default() {
    let text = service("h", rev("ns", "web", "r1"), &spec(), &settings()).unwrap();
    assert_eq!(the(&text, "WorkingDirectory"), "/var/lib/capstan/ns/team-a");
    assert_eq!(
        the(&text, "ReadWritePaths"),
        "\"/var/lib/capstan/ns/team-a\""
    );
    assert_eq!(the(&text, "StartLimitBurst"), "10");
    for absent in ["User=", "Group=", "MemoryMax=", "CPUQuota="] {
        assert!(!text.contains(absent), "{absent}");
    }
}

#[test]
fn given_hostile_arguments_when_rendered_then_one_line_a_directive_and_no_new_section() {
    let mut s = spec();
    s.command = std::iter::once("/usr/bin/printf".to_string())
        .chain(hostile())
        .chain(["\nX-Capstan-Host=evil".into(), "\n[Install]".into()])
        .collect();
    s.working_dir = Some("/srv/%h/$HOME/\"x\";y".into());
    s.systemd.read_write_paths = vec!["/srv/\"\\ ; %h".into()];
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
    // Every other line is a setting, each setting once: 8 in [Unit], 18 in [Service],
    // 1 in [Install].
    let keys: std::collections::BTreeSet<&str> = text
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty() && !l.starts_with('['))
        .map(|l| l.split_once('=').expect("a setting").0)
        .collect();
    assert_eq!(keys.len(), 8 + 18 + 1);
    assert_eq!(text.lines().count(), 1 + 3 + 2 + 8 + 18 + 1);
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
    s.systemd.user = Some("root\nUser=0".into());
    let err = service("h", r, &s, &settings()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidSpec);
    assert!(err.to_string().starts_with("systemd.user: "), "{err}");

    let mut s = spec();
    s.systemd.read_write_paths = vec!["relative".into()];
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
    assert!(slice("h", "ns\n[Slice]").is_err());
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

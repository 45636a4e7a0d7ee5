use super::*;

fn systemd_spec(command: &[&str]) -> Spec {
    Spec {
        driver: DriverKind::SYSTEMD,
        command: command.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `spec` with its settings changed by `set`.
fn with(mut spec: Spec, set: impl FnOnce(&mut SystemdSpec)) -> Spec {
    SystemdSpec::edit(&mut spec, set);
    spec
}

fn invalid(spec: &Spec) -> String {
    let e = check(spec).expect_err("should be refused");
    assert_eq!(e.code, ErrorCode::InvalidSpec, "{e:?}");
    e.message
}

#[test]
fn a_systemd_spec_runs_an_absolute_program_with_settings_a_unit_can_hold() {
    let ok = with(
        systemd_spec(&["/usr/bin/app", "--flag", "a b; $X %h"]),
        |s| {
            s.user = Some("app".into());
            s.group = Some("1001".into());
            s.read_write_paths = vec!["/srv/app data".into()];
            s.memory_max_bytes = Some(64 << 20);
            s.cpu_quota_percent = Some(150);
        },
    );
    check(&ok).unwrap();

    assert!(invalid(&systemd_spec(&[])).contains("absolute"));
    assert!(invalid(&systemd_spec(&["app"])).contains("absolute"));
    assert!(invalid(&systemd_spec(&["-/bin/app"])).contains("absolute"));
    let mut image = systemd_spec(&["/bin/app"]);
    image.image = Some("busybox".into());
    assert!(invalid(&image).contains("image"));
    for user in ["Root", "a b", "x\ny", "", "-x", &"a".repeat(33)] {
        let s = with(systemd_spec(&["/bin/app"]), |s| s.user = Some(user.into()));
        assert!(invalid(&s).contains("user"), "{user:?}");
    }
    let path = with(systemd_spec(&["/bin/app"]), |s| {
        s.read_write_paths = vec!["relative".into()]
    });
    assert!(invalid(&path).contains("read_write_paths"));
    let zero = with(systemd_spec(&["/bin/app"]), |s| {
        s.memory_max_bytes = Some(0)
    });
    assert!(invalid(&zero).contains("above 0"));
}

/// Given a systemd spec asking for more than the hardened default, when it is
/// validated, then only names from the allow-lists and grammars pass.
#[test]
fn a_systemd_spec_may_ask_for_listed_capabilities_and_syscalls_only() {
    let ok = with(systemd_spec(&["/bin/app"]), |s| {
        s.user = Some("0".into());
        s.capabilities = vec!["CAP_NET_BIND_SERVICE".into(), "CAP_IPC_LOCK".into()];
        s.syscalls = vec!["@privileged".into(), "ptrace".into(), "_llseek".into()];
    });
    check(&ok).unwrap();

    for cap in [
        "CAP_SYS_ADMIN",
        "cap_net_bind_service",
        "NET_BIND_SERVICE",
        "CAP_NET_BIND_SERVICE\nUser=root",
        "CAP_NET_BIND_SERVICE CAP_SYS_ADMIN",
        "",
        "CAP_NËT",
    ] {
        let s = with(systemd_spec(&["/bin/app"]), |s| {
            s.capabilities = vec!["CAP_CHOWN".into(), cap.into()]
        });
        assert!(invalid(&s).contains("systemd.capabilities"), "{cap:?}");
    }
    for call in [
        "@nosuchgroup",
        "~@privileged",
        "Ptrace",
        "ptrace\n[Service]",
        "a b",
        "",
        "é",
        &"a".repeat(65),
    ] {
        let s = with(systemd_spec(&["/bin/app"]), |s| {
            s.syscalls = vec![call.into()]
        });
        assert!(invalid(&s).contains("systemd.syscalls"), "{call:?}");
    }
    let many = with(systemd_spec(&["/bin/app"]), |s| {
        s.syscalls = vec!["read".into(); 129]
    });
    assert!(invalid(&many).contains("at most 128"));
    let twice = with(systemd_spec(&["/bin/app"]), |s| {
        s.capabilities = vec!["CAP_CHOWN".into(), "CAP_LEASE".into(), "CAP_CHOWN".into()]
    });
    assert!(invalid(&twice).contains("twice"));
}

/// Given user and group names, when validated, then a unix account name or a
/// usable numeric id passes, and nothing that could end a unit-file line does.
#[test]
fn systemd_user_and_group_names_are_account_names() {
    for ok in [
        "app",
        "_svc",
        "web-1",
        "a_b-c",
        "0",
        "1001",
        "4294967294",
        &"a".repeat(32),
    ] {
        assert!(is_account_name(ok), "{ok:?}");
    }
    for bad in [
        "",
        "Root",
        "1a",
        "-x",
        "a b",
        "app\nUser=root",
        "app\r",
        "app;id",
        "ápp",
        "4294967295",
        "65535",
        "99999999999",
        &"a".repeat(33),
    ] {
        assert!(!is_account_name(bad), "{bad:?}");
        let s = with(systemd_spec(&["/bin/app"]), |s| s.group = Some(bad.into()));
        assert!(invalid(&s).contains("user`/`group"), "{bad:?}");
    }
}

/// Given a section the driver cannot read (an unknown field, a wrong type), when
/// checked, then it is `invalid_spec` naming the section.
#[test]
fn an_unreadable_section_is_invalid_spec() {
    for section in [
        r#"{"usr":"app"}"#,
        r#"{"user":1}"#,
        r#"{"memory_max_bytes":-1}"#,
    ] {
        let mut s = systemd_spec(&["/bin/app"]);
        let text = format!(
            r#"{{"driver":"systemd","image":null,"command":["/bin/app"],"env":{{}},"working_dir":null,"mounts":[],"ports":[],"systemd":{section}}}"#
        );
        s.sections = serde_json::from_str::<Spec>(&text).unwrap().sections;
        assert!(invalid(&s).starts_with("`systemd`: "), "{section}");
    }
}

/// Given a spec of a systemd revision with a readiness check, when checked, then
/// port checks pass and an exec check (it would run outside the unit) is refused.
#[test]
fn the_systemd_driver_probes_ports_only() {
    let mut s = systemd_spec(&["/bin/app"]);
    s.readiness = Some(serde_json::from_str(r#"{"check":{"tcp":{"port":80}}}"#).unwrap());
    check(&s).unwrap();
    s.readiness = Some(serde_json::from_str(r#"{"check":{"exec":{"command":["true"]}}}"#).unwrap());
    assert!(invalid(&s).contains("`http` and `tcp` readiness only"));
}

/// Given settings written into a spec, when the spec goes to JSON and back, then the
/// section is spelled in the settings' field order, as before sections were data (the
/// canonical JSON, hash and id binding of a spec written then is unchanged).
#[test]
fn a_section_keeps_the_canonical_json_settings_had_as_a_typed_field() {
    let s = with(systemd_spec(&["/bin/app"]), |s| {
        s.user = Some("app".into());
        s.capabilities = vec!["CAP_CHOWN".into()];
    });
    let json = serde_json::to_string(&s).unwrap();
    let expected = r#""ports":[],"systemd":{"user":"app","group":null,"capabilities":["CAP_CHOWN"],"read_write_paths":[],"memory_max_bytes":null,"cpu_quota_percent":null}}"#;
    assert!(json.ends_with(expected), "{json}");
    let back: Spec = serde_json::from_str(&json).unwrap();
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
    assert_eq!(check(&back).unwrap().capabilities, ["CAP_CHOWN"]);
}

use super::*;
use proptest::prelude::*;

fn systemd_spec(command: &[&str]) -> Spec {
    Spec {
        driver: DriverKind::Systemd,
        image: None,
        command: command.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        working_dir: None,
        mounts: vec![],
        ports: vec![],
        systemd: Default::default(),
        kube: Default::default(),
        readiness: None,
        strategy: Default::default(),
    }
}

fn invalid(spec: &Spec) -> String {
    let e = super::spec(spec).expect_err("should be refused");
    assert_eq!(e.code, ErrorCode::InvalidSpec, "{e:?}");
    e.message
}

#[test]
fn a_systemd_spec_runs_an_absolute_program_with_settings_a_unit_can_hold() {
    let mut ok = systemd_spec(&["/usr/bin/app", "--flag", "a b; $X %h"]);
    ok.systemd.user = Some("app".into());
    ok.systemd.group = Some("1001".into());
    ok.systemd.read_write_paths = vec!["/srv/app data".into()];
    ok.systemd.memory_max_bytes = Some(64 << 20);
    ok.systemd.cpu_quota_percent = Some(150);
    super::spec(&ok).unwrap();

    assert!(invalid(&systemd_spec(&[])).contains("absolute"));
    assert!(invalid(&systemd_spec(&["app"])).contains("absolute"));
    assert!(invalid(&systemd_spec(&["-/bin/app"])).contains("absolute"));
    let mut image = systemd_spec(&["/bin/app"]);
    image.image = Some("busybox".into());
    assert!(invalid(&image).contains("image"));
    for user in ["Root", "a b", "x\ny", "", "-x", &"a".repeat(33)] {
        let mut s = systemd_spec(&["/bin/app"]);
        s.systemd.user = Some(user.into());
        assert!(invalid(&s).contains("user"), "{user:?}");
    }
    let mut path = systemd_spec(&["/bin/app"]);
    path.systemd.read_write_paths = vec!["relative".into()];
    assert!(invalid(&path).contains("read_write_paths"));
    let mut zero = systemd_spec(&["/bin/app"]);
    zero.systemd.memory_max_bytes = Some(0);
    assert!(invalid(&zero).contains("above 0"));
}

/// Given a systemd spec asking for more than the hardened default, when it is
/// validated, then only names from the allow-lists and grammars pass.
#[test]
fn a_systemd_spec_may_ask_for_listed_capabilities_and_syscalls_only() {
    let mut ok = systemd_spec(&["/bin/app"]);
    ok.systemd.user = Some("0".into());
    ok.systemd.capabilities = vec!["CAP_NET_BIND_SERVICE".into(), "CAP_IPC_LOCK".into()];
    ok.systemd.syscalls = vec!["@privileged".into(), "ptrace".into(), "_llseek".into()];
    super::spec(&ok).unwrap();

    for cap in [
        "CAP_SYS_ADMIN",
        "cap_net_bind_service",
        "NET_BIND_SERVICE",
        "CAP_NET_BIND_SERVICE\nUser=root",
        "CAP_NET_BIND_SERVICE CAP_SYS_ADMIN",
        "",
        "CAP_NËT",
    ] {
        let mut s = systemd_spec(&["/bin/app"]);
        s.systemd.capabilities = vec!["CAP_CHOWN".into(), cap.into()];
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
        let mut s = systemd_spec(&["/bin/app"]);
        s.systemd.syscalls = vec![call.into()];
        assert!(invalid(&s).contains("systemd.syscalls"), "{call:?}");
    }
    let mut many = systemd_spec(&["/bin/app"]);
    many.systemd.syscalls = vec!["read".into(); 129];
    assert!(invalid(&many).contains("at most 128"));
    let mut twice = systemd_spec(&["/bin/app"]);
    twice.systemd.capabilities = vec!["CAP_CHOWN".into(), "CAP_LEASE".into(), "CAP_CHOWN".into()];
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
        let mut s = systemd_spec(&["/bin/app"]);
        s.systemd.group = Some(bad.into());
        assert!(invalid(&s).contains("user`/`group"), "{bad:?}");
    }
}

#[test]
fn other_drivers_refuse_systemd_settings() {
    let mut s = systemd_spec(&["/bin/app"]);
    s.driver = DriverKind::Sim;
    super::spec(&s).unwrap();
    s.systemd.user = Some("app".into());
    assert!(invalid(&s).contains("only for driver systemd"));
}

#[test]
fn stop_first_is_written_out_and_every_driver_takes_it() {
    let mut s = systemd_spec(&["/bin/app"]);
    s.strategy = crate::Strategy::StopFirst;
    super::spec(&s).unwrap();
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains(r#""strategy":"stop-first""#), "{json}");
    let default = serde_json::to_string(&systemd_spec(&["/bin/app"])).unwrap();
    assert!(
        !default.contains("strategy"),
        "left out at its default: {default}"
    );
    // The kube driver replaces a revision stop-first with a Recreate Deployment.
    s.driver = DriverKind::Kube;
    s.command = vec![];
    s.image = Some("shop/web:1".into());
    super::spec(&s).unwrap();
}

#[test]
fn dns_labels() {
    for ok in ["a", "a1", "web-1", "0", &"a".repeat(63)] {
        assert!(is_dns_label(ok), "{ok}");
    }
    for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64), "é"] {
        assert!(!is_dns_label(bad), "{bad}");
    }
}

#[test]
fn image_refs() {
    for ok in [
        "busybox",
        "busybox:1.36",
        "library/busybox:latest",
        "registry.local:5000/team/app:v1.2_3",
        "localhost/app",
        "capstan-test/busybox:1",
        "app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        assert!(is_image_ref(ok), "{ok}");
    }
    for bad in [
        "",
        "Busybox",
        "a b",
        "app:",
        "app:-x",
        "-app",
        "app@sha256:zz",
        "a//b",
        "ho_st.x/app",
    ] {
        assert!(!is_image_ref(bad), "{bad}");
    }
}

/// `IMAGE_REF_PATTERN` (within `IMAGE_REF_MAX_LEN`) says of these what
/// `is_image_ref` says: the cases above and edges of each rule.
#[test]
fn the_image_pattern_gives_the_validators_verdicts() {
    let pattern = regex::Regex::new(IMAGE_REF_PATTERN).unwrap();
    let hex = "0123456789abcdef".repeat(4);
    let long_tag = format!("app:{}", "t".repeat(128));
    let longer_tag = format!("app:{}", "t".repeat(129));
    let long = format!("{}/app", "a".repeat(508));
    let longer = format!("{}/app", "a".repeat(509));
    let cases = [
        "busybox",
        "busybox:1.36",
        "library/busybox:latest",
        "registry.local:5000/team/app:v1.2_3",
        "localhost/app",
        "localhost",
        "localhost:5000/app",
        "capstan-test/busybox:1",
        "Busybox",
        "a b",
        "app:",
        "app:-x",
        "app:_x",
        "app:X.Y-z",
        "-app",
        "app-",
        "a..b",
        "a__b",
        "a/b/c/d",
        "a//b",
        "/app",
        "app/",
        "ho_st.x/app",
        "HOST.x/app",
        "h:/app",
        "./app",
        ".",
        "a.b",
        "a.b/c",
        "a_b/c",
        "a-b/c",
        "A/b",
        "a/B",
        "a:b/c",
        "a:b:c",
        "a/b:c",
        "a/b:c:d",
        "host:5000",
        "app@",
        "@sha256:x",
        "app@sha256:",
        "app@sha256:zz",
        "app@sha256:ABCDEF",
        "app@sha1:00",
        "a@b@c",
        "app:1@",
        "é",
        "app\n",
        "a/b.c/d:1",
        "a.b:1/c.d",
        "a-/b",
        "a/-b",
        "a/b-",
    ];
    let digests = [
        format!("app@sha256:{hex}"),
        format!("app:1@sha256:{hex}"),
        format!("r.io:1/a/b:c@sha256:{hex}"),
        format!("app@sha256:{hex}0"),
        format!("app@sha256:{}", &hex[1..]),
        format!("app@sha256:{}", hex.to_uppercase()),
    ];
    let mut verdicts = (0, 0);
    for image in cases
        .iter()
        .map(|c| c.to_string())
        .chain(digests)
        .chain([long_tag, longer_tag, long, longer])
    {
        let expected = is_image_ref(&image);
        let matched = image.len() <= IMAGE_REF_MAX_LEN && pattern.is_match(&image);
        assert_eq!(matched, expected, "{image:?}");
        if expected {
            verdicts.0 += 1
        } else {
            verdicts.1 += 1
        }
    }
    assert!(verdicts.0 >= 20 && verdicts.1 >= 30, "{verdicts:?}");
}

#[test]
fn paths_and_volumes() {
    for ok in ["/", "/data", "/a/b.c/d"] {
        assert!(is_abs_path(ok), "{ok}");
    }
    for bad in ["", "data", "/a/../b", "/a\0", "/a\nb", "/a,b"] {
        assert!(!is_abs_path(bad), "{bad}");
    }
    assert!(is_volume_name("cache_1.v"));
    for bad in ["", "-v", "a/b", "a b"] {
        assert!(!is_volume_name(bad), "{bad}");
    }
}

proptest! {
    /// Strings of every character the grammar gives a role (and a few it gives
    /// none), shaped like references: the pattern and the validator agree.
    #[test]
    fn the_image_pattern_agrees_with_the_validator(
        s in "([a-zA-Z0-9._:@/-]{0,12}|[a-z0-9.:]{1,8}/[a-z0-9._-]{1,8}(:[A-Za-z0-9._-]{1,6})?(@sha256:[0-9a-f]{63,65})?| |é)",
    ) {
        let pattern = regex::Regex::new(IMAGE_REF_PATTERN).unwrap();
        let matched = s.len() <= IMAGE_REF_MAX_LEN && pattern.is_match(&s);
        prop_assert_eq!(matched, is_image_ref(&s), "{:?}", s);
    }

    #[test]
    fn dns_label_grammar_matches_definition(s in "[a-z0-9-]{0,70}") {
        let expect = !s.is_empty() && s.len() <= 63 && !s.starts_with('-') && !s.ends_with('-');
        prop_assert_eq!(is_dns_label(&s), expect);
    }

    /// Strings of name characters mixed with `=`, NUL, `-`, a space and a
    /// non-ASCII letter: the answer is exactly the documented grammar.
    #[test]
    fn env_name_grammar_matches_definition(s in "[A-Za-z0-9_=\\x00 é-]{0,20}") {
        let mut chars = s.chars();
        let expect = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        prop_assert_eq!(is_env_name(&s), expect, "{:?}", s);
    }

    /// A valid name with `=` or NUL put anywhere in it is never a name.
    #[test]
    fn env_names_never_contain_equals_or_nul(
        name in "[A-Za-z_][A-Za-z0-9_]{0,15}",
        bad in prop::sample::select(vec!['=', '\0']),
        at in any::<prop::sample::Index>(),
    ) {
        prop_assert!(is_env_name(&name));
        let mut s = name.clone();
        s.insert(at.index(name.len() + 1), bad);
        prop_assert!(!is_env_name(&s), "{:?}", s);
    }
}

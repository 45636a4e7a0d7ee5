use super::*;
use proptest::prelude::*;

fn sim_spec(command: &[&str]) -> Spec {
    Spec {
        driver: DriverKind::SIM,
        command: command.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn invalid(spec: &Spec) -> String {
    let e = super::spec(spec).expect_err("should be refused");
    assert_eq!(e.code, ErrorCode::InvalidSpec, "{e:?}");
    e.message
}

/// `spec` with `sections` (a JSON object's members) as the JSON gives them.
fn with_sections(spec: &Spec, sections: &str) -> Spec {
    let json = serde_json::to_string(spec).unwrap();
    let json = format!("{},{sections}}}", &json[..json.len() - 1]);
    serde_json::from_str(&json).unwrap()
}

#[test]
fn stop_first_is_written_out_and_every_driver_takes_it() {
    let mut s = sim_spec(&["/bin/app"]);
    s.strategy = crate::Strategy::StopFirst;
    super::spec(&s).unwrap();
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains(r#""strategy":"stop-first""#), "{json}");
    let default = serde_json::to_string(&sim_spec(&["/bin/app"])).unwrap();
    assert!(
        !default.contains("strategy"),
        "left out at its default: {default}"
    );
    s.driver = DriverKind::KUBE;
    s.command = vec![];
    s.image = Some("shop/web:1".into());
    super::spec(&s).unwrap();
}

/// Given a spec with sections, when validated, then only its own driver's section,
/// an object, passes: another built-in driver's settings, a misspelt field and a
/// section that is not an object are `invalid_spec`, each saying which.
#[test]
fn a_spec_carries_its_own_drivers_section_only() {
    let sim = sim_spec(&["/bin/app"]);
    super::spec(&with_sections(&sim, r#""sim":{"anything":[1]}"#)).unwrap();
    let other = with_sections(&sim, r#""systemd":{"user":"app"}"#);
    assert_eq!(
        invalid(&other),
        "`systemd` settings are only for driver systemd; this spec is for sim"
    );
    let typo = with_sections(&sim, r#""imgae":"busybox""#);
    assert_eq!(
        invalid(&typo),
        "`imgae` is not a field of a spec, nor the section of its driver sim"
    );
    let not_object = with_sections(&sim, r#""sim":[1]"#);
    assert!(invalid(&not_object).contains("must be an object"));
    let mut acme = with_sections(&sim, r#""acme":{"size":"xl"}"#);
    assert!(invalid(&acme).contains("not a field of a spec"));
    acme.driver = "acme".parse().unwrap();
    super::spec(&acme).unwrap();
    assert_eq!(acme.section().unwrap().json(), r#"{"size":"xl"}"#);
    // Empty, another driver's section and a misspelt field are refused all the same;
    // the spec's own driver's empty section is kept, as written.
    let empty = with_sections(&sim, r#""kube":{}"#);
    assert!(invalid(&empty).contains("only for driver kube"));
    let empty = with_sections(&sim, r#""Imgae":{}"#);
    assert!(invalid(&empty).contains("not a field of a spec"));
    let own = with_sections(&sim, r#""sim":{}"#);
    super::spec(&own).unwrap();
    assert_eq!(own.section().unwrap().json(), "{}");
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

use super::decode::{self, hostile};
use super::*;
use proptest::prelude::*;

fn one_line(line: &str) {
    assert!(!line.contains(['\n', '\r', '\0']), "not one line: {line:?}");
    assert!(!decode::continues(line), "continues: {line:?}");
}

#[test]
fn given_hostile_values_when_written_as_environment_then_each_is_one_line_that_decodes_to_itself() {
    for value in hostile() {
        let line = environment("NAME_1", &value).unwrap();
        one_line(&line);
        assert!(line.starts_with("Environment=\"NAME_1="));
        assert_eq!(
            decode::environment(&line),
            Ok(("NAME_1".to_string(), value.clone())),
            "{line:?}"
        );
    }
}

#[test]
fn given_a_64_kib_value_when_written_then_it_is_accepted_and_too_long_lines_are_refused() {
    let value = "v".repeat(64 * 1024);
    assert!(environment("BIG", &value).is_ok());
    let err = environment("BIG", &"v".repeat(MAX_LINE)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidEnv);
    // Escapes count: a value of control characters grows fourfold.
    let err = environment("BIG", &"\x01".repeat(MAX_LINE / 4)).unwrap_err();
    assert!(matches!(err, EscapeError::EnvValue { .. }), "{err}");
    assert_eq!(err.code(), ErrorCode::InvalidEnv);
}

#[test]
fn given_bad_env_names_or_nul_when_written_then_refused_as_invalid_env_without_the_value() {
    for name in ["", "1A", "A-B", "A=B", "A B", "A\nB", "É", "A\0"] {
        let err = environment(name, "v").unwrap_err();
        assert!(matches!(err, EscapeError::EnvName { .. }), "{name:?}");
        assert_eq!(err.code(), ErrorCode::InvalidEnv);
    }
    let err = environment("TOKEN", "opaque-secret\0tail").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidEnv);
    assert!(!err.to_string().contains("secret"));
    // A hostile name shows only a short, escaped prefix.
    let long = format!("\n[Service]{}", "X".repeat(1000));
    let message = environment(&long, "v").unwrap_err().to_string();
    assert!(message.len() < 120 && !message.contains('\n'), "{message}");
}

#[test]
fn given_hostile_arguments_when_written_as_exec_start_then_the_process_gets_them_verbatim() {
    for value in hostile() {
        let argv = vec!["/usr/bin/printf".to_string(), value.clone(), "tail".into()];
        let line = format!("ExecStart={}", exec_start(&argv).unwrap());
        one_line(&line);
        assert_eq!(decode::exec_start(&line), Ok(argv), "{line:?}");
    }
    let all: Vec<String> = std::iter::once("/bin/echo".to_string())
        .chain(hostile().into_iter().take(40))
        .collect();
    let line = format!("ExecStart={}", exec_start(&all).unwrap());
    one_line(&line);
    assert_eq!(decode::exec_start(&line), Ok(all));
}

#[test]
fn given_a_lone_semicolon_or_an_empty_argument_when_written_then_each_stays_one_argument() {
    let argv: Vec<String> = ["/bin/true", ";", "", "\\;", "/bin/false"]
        .map(String::from)
        .to_vec();
    let value = exec_start(&argv).unwrap();
    assert_eq!(value, r#""/bin/true" ";" "" "\\;" "/bin/false""#);
    assert_eq!(decode::exec_start(&format!("ExecStart={value}")), Ok(argv));
}

#[test]
fn given_a_program_systemd_would_misread_when_written_then_refused_naming_command_0() {
    for program in [
        "",
        "bin/true",
        "-/bin/true",
        "@/bin/true",
        "/usr/bin/",
        "/usr/bin/$X",
        "/usr/bin/a\"b",
        "/usr/bin/a'b",
        "/usr/bin/a\\b",
        "/usr/bin/a\nb",
        "/usr/bin/a\0b",
    ] {
        let err = exec_start(&[program.to_string()]).unwrap_err();
        assert!(
            matches!(err, EscapeError::Command { index: 0, .. }),
            "{program:?}: {err}"
        );
        assert_eq!(err.code(), ErrorCode::InvalidSpec);
    }
    let long = format!("/{}", "a".repeat(256));
    for argv in [vec![], vec![long]] {
        let err = exec_start(&argv).unwrap_err();
        assert!(
            matches!(err, EscapeError::Command { index: 0, .. }),
            "{argv:?}: {err}"
        );
        assert_eq!(err.code(), ErrorCode::InvalidSpec);
    }
    let err = exec_start(&["/bin/x".into(), "a\0b".into()]).unwrap_err();
    assert!(matches!(err, EscapeError::Command { index: 1, .. }));
}

#[test]
fn given_a_program_with_percent_or_spaces_when_written_then_its_path_is_kept() {
    for program in [
        "/opt/my app/run",
        "/opt/100%/run",
        "/opt/é/run;x",
        "/opt/#/x",
    ] {
        let argv = vec![program.to_string()];
        let line = format!("ExecStart={}", exec_start(&argv).unwrap());
        assert_eq!(decode::exec_start(&line), Ok(argv));
    }
}

#[test]
fn given_paths_when_written_for_working_directory_then_they_decode_to_themselves() {
    for p in [
        "/srv/app",
        "/srv/with space/x",
        "/srv/100%/%h",
        "/srv/\"q\"/'q'",
        "/srv/a;b#c",
        "/srv/$HOME",
        "/srv/é🦀",
        "/",
    ] {
        let line = format!("WorkingDirectory={}", path(p).unwrap());
        one_line(&line);
        assert_eq!(decode::path(&line, "WorkingDirectory"), Ok(p.to_string()));
    }
}

#[test]
fn given_paths_working_directory_cannot_carry_when_written_then_refused() {
    let long = format!("/{}", "a".repeat(256));
    for p in [
        "",
        "srv",
        "/srv/a\nb",
        "/srv/a\rb",
        "/srv/a\tb",
        "/srv/a\\",
        "/srv/a\\b",
        "/srv/a ",
        "/srv/../etc",
        "/srv/a\0",
        long.as_str(),
    ] {
        let err = path(p).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidSpec);
        assert!(matches!(err, EscapeError::Invalid { field: "path", .. }));
        assert!(matches!(
            err.within("WorkingDirectory"),
            EscapeError::Invalid {
                field: "WorkingDirectory",
                ..
            }
        ));
    }
}

#[test]
fn given_path_lists_when_written_then_each_path_decodes_to_itself() {
    let paths: Vec<String> = [
        "/var/lib/capstan/ns",
        "/srv/with space",
        "/srv/back\\slash\\",
        "/srv/\"dq\"",
        "/srv/'sq'",
        "/srv/100%/%h",
        "/srv/a;b",
        "/srv/é",
        "/srv/-x",
    ]
    .map(String::from)
    .to_vec();
    let line = format!("ReadWritePaths={}", path_list(&paths).unwrap());
    one_line(&line);
    assert_eq!(decode::path_list(&line, "ReadWritePaths"), Ok(paths));
}

#[test]
fn given_path_lists_with_bad_items_when_written_then_refused_naming_the_item() {
    let ok = "/srv/ok".to_string();
    for bad in ["relative", "/a\nb", "/a\tb", "/a\x7f", "/a/../b", "/a\0"] {
        let err = path_list(&[ok.clone(), bad.to_string()]).unwrap_err();
        assert!(
            matches!(err, EscapeError::InvalidItem { index: 1, .. }),
            "{bad:?}: {err}"
        );
    }
    let err = path_list(&[]).unwrap_err();
    assert!(
        matches!(err, EscapeError::Invalid { field: "paths", .. }),
        "{err}"
    );
    assert_eq!(err.code(), ErrorCode::InvalidSpec);
}

#[test]
fn given_tokens_when_written_plain_then_only_the_safe_set_passes() {
    for ok in ["capstan", "team-a", "1000", "a.b_c:d@e/f+g"] {
        assert_eq!(plain("user", ok), Ok(ok.to_string()));
    }
    for bad in [
        "", "a b", "a\nb", "%h", "$x", "a\"", "a\\b", "é", "a=b", "[Unit]",
    ] {
        let err = plain("user", bad).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidSpec);
        assert!(err.to_string().starts_with("user: "));
    }
}

/// Absolute paths a path setting can carry: no control characters or `..`.
fn writable_path() -> impl Strategy<Value = String> {
    "(/[^\\x00-\\x1f\\x7f/]{0,12}){1,4}"
        .prop_filter("no '..'", |p| !p.split('/').any(|c| c == ".."))
}

proptest! {
    #[test]
    fn env_values_round_trip(value in "[^\\x00]{0,64}", any_value in any::<String>()) {
        for v in [value, any_value] {
            match environment("X", &v) {
                Ok(line) => {
                    prop_assert!(!line.contains(['\n', '\r']));
                    prop_assert_eq!(decode::environment(&line), Ok(("X".to_string(), v)));
                }
                Err(_) => prop_assert!(v.contains('\0')),
            }
        }
    }

    #[test]
    fn exec_arguments_round_trip(args in prop::collection::vec("[^\\x00]{0,24}", 0..6)) {
        let argv: Vec<String> = std::iter::once("/usr/bin/env".to_string()).chain(args).collect();
        let line = format!("ExecStart={}", exec_start(&argv).unwrap());
        prop_assert!(!line.contains(['\n', '\r']));
        prop_assert_eq!(decode::exec_start(&line), Ok(argv));
    }

    #[test]
    fn path_lists_round_trip(paths in prop::collection::vec(writable_path(), 1..4)) {
        let line = format!("ReadWritePaths={}", path_list(&paths).unwrap());
        prop_assert!(!line.contains(['\n', '\r']));
        prop_assert_eq!(decode::path_list(&line, "ReadWritePaths"), Ok(paths));
    }

    #[test]
    fn single_paths_round_trip_or_are_refused(p in writable_path()) {
        match path(&p) {
            Ok(value) => {
                let line = format!("WorkingDirectory={value}");
                prop_assert!(!line.contains(['\n', '\r']));
                prop_assert_eq!(decode::path(&line, "WorkingDirectory"), Ok(p));
            }
            Err(_) => prop_assert!(p.contains('\\') || p.ends_with(' ')),
        }
    }
}

#[test]
fn given_hardening_lists_when_written_then_only_allowed_plain_names_pass() {
    let caps = |v: &[&str]| capabilities(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(caps(&[]), Ok(String::new()));
    assert_eq!(
        caps(&["CAP_NET_BIND_SERVICE", "CAP_CHOWN"]),
        Ok("CAP_NET_BIND_SERVICE CAP_CHOWN".into())
    );
    for bad in [
        "CAP_SYS_ADMIN",
        "CAP_CHOWN\nUser=root",
        "CAP_CHOWN CAP_SYS_ADMIN",
        "~CAP_CHOWN",
        "",
    ] {
        let err = caps(&["CAP_CHOWN", bad]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidSpec);
        assert!(
            err.to_string().starts_with("systemd.capabilities[1]: "),
            "{err}"
        );
    }
    let calls = |v: &[&str]| syscalls(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(calls(&["@mount", "ptrace"]), Ok("@mount ptrace".into()));
    for bad in [
        "~@mount",
        "@mount\n[Service]",
        "@nosuch",
        "a b",
        "%h",
        "ptrace;",
    ] {
        let err = calls(&[bad]).unwrap_err();
        assert!(
            err.to_string().starts_with("systemd.syscalls[0]: "),
            "{err}"
        );
    }
}

#[test]
fn given_state_directories_when_written_then_relative_plain_paths_pass() {
    assert_eq!(
        state_directory("capstan/units/team-a"),
        Ok("capstan/units/team-a".into())
    );
    for bad in [
        "/var/lib/capstan",
        "capstan/../etc",
        "capstan//units",
        "capstan/./units",
        "capstan/units/",
        "",
        "with space/ns",
        "a:b/ns",
        "%h/ns",
        "a\nStateDirectory=x",
        "é/ns",
    ] {
        let err = state_directory(bad).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidSpec);
        assert!(err.to_string().starts_with("state_dir: "), "{bad:?}: {err}");
    }
}

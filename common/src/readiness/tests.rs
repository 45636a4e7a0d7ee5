use super::*;

fn tcp(port: u16) -> Readiness {
    Readiness {
        check: Check::Tcp { port },
        interval_ms: 100,
        timeout_ms: 100,
        threshold: 1,
        deadline_ms: 1_000,
    }
}

fn http(path: &str) -> Readiness {
    Readiness {
        check: Check::Http {
            port: 8080,
            path: path.into(),
        },
        ..tcp(1)
    }
}

fn code(r: &Readiness) -> Option<ErrorCode> {
    validate(r).err().map(|e| e.code)
}

#[test]
fn given_only_a_check_when_parsed_then_every_bound_has_its_documented_default() {
    let r: Readiness = serde_json::from_str(r#"{"check":{"http":{"port":80}}}"#).unwrap();
    assert_eq!(
        r,
        Readiness {
            check: Check::Http {
                port: 80,
                path: "/".into()
            },
            interval_ms: 1_000,
            timeout_ms: 1_000,
            threshold: 1,
            deadline_ms: 60_000,
        }
    );
    assert_eq!(validate(&r), Ok(()));
}

#[test]
fn given_an_unknown_field_or_two_checks_when_parsed_then_it_is_refused() {
    for text in [
        r#"{"check":{"tcp":{"port":80}},"period_ms":5}"#,
        r#"{"check":{"tcp":{"port":80,"host":"10.0.0.1"}}}"#,
        r#"{"check":{"tcp":{"port":80},"exec":{"command":["true"]}}}"#,
        r#"{"check":{"grpc":{"port":80}}}"#,
    ] {
        assert!(serde_json::from_str::<Readiness>(text).is_err(), "{text}");
    }
}

#[test]
fn given_a_path_that_could_change_the_request_line_when_validated_then_it_is_refused() {
    for path in [
        "",
        "healthz",
        "/a b",
        "/a\r\nHost: evil",
        "/\u{7f}",
        "/caf\u{e9}",
        "/\u{85}",
        &format!("/{}", "a".repeat(MAX_PATH)),
    ] {
        assert_eq!(code(&http(path)), Some(ErrorCode::InvalidSpec), "{path:?}");
    }
    assert_eq!(code(&http("/healthz?full=1&x=%20")), None);
}

#[test]
fn given_a_bound_outside_its_range_when_validated_then_the_field_is_named() {
    let cases = [
        (
            "interval_ms",
            Readiness {
                interval_ms: 9,
                ..tcp(1)
            },
        ),
        (
            "timeout_ms",
            Readiness {
                timeout_ms: 0,
                ..tcp(1)
            },
        ),
        (
            "threshold",
            Readiness {
                threshold: 0,
                ..tcp(1)
            },
        ),
        (
            "threshold",
            Readiness {
                threshold: 101,
                ..tcp(1)
            },
        ),
        (
            "deadline_ms",
            Readiness {
                deadline_ms: 3_600_001,
                ..tcp(1)
            },
        ),
    ];
    for (field, r) in cases {
        let e = validate(&r).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidSpec);
        assert!(e.message.contains(field), "{field}: {}", e.message);
    }
    assert_eq!(code(&tcp(0)), Some(ErrorCode::InvalidSpec));
}

#[test]
fn given_an_exec_check_when_validated_then_it_needs_a_program_without_nul() {
    let exec = |command: &[&str]| Readiness {
        check: Check::Exec {
            command: command.iter().map(|s| s.to_string()).collect(),
        },
        ..tcp(1)
    };
    assert_eq!(code(&exec(&[])), Some(ErrorCode::InvalidSpec));
    assert_eq!(
        code(&exec(&["test", "-f", "a\0b"])),
        Some(ErrorCode::InvalidSpec)
    );
    assert_eq!(code(&exec(&["test", "-f", "/ready"])), None);
}

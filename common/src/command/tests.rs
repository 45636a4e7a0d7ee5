//! Unit tests of commands: parsing, validation, the canonical JSON and its content.

#[test]
fn a_deadline_is_an_rfc3339_timestamp_kept_in_the_canonical_json_and_the_content() {
    let text = |deadline: &str| {
        format!(
            r#"{{"v":1,"id":"c1","host":"h1","issued_at":"2026-01-01T00:00:00Z"{deadline},"op":"ensure_namespace","namespace":"ns"}}"#
        )
    };
    let plain = super::Command::parse(&text("")).unwrap();
    assert_eq!(plain.deadline, None);
    assert!(!plain.to_json().contains("deadline"), "{}", plain.to_json());
    let bounded =
        super::Command::parse(&text(r#","deadline":"2026-01-01T00:00:30+01:00""#)).unwrap();
    assert_eq!(
        bounded.deadline.unwrap().to_rfc3339(),
        "2025-12-31T23:00:30+00:00"
    );
    assert!(bounded
        .to_json()
        .contains(r#""deadline":"2025-12-31T23:00:30Z""#));
    assert_ne!(
        bounded.content(),
        plain.content(),
        "another deadline, another command"
    );
    // A string that is not RFC 3339 is `invalid_timestamp` (docs/protocol.md); a
    // value of the wrong type is `invalid_command`, as for any field.
    for (bad, code) in [
        (
            r#","deadline":"in 30 s""#,
            crate::ErrorCode::InvalidTimestamp,
        ),
        (r#","deadline":30"#, crate::ErrorCode::InvalidCommand),
    ] {
        let e = super::Command::parse(&text(bad)).unwrap_err();
        assert_eq!(e.code, code, "{bad}: {e:?}");
    }
    let e = super::Command::parse(&text(r#","deadline":"tomorrow""#)).unwrap_err();
    assert_eq!(e.code, crate::ErrorCode::InvalidTimestamp);
}

#[test]
fn content_ignores_issued_at_only() {
    let a = super::Command::parse(
        r#"{"v":1,"id":"c1","host":"h1","issued_at":"2026-01-01T00:00:00Z","op":"ensure_namespace","namespace":"ns"}"#,
    )
    .unwrap();
    let mut b = a.clone();
    b.issued_at = chrono::Utc::now();
    assert_eq!(a.content(), b.content());
    assert!(!a.content().contains("issued_at"), "{}", a.content());
    b.host = "h2".into();
    assert_ne!(a.content(), b.content());
}

use super::*;

fn line(op_fields: &str) -> String {
    format!(r#"{{"v":1,"id":"c-1","host":"h1","issued_at":"2026-11-29T10:00:00Z",{op_fields}}}"#)
}

fn code(text: &str) -> ErrorCode {
    Command::parse(text).expect_err("should be rejected").code
}

#[test]
fn parses_every_op() {
    let spec =
        r#""spec":{"driver":"sim","image":"busybox:1","command":["sleep","1"],"env":{"A":"b"}}"#;
    for fields in [
        r#""op":"ensure_namespace","namespace":"ns""#.to_string(),
        r#""op":"delete_namespace","namespace":"ns""#.to_string(),
        format!(
            r#""op":"prepare_revision","namespace":"ns","workload":"w","revision":"r1",{spec}"#
        ),
        r#""op":"activate_revision","namespace":"ns","workload":"w","revision":"r1""#.to_string(),
        r#""op":"stop_workload","namespace":"ns","workload":"w""#.to_string(),
        r#""op":"start_workload","namespace":"ns","workload":"w""#.to_string(),
        r#""op":"retire_revision","namespace":"ns","workload":"w","revision":"r1""#.to_string(),
    ] {
        let c = Command::parse(&line(&fields)).unwrap_or_else(|e| panic!("{fields}: {e}"));
        // Round trip through the canonical form.
        assert_eq!(Command::parse(&c.to_json()).unwrap(), c);
    }
}

#[test]
fn rejects_with_stable_codes() {
    assert_eq!(code("{not json"), ErrorCode::InvalidJson);
    assert_eq!(code("[1,2]"), ErrorCode::InvalidJson);
    assert_eq!(
        code(r#"{"v":2,"op":"ensure_namespace"}"#),
        ErrorCode::UnsupportedVersion
    );
    assert_eq!(code(&line(r#""op":"reboot_host""#)), ErrorCode::UnknownOp);
    assert_eq!(
        code(&line(r#""op":"ensure_namespace""#)),
        ErrorCode::InvalidCommand
    );
    assert_eq!(
        code(&line(r#""op":"ensure_namespace","namespace":"Bad_NS""#)),
        ErrorCode::InvalidName
    );
    assert_eq!(
        code(&line(r#""op":"ensure_namespace","namespace":"-x""#)),
        ErrorCode::InvalidName
    );
    let long = "a".repeat(64);
    assert_eq!(
        code(&line(&format!(
            r#""op":"ensure_namespace","namespace":"{long}""#
        ))),
        ErrorCode::InvalidName
    );
    assert_eq!(
        code(
            r#"{"v":1,"id":"bad id","host":"h1","issued_at":"2026-11-29T10:00:00Z","op":"ensure_namespace","namespace":"n"}"#
        ),
        ErrorCode::InvalidId
    );
    assert_eq!(
        code(
            r#"{"v":1,"id":"a","host":"h1","issued_at":"yesterday","op":"ensure_namespace","namespace":"n"}"#
        ),
        ErrorCode::InvalidTimestamp
    );
    let big = format!(
        r#""op":"ensure_namespace","namespace":"n","pad":"{}""#,
        "x".repeat(MAX_COMMAND_BYTES)
    );
    assert_eq!(code(&line(&big)), ErrorCode::TooLarge);
}

#[test]
fn rejects_bad_env_and_spec() {
    let prep = |spec: &str| {
        line(&format!(
            r#""op":"prepare_revision","namespace":"n","workload":"w","revision":"r",{spec}"#
        ))
    };
    assert_eq!(
        code(&prep(r#""spec":{"driver":"sim","env":{"A=B":"x"}}"#)),
        ErrorCode::InvalidEnv
    );
    assert_eq!(
        code(&prep(r#""spec":{"driver":"sim","env":{"1A":"x"}}"#)),
        ErrorCode::InvalidEnv
    );
    assert_eq!(
        code(&prep(r#""spec":{"driver":"sim","env":{"A":"x\u0000y"}}"#)),
        ErrorCode::InvalidEnv
    );
    assert_eq!(
        code(&prep(r#""spec":{"driver":"sim","command":["a\u0000"]}"#)),
        ErrorCode::InvalidSpec
    );
    assert_eq!(
        code(&prep(
            r#""spec":{"driver":"docker","image":"Not An Image"}"#
        )),
        ErrorCode::InvalidSpec
    );
    assert_eq!(
        code(&prep(r#""spec":{"driver":"docker"}"#)),
        ErrorCode::InvalidSpec
    );
    assert_eq!(
        code(&prep(r#""spec":{"driver":"warp"}"#)),
        ErrorCode::InvalidCommand
    );
}

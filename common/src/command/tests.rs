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
        code(&prep(r#""spec":{"driver":"Warp"}"#)),
        ErrorCode::InvalidCommand
    );
    assert_eq!(
        code(&prep(r#""spec":{"driver":"sim","systemd":{"user":"app"}}"#)),
        ErrorCode::InvalidSpec
    );
    // A member that is no field, even empty: refused, not ignored.
    assert_eq!(
        code(&prep(r#""spec":{"driver":"sim","Image":{}}"#)),
        ErrorCode::InvalidSpec
    );
    assert_eq!(
        code(&prep(r#""spec":{"driver":"sim","imgae":"busybox"}"#)),
        ErrorCode::InvalidSpec
    );
    // What a driver needs besides (docker an image, systemd an absolute program) is
    // its own rule, checked by the agent that runs it; any kind is a kind.
    Command::parse(&prep(r#""spec":{"driver":"docker"}"#)).unwrap();
    Command::parse(&prep(r#""spec":{"driver":"warp","warp":{"factor":9}}"#)).unwrap();
}

/// Given specs read by hand (no derive), when parsed, then they behave as the derived
/// reader did: `driver` required, a member twice refused, `null` for an optional field
/// its default, and any spelling read back as it was written.
#[test]
fn a_spec_reads_as_the_derived_reader_did() {
    let prep = |spec: &str| {
        line(&format!(
            r#""op":"prepare_revision","namespace":"n","workload":"w","revision":"r","spec":{spec}"#
        ))
    };
    let rejected = |spec: &str| Command::parse(&prep(spec)).expect_err(spec);
    let e = rejected(r#"{"image":"busybox"}"#);
    assert_eq!(e.code, ErrorCode::InvalidCommand);
    assert!(e.message.contains("missing field `driver`"), "{e:?}");
    for (text, says) in [
        (
            r#"{"driver":"sim","image":null,"image":"busybox"}"#,
            "duplicate field `image`",
        ),
        (
            r#"{"driver":"sim","sim":{},"sim":{"a":1}}"#,
            "appears twice",
        ),
    ] {
        let e = serde_json::from_str::<Spec>(text).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
        let e = rejected(text);
        assert_eq!(e.code, ErrorCode::InvalidCommand);
        assert!(e.message.contains(says), "{e:?}");
    }
    assert_eq!(rejected(r#"["sim"]"#).code, ErrorCode::InvalidCommand);
    assert_eq!(
        rejected(r#"{"driver":"sim","env":[]}"#).code,
        ErrorCode::InvalidCommand
    );

    let text = r#"{"driver":"sim","image":null,"command":[],"env":{},"working_dir":null,"mounts":[],"ports":[],"readiness":null}"#;
    let spec: Spec = serde_json::from_str(text).unwrap();
    assert_eq!(spec, Spec::default());
    let c = Command::parse(&prep(text)).unwrap();
    assert_eq!(
        c.op,
        super::Op::PrepareRevision {
            namespace: "n".into(),
            workload: "w".into(),
            revision: "r".into(),
            spec: Spec::default(),
        }
    );
    let full = r#"{"driver":"sim","image":"busybox:1","command":["a"],"env":{"A":"b"},"working_dir":"/w","mounts":[{"source":"/s","target":"/t","read_only":true}],"ports":[{"container_port":80,"host_port":0,"host_ip":null,"protocol":"udp"}],"sim":{"z":1,"a":2},"readiness":{"check":{"tcp":{"port":80}},"interval_ms":1000,"timeout_ms":1000,"threshold":1,"deadline_ms":60000},"strategy":"stop-first"}"#;
    let spec: Spec = serde_json::from_str(full).unwrap();
    assert_eq!(serde_json::to_string(&spec).unwrap(), full);
}

/// Given a command an older coordinator signed, its `systemd` section spelt in the
/// typed settings' field order (and one a client wrote in another order), when parsed,
/// then its canonical JSON — what the signature covers — is the text as written.
#[test]
fn a_section_in_a_command_keeps_the_order_it_was_signed_in() {
    for section in [
        r#"{"user":"app","group":null,"read_write_paths":["/srv"],"memory_max_bytes":null,"cpu_quota_percent":150}"#,
        r#"{"zeta":1,"alpha":{"y":[2,1],"b":"é"}}"#,
    ] {
        let text = line(&format!(
            r#""op":"prepare_revision","namespace":"n","workload":"w","revision":"r","spec":{{"driver":"systemd","image":null,"command":["/bin/app"],"env":{{}},"working_dir":null,"mounts":[],"ports":[],"systemd":{section}}}"#
        ));
        let command = Command::parse(&text).unwrap();
        assert_eq!(command.to_json(), text);
    }
}

/// Given a JSON error on line 3 of a file of commands, when that line is parsed as
/// line 3, then the message names line 3 and the column in it, not the line's own
/// "line 1".
#[test]
fn a_json_error_names_the_files_line() {
    let text = r#"  {"v":1, "id": oops}"#;
    let message = |line| super::Command::parse_at(text, line).unwrap_err().message;
    assert_eq!(message(1), "not JSON: expected value at line 1 column 17");
    assert_eq!(message(3), "not JSON: expected value at line 3 column 17");
    // A text of many lines: its own lines, counted from where it begins.
    let text = "{\n  \"v\": 1,\n  \"id\": oops\n}";
    let message = super::Command::parse_at(text, 10).unwrap_err().message;
    assert_eq!(message, "not JSON: expected value at line 12 column 9");
}

#[test]
fn known_ops_are_every_ops_name_once() {
    use super::{Op, KNOWN_OPS};
    // One line of each op; a new op fails to compile in the match below until it is
    // listed here (and in KNOWN_OPS).
    let fields = [
        r#""op":"ensure_namespace","namespace":"ns""#,
        r#""op":"delete_namespace","namespace":"ns""#,
        r#""op":"prepare_revision","namespace":"ns","workload":"web","revision":"r1","spec":{"driver":"sim","image":"a"}"#,
        r#""op":"activate_revision","namespace":"ns","workload":"web","revision":"r1""#,
        r#""op":"stop_workload","namespace":"ns","workload":"web""#,
        r#""op":"start_workload","namespace":"ns","workload":"web""#,
        r#""op":"retire_revision","namespace":"ns","workload":"web","revision":"r1""#,
        r#""op":"cancel_command","target":"c0""#,
    ];
    let mut names = Vec::new();
    for f in fields {
        let text =
            format!(r#"{{"v":1,"id":"c1","host":"h1","issued_at":"2026-01-01T00:00:00Z",{f}}}"#);
        let op = super::Command::parse(&text).expect(f).op;
        let kind = match op {
            Op::EnsureNamespace { .. } => 0,
            Op::DeleteNamespace { .. } => 1,
            Op::PrepareRevision { .. } => 2,
            Op::ActivateRevision { .. } => 3,
            Op::StopWorkload { .. } => 4,
            Op::StartWorkload { .. } => 5,
            Op::RetireRevision { .. } => 6,
            Op::CancelCommand { .. } => 7,
        };
        assert_eq!(kind, names.len(), "{f}: one of each op, in order");
        names.push(op.name());
    }
    assert_eq!(names, KNOWN_OPS);
}

#[test]
fn a_number_in_a_section_reads_back_as_itself_from_the_canonical_json() {
    // Found by the `command` fuzz target: without serde_json's exact float parsing
    // (`float_roundtrip`), 5.099999999989999e+76 was read back as
    // 5.0999999999899986e+76, so the canonical JSON (what is signed) of a command
    // changed when it was read again.
    let text = r#"{"v":1,"id":"p2","host":"h1","issued_at":"2026-11-29T10:00:00Z","op":"prepare_revision","namespace":"shop","workload":"api","revision":"r1","spec":{"driver":"systemd","command":["/usr/bin/api"],"systemd":{"user":"app","x_percent":50999999999900000000000000000000000000000000000000000000009223372036854775807,"y":0.1,"z":1e-300}}}"#;
    let canonical = super::Command::parse(text).unwrap().to_json();
    let again = super::Command::parse(&canonical).unwrap();
    assert_eq!(again.to_json(), canonical);
    assert!(canonical.contains(r#""y":0.1,"z":1e-300"#), "{canonical}");
}

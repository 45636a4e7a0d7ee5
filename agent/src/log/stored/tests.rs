//! The stored formats: every event round-trips through the current one, format 1
//! upcasts to the same events, a field added to `Spec` later still decodes from older
//! records, a driver's own spec section is stored only when set, and an upcaster chain to a (test-only) format 3 works.

use super::samples::{every_event, spec};
use super::test_v3 as v3;
use super::*;
use crate::event::Cause;
use capstan_common::{DriverKind, ErrorCode};

fn v1_bytes(seq: u64, event: v1::Event) -> Vec<u8> {
    let record = v1::Record {
        seq,
        at_ms: 1_700_000_000_000,
        prev_hash: [7; 32],
        event,
    };
    encode_as(1, &record).unwrap()
}

#[test]
fn every_event_round_trips_through_the_current_format() {
    for (seq, (event, _)) in (1..).zip(every_event()) {
        let bytes = encode(seq, 5, [1; 32], &event).unwrap();
        assert_eq!(bytes[0], CURRENT);
        let record = decode(&bytes).unwrap();
        assert_eq!(
            (record.seq, record.at_ms, record.prev_hash),
            (seq, 5, [1; 32])
        );
        assert_eq!(record.event, event);
    }
}

#[test]
fn format_1_records_upcast_to_the_same_events() {
    for (seq, (event, old)) in (1..).zip(every_event()) {
        let record = decode(&v1_bytes(seq, old)).unwrap();
        assert_eq!(record.seq, seq);
        assert_eq!(record.prev_hash, [7; 32]);
        assert_eq!(record.event, event, "{}", event.kind());
    }
}

#[test]
fn codes_are_stored_by_spelling_and_unknown_ones_refused() {
    let failed = Event::WorkloadFailed {
        cause: Cause::AgentStartup,
        namespace: "ns".into(),
        workload: "web".into(),
        code: ErrorCode::ImageNotFound,
        message: "m".into(),
    };
    let stored: v2::Record = from_bincode(&encode(1, 0, [0; 32], &failed).unwrap()[1..]).unwrap();
    let v2::Event::WorkloadFailed { code, .. } = &stored.event else {
        panic!("{stored:?}");
    };
    assert_eq!(code, "image_not_found");
    // A code this build does not know (written by a newer one) is not misread.
    let mut newer = stored.clone();
    if let v2::Event::WorkloadFailed { code, .. } = &mut newer.event {
        *code = "quota_exceeded".into();
    }
    let bytes = encode_as(2, &newer).unwrap();
    assert!(matches!(
        decode(&bytes),
        Err(StoredError::Spelling {
            kind: "ErrorCode",
            ..
        })
    ));
    assert!(matches!(
        decode(&[9, 0]),
        Err(StoredError::UnknownFormat(9))
    ));
    let mut trailing = encode_as(2, &stored).unwrap();
    trailing.push(0);
    assert!(matches!(decode(&trailing), Err(StoredError::Trailing(1))));
}

/// `Spec` as it would be with a field a driver adds later.
#[derive(Debug, PartialEq, serde::Deserialize)]
struct SpecWithCpu {
    driver: DriverKind,
    image: Option<String>,
    command: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
    working_dir: Option<String>,
    mounts: Vec<capstan_common::Mount>,
    ports: Vec<capstan_common::PortMapping>,
    #[serde(default)]
    cpu_millis: Option<u32>,
}

/// The stored spec JSON of a record, however old, as the current format holds it.
fn stored_spec(bytes: &[u8]) -> String {
    let record = match bytes[0] {
        1 => v2::Record::from(from_bincode::<v1::Record>(&bytes[1..]).unwrap()),
        _ => from_bincode::<v2::Record>(&bytes[1..]).unwrap(),
    };
    match record.event {
        v2::Event::RevisionPrepared { spec, .. } => spec,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_spec_field_added_later_decodes_from_older_records() {
    let (prepared, old) = every_event().swap_remove(5);
    let written = [v1_bytes(1, old), encode(2, 0, [0; 32], &prepared).unwrap()];
    for bytes in written {
        let later: SpecWithCpu = serde_json::from_str(&stored_spec(&bytes)).unwrap();
        assert_eq!(later.cpu_millis, None, "format {}", bytes[0]);
        assert_eq!(later.image.as_deref(), Some("shop/web:1"));
        assert_eq!(later.ports, spec().ports);
        assert_eq!(later.mounts, spec().mounts);
    }
    // And a record written by a build that has the field still decodes here, the
    // field kept, not dropped: among the spec's sections, as any name a spec does not
    // know (written back after `ports`, where the sections go).
    let mut newer: v2::Record =
        from_bincode(&encode(3, 0, [0; 32], &prepared).unwrap()[1..]).unwrap();
    let mut written = String::new();
    if let v2::Event::RevisionPrepared { spec, .. } = &mut newer.event {
        *spec = spec.replacen(r#","ports":"#, r#","cpu_millis":250,"ports":"#, 1);
        written = spec.clone();
    }
    let Event::RevisionPrepared { spec: decoded, .. } =
        decode(&encode_as(2, &newer).unwrap()).unwrap().event
    else {
        panic!("not a revision_prepared");
    };
    let Event::RevisionPrepared { spec: original, .. } = prepared else {
        panic!("not a revision_prepared");
    };
    assert_eq!(
        (&decoded.image, &decoded.ports),
        (&original.image, &original.ports)
    );
    let sections: Vec<(&str, &str)> = decoded
        .sections
        .iter()
        .map(|(k, s)| (k, s.json()))
        .collect();
    assert_eq!(sections, [("cpu_millis", "250")]);
    let again = serde_json::to_string(&decoded).unwrap();
    let strip = |s: &str| {
        s.replace(r#""cpu_millis":250,"#, "")
            .replace(r#","cpu_millis":250"#, "")
    };
    assert_eq!(
        strip(&again),
        strip(&written),
        "only the place of the field moves"
    );
    assert!(again.contains(r#""cpu_millis":250"#), "{again}");
}

#[test]
fn the_systemd_section_is_stored_when_set_and_left_out_otherwise() {
    let (mut prepared, _) = every_event().swap_remove(5);
    // A spec without it stores the JSON it stored before the section existed.
    let stored = stored_spec(&encode(1, 0, [0; 32], &prepared).unwrap());
    assert!(!stored.contains("systemd"), "{stored}");
    let Event::RevisionPrepared { spec, .. } = &mut prepared else {
        panic!("{prepared:?}");
    };
    *spec = serde_json::from_str(
        r#"{"driver":"systemd","command":["/usr/bin/web"],
            "systemd":{"user":"web","read_write_paths":["/srv/web"],"memory_max_bytes":1048576}}"#,
    )
    .unwrap();
    let bytes = encode(2, 0, [0; 32], &prepared).unwrap();
    assert!(stored_spec(&bytes).contains(r#""systemd":{"user":"web""#));
    assert_eq!(decode(&bytes).unwrap().event, prepared);
}

#[test]
fn an_upcaster_chain_reaches_a_later_format() {
    let (exited, old) = every_event().swap_remove(10);
    let from_v1 = v3::decode(&v1_bytes(1, old)).unwrap();
    let from_v2 = v3::decode(&encode(1, 1_700_000_000_000, [7; 32], &exited).unwrap()).unwrap();
    assert_eq!(from_v1, from_v2);
    let v3::Event::WorkloadExited {
        exit_code, signal, ..
    } = &from_v1.event
    else {
        panic!("{from_v1:?}");
    };
    assert_eq!((*exit_code, *signal), (Some(-9), None));
    // Unchanged kinds come across as they were.
    let (ready, old_ready) = every_event().swap_remove(3);
    let ready_v3 = v3::decode(&v1_bytes(2, old_ready)).unwrap();
    let ready_v2 =
        from_bincode::<v2::Record>(&encode(2, 1_700_000_000_000, [7; 32], &ready).unwrap()[1..])
            .unwrap();
    assert_eq!(
        serde_json::to_value(&ready_v3).unwrap(),
        serde_json::to_value(&ready_v2).unwrap()
    );
    // And format 3's own records, with the new field set.
    let mut with_signal = from_v1;
    if let v3::Event::WorkloadExited { signal, .. } = &mut with_signal.event {
        *signal = Some(9);
    }
    let bytes = encode_as(3, &with_signal).unwrap();
    assert_eq!(v3::decode(&bytes).unwrap(), with_signal);
}

#[test]
fn a_hook_start_naming_its_revision_is_stored_in_the_appended_variant() {
    let named = Event::HookStarted {
        command_id: "c1".into(),
        phase: capstan_common::Phase::BeforeWorkloadStop,
        owner: "iam".into(),
        revision: Some("r1".into()),
    };
    let bytes = encode(1, 0, [0; 32], &named).unwrap();
    let stored: v2::Record = from_bincode(&bytes[1..]).unwrap();
    assert!(
        matches!(&stored.event, v2::Event::HookStartedFor { revision, .. } if revision == "r1"),
        "{stored:?}"
    );
    assert_eq!(decode(&bytes).unwrap().event, named);
    // Without a revision it is stored as records before it were, and reads back so.
    let unnamed = Event::HookStarted {
        command_id: "c1".into(),
        phase: capstan_common::Phase::BeforeWorkloadStop,
        owner: "iam".into(),
        revision: None,
    };
    let bytes = encode(2, 0, [0; 32], &unnamed).unwrap();
    let stored: v2::Record = from_bincode(&bytes[1..]).unwrap();
    assert!(
        matches!(stored.event, v2::Event::HookStarted { .. }),
        "{stored:?}"
    );
    assert_eq!(decode(&bytes).unwrap().event, unnamed);
}

#[test]
fn a_cancel_request_is_stored_in_its_appended_variant_and_reads_back() {
    let requested = Event::CancelRequested {
        command_id: "a1".into(),
        by: "cancel-0123".into(),
    };
    let bytes = encode(1, 0, [0; 32], &requested).unwrap();
    let stored: v2::Record = from_bincode(&bytes[1..]).unwrap();
    assert!(
        matches!(&stored.event, v2::Event::CancelRequested { by, .. } if by == "cancel-0123"),
        "{stored:?}"
    );
    assert_eq!(decode(&bytes).unwrap().event, requested);
}

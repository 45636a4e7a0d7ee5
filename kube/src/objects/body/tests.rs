use super::*;
use serde_json::json;

/// Every character of the Basic Multilingual Plane but NUL and the surrogates, and a
/// few beyond it.
fn every_character() -> String {
    (1..=0xFFFF_u32)
        .filter_map(char::from_u32)
        .chain(['\u{10000}', '😀', '\u{10FFFF}'])
        .collect()
}

#[test]
fn given_every_character_when_written_then_it_reads_back_the_same() {
    let all = every_character();
    let object = json!({"env": [{"name": "V", "value": all}], all.clone(): all});
    let body = apply_body(&object);
    let back: Value = serde_json::from_str(body.get()).unwrap();
    assert_eq!(back, object);
}

#[test]
fn given_every_character_when_written_then_the_body_is_printable_ascii_but_for_beyond_the_plane() {
    let body = apply_body(&json!({"value": every_character()}));
    for c in body.get().chars() {
        let printable_ascii = (' '..='~').contains(&c);
        assert!(
            printable_ascii || u32::from(c) > 0xFFFF,
            "{:?} (U+{:04X}) is written raw",
            c,
            u32::from(c)
        );
    }
}

#[test]
fn given_the_characters_yaml_refuses_or_folds_when_written_then_each_is_escaped() {
    let body = apply_body(&json!({"v": "\u{7f}\u{80}\u{85}\u{9b}\u{fffe}\u{2028}\t\n"}));
    assert_eq!(
        body.get(),
        r#"{"v":"\u007f\u0080\u0085\u009b\ufffe\u2028\t\n"}"#
    );
}

#[test]
fn given_plain_ascii_when_written_then_it_is_serde_jsons_compact_form() {
    let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b \"q\" \\"}});
    assert_eq!(
        apply_body(&object).get(),
        serde_json::to_string(&object).unwrap()
    );
}

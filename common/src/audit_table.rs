//! The audit log as a table, in one format for both printers: `capstan-agent log` (the
//! host's own log) and `capstan log HOST` (its copy in `CAPSTAN_EVT`), so the two read
//! side by side. Each record is its JSON (`docs/protocol.md`, *Log records*); the
//! stream's copy adds `host`, which the table leaves out (a table is one host's).

use serde_json::Value;

/// The columns: title, width (0: the last column, unpadded) and whether it is
/// right-aligned. Every row is padded to these widths; a longer value pushes the
/// rest of its row right rather than being cut.
const COLUMNS: [(&str, usize, bool); 6] = [
    ("SEQ", 6, true),
    ("AT", 24, false),
    ("KIND", 18, false),
    ("COMMAND", 24, false),
    ("TARGET", 32, false),
    ("DETAIL", 0, false),
];

/// The fields shown in DETAIL, in this order, when the record has them.
const DETAIL: [&str; 8] = [
    "outcome",
    "code",
    "cause",
    "op",
    "phase",
    "owner",
    "exit_code",
    "reaped",
];

/// The header line, aligned with [`row`].
pub fn header() -> String {
    line(COLUMNS.map(|(title, _, _)| title.to_string()))
}

/// One record as a row: seq, time appended, kind, command id (`-` for none), target
/// (`namespace/workload@revision`, as far as the record names them) and the detail
/// fields as `key=value`.
pub fn row(record: &Value) -> String {
    let field = |k: &str| record.get(k).and_then(Value::as_str);
    let target = match (field("namespace"), field("workload"), field("revision")) {
        (Some(n), Some(w), Some(v)) => format!("{n}/{w}@{v}"),
        (Some(n), Some(w), None) => format!("{n}/{w}"),
        (Some(n), None, _) => n.to_string(),
        _ => String::new(),
    };
    let detail = DETAIL
        .iter()
        .filter_map(|k| {
            record
                .get(*k)
                .filter(|v| !v.is_null())
                .map(|v| format!("{k}={}", cell(v)))
        })
        .collect::<Vec<_>>()
        .join(" ");
    line([
        record.get("seq").map(cell).unwrap_or_default(),
        field("at").unwrap_or("").to_string(),
        field("kind").unwrap_or("").to_string(),
        field("command_id").unwrap_or("-").to_string(),
        target,
        detail,
    ])
}

/// The cells padded to their columns, two spaces apart, without trailing spaces.
fn line(cells: [String; 6]) -> String {
    let mut out = String::new();
    for (i, (cell, (_, width, right))) in cells.iter().zip(COLUMNS).enumerate() {
        if i > 0 {
            out.push_str("  ");
        }
        if right {
            out.push_str(&format!("{cell:>width$}"));
        } else {
            out.push_str(&format!("{cell:<width$}"));
        }
    }
    out.trim_end().to_string()
}

/// A JSON value in a cell: strings bare, `{"command": id}` as `command`.
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => o.keys().next().cloned().unwrap_or_default(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Where each column of `line` after SEQ starts: after a run of two or more
    /// spaces.
    fn starts(line: &str) -> Vec<usize> {
        let bytes = line.as_bytes();
        let mut starts = vec![];
        for i in 7..bytes.len() {
            if bytes[i] != b' ' && bytes[i - 1] == b' ' && bytes[i - 2] == b' ' {
                starts.push(i);
            }
        }
        starts
    }

    /// Given records with one- to six-digit seqs, when printed, then every column of
    /// every row starts where the header's does, and the seq is right-aligned under
    /// `SEQ`.
    #[test]
    fn rows_line_up_with_the_header() {
        let header = header();
        for seq in [1u64, 42, 999_999] {
            let record = json!({
                "seq": seq, "at": "2026-12-07T18:25:32.518Z", "kind": "command_received",
                "command_id": "demo-ns.h1", "namespace": "shop", "workload": "web",
                "revision": "r1", "op": "prepare_revision", "host": "h1",
            });
            let row = row(&record);
            assert_eq!(starts(&row), starts(&header), "\n{header}\n{row}");
            let end = header.find("SEQ").unwrap() + 3;
            assert_eq!(&row[..end].trim_start(), &seq.to_string());
        }
    }

    /// Given a record without a command, target or detail, then its row says `-` for
    /// the command and ends without trailing spaces.
    #[test]
    fn a_bare_record() {
        let row =
            row(&json!({"seq": 7, "at": "2026-12-07T18:25:32.518Z", "kind": "drift_detected"}));
        assert!(row.contains("drift_detected      -"), "{row:?}");
        assert_eq!(row, row.trim_end());
    }

    /// Given the detail fields, then they are shown as `key=value`, strings bare and
    /// an object by its key.
    #[test]
    fn detail_fields() {
        let row = row(&json!({
            "seq": 3, "kind": "command_completed", "outcome": "failed", "code": "hook_failed",
            "cause": {"command": "c1"}, "exit_code": 3, "message": null,
        }));
        assert!(
            row.ends_with("outcome=failed code=hook_failed cause=command exit_code=3"),
            "{row:?}"
        );
    }
}

//! The bytes of a server-side apply: the apiserver decodes an apply body as YAML,
//! whose reader refuses raw DEL, C1 controls and U+FFFE/U+FFFF ("control characters
//! are not allowed") and folds a raw NEL, U+2028 or U+2029 into a space. Every value
//! `docs/protocol.md` allows (anything but NUL) must arrive as it was sent, so the body
//! is JSON (a subset of YAML) with those characters never raw.

use serde_json::value::RawValue;
use serde_json::Value;
use std::io::{self, Write};

/// `object` as the body of an apply: JSON in which DEL and every character outside
/// ASCII in the Basic Multilingual Plane is `\u`-escaped (escapes YAML and JSON decode
/// alike). Characters beyond the plane are sent as UTF-8: YAML's `\u` cannot carry a
/// surrogate pair, and as raw text they are printable in YAML and mean nothing else.
pub fn apply_body(object: &Value) -> Box<RawValue> {
    let mut out = Vec::new();
    let mut writer = serde_json::Serializer::with_formatter(&mut out, Escaped);
    serde::Serialize::serialize(object, &mut writer).expect("a Value always serialises");
    let text = String::from_utf8(out).expect("the formatter writes UTF-8");
    RawValue::from_string(text).expect("the formatter writes JSON")
}

/// serde_json's compact formatter, but for the characters of strings it writes as is.
struct Escaped;

impl serde_json::ser::Formatter for Escaped {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut from = 0;
        for (at, c) in fragment.char_indices() {
            let raw = (c.is_ascii() && c != '\x7f') || u32::from(c) > 0xFFFF;
            if raw {
                continue;
            }
            writer.write_all(&fragment.as_bytes()[from..at])?;
            write!(writer, "\\u{:04x}", u32::from(c))?;
            from = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[from..])
    }
}

#[cfg(test)]
mod tests;

//! The grammar of a container image reference, as a validator and as the regular
//! expression the OpenAPI description gives for it.

/// [`is_image_ref`]'s grammar as a regular expression (ECMA 262 and the `regex`
/// crate alike; what the OpenAPI description's `Spec.image` says), for a string of at
/// most [`IMAGE_REF_MAX_LEN`] bytes: a first path component with more after it is a
/// registry host when it holds `.` or `:` (or is `localhost`, which is a component
/// too); a tag follows the last component, a digest the tag. A test holds the two
/// to the same verdicts.
pub const IMAGE_REF_PATTERN: &str = concat!(
    "^(?:",
    // A registry host, or a component without `.` (one with is a host), then more.
    "(?:[A-Za-z0-9.:-]*[.:][A-Za-z0-9.:-]*|[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?)",
    "(?:/[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)+",
    // Or one component alone.
    "|[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?",
    ")",
    "(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?",
    "(?:@sha256:[0-9a-f]{64})?$",
);

/// The longest image reference [`is_image_ref`] takes.
pub const IMAGE_REF_MAX_LEN: usize = 512;

/// A container image reference: `[host[:port]/]path[:tag][@sha256:<64 hex>]`, where
/// path components are `[a-z0-9]+([._-][a-z0-9]+)*`. Also [`IMAGE_REF_PATTERN`].
pub fn is_image_ref(s: &str) -> bool {
    if s.is_empty() || s.len() > IMAGE_REF_MAX_LEN {
        return false;
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        {
            return false;
        }
    }
    // A tag is after the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let tb = t.as_bytes();
        let ok = !tb.is_empty()
            && tb.len() <= 128
            && (tb[0].is_ascii_alphanumeric() || tb[0] == b'_')
            && tb
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
        if !ok {
            return false;
        }
    }
    let mut parts: Vec<&str> = path.split('/').collect();
    if parts.len() > 1
        && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
    {
        let host = parts.remove(0);
        let ok = host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b':'));
        if !ok {
            return false;
        }
    }
    parts.iter().all(|p| is_path_component(p))
}

fn is_path_component(p: &str) -> bool {
    let b = p.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

//! Unit names. A revision is the service `capstan-<ns>-<workload>-<rev>.service` and
//! a namespace the slice `capstan-<ns>.slice`. Inside a name each component (a DNS
//! label, checked at intake) has its `-` escaped as `\x2d`, systemd-escape's
//! convention, so the only raw `-` are the separators: systemd's prefix drop-ins line
//! up with components (`capstan-.service.d/` reaches every capstan unit,
//! `capstan-<ns>-.service.d/` one namespace), a slice is a child of `capstan.slice`
//! and never of another namespace's slice, and no two triples spell the same name.
//!
//! Names stay within systemd's 255 bytes: a namespace part longer than
//! [`MAX_NAMESPACE_PART`] becomes `_<hash of the namespace>`, and a service name that
//! would be too long becomes `capstan-<ns part>-_<hash of the triple>.service`, still
//! under its namespace's prefix. A literal component never begins with `_` (it is
//! escaped), and the hashed form has one part fewer, so a shortened name can only
//! meet another name on a 48-bit hash collision.

use capstan_driver::RevisionRef;
use std::fmt::Write as _;

/// Every name capstan gives a unit begins with this.
pub const PREFIX: &str = "capstan-";
/// systemd's longest unit name, suffix included.
pub const MAX_UNIT_NAME: usize = 255;
/// The longest escaped namespace kept readable in names (a 63-byte label with up to
/// 21 dashes); longer ones are hashed.
pub const MAX_NAMESPACE_PART: usize = 126;
/// The drop-in holding a revision's launch environment, in [`dropin_dir`].
pub const ENV_DROPIN: &str = "50-capstan-env.conf";

/// The service unit of a revision.
pub fn unit_name(rev: RevisionRef<'_>) -> String {
    let ns = namespace_part(rev.namespace);
    let readable = format!(
        "{PREFIX}{ns}-{}-{}.service",
        escape(rev.workload),
        escape(rev.revision)
    );
    if readable.len() <= MAX_UNIT_NAME {
        return readable;
    }
    let triple = format!("{}\n{}\n{}", rev.namespace, rev.workload, rev.revision);
    format!("{PREFIX}{ns}-_{}.service", short_hash(triple.as_bytes()))
}

/// What the name of every service unit of `namespace` begins with. A namespace's part
/// never holds `-` (it is escaped), so no other namespace's units begin so.
pub fn namespace_prefix(namespace: &str) -> String {
    format!("{PREFIX}{}-", namespace_part(namespace))
}

/// The slice of a namespace: a child of `capstan.slice`.
pub fn slice_name(namespace: &str) -> String {
    format!("{PREFIX}{}.slice", namespace_part(namespace))
}

/// The longest user name systemd takes for `User=` with `DynamicUser=` (its
/// `UT_NAMESIZE - 1`).
pub const MAX_USER_NAME: usize = 31;

/// The user a namespace's units run as unless their spec names one: `capstan-<ns>`,
/// allocated by systemd (`DynamicUser=`) while one of them runs. Every unit of the
/// namespace shares it, so they share the namespace's state directory, and no other
/// namespace has it. A name longer than [`MAX_USER_NAME`] becomes `capstan-_` and 22
/// hex digits of the namespace's SHA-256 (88 bits; a DNS label never holds `_`, so
/// the two forms cannot meet).
pub fn namespace_user(namespace: &str) -> String {
    let readable = format!("{PREFIX}{namespace}");
    if readable.len() <= MAX_USER_NAME {
        return readable;
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(namespace.as_bytes());
    format!(
        "{PREFIX}_{}",
        capstan_common::signing::to_hex(&digest[..11])
    )
}

/// The unit that removes a namespace's state directory when the namespace is
/// deleted: `capstan-<ns>.service` (one part: never a revision's name).
pub fn cleanup_unit(namespace: &str) -> String {
    format!("{PREFIX}{}.service", namespace_part(namespace))
}

/// The drop-in directory of a unit.
pub fn dropin_dir(unit: &str) -> String {
    format!("{unit}.d")
}

/// True for the file name of a unit capstan names: [`PREFIX`], a non-empty rest of
/// unit-name characters, `.service` or `.slice`. For the directory scan; whether the
/// unit is really ours is for its markers to say.
pub fn is_capstan_unit_file(file_name: &str) -> bool {
    let Some(rest) = file_name.strip_prefix(PREFIX) else {
        return false;
    };
    let Some(stem) = rest
        .strip_suffix(".service")
        .or_else(|| rest.strip_suffix(".slice"))
    else {
        return false;
    };
    file_name.len() <= MAX_UNIT_NAME
        && !stem.is_empty()
        && stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'\\' | b'-'))
}

pub use capstan_driver::{short_hash, spec_hash};

/// A namespace as it stands in names: escaped, or hashed when that is too long.
fn namespace_part(namespace: &str) -> String {
    let escaped = escape(namespace);
    if escaped.len() <= MAX_NAMESPACE_PART {
        escaped
    } else {
        format!("_{}", short_hash(namespace.as_bytes()))
    }
}

/// A component inside a unit name: `[a-z0-9]` as they are, every other byte as
/// `\xNN` (for a DNS label, only `-`, as `\x2d`).
fn escape(component: &str) -> String {
    let mut out = String::with_capacity(component.len());
    for b in component.bytes() {
        if b.is_ascii_lowercase() || b.is_ascii_digit() {
            out.push(b as char);
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rev<'a>(namespace: &'a str, workload: &'a str, revision: &'a str) -> RevisionRef<'a> {
        RevisionRef {
            namespace,
            workload,
            revision,
        }
    }

    fn is_valid_unit_name(name: &str) -> bool {
        name.len() <= MAX_UNIT_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b":_.\\-".contains(&b))
    }

    /// Given namespaces short and long, when their user is named, then it is a user
    /// name systemd takes for a dynamic user, one per namespace.
    #[test]
    fn given_namespaces_when_their_user_is_named_then_a_valid_distinct_name_each() {
        assert_eq!(namespace_user("shop"), "capstan-shop");
        let exact = "a".repeat(MAX_USER_NAME - PREFIX.len());
        assert_eq!(namespace_user(&exact), format!("capstan-{exact}"));
        let long = format!("{exact}b");
        let hashed = namespace_user(&long);
        assert!(hashed.starts_with("capstan-_"), "{hashed}");
        assert_ne!(hashed, namespace_user(&format!("{exact}c")));
        for ns in ["shop", "team-a", "0ns", &exact, &long, &"z".repeat(63)] {
            let user = namespace_user(ns);
            let b = user.as_bytes();
            assert!(user.len() <= MAX_USER_NAME, "{user}");
            assert!(b[0].is_ascii_alphabetic(), "{user}");
            assert!(
                b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"_-".contains(c)),
                "{user}"
            );
        }
        assert_eq!(cleanup_unit("team-a"), r"capstan-team\x2da.service");
    }

    #[test]
    fn given_plain_labels_when_named_then_the_name_is_readable() {
        assert_eq!(
            unit_name(rev("ns", "web", "r1")),
            "capstan-ns-web-r1.service"
        );
        assert_eq!(slice_name("ns"), "capstan-ns.slice");
        assert_eq!(
            dropin_dir("capstan-ns-web-r1.service"),
            "capstan-ns-web-r1.service.d"
        );
    }

    #[test]
    fn given_dashed_labels_when_named_then_dashes_are_escaped_and_separators_are_not() {
        assert_eq!(
            unit_name(rev("team-a", "web-1", "r-2")),
            r"capstan-team\x2da-web\x2d1-r\x2d2.service"
        );
        assert_ne!(
            unit_name(rev("a", "b-c", "d")),
            unit_name(rev("a-b", "c", "d"))
        );
        // The prefix drop-in of a namespace reaches its units only.
        let ns_prefix = format!("{}-", slice_name("team-a").trim_end_matches(".slice"));
        assert!(unit_name(rev("team-a", "w", "r")).starts_with(&ns_prefix));
        assert!(!unit_name(rev("team", "a-w", "r")).starts_with(&ns_prefix));
    }

    #[test]
    fn given_a_dashed_namespace_when_its_slice_is_named_then_its_parent_is_capstan_slice() {
        let slice = slice_name("team-a");
        assert_eq!(slice, r"capstan-team\x2da.slice");
        // systemd's parent slice: cut at the last raw '-'.
        let stem = slice.trim_end_matches(".slice");
        assert_eq!(&stem[..stem.rfind('-').unwrap()], "capstan");
    }

    #[test]
    fn given_very_long_dashed_labels_when_named_then_the_name_is_bounded_and_keeps_its_prefix() {
        let dashed = format!("a{}a", "-".repeat(61));
        let long = "b".repeat(63);
        let name = unit_name(rev(&long, &dashed, &dashed));
        assert!(is_valid_unit_name(&name), "{name}");
        assert!(name.starts_with(&format!("capstan-{long}-_")));
        assert!(name.ends_with(".service"));
        // A namespace that cannot be kept readable is hashed, in both names.
        let name = unit_name(rev(&dashed, &dashed, &dashed));
        let slice = slice_name(&dashed);
        assert!(is_valid_unit_name(&name) && is_valid_unit_name(&slice));
        assert!(name.starts_with(&format!("{}-_", slice.trim_end_matches(".slice"))));
        assert_ne!(name, unit_name(rev(&dashed, &dashed, "r")));
    }

    #[test]
    fn given_file_names_when_scanned_then_only_capstan_units_match() {
        for ours in [
            "capstan-ns-web-r1.service",
            r"capstan-team\x2da.slice",
            "capstan-ns-_0123456789ab.service",
        ] {
            assert!(is_capstan_unit_file(ours), "{ours}");
        }
        for theirs in [
            "capstan.slice",
            "capstan-.service",
            "capstan-ns-web-r1.service.d",
            "capstan-ns-web-r1.socket",
            "sshd.service",
            "capstan-a@b.service",
            "capstan-a b.service",
            "Capstan-ns.slice",
        ] {
            assert!(!is_capstan_unit_file(theirs), "{theirs}");
        }
        assert!(!is_capstan_unit_file(&format!(
            "capstan-{}.slice",
            "a".repeat(250)
        )));
    }

    #[test]
    fn given_bytes_when_hashed_then_twelve_hex_digits() {
        let h = short_hash(b"x");
        assert_eq!(h.len(), 12);
        assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(h, short_hash(b"y"));
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
    }

    proptest! {
        #[test]
        fn distinct_triples_have_distinct_valid_names(
            a in (label(), label(), label()),
            b in (label(), label(), label()),
        ) {
            let (na, nb) = (
                unit_name(rev(&a.0, &a.1, &a.2)),
                unit_name(rev(&b.0, &b.1, &b.2)),
            );
            prop_assert!(is_valid_unit_name(&na) && is_capstan_unit_file(&na));
            prop_assert_eq!(a == b, na == nb);
            let (sa, sb) = (slice_name(&a.0), slice_name(&b.0));
            prop_assert!(is_valid_unit_name(&sa) && is_capstan_unit_file(&sa));
            prop_assert_eq!(a.0 == b.0, sa == sb);
        }

        #[test]
        fn small_alphabet_triples_do_not_collide(
            a in ("[ab-]{1,4}", "[ab-]{1,4}", "[ab-]{1,4}"),
            b in ("[ab-]{1,4}", "[ab-]{1,4}", "[ab-]{1,4}"),
        ) {
            let na = unit_name(rev(&a.0, &a.1, &a.2));
            let nb = unit_name(rev(&b.0, &b.1, &b.2));
            prop_assert_eq!(a == b, na == nb);
        }
    }
}

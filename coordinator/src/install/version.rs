//! Which of two package versions is older (pure): what `capstan install` needs to
//! tell a downgrade from an upgrade.
//!
//! A Debian version `[epoch:]MAJOR.MINOR.PATCH[suffix]`, read semver-ish:
//! - `epoch` (digits and a colon) first, 0 when absent;
//! - then `MAJOR.MINOR.PATCH`, numerically (a missing `.PATCH` or `.MINOR` is 0);
//! - a pre-release, `~rc1` (Debian's) or `-rc1` (semver's: a `-` followed by a
//!   letter), sorts before the release it precedes; pre-releases compare by their
//!   dot-separated identifiers, numeric ones numerically and before alphanumeric ones;
//! - a Debian revision, `-1` (a `-` followed by a digit, `-2ubuntu1`), sorts after
//!   the release without one, and revisions compare by their leading number, then
//!   the rest;
//! - `+build` metadata (`+local`, `+upgrade-test`) does not order: `1.2.3+a` is
//!   neither older nor newer than `1.2.3`.
//!
//! A version that does not start with a number cannot be compared (`None`).

use std::cmp::Ordering;

/// A version, read as the module says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    epoch: u64,
    release: [u64; 3],
    /// The pre-release identifiers, if any.
    pre: Option<Vec<String>>,
    /// The Debian revision, if any.
    revision: Option<String>,
}

fn number(text: &str) -> Option<u64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

fn parse(text: &str) -> Option<Version> {
    let (epoch, rest) = match text.split_once(':') {
        Some((e, rest)) => (number(e)?, rest),
        None => (0, text),
    };
    // `+build` metadata never orders.
    let rest = rest.split_once('+').map_or(rest, |(v, _)| v);
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (numbers, mut suffix) = rest.split_at(end);
    let mut release = [0; 3];
    let mut parts = numbers.split('.');
    for slot in &mut release {
        match parts.next() {
            Some(p) => *slot = number(p)?,
            None => break,
        }
    }
    if parts.next().is_some() {
        return None;
    }
    let mut pre = None;
    let mut revision = None;
    // A Debian revision follows the last `-` that a digit follows.
    if let Some(at) = suffix.rfind('-') {
        let tail = &suffix[at + 1..];
        if tail.starts_with(|c: char| c.is_ascii_digit()) {
            revision = Some(tail.to_string());
            suffix = &suffix[..at];
        }
    }
    if let Some(p) = suffix
        .strip_prefix('~')
        .or_else(|| suffix.strip_prefix('-'))
    {
        pre = Some(p.split('.').map(str::to_string).collect());
    } else if !suffix.is_empty() {
        return None;
    }
    Some(Version {
        epoch,
        release,
        pre,
        revision,
    })
}

/// Semver's order of two pre-release identifiers.
fn identifier(a: &str, b: &str) -> Ordering {
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// A Debian revision's leading number, then the rest.
fn revision_key(r: &str) -> (u64, &str) {
    let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
    (r[..end].parse().unwrap_or(0), &r[end..])
}

/// How version `a` compares to version `b`; `None` when either cannot be read.
pub fn compare(a: &str, b: &str) -> Option<Ordering> {
    let (a, b) = (parse(a)?, parse(b)?);
    let pre = match (&a.pre, &b.pre) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => x
            .iter()
            .zip(y)
            .map(|(i, j)| identifier(i, j))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
    };
    let revision = match (&a.revision, &b.revision) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => revision_key(x).cmp(&revision_key(y)),
    };
    Some(
        a.epoch
            .cmp(&b.epoch)
            .then(a.release.cmp(&b.release))
            .then(pre)
            .then(revision),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Ordering::{Equal, Greater, Less};

    fn check(cases: &[(&str, &str, Ordering)]) {
        for (a, b, want) in cases {
            assert_eq!(compare(a, b), Some(*want), "{a} vs {b}");
            assert_eq!(compare(b, a), Some(want.reverse()), "{b} vs {a}");
        }
    }

    #[test]
    fn given_two_releases_then_the_numbers_decide_numerically() {
        check(&[
            ("0.1.0", "0.2.0", Less),
            ("0.9.0", "0.10.0", Less),
            ("1.0.0", "0.99.99", Greater),
            ("1.2.3", "1.2.3", Equal),
            ("1.2.10", "1.2.9", Greater),
            ("1.2", "1.2.0", Equal),
            ("2", "1.9.9", Greater),
        ]);
    }

    #[test]
    fn given_a_pre_release_then_it_comes_before_its_release_and_after_the_one_before() {
        check(&[
            ("1.0.0~rc1", "1.0.0", Less),
            ("1.0.0-rc1", "1.0.0", Less),
            ("1.0.0-rc.2", "1.0.0-rc.10", Less),
            ("1.0.0-alpha", "1.0.0-beta", Less),
            ("1.0.0-alpha", "1.0.0-alpha.1", Less),
            ("1.0.0-1", "1.0.0-alpha", Greater),
            ("1.0.0~rc1", "0.9.9", Greater),
        ]);
    }

    #[test]
    fn given_a_debian_revision_then_it_orders_after_the_release_it_packages() {
        check(&[
            ("1.2.3-1", "1.2.3", Greater),
            ("1.2.3-2", "1.2.3-10", Less),
            ("1.2.3-2", "1.2.3-2ubuntu1", Less),
            ("1.2.3-9", "1.2.4", Less),
            ("1.2.3~rc1-1", "1.2.3~rc1", Greater),
            ("1.2.3~rc1-1", "1.2.3", Less),
        ]);
    }

    #[test]
    fn given_an_epoch_or_build_metadata_then_the_epoch_decides_and_the_build_does_not() {
        check(&[
            ("1:0.1.0", "2.0.0", Greater),
            ("1:0.1.0", "2:0.0.1", Less),
            ("0:1.0.0", "1.0.0", Equal),
            ("0.1.0+upgrade-test", "0.1.0", Equal),
            ("0.0.0+upgrade-test", "0.1.0", Less),
            ("1.2.3+a", "1.2.3+b", Equal),
        ]);
    }

    #[test]
    fn given_a_version_that_is_not_one_then_nothing_is_said() {
        for bad in [
            "",
            "latest",
            "v1.2.3",
            "1.2.3.4",
            "1.x",
            "a:1.0",
            "1.0.0 beta",
        ] {
            assert_eq!(compare(bad, "1.0.0"), None, "{bad:?}");
            assert_eq!(compare("1.0.0", bad), None, "{bad:?}");
        }
    }
}

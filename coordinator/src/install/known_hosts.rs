//! What an OpenSSH known_hosts file says of one host (`capstan install`'s host key
//! check), and the verdict on the key it presents ([`verdict`], pure).
//!
//! A line is `[@marker] patterns keytype base64 [comment]` (fields separated by
//! spaces or tabs; `#` starts a comment line). The patterns are a comma-separated
//! list — `*` and `?` globs, a `!` before a pattern excludes what it matches, and
//! `[host]:port` names a port other than 22 — or one hashed name `|1|salt|hash`
//! (`ssh-keygen -H`). Names match without regard to case, as OpenSSH's do.
//!
//! Markers:
//! - `@revoked`: the key is refused for every host the line matches (`@revoked *`:
//!   everywhere), whatever else the file says of it, and `--accept-new` never records it.
//! - `@cert-authority`: a CA trusted to sign the hosts' certificates. capstan install
//!   uses no host certificates (a host presenting one is refused), so such a line is
//!   never taken for the host's own key; and a host the file knows only through a CA
//!   is refused, not trusted on first use: its plain key has to be recorded.
//!
//! A line with an unknown marker or missing fields is an error naming it (a
//! misspelt `@revoked` must not pass unnoticed); a matching line whose key cannot be
//! read is one too. Lines for other hosts are not read further.

use hmac::{KeyInit as _, Mac as _};
use russh::keys::ssh_key::known_hosts::HostPatterns;
use russh::keys::PublicKey;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum KnownHostsError {
    #[error("cannot read it")]
    Read(#[source] std::io::Error),
    #[error("line {line} has the unknown marker {marker:?} (known: @revoked, @cert-authority)")]
    Marker { line: usize, marker: String },
    #[error("line {line} is not `[@marker] hosts key-type base64-key [comment]`")]
    Fields { line: usize },
    #[error("line {line}: its host patterns cannot be read")]
    Patterns {
        line: usize,
        #[source]
        source: russh::keys::ssh_key::Error,
    },
    #[error("line {line}: its key cannot be read")]
    Key {
        line: usize,
        #[source]
        source: russh::keys::ssh_key::Error,
    },
}

/// The lines of a known_hosts file that match one host, by kind: `(line, key)`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ForHost {
    /// Its plain host keys.
    pub keys: Vec<(usize, PublicKey)>,
    /// Keys `@revoked` for it.
    pub revoked: Vec<(usize, PublicKey)>,
    /// `@cert-authority` lines covering it.
    pub authorities: Vec<(usize, PublicKey)>,
}

/// What the file says of a presented key.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Trusted,
    /// The key is `@revoked` (on that line).
    Revoked(usize),
    /// The host has recorded keys; none is the presented one (their fingerprints).
    Mismatch(Vec<String>),
    /// No plain key is recorded and a `@cert-authority` line covers the host.
    OnlyAuthority(usize),
    Unknown,
}

/// The verdict on `presented` for a host the file says `known` of (pure).
pub fn verdict(known: &ForHost, presented: &PublicKey) -> Verdict {
    let same = |(_, k): &&(usize, PublicKey)| k.key_data() == presented.key_data();
    if let Some((line, _)) = known.revoked.iter().find(same) {
        return Verdict::Revoked(*line);
    }
    if known.keys.iter().any(|k| same(&k)) {
        return Verdict::Trusted;
    }
    if !known.keys.is_empty() {
        return Verdict::Mismatch(
            known
                .keys
                .iter()
                .map(|(_, k)| super::ssh::fingerprint(k))
                .collect(),
        );
    }
    match known.authorities.first() {
        Some((line, _)) => Verdict::OnlyAuthority(*line),
        None => Verdict::Unknown,
    }
}

/// What the file at `path` says of `host` on `port`; a missing file says nothing.
pub fn read(path: &Path, host: &str, port: u16) -> Result<ForHost, KnownHostsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, host, port),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ForHost::default()),
        Err(e) => Err(KnownHostsError::Read(e)),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Marker {
    None,
    Revoked,
    CertAuthority,
}

/// What the known_hosts text `text` says of `host` on `port` (pure).
pub fn parse(text: &str, host: &str, port: u16) -> Result<ForHost, KnownHostsError> {
    let name = if port == 22 {
        host.to_ascii_lowercase()
    } else {
        format!("[{}]:{port}", host.to_ascii_lowercase())
    };
    let mut known = ForHost::default();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut fields = trimmed.split_whitespace();
        let mut first = fields.next().unwrap_or_default();
        let marker = match first {
            "@revoked" => Marker::Revoked,
            "@cert-authority" => Marker::CertAuthority,
            m if m.starts_with('@') => {
                return Err(KnownHostsError::Marker {
                    line: line_no,
                    marker: m.to_string(),
                })
            }
            _ => Marker::None,
        };
        if marker != Marker::None {
            first = fields.next().unwrap_or_default();
        }
        let (Some(kind), Some(blob)) = (fields.next(), fields.next()) else {
            return Err(KnownHostsError::Fields { line: line_no });
        };
        let patterns: HostPatterns = first.parse().map_err(|source| KnownHostsError::Patterns {
            line: line_no,
            source,
        })?;
        if !matches(&patterns, &name) {
            continue;
        }
        let key = PublicKey::from_openssh(&format!("{kind} {blob}")).map_err(|source| {
            KnownHostsError::Key {
                line: line_no,
                source,
            }
        })?;
        let into = match marker {
            Marker::None => &mut known.keys,
            Marker::Revoked => &mut known.revoked,
            Marker::CertAuthority => &mut known.authorities,
        };
        into.push((line_no, key));
    }
    Ok(known)
}

/// Whether `patterns` match `name` (lower-case; `[host]:port` for another port).
fn matches(patterns: &HostPatterns, name: &str) -> bool {
    match patterns {
        HostPatterns::HashedName { salt, hash } => {
            let Ok(mac) = hmac::Hmac::<sha1::Sha1>::new_from_slice(salt) else {
                return false;
            };
            mac.chain_update(name.as_bytes()).verify_slice(hash).is_ok()
        }
        HostPatterns::Patterns(list) => {
            let mut matched = false;
            for pattern in list {
                let pattern = pattern.to_ascii_lowercase();
                match pattern.strip_prefix('!') {
                    Some(negated) if glob(negated.as_bytes(), name.as_bytes()) => return false,
                    Some(_) => {}
                    None => matched |= glob(pattern.as_bytes(), name.as_bytes()),
                }
            }
            matched
        }
    }
}

/// OpenSSH's `match_pattern`: `*` any run of characters, `?` one.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && glob(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && glob(rest, &name[1..]),
    }
}

#[cfg(test)]
mod tests;

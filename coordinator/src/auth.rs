//! API tokens: who may use the HTTP API, and for what.
//!
//! The tokens file (`tokens_file` in `coordinator.toml`) holds one token per line as
//! `ROLE SHA256 [NAME]`: the role (`read` or `submit`), the lower-case hex SHA-256 of
//! the token (64 digits) and an optional name for the operator (one word). Blank
//! lines and lines starting with `#` are ignored. The tokens themselves are never
//! stored: a request's `Authorization: Bearer <token>` is hashed and compared with
//! every stored hash in constant time. `capstan-coordinator token` makes a token and
//! its line.

use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use subtle::ConstantTimeEq as _;

/// What a token may do. `Submit` implies `Read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// `GET` every `/v1` endpoint.
    Read,
    /// `POST` commands (and so roll out), and everything `Read` may.
    Submit,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Submit => "submit",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "read" => Some(Role::Read),
            "submit" => Some(Role::Submit),
            _ => None,
        }
    }

    /// True when a token with this role may do what `needed` guards.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("cannot read the tokens file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: {reason} (a line is `ROLE SHA256 [NAME]`, ROLE `read` or `submit`, SHA256 64 hex digits)")]
    Line {
        path: PathBuf,
        line: usize,
        reason: &'static str,
    },
    #[error("the tokens file {path} holds no token: nobody could use the API")]
    Empty { path: PathBuf },
    #[error("cannot make a random token")]
    Random(#[source] getrandom::Error),
}

/// One stored token.
#[derive(Debug, Clone)]
struct Entry {
    role: Role,
    digest: [u8; 32],
    name: String,
}

/// Who presented a valid token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub role: Role,
    /// The line's NAME, or `line N` when it has none.
    pub name: String,
}

/// The tokens file, loaded once at start.
#[derive(Debug, Clone)]
pub struct Tokens {
    entries: Vec<Entry>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Tokens {
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Tokens::parse(path, &text)
    }

    /// Parses the file's text; `path` only names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Tokens, TokensError> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let bad = |reason| TokensError::Line {
                path: path.to_path_buf(),
                line: line_no,
                reason,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() > 3 || fields.len() < 2 {
                return Err(bad("expected 2 or 3 fields"));
            }
            let role = Role::parse(fields[0]).ok_or_else(|| bad("unknown role"))?;
            let digest = parse_digest(fields[1])
                .ok_or_else(|| bad("the hash is not 64 lower-case hex digits"))?;
            let name = fields
                .get(2)
                .map_or_else(|| format!("line {line_no}"), |n| n.to_string());
            entries.push(Entry { role, digest, name });
        }
        if entries.is_empty() {
            return Err(TokensError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(Tokens { entries })
    }

    /// The caller `token` belongs to, if any. Every stored hash is compared, each in
    /// constant time, so the answer's timing does not depend on which (if any) matched.
    pub fn check(&self, token: &str) -> Option<Caller> {
        let presented = digest(token);
        let mut found: Option<&Entry> = None;
        for entry in &self.entries {
            let same: bool = entry.digest.ct_eq(&presented).into();
            if same && found.is_none_or(|f| entry.role > f.role) {
                found = Some(entry);
            }
        }
        found.map(|e| Caller {
            role: e.role,
            name: e.name.clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A new token (`capstan_` + 64 hex digits: 256 random bits) and its tokens-file line.
pub fn generate(role: Role, name: Option<&str>) -> Result<(String, String), TokensError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(TokensError::Random)?;
    let token = format!("capstan_{}", capstan_common::signing::to_hex(&bytes));
    let mut line = format!(
        "{} {}",
        role.as_str(),
        capstan_common::signing::to_hex(&digest(&token))
    );
    if let Some(name) = name {
        line.push(' ');
        line.push_str(name);
    }
    Ok((token, line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Result<Tokens, TokensError> {
        Tokens::parse(Path::new("tokens"), text)
    }

    #[test]
    fn generated_lines_load_and_check_with_their_role() {
        let (submit, submit_line) = generate(Role::Submit, Some("ci")).unwrap();
        let (read, read_line) = generate(Role::Read, None).unwrap();
        assert!(submit.starts_with("capstan_") && submit.len() == 8 + 64);
        assert!(
            !submit_line.contains(&submit),
            "the line holds only the hash"
        );
        let t = tokens(&format!("# ops\n\n{submit_line}\n  {read_line}  \n")).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.check(&submit),
            Some(Caller {
                role: Role::Submit,
                name: "ci".into()
            })
        );
        let r = t.check(&read).unwrap();
        assert_eq!((r.role, r.name.as_str()), (Role::Read, "line 4"));
        assert_eq!(t.check("capstan_wrong"), None);
        assert_eq!(t.check(""), None);
        assert_eq!(t.check(&submit[..submit.len() - 1]), None);
    }

    #[test]
    fn the_same_hash_twice_gets_the_stronger_role() {
        let (token, line) = generate(Role::Read, None).unwrap();
        let hash = line.split(' ').nth(1).unwrap();
        let t = tokens(&format!("read {hash}\nsubmit {hash}\nread {hash}\n")).unwrap();
        assert_eq!(t.check(&token).unwrap().role, Role::Submit);
    }

    #[test]
    fn roles() {
        assert!(Role::Submit.allows(Role::Read));
        assert!(Role::Submit.allows(Role::Submit));
        assert!(Role::Read.allows(Role::Read));
        assert!(!Role::Read.allows(Role::Submit));
    }

    #[test]
    fn bad_files_name_the_line() {
        let hash = "a".repeat(64);
        for (text, line, reason) in [
            (format!("admin {hash}"), 1, "unknown role"),
            ("read abc".to_string(), 1, "64 lower-case hex"),
            (
                format!("#c\nread {}", "A".repeat(64)),
                2,
                "64 lower-case hex",
            ),
            (format!("read {hash} name extra"), 1, "2 or 3 fields"),
            ("submit".to_string(), 1, "2 or 3 fields"),
        ] {
            let err = tokens(&text).unwrap_err();
            let message = err.to_string();
            assert!(
                matches!(err, TokensError::Line { line: l, .. } if l == line),
                "{text}: {message}"
            );
            assert!(message.contains(reason), "{text}: {message}");
        }
        assert!(matches!(
            tokens("# nobody\n\n"),
            Err(TokensError::Empty { .. })
        ));
    }
}

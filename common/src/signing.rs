//! Command signatures (ed25519); the same keys sign what hosts publish
//! ([`crate::published`]).
//!
//! The coordinator signs every command it publishes; agents verify before acting.
//! The signed bytes are [`canonical_bytes`]: the ASCII prefix `capstan-command-v1\n`
//! followed by the command's canonical JSON ([`Command::to_json`]: fields in a fixed
//! order, no whitespace, no `sig`). The signature travels in the command's own `sig`
//! field as 128 lower-case hex digits; keys are 64 hex digits (the 32-byte ed25519
//! seed for the secret key, the 32-byte point for a public key).

use crate::{Command, ErrorCode, Rejection};
use chrono::{DateTime, Utc};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use std::time::Duration;

/// Domain separation: a signature over a command can never be mistaken for one over
/// anything else.
pub const SIGNING_PREFIX: &[u8] = b"capstan-command-v1\n";

/// A key that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("a key is 64 hex digits (32 bytes); got {0} characters")]
    Length(usize),
    #[error("a key is hex digits only")]
    NotHex,
    #[error("not a valid ed25519 public key")]
    BadPoint,
    #[error("the system random source failed")]
    Random(#[source] getrandom::Error),
}

/// The bytes a signature covers.
pub fn canonical_bytes(command: &Command) -> Vec<u8> {
    let mut bytes = SIGNING_PREFIX.to_vec();
    bytes.extend_from_slice(command.to_json().as_bytes());
    bytes
}

/// What [`Signer::signed_json`] adds to a command's canonical JSON: `,"sig":"…"` with
/// the 128 hex digits of an ed25519 signature.
const SIG_FIELD_BYTES: usize = r#","sig":"""#.len() + 128;

/// The length of [`Signer::signed_json`] of `command`, whatever the key: the size of
/// what the coordinator publishes, which the agent holds to
/// [`crate::MAX_COMMAND_BYTES`]. It can be several times the size of the JSON a client
/// sent: the canonical form spells out every field, defaults included.
pub fn signed_len(command: &Command) -> usize {
    command.to_json().len() + SIG_FIELD_BYTES
}

/// Lower-case hex.
pub fn to_hex(bytes: &[u8]) -> String {
    // A digit at a time from a table: a `format!` a byte cost the agent's hot path
    // (every record's hash, every signature) several percent of its CPU.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

pub(crate) fn from_hex<const N: usize>(text: &str) -> Result<[u8; N], KeyError> {
    let text = text.trim();
    if text.len() != N * 2 {
        return Err(KeyError::Length(text.len()));
    }
    let mut out = [0u8; N];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        let digits = std::str::from_utf8(pair).map_err(|_| KeyError::NotHex)?;
        out[i] = u8::from_str_radix(digits, 16).map_err(|_| KeyError::NotHex)?;
    }
    Ok(out)
}

/// The coordinator's signing key.
pub struct Signer {
    key: SigningKey,
}

impl Signer {
    /// A fresh key from the system's random source.
    pub fn generate() -> Result<Signer, KeyError> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed).map_err(KeyError::Random)?;
        Ok(Signer {
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// Reads a secret key (the seed) from its hex form.
    pub fn from_hex(text: &str) -> Result<Signer, KeyError> {
        Ok(Signer {
            key: SigningKey::from_bytes(&from_hex::<32>(text)?),
        })
    }

    /// The secret key's hex form (keep it secret).
    pub fn secret_hex(&self) -> String {
        to_hex(&self.key.to_bytes())
    }

    /// The public key.
    pub fn verifying_key(&self) -> ed25519_dalek::VerifyingKey {
        self.key.verifying_key()
    }

    /// The public key's hex form, for agent configs.
    pub fn public_hex(&self) -> String {
        to_hex(self.key.verifying_key().as_bytes())
    }

    /// The signature over `command`, hex.
    pub fn sign(&self, command: &Command) -> String {
        self.sign_bytes(&canonical_bytes(command))
    }

    /// The signature over `bytes`, hex.
    pub(crate) fn sign_bytes(&self, bytes: &[u8]) -> String {
        to_hex(&self.key.sign(bytes).to_bytes())
    }

    /// The command's wire form: its canonical JSON with `sig` added.
    pub fn signed_json(&self, command: &Command) -> String {
        let mut value: serde_json::Value =
            serde_json::from_str(&command.to_json()).expect("canonical JSON parses");
        value["sig"] = self.sign(command).into();
        value.to_string()
    }
}

/// The `sig` field of a command's JSON text, if it has a string one.
pub fn sig_field(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value.get("sig")?.as_str().map(str::to_string)
}

/// What an agent accepts.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Trusted public keys; a command must verify against one of them.
    pub keys: Vec<VerifyingKey>,
    /// Accept commands without any signature (development only).
    pub allow_unsigned: bool,
    /// Reject commands issued longer ago than this (replays of old commands).
    pub max_age: Duration,
    /// Reject commands issued further than this in the future (clock skew).
    pub max_skew: Duration,
}

/// Parses a public key from hex.
pub fn public_key(text: &str) -> Result<VerifyingKey, KeyError> {
    VerifyingKey::from_bytes(&from_hex::<32>(text)?).map_err(|_| KeyError::BadPoint)
}

impl Policy {
    /// Checks `sig` and `issued_at` of a parsed, valid command. The host is checked by
    /// the executor (`wrong_host`); the signature covers it, so it cannot be altered.
    pub fn authorize(
        &self,
        command: &Command,
        sig: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), Rejection> {
        match sig {
            None if self.allow_unsigned => {}
            None => {
                return Err(Rejection::new(
                    ErrorCode::Unsigned,
                    "the command carries no `sig`; this agent accepts only signed commands",
                ))
            }
            Some(sig) => {
                let bytes = from_hex::<64>(sig).map_err(|e| {
                    Rejection::new(ErrorCode::BadSignature, format!("`sig` is malformed: {e}"))
                })?;
                let signature = Signature::from_bytes(&bytes);
                let message = canonical_bytes(command);
                if !self
                    .keys
                    .iter()
                    .any(|k| k.verify_strict(&message, &signature).is_ok())
                {
                    return Err(Rejection::new(
                        ErrorCode::BadSignature,
                        "`sig` does not verify against any trusted key",
                    ));
                }
            }
        }
        let age = now.signed_duration_since(command.issued_at);
        if age.to_std().is_ok_and(|a| a > self.max_age) {
            return Err(Rejection::new(
                ErrorCode::Expired,
                format!(
                    "issued {}s ago; the limit is {}s",
                    age.num_seconds(),
                    self.max_age.as_secs()
                ),
            ));
        }
        if (-age).to_std().is_ok_and(|a| a > self.max_skew) {
            return Err(Rejection::new(
                ErrorCode::IssuedInFuture,
                format!(
                    "issued {}s in the future; the allowed skew is {}s",
                    (-age).num_seconds(),
                    self.max_skew.as_secs()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(to_hex(&all), expected);
        assert_eq!(to_hex(&[]), "");
    }

    fn command(host: &str, issued_at: DateTime<Utc>) -> Command {
        let text = format!(
            r#"{{"v":1,"id":"c-1","host":"{host}","issued_at":"{}","op":"ensure_namespace","namespace":"ns"}}"#,
            issued_at.to_rfc3339()
        );
        Command::parse(&text).unwrap()
    }

    fn policy(signer: &Signer) -> Policy {
        Policy {
            keys: vec![public_key(&signer.public_hex()).unwrap()],
            allow_unsigned: false,
            max_age: Duration::from_secs(60),
            max_skew: Duration::from_secs(5),
        }
    }

    #[test]
    fn signed_commands_verify_and_tampering_is_caught() {
        let signer = Signer::generate().unwrap();
        let now = Utc::now();
        let c = command("h1", now);
        let wire = signer.signed_json(&c);
        let parsed = Command::parse(&wire).unwrap();
        assert_eq!(parsed, c);
        let sig = sig_field(&wire);
        policy(&signer)
            .authorize(&parsed, sig.as_deref(), now)
            .unwrap();
        // Same signature, another host: the signature covers the host.
        let other = command("h2", now);
        let e = policy(&signer)
            .authorize(&other, sig.as_deref(), now)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadSignature);
    }

    #[test]
    fn unsigned_wrong_key_old_and_future_are_rejected() {
        let signer = Signer::generate().unwrap();
        let stranger = Signer::generate().unwrap();
        let now = Utc::now();
        let c = command("h1", now);
        let p = policy(&signer);
        let code = |sig: Option<&str>, c: &Command| p.authorize(c, sig, now).unwrap_err().code;
        assert_eq!(code(None, &c), ErrorCode::Unsigned);
        assert_eq!(code(Some(&stranger.sign(&c)), &c), ErrorCode::BadSignature);
        assert_eq!(code(Some("zz"), &c), ErrorCode::BadSignature);
        let old = command("h1", now - chrono::Duration::seconds(120));
        assert_eq!(code(Some(&signer.sign(&old)), &old), ErrorCode::Expired);
        let future = command("h1", now + chrono::Duration::seconds(60));
        assert_eq!(
            code(Some(&signer.sign(&future)), &future),
            ErrorCode::IssuedInFuture
        );
    }

    /// Given commands with escapes, non-ASCII text and defaults the client left out,
    /// when signed, then `signed_len` is the signed JSON's length, and a compact body
    /// can grow past the limit in its canonical form.
    #[test]
    fn signed_len_is_the_length_of_the_signed_json() {
        let signer = Signer::generate().unwrap();
        let ports: Vec<serde_json::Value> = (1..=2000)
            .map(|p| serde_json::json!({"container_port": p}))
            .collect();
        let prepare = |id: &str, spec: serde_json::Value| {
            serde_json::json!({"v": 1, "id": id, "host": "h1",
                "issued_at": "2026-12-01T10:00:00.123456789+02:00", "op": "prepare_revision",
                "namespace": "ns", "workload": "w", "revision": "r1", "spec": spec})
            .to_string()
        };
        for text in [
            prepare("c-1", serde_json::json!({"driver": "sim"})),
            prepare(
                "c-2",
                serde_json::json!({"driver": "sim", "command": ["a\"b\\c\n\u{1}é✓\u{2028}"],
                    "env": {"X": "%$\t"}, "ports": ports}),
            ),
        ] {
            let c = Command::parse(&text).unwrap();
            assert_eq!(signed_len(&c), signer.signed_json(&c).len(), "{text:.80}");
        }
        let compact = prepare("c-3", serde_json::json!({"driver": "sim", "ports": ports}));
        let c = Command::parse(&compact).unwrap();
        assert!(signed_len(&c) > 2 * compact.len(), "{}", signed_len(&c));
    }

    #[test]
    fn keys_round_trip_through_hex() {
        let signer = Signer::generate().unwrap();
        let again = Signer::from_hex(&signer.secret_hex()).unwrap();
        assert_eq!(again.public_hex(), signer.public_hex());
        assert!(matches!(Signer::from_hex("abc"), Err(KeyError::Length(3))));
        assert!(matches!(public_key(&"g".repeat(64)), Err(KeyError::NotHex)));
    }
}

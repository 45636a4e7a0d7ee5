//! What a host publishes is signed by the host (ed25519), so that the coordinator and
//! `capstan verify` can refuse anything its host did not write — a second line of
//! defence behind the broker's confinement (`docs/nats.md`, *Security model*).
//!
//! Every message an agent publishes — each log record on `capstan.v1.evt.<host>`, its
//! heartbeat, each command result (and its notice), each RPC answer — carries the
//! header [`HEADER`]: 128 lower-case hex digits, the signature over
//! [`signed_bytes`]: a prefix naming what the message is (domain separation, so a
//! signed record can never pass for a signed heartbeat), then the exact payload bytes.
//! An RPC answer's prefix also names the subject it answers (`capstan.v1.rpc.<host>.<verb>`),
//! so an answer to one verb or host cannot be replayed as another's.
//!
//! The host's key is made on the host (`capstan-agent host-key`) and its public half
//! registered with the coordinator (`capstan register`, `PUT /v1/hosts/{host}/keys`).

use crate::signing::{public_key, to_hex, KeyError, Signer};
use ed25519_dalek::{Signature, VerifyingKey};

/// The header that carries a publication's signature.
pub const HEADER: &str = "Capstan-Sig";

/// What a signed message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication<'a> {
    /// A log record on `capstan.v1.evt.<host>`.
    Record,
    /// A heartbeat in `capstan_hosts`.
    Beat,
    /// A command result in `capstan_results` (and its notice on `capstan.v1.res.…`).
    Result,
    /// An answer to the request on `subject`.
    Answer { subject: &'a str },
}

/// The bytes a publication's signature covers.
pub fn signed_bytes(what: Publication<'_>, payload: &[u8]) -> Vec<u8> {
    let mut bytes = match what {
        Publication::Record => b"capstan-record-v1\n".to_vec(),
        Publication::Beat => b"capstan-beat-v1\n".to_vec(),
        Publication::Result => b"capstan-result-v1\n".to_vec(),
        Publication::Answer { subject } => format!("capstan-answer-v1\n{subject}\n").into_bytes(),
    };
    bytes.extend_from_slice(payload);
    bytes
}

impl Signer {
    /// The signature of a publication, hex (the value of [`HEADER`]).
    pub fn sign_publication(&self, what: Publication<'_>, payload: &[u8]) -> String {
        self.sign_bytes(&signed_bytes(what, payload))
    }
}

/// Why a publication is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unverified {
    #[error("host {0} has no registered key")]
    NoKey(String),
    #[error("it carries no {HEADER} header")]
    Unsigned,
    #[error("its {HEADER} header is not a signature")]
    Malformed,
    #[error("its signature does not verify against a key registered for host {0}")]
    BadSignature(String),
}

/// The public keys registered for one host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostKeys {
    pub host: String,
    pub keys: Vec<VerifyingKey>,
}

impl HostKeys {
    /// From public keys in hex (`capstan_host_keys` entries); a bad key is an error.
    pub fn from_hex<'a>(
        host: &str,
        keys: impl IntoIterator<Item = &'a str>,
    ) -> Result<HostKeys, KeyError> {
        Ok(HostKeys {
            host: host.to_string(),
            keys: keys.into_iter().map(public_key).collect::<Result<_, _>>()?,
        })
    }

    /// The keys in hex, in order.
    pub fn hex(&self) -> Vec<String> {
        self.keys.iter().map(|k| to_hex(k.as_bytes())).collect()
    }

    /// Checks that `sig` (the [`HEADER`] value, if any) signs `payload` as `what`
    /// with one of this host's keys.
    pub fn verify(
        &self,
        what: Publication<'_>,
        payload: &[u8],
        sig: Option<&str>,
    ) -> Result<(), Unverified> {
        if self.keys.is_empty() {
            return Err(Unverified::NoKey(self.host.clone()));
        }
        let sig = sig.ok_or(Unverified::Unsigned)?;
        let bytes = crate::signing::from_hex::<64>(sig).map_err(|_| Unverified::Malformed)?;
        let signature = Signature::from_bytes(&bytes);
        let message = signed_bytes(what, payload);
        if self
            .keys
            .iter()
            .any(|k| k.verify_strict(&message, &signature).is_ok())
        {
            Ok(())
        } else {
            Err(Unverified::BadSignature(self.host.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_of(host: &str, signer: &Signer) -> HostKeys {
        HostKeys::from_hex(host, [signer.public_hex().as_str()]).unwrap()
    }

    #[test]
    fn a_signed_publication_verifies_and_nothing_else_does() {
        let h1 = Signer::generate().unwrap();
        let stranger = Signer::generate().unwrap();
        let keys = keys_of("h1", &h1);
        let record = br#"{"host":"h1","seq":1}"#;
        let sig = h1.sign_publication(Publication::Record, record);
        keys.verify(Publication::Record, record, Some(&sig))
            .unwrap();
        // Another payload, another kind, another key, no signature, junk.
        let other = br#"{"host":"h1","seq":2}"#;
        let bad = Unverified::BadSignature("h1".into());
        assert_eq!(
            keys.verify(Publication::Record, other, Some(&sig)),
            Err(bad.clone())
        );
        assert_eq!(
            keys.verify(Publication::Beat, record, Some(&sig)),
            Err(bad.clone())
        );
        let theirs = stranger.sign_publication(Publication::Record, record);
        assert_eq!(
            keys.verify(Publication::Record, record, Some(&theirs)),
            Err(bad)
        );
        assert_eq!(
            keys.verify(Publication::Record, record, None),
            Err(Unverified::Unsigned)
        );
        assert_eq!(
            keys.verify(Publication::Record, record, Some("zz")),
            Err(Unverified::Malformed)
        );
        assert_eq!(
            HostKeys::default().verify(Publication::Record, record, Some(&sig)),
            Err(Unverified::NoKey(String::new()))
        );
    }

    #[test]
    fn an_answer_is_bound_to_its_subject() {
        let h1 = Signer::generate().unwrap();
        let keys = keys_of("h1", &h1);
        let body = br#"{"host":"h1"}"#;
        let subject = "capstan.v1.rpc.h1.status";
        let sig = h1.sign_publication(Publication::Answer { subject }, body);
        keys.verify(Publication::Answer { subject }, body, Some(&sig))
            .unwrap();
        let other = Publication::Answer {
            subject: "capstan.v1.rpc.h1.intent",
        };
        assert!(keys.verify(other, body, Some(&sig)).is_err());
    }

    #[test]
    fn any_registered_key_verifies() {
        let old = Signer::generate().unwrap();
        let new = Signer::generate().unwrap();
        let keys = HostKeys::from_hex("h1", [old.public_hex().as_str(), new.public_hex().as_str()])
            .unwrap();
        for signer in [&old, &new] {
            let sig = signer.sign_publication(Publication::Beat, b"{}");
            keys.verify(Publication::Beat, b"{}", Some(&sig)).unwrap();
        }
        assert_eq!(keys.hex(), [old.public_hex(), new.public_hex()]);
    }
}

//! What a host publishes is signed by the host (ed25519), so that the coordinator and
//! `capstan verify` can refuse anything its host did not write — a second line of
//! defence behind the broker's confinement (`docs/nats.md`, *Security model*).
//!
//! Every message an agent publishes carries the header [`HEADER`]: 128 lower-case hex
//! digits, a signature over [`signed_bytes`], which start with a prefix naming what
//! the message is (domain separation: a signed record can never pass for a signed
//! heartbeat).
//!
//! - A heartbeat, an RPC answer and the results' progress are signed one by one,
//!   over their exact payload. An answer's prefix also names the subject it answers
//!   and the request's nonce ([`NONCE_HEADER`], chosen at random by the coordinator
//!   for each request), so an answer to one verb, host or request cannot be replayed
//!   as another's.
//! - Records and results go out in batches (an outbox burst, a round of result puts),
//!   and a batch is signed **once**: over the root of a Merkle tree (RFC 6962's) of
//!   its members' payloads and the batch's size. Each member carries the same
//!   signature and, in [`PROOF_HEADER`], its place in the tree (`<index>/<size>/<hex
//!   of its audit path>`), so each is checked on its own: its leaf and path give the
//!   root, the root and size the signed bytes. A record published alone is a batch of
//!   one (its root is its leaf, its path empty). One signature a batch instead of one
//!   a message: signing was a fifth of the agent's CPU per command over NATS.
//!
//! The host's key is made on the host (`capstan-agent host-key`) and its public half
//! registered with the coordinator (`capstan register`, `PUT /v1/hosts/{host}/keys`).

use crate::signing::{public_key, to_hex, KeyError, Signer};
use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest as _, Sha256};

/// The header that carries a publication's signature.
pub const HEADER: &str = "Capstan-Sig";
/// The header that carries a batch member's place in its batch's tree.
pub const PROOF_HEADER: &str = "Capstan-Proof";
/// The header of an RPC request that carries its nonce, which the answer's signature
/// covers: [`nonce_of`].
pub const NONCE_HEADER: &str = "Capstan-Nonce";

/// A request's nonce from its [`NONCE_HEADER`] value: 32 to 64 lower-case hex digits,
/// else none (an answer to a request without one is signed as before nonces,
/// `capstan-answer-v1`, which a coordinator of this release refuses).
pub fn nonce_of(header: Option<&str>) -> Option<&str> {
    let nonce = header?;
    let ok = (32..=64).contains(&nonce.len())
        && nonce
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then_some(nonce)
}

/// The most members a signed batch may have (a proof naming more is refused).
pub const MAX_BATCH: u64 = 1 << 16;

/// What a signed message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication<'a> {
    /// A log record on `capstan.v1.evt.<host>` (batched).
    Record,
    /// A heartbeat on `capstan.v1.beat.<host>`.
    Beat,
    /// A command result in `capstan_results`, and its notice on `capstan.v1.res.…`
    /// (batched).
    Result,
    /// An answer to the request on `subject` that carried `nonce` ([`nonce_of`]).
    Answer {
        subject: &'a str,
        nonce: Option<&'a str>,
    },
    /// The results' progress key of the host (`<host>._progress`), which only the host
    /// reads back: signed, so that no one else's put moves where its results resume.
    Progress,
}

impl Publication<'_> {
    /// Whether it is signed in batches (through a Merkle root and a proof).
    pub fn batched(self) -> bool {
        matches!(self, Publication::Record | Publication::Result)
    }

    fn prefix(self) -> Vec<u8> {
        match self {
            Publication::Record => b"capstan-records-v1\n".to_vec(),
            Publication::Beat => b"capstan-beat-v1\n".to_vec(),
            Publication::Result => b"capstan-results-v1\n".to_vec(),
            Publication::Answer {
                subject,
                nonce: None,
            } => format!("capstan-answer-v1\n{subject}\n").into_bytes(),
            Publication::Answer {
                subject,
                nonce: Some(nonce),
            } => format!("capstan-answer-v2\n{subject}\n{nonce}\n").into_bytes(),
            Publication::Progress => b"capstan-progress-v1\n".to_vec(),
        }
    }
}

/// The bytes a publication's signature covers: for a single message its prefix and
/// payload; for a batch its prefix, its size (8 bytes, big-endian) and its root.
pub fn signed_bytes(what: Publication<'_>, payload: &[u8]) -> Vec<u8> {
    let mut bytes = what.prefix();
    bytes.extend_from_slice(payload);
    bytes
}

fn batch_bytes(what: Publication<'_>, size: u64, root: &[u8; 32]) -> Vec<u8> {
    let mut bytes = what.prefix();
    bytes.extend_from_slice(&size.to_be_bytes());
    bytes.extend_from_slice(root);
    bytes
}

type Hash = [u8; 32];

fn leaf(payload: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(payload);
    h.finalize().into()
}

fn node(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The largest power of two below `n` (n ≥ 2): where RFC 6962 splits a tree.
fn split(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

#[cfg(test)]
fn root(leaves: &[Hash]) -> Hash {
    match leaves {
        [one] => *one,
        _ => {
            let k = split(leaves.len());
            node(&root(&leaves[..k]), &root(&leaves[k..]))
        }
    }
}

/// The root of `leaves`, with each leaf's audit path (its siblings from the bottom
/// of the tree up) pushed onto its entry of `paths`: each node hashed once.
fn tree(leaves: &[Hash], paths: &mut [Vec<Hash>]) -> Hash {
    if leaves.len() <= 1 {
        return leaves[0];
    }
    let k = split(leaves.len());
    let (left_paths, right_paths) = paths.split_at_mut(k);
    let left = tree(&leaves[..k], left_paths);
    let right = tree(&leaves[k..], right_paths);
    left_paths.iter_mut().for_each(|p| p.push(right));
    right_paths.iter_mut().for_each(|p| p.push(left));
    node(&left, &right)
}

/// Leaf `m`'s audit path, as [`tree`] makes it (the tests check the two agree).
#[cfg(test)]
fn path(m: usize, leaves: &[Hash]) -> Vec<Hash> {
    if leaves.len() <= 1 {
        return Vec::new();
    }
    let k = split(leaves.len());
    let (mut below, sibling) = if m < k {
        (path(m, &leaves[..k]), root(&leaves[k..]))
    } else {
        (path(m - k, &leaves[k..]), root(&leaves[..k]))
    };
    below.push(sibling);
    below
}

/// The root a leaf at `m` of `n` with audit path `path` (bottom up) belongs to; `None`
/// when the path is not the length such a leaf's is.
fn root_from(m: u64, n: u64, leaf: Hash, path: &[Hash]) -> Option<Hash> {
    if n == 1 {
        return path.is_empty().then_some(leaf);
    }
    let (top, rest) = path.split_last()?;
    let k = split(usize::try_from(n).ok()?) as u64;
    Some(if m < k {
        node(&root_from(m, k, leaf, rest)?, top)
    } else {
        node(top, &root_from(m - k, n - k, leaf, rest)?)
    })
}

/// A signed batch: the one signature, and each member's proof, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub sig: String,
    pub proofs: Vec<String>,
}

impl Signer {
    /// Its own public key as host `host`'s only one: what a host checks what it reads
    /// back of its own with (its results' progress, its last record).
    pub fn own_keys(&self, host: &str) -> HostKeys {
        HostKeys {
            host: host.to_string(),
            keys: vec![self.verifying_key()],
        }
    }

    /// The signature of a single publication (a beat, an answer), hex: the value of
    /// [`HEADER`].
    pub fn sign_publication(&self, what: Publication<'_>, payload: &[u8]) -> String {
        debug_assert!(!what.batched(), "{what:?} is signed in batches");
        self.sign_bytes(&signed_bytes(what, payload))
    }

    /// One signature for every payload of a batch of `what` (records or results),
    /// and each one's [`PROOF_HEADER`].
    pub fn sign_batch(&self, what: Publication<'_>, payloads: &[&[u8]]) -> Batch {
        debug_assert!(what.batched(), "{what:?} is signed one by one");
        let leaves: Vec<Hash> = payloads.iter().map(|p| leaf(p)).collect();
        let n = leaves.len();
        if n == 0 {
            return Batch {
                sig: String::new(),
                proofs: Vec::new(),
            };
        }
        let mut paths = vec![Vec::new(); n];
        let root = tree(&leaves, &mut paths);
        let sig = self.sign_bytes(&batch_bytes(what, n as u64, &root));
        let proofs = paths
            .iter()
            .enumerate()
            .map(|(m, path)| format!("{m}/{n}/{}", to_hex(&path.concat())))
            .collect();
        Batch { sig, proofs }
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
    #[error("its {PROOF_HEADER} header is missing or does not place it in a batch")]
    BadProof,
    #[error("its signature does not verify against a key registered for host {0}")]
    BadSignature(String),
}

/// A member's place in its batch, read from its [`PROOF_HEADER`].
fn parse_proof(proof: &str) -> Option<(u64, u64, Vec<Hash>)> {
    let mut parts = proof.splitn(3, '/');
    let m: u64 = parts.next()?.parse().ok()?;
    let n: u64 = parts.next()?.parse().ok()?;
    let hex = parts.next()?;
    if m >= n || n > MAX_BATCH || hex.len() % 64 != 0 || hex.len() / 64 > 16 {
        return None;
    }
    let path = hex
        .as_bytes()
        .chunks(64)
        .map(|c| crate::signing::from_hex::<32>(std::str::from_utf8(c).ok()?).ok())
        .collect::<Option<Vec<Hash>>>()?;
    Some((m, n, path))
}

/// The bytes a batched publication's signature must cover, from its payload and
/// proof: what [`HostKeys::verify`] checks the signature over (and what a verifier
/// may remember as checked, to skip checking the same batch's signature again).
pub fn batch_signed_bytes(
    what: Publication<'_>,
    payload: &[u8],
    proof: Option<&str>,
) -> Result<Vec<u8>, Unverified> {
    let (m, n, path) = proof.and_then(parse_proof).ok_or(Unverified::BadProof)?;
    let root = root_from(m, n, leaf(payload), &path).ok_or(Unverified::BadProof)?;
    Ok(batch_bytes(what, n, &root))
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

    /// Checks that `sig` (the [`HEADER`] value, if any) signs `payload` as `what` with
    /// one of this host's keys; a batched kind also needs its `proof` (the
    /// [`PROOF_HEADER`] value).
    pub fn verify(
        &self,
        what: Publication<'_>,
        payload: &[u8],
        sig: Option<&str>,
        proof: Option<&str>,
    ) -> Result<(), Unverified> {
        if self.keys.is_empty() {
            return Err(Unverified::NoKey(self.host.clone()));
        }
        let sig = sig.ok_or(Unverified::Unsigned)?;
        let message = if what.batched() {
            batch_signed_bytes(what, payload, proof)?
        } else {
            signed_bytes(what, payload)
        };
        self.verify_bytes(&message, sig)
    }

    /// Checks that `sig` signs `message` with one of this host's keys.
    pub fn verify_bytes(&self, message: &[u8], sig: &str) -> Result<(), Unverified> {
        let bytes = crate::signing::from_hex::<64>(sig).map_err(|_| Unverified::Malformed)?;
        let signature = Signature::from_bytes(&bytes);
        if self
            .keys
            .iter()
            .any(|k| k.verify_strict(message, &signature).is_ok())
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
    fn a_signed_beat_verifies_and_nothing_else_does() {
        let h1 = Signer::generate().unwrap();
        let stranger = Signer::generate().unwrap();
        let keys = keys_of("h1", &h1);
        let beat = br#"{"host":"h1","last_seq":1}"#;
        let sig = h1.sign_publication(Publication::Beat, beat);
        keys.verify(Publication::Beat, beat, Some(&sig), None)
            .unwrap();
        let bad = Unverified::BadSignature("h1".into());
        let other = br#"{"host":"h1","last_seq":2}"#;
        assert_eq!(
            keys.verify(Publication::Beat, other, Some(&sig), None),
            Err(bad.clone())
        );
        let answer = Publication::Answer {
            subject: "capstan.v1.rpc.h1.status",
            nonce: None,
        };
        assert_eq!(
            keys.verify(answer, beat, Some(&sig), None),
            Err(bad.clone())
        );
        let theirs = stranger.sign_publication(Publication::Beat, beat);
        assert_eq!(
            keys.verify(Publication::Beat, beat, Some(&theirs), None),
            Err(bad)
        );
        assert_eq!(
            keys.verify(Publication::Beat, beat, None, None),
            Err(Unverified::Unsigned)
        );
        assert_eq!(
            keys.verify(Publication::Beat, beat, Some("zz"), None),
            Err(Unverified::Malformed)
        );
        assert_eq!(
            HostKeys::default().verify(Publication::Beat, beat, Some(&sig), None),
            Err(Unverified::NoKey(String::new()))
        );
    }

    #[test]
    fn an_answer_is_bound_to_its_subject_and_its_requests_nonce() {
        let h1 = Signer::generate().unwrap();
        let keys = keys_of("h1", &h1);
        let body = br#"{"host":"h1"}"#;
        let subject = "capstan.v1.rpc.h1.status";
        let nonce = Some("0123456789abcdef0123456789abcdef");
        let sig = h1.sign_publication(Publication::Answer { subject, nonce }, body);
        keys.verify(
            Publication::Answer { subject, nonce },
            body,
            Some(&sig),
            None,
        )
        .unwrap();
        let bad = Err(Unverified::BadSignature("h1".into()));
        for (subject, nonce) in [
            ("capstan.v1.rpc.h1.intent", nonce),
            (subject, Some("fedcba9876543210fedcba9876543210")),
            (subject, None),
        ] {
            let other = Publication::Answer { subject, nonce };
            assert_eq!(keys.verify(other, body, Some(&sig), None), bad);
        }
        // Progress is its own domain too.
        let progress = h1.sign_publication(Publication::Progress, body);
        keys.verify(Publication::Progress, body, Some(&progress), None)
            .unwrap();
        assert_eq!(
            keys.verify(Publication::Beat, body, Some(&progress), None),
            bad
        );
    }

    #[test]
    fn a_nonce_is_taken_only_in_its_form() {
        let good = "0123456789abcdef0123456789abcdef";
        assert_eq!(nonce_of(Some(good)), Some(good));
        for bad in [
            "",
            "0123",
            &good.to_uppercase(),
            &format!("{good}\nx"),
            &"a".repeat(65),
            "é",
        ] {
            assert_eq!(nonce_of(Some(bad)), None, "{bad:?}");
        }
        assert_eq!(nonce_of(None), None);
    }

    fn payloads(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!(r#"{{"seq":{i}}}"#).into_bytes())
            .collect()
    }

    #[test]
    fn every_member_of_a_batch_of_any_size_verifies_on_its_own() {
        let h1 = Signer::generate().unwrap();
        let keys = keys_of("h1", &h1);
        for n in [1, 2, 3, 5, 8, 13, 64, 100, 256] {
            let all = payloads(n);
            let refs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
            let batch = h1.sign_batch(Publication::Record, &refs);
            assert_eq!(batch.proofs.len(), n);
            for (payload, proof) in all.iter().zip(&batch.proofs) {
                keys.verify(Publication::Record, payload, Some(&batch.sig), Some(proof))
                    .unwrap_or_else(|e| panic!("{n}: {proof}: {e}"));
                // The same member as a result: another domain.
                assert_eq!(
                    keys.verify(Publication::Result, payload, Some(&batch.sig), Some(proof)),
                    Err(Unverified::BadSignature("h1".into()))
                );
            }
        }
    }

    #[test]
    fn a_member_changed_moved_or_taken_into_another_batch_is_refused() {
        let h1 = Signer::generate().unwrap();
        let keys = keys_of("h1", &h1);
        let all = payloads(10);
        let refs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        let batch = h1.sign_batch(Publication::Record, &refs);
        let check = |payload: &[u8], proof: &str| {
            keys.verify(Publication::Record, payload, Some(&batch.sig), Some(proof))
        };
        let bad = Err(Unverified::BadSignature("h1".into()));
        // Another payload under a member's proof; a member under another's proof.
        assert_eq!(check(b"{\"seq\":99}", &batch.proofs[3]), bad);
        assert_eq!(check(&all[3], &batch.proofs[4]), bad);
        // A proof that claims another size or index with the same path.
        let (rest, path) = batch.proofs[3].rsplit_once('/').unwrap();
        let (m, _) = rest.split_once('/').unwrap();
        assert_eq!(check(&all[3], &format!("{m}/11/{path}")), bad);
        assert_eq!(check(&all[3], &format!("2/10/{path}")), bad);
        // A path cut short, or grown, or junk: not a place in a batch.
        assert_eq!(
            check(&all[3], &format!("3/10/{}", &path[64..])),
            Err(Unverified::BadProof)
        );
        assert_eq!(
            check(&all[3], &format!("3/10/{path}{}", "0".repeat(64))),
            Err(Unverified::BadProof)
        );
        for junk in ["", "3", "3/10", "10/10/", "3/10/xyz", "0/99999999/"] {
            assert_eq!(check(&all[3], junk), Err(Unverified::BadProof), "{junk:?}");
        }
        assert_eq!(
            keys.verify(Publication::Record, &all[3], Some(&batch.sig), None),
            Err(Unverified::BadProof)
        );
        // The same member of another batch (of the same records, one more): another root.
        let more = payloads(11);
        let refs: Vec<&[u8]> = more.iter().map(Vec::as_slice).collect();
        let other = h1.sign_batch(Publication::Record, &refs);
        assert_eq!(
            keys.verify(
                Publication::Record,
                &all[3],
                Some(&batch.sig),
                Some(&other.proofs[3])
            ),
            bad
        );
    }

    #[test]
    fn the_tree_is_rfc_6962s() {
        // RFC 6962's root of the empty-string leaf alone, and of two leaves.
        let a = leaf(b"");
        assert_eq!(
            to_hex(&a),
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
        );
        let b = leaf(b"\x00");
        assert_eq!(root(&[a, b]), node(&a, &b));
        let c = leaf(b"\x10");
        // Three leaves split 2 + 1.
        assert_eq!(root(&[a, b, c]), node(&node(&a, &b), &c));
        assert_eq!(path(2, &[a, b, c]), vec![node(&a, &b)]);
        assert_eq!(path(0, &[a, b, c]), vec![b, c]);
    }

    #[test]
    fn the_tree_gives_every_leaf_its_rfc_6962_path() {
        for n in 1..=40 {
            let leaves: Vec<Hash> = (0..n).map(|i| leaf(&[i as u8])).collect();
            let mut paths = vec![Vec::new(); n];
            assert_eq!(tree(&leaves, &mut paths), root(&leaves), "{n}");
            for (m, p) in paths.iter().enumerate() {
                assert_eq!(*p, path(m, &leaves), "{n}: {m}");
            }
        }
    }

    #[test]
    fn any_registered_key_verifies() {
        let old = Signer::generate().unwrap();
        let new = Signer::generate().unwrap();
        let keys = HostKeys::from_hex("h1", [old.public_hex().as_str(), new.public_hex().as_str()])
            .unwrap();
        for signer in [&old, &new] {
            let sig = signer.sign_publication(Publication::Beat, b"{}");
            keys.verify(Publication::Beat, b"{}", Some(&sig), None)
                .unwrap();
        }
        assert_eq!(keys.hex(), [old.public_hex(), new.public_hex()]);
    }
}

//! The sealed form of records and snapshots: `[format version][body][SHA-256 of
//! version+body]`. A record's body carries the previous record's hash, which chains the
//! log. The hash covers the stored bytes, so a record keeps its hash for ever, whatever
//! format version it was written in (see [`crate::stored`]).

use super::stored::StoredError;
use super::{Corruption, Defect, Entry, Record};
use sha2::{Digest, Sha256};

const HASH_LEN: usize = 32;

/// A 32-byte SHA-256.
pub type Hash = [u8; HASH_LEN];

/// Appends the hash of `content` (`[version][body]`) to it.
pub fn seal(mut content: Vec<u8>) -> (Vec<u8>, Hash) {
    let hash: Hash = Sha256::digest(&content).into();
    content.extend_from_slice(&hash);
    (content, hash)
}

/// Checks the stored bytes against their hash; returns `[version][body]` and the hash.
/// `seq` names the record in the error.
pub fn unseal(seq: u64, stored: &[u8]) -> Result<(&[u8], Hash), Corruption> {
    let bad = |defect| Corruption { seq, defect };
    if stored.len() < 1 + HASH_LEN {
        return Err(bad(Defect::Truncated));
    }
    let (content, hash) = stored.split_at(stored.len() - HASH_LEN);
    let expected: Hash = Sha256::digest(content).into();
    if expected != hash {
        return Err(bad(Defect::HashMismatch));
    }
    Ok((content, expected))
}

/// A new record, sealed in the current format.
pub fn seal_record<E: Entry>(
    seq: u64,
    at_ms: i64,
    prev_hash: Hash,
    event: &E,
) -> Result<(Vec<u8>, Hash), StoredError> {
    Ok(seal(event.encode(seq, at_ms, prev_hash)?))
}

/// A stored record of any known format, checked against its hash.
pub fn open_record<E: Entry>(seq: u64, stored: &[u8]) -> Result<(Record<E>, Hash), Corruption> {
    let (content, hash) = unseal(seq, stored)?;
    let defect = match E::decode(content) {
        Ok(record) => return Ok((record, hash)),
        Err(StoredError::UnknownFormat(v)) => Defect::UnknownFormat(v),
        Err(_) => Defect::Undecodable,
    };
    Err(Corruption { seq, defect })
}

//! The stored form of records and snapshots:
//! `[format version][bincode body][SHA-256 of version+body]`.
//! A record's body carries the previous record's hash, which chains the log.

use super::{Corruption, Defect};
use serde::{de::DeserializeOwned, Serialize};
use sha2::{Digest, Sha256};

/// The format version byte written in front of every stored value.
pub const FORMAT_VERSION: u8 = 1;
const HASH_LEN: usize = 32;

/// A 32-byte SHA-256.
pub type Hash = [u8; HASH_LEN];

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes `value`, returning the stored bytes and their hash.
pub fn seal<T: Serialize>(value: &T) -> Result<(Vec<u8>, Hash), bincode::error::EncodeError> {
    let mut bytes = vec![FORMAT_VERSION];
    bytes.extend(bincode::serde::encode_to_vec(value, config())?);
    let hash: Hash = Sha256::digest(&bytes).into();
    bytes.extend_from_slice(&hash);
    Ok((bytes, hash))
}

/// Checks the stored bytes against their hash and decodes them. `seq` names the
/// record in the error.
pub fn open<T: DeserializeOwned>(seq: u64, stored: &[u8]) -> Result<(T, Hash), Corruption> {
    let bad = |defect| Corruption { seq, defect };
    if stored.len() < 1 + HASH_LEN {
        return Err(bad(Defect::Truncated));
    }
    let (content, hash) = stored.split_at(stored.len() - HASH_LEN);
    let expected: Hash = Sha256::digest(content).into();
    if expected != hash {
        return Err(bad(Defect::HashMismatch));
    }
    if content[0] != FORMAT_VERSION {
        return Err(bad(Defect::UnknownFormat(content[0])));
    }
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(&content[1..], config())
        .map_err(|_| bad(Defect::Undecodable))?;
    if used != content.len() - 1 {
        return Err(bad(Defect::Undecodable));
    }
    Ok((value, expected))
}

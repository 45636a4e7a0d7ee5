//! The stored shapes of records, one module per format version, apart from the domain
//! [`Event`](crate::event::Event) (whose JSON is the wire form and which may change
//! freely). A stored record is `[format version][body]` (then its hash, see `codec`);
//! decoding dispatches on the version and upcasts old formats to the current one, so
//! records of every version live in one chain and keep their bytes and hashes. New
//! records are always written in [`CURRENT`].
//!
//! - [`v1`]: frozen; events with the wire enums and the spec stored by position.
//! - [`v2`]: current; codes, outcomes and phases by spelling, the spec as JSON.
//!
//! [`pruned`] holds the shapes of what retention keeps of pruned commands.
//!
//! Evolving: a new event kind is appended to `v2::Event`; a field added to an event
//! means a `v3` module (copy `v2`, add the field, `From<v2::Record> for v3::Record`,
//! make it [`CURRENT`]) and a new fixture (`tests/fixtures/make-log-v3.sh`).

pub mod pruned;
pub mod v1;
pub mod v2;

#[cfg(test)]
pub(crate) mod samples;
#[cfg(test)]
mod test_v3;
#[cfg(test)]
mod tests;

use crate::event::{Event, Record};
use serde::{de::DeserializeOwned, Serialize};

/// The format version new records are written in.
pub const CURRENT: u8 = 2;

/// Why a record cannot be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum StoredError {
    #[error("cannot encode the record")]
    Encode(#[source] bincode::error::EncodeError),
    #[error("cannot decode the record body")]
    Decode(#[source] bincode::error::DecodeError),
    #[error("{0} bytes follow the record body")]
    Trailing(usize),
    #[error("{spelling:?} is not a known {kind}")]
    Spelling {
        kind: &'static str,
        spelling: String,
    },
    #[error("the spec is not valid spec JSON")]
    Spec(#[source] serde_json::Error),
    #[error("unknown format version {0}")]
    UnknownFormat(u8),
}

/// The most bytes decoding one record may claim. bincode reads lengths from the
/// input and allocates what they say: a damaged length (even under a valid hash,
/// if resealed) must give an undecodable record, not an allocation failure. Far
/// above the largest legitimate record (a command is at most 256 KiB of JSON, and a
/// record carries it once, with its spec).
pub const DECODE_LIMIT: usize = 16 << 20;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

fn decode_config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<DECODE_LIMIT>,
> {
    config().with_limit::<DECODE_LIMIT>()
}

/// `[CURRENT][body]` of a record.
pub fn encode(
    seq: u64,
    at_ms: i64,
    prev_hash: [u8; 32],
    event: &Event,
) -> Result<Vec<u8>, StoredError> {
    let record = v2::Record {
        seq,
        at_ms,
        prev_hash,
        event: v2::Event::from_domain(event)?,
    };
    encode_as(CURRENT, &record)
}

/// `[version][bincode of value]`.
pub(crate) fn encode_as<T: Serialize>(version: u8, value: &T) -> Result<Vec<u8>, StoredError> {
    let mut bytes = vec![version];
    bincode::serde::encode_into_std_write(value, &mut bytes, config())
        .map_err(StoredError::Encode)?;
    Ok(bytes)
}

/// The record in `[version][body]`, whatever format version wrote it.
pub fn decode(stored: &[u8]) -> Result<Record, StoredError> {
    let (&version, body) = stored.split_first().ok_or(StoredError::UnknownFormat(0))?;
    let current = match version {
        1 => v2::Record::from(from_bincode::<v1::Record>(body)?),
        2 => from_bincode::<v2::Record>(body)?,
        v => return Err(StoredError::UnknownFormat(v)),
    };
    Ok(Record {
        seq: current.seq,
        at_ms: current.at_ms,
        prev_hash: current.prev_hash,
        event: current.event.into_domain()?,
    })
}

/// Decodes a whole body: trailing bytes mean it is not what it claims to be.
pub(crate) fn from_bincode<T: DeserializeOwned>(body: &[u8]) -> Result<T, StoredError> {
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(body, decode_config())
        .map_err(StoredError::Decode)?;
    match body.len() - used {
        0 => Ok(value),
        extra => Err(StoredError::Trailing(extra)),
    }
}

/// The stable `snake_case` spelling of a unit variant (an error code, an outcome, a
/// phase): its serde name, which is also its wire form.
pub(crate) fn spell<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        other => unreachable!("only unit variants are spelled, got {other:?}"),
    }
}

/// The value a spelling names; a spelling this build does not know (written by a
/// newer build) makes the record undecodable rather than misread.
pub(crate) fn parse<T: DeserializeOwned>(spelling: &str) -> Result<T, StoredError> {
    let de = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(spelling);
    T::deserialize(de).map_err(|_| StoredError::Spelling {
        kind: std::any::type_name::<T>()
            .rsplit("::")
            .next()
            .unwrap_or("value"),
        spelling: spelling.to_string(),
    })
}

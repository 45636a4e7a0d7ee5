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
//! Evolving: a new event kind is appended to `v2::Event`; a field added to an event
//! means a `v3` module (copy `v2`, add the field, `From<v2::Record> for v3::Record`,
//! make it [`CURRENT`]) and a new fixture (`tests/fixtures/make-log-v3.sh`).

pub mod v1;
pub mod v2;

#[cfg(test)]
pub(crate) mod samples;
#[cfg(test)]
mod test_v3;
#[cfg(test)]
mod tests;

use crate::event::{Event, Record};
pub use capstan_log::stored::StoredError;
use capstan_log::stored::{encode_as, from_bincode, parse, spell};

/// The format version new records are written in.
pub const CURRENT: u8 = 2;

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

//! The stored shapes of what retention keeps of pruned commands (see
//! [`crate::log::pruned`]), apart from the domain's: `[format version][bincode body]`,
//! like records (without a seal: they are not part of the chain, and sled checks its
//! own pages).
//!
//! - [`Entry`] (format 1): one pruned command, under its id.
//! - [`Batch`] (format 1): the ids one prune added, under the prune's time, so they
//!   expire together.
//!
//! Positional, like the record formats: once released a shape never changes. A new
//! field means a format 2 (a new struct beside this one, `From<Entry> for EntryV2`,
//! [`decode`] of an entry dispatching on the version) and a test decoding the frozen
//! format-1 bytes below ([`tests`]).

use super::{encode_as, from_bincode, StoredError};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The format new entries and batches are written in.
pub const CURRENT: u8 = 1;

/// A pruned command, format 1: outcome and code by spelling (`succeeded`,
/// `revision_not_found`), as in record format 2.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The seq its `command_received` had.
    pub received_seq: u64,
    /// When the prune removed that record (ms since the epoch, the agent's clock).
    pub pruned_at_ms: i64,
    /// SHA-256 of the command's content (`Command::content`), `None` when the stored
    /// command did not parse.
    pub content: Option<[u8; 32]>,
    pub outcome: String,
    pub code: Option<String>,
    pub message: Option<String>,
}

/// The ids one prune added, format 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub ids: Vec<String>,
}

/// `[CURRENT][bincode of value]`: an [`Entry`] or a [`Batch`].
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoredError> {
    encode_as(CURRENT, value)
}

/// An [`Entry`] or a [`Batch`] from its stored bytes; another format version (a newer
/// build's) is refused, not misread.
pub fn decode<T: DeserializeOwned>(stored: &[u8]) -> Result<T, StoredError> {
    match stored.split_first() {
        Some((&CURRENT, body)) => from_bincode(body),
        Some((&v, _)) => Err(StoredError::UnknownFormat(v)),
        None => Err(StoredError::UnknownFormat(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            received_seq: 300,
            pruned_at_ms: 1_790_000_000_000,
            content: Some([7; 32]),
            outcome: "failed".into(),
            code: Some("revision_not_found".into()),
            message: Some("m".into()),
        }
    }

    /// Format 1 as released: these bytes must decode to the same entry for ever.
    const ENTRY_V1: &str = concat!(
        "01",                                                               // format 1
        "fb2c01",                                                           // received_seq 300
        "fd00d8a08841030000",                                               // pruned_at_ms
        "01",                                                               // content: Some
        "0707070707070707070707070707070707070707070707070707070707070707", // [7; 32]
        "066661696c6564",                                                   // "failed"
        "01127265766973696f6e5f6e6f745f666f756e64", // Some("revision_not_found")
        "01016d",                                   // Some("m")
    );

    use capstan_common::signing::to_hex as hex;

    #[test]
    fn a_format_1_entry_decodes_as_released() {
        let bytes = crate::export::unhex(ENTRY_V1).unwrap();
        assert_eq!(decode::<Entry>(&bytes).unwrap(), entry());
        assert_eq!(hex(&encode(&entry()).unwrap()), ENTRY_V1);
    }

    #[test]
    fn entries_and_batches_round_trip_and_unknown_formats_are_refused() {
        let e = entry();
        assert_eq!(decode::<Entry>(&encode(&e).unwrap()).unwrap(), e);
        let b = Batch {
            ids: vec!["a".into(), "b".into()],
        };
        assert_eq!(decode::<Batch>(&encode(&b).unwrap()).unwrap(), b);
        let mut newer = encode(&e).unwrap();
        newer[0] = 2;
        assert!(matches!(
            decode::<Entry>(&newer),
            Err(StoredError::UnknownFormat(2))
        ));
        assert!(matches!(
            decode::<Entry>(&[]),
            Err(StoredError::UnknownFormat(0))
        ));
        assert!(matches!(
            decode::<Entry>(&[1, 0xff]),
            Err(StoredError::Decode(_))
        ));
    }
}

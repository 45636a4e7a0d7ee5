//! The stored form of what the log writes: `[format version][bincode body]` (a record
//! or a snapshot is then sealed, see [`crate::codec`]). An [`Entry`](crate::Entry)
//! type keeps its own record shapes, one per format version, and reads and writes them
//! with [`encode_as`] and [`from_bincode`]; this module holds the rules every stored
//! shape shares (a decode limit, no trailing bytes, unit variants by spelling), and
//! [`pruned`] the shapes of what retention keeps of pruned commands.

pub mod pruned;

use serde::{de::DeserializeOwned, Serialize};

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
    #[error("a field held as JSON is not valid")]
    Json(#[source] serde_json::Error),
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

/// `[version][bincode of value]`.
pub fn encode_as<T: Serialize>(version: u8, value: &T) -> Result<Vec<u8>, StoredError> {
    let mut bytes = vec![version];
    bincode::serde::encode_into_std_write(value, &mut bytes, config())
        .map_err(StoredError::Encode)?;
    Ok(bytes)
}

/// Decodes a whole body: trailing bytes mean it is not what it claims to be.
pub fn from_bincode<T: DeserializeOwned>(body: &[u8]) -> Result<T, StoredError> {
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(body, decode_config())
        .map_err(StoredError::Decode)?;
    match body.len() - used {
        0 => Ok(value),
        extra => Err(StoredError::Trailing(extra)),
    }
}

/// The stable `snake_case` spelling of a unit variant (an error code, an outcome, a
/// phase): its serde name, which is also its wire form.
pub fn spell<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        other => unreachable!("only unit variants are spelled, got {other:?}"),
    }
}

/// The value a spelling names; a spelling this build does not know (written by a
/// newer build) makes the record undecodable rather than misread.
pub fn parse<T: DeserializeOwned>(spelling: &str) -> Result<T, StoredError> {
    let de = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(spelling);
    T::deserialize(de).map_err(|_| StoredError::Spelling {
        kind: std::any::type_name::<T>()
            .rsplit("::")
            .next()
            .unwrap_or("value"),
        spelling: spelling.to_string(),
    })
}

//! Marks: named positions the log's user keeps beside its records (tree `marks`,
//! key = the mark's name, value = a big-endian u64), e.g. the agent's position in
//! its host's command stream. A mark only moves forward, is not a record (it is
//! neither chained nor exported: it says how far the user got, not what happened),
//! and is made durable by the next flush, with the records written before it: a
//! crash loses at most the moves since the last flush, never shows a mark ahead of
//! the records the user wrote before moving it (sled recovers a prefix of writes).

use super::{Fold, Log, LogError};

/// The sled tree of the marks.
pub(crate) const TREE: &str = "marks";

impl<F: Fold> Log<F> {
    /// Mark `name`: 0 when it was never set.
    pub fn mark(&self, name: &str) -> Result<u64, LogError> {
        Ok(self
            .marks
            .get(name.as_bytes())
            .map_err(LogError::Storage)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes))
    }

    /// Moves mark `name` to `value`, if that is forward; durable with the next flush.
    /// Returns the mark's value after the call.
    pub fn advance_mark(&self, name: &str, value: u64) -> Result<u64, LogError> {
        let moved = self
            .marks
            .fetch_and_update(name.as_bytes(), |old| {
                let old = old
                    .and_then(|v| <[u8; 8]>::try_from(v).ok())
                    .map_or(0, u64::from_be_bytes);
                Some(old.max(value).to_be_bytes().to_vec())
            })
            .map_err(LogError::Storage)?;
        let old = moved
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes);
        Ok(old.max(value))
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::Log;
    use crate::LogOptions;

    #[test]
    fn a_mark_only_moves_forward_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = Log::open(dir.path(), LogOptions::default()).unwrap();
            assert_eq!(log.mark("commands").unwrap(), 0);
            assert_eq!(log.advance_mark("commands", 7).unwrap(), 7);
            assert_eq!(log.advance_mark("commands", 3).unwrap(), 7);
            assert_eq!(log.mark("other").unwrap(), 0);
            log.flush().unwrap();
        }
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        assert_eq!(log.mark("commands").unwrap(), 7);
    }
}
